/* SPDX-License-Identifier: GPL-2.0 */
/*
 * What gear_int.ko (the lab's INT switch) records per TCP data segment at the bottleneck's
 * egress, and how tcp_gear.ko reads it back per ACK (gear_int.c says why this stands in for
 * the telemetry an INT switch writes into the packet and the receiver echoes).
 */
#ifndef _GEAR_INT_H
#define _GEAR_INT_H

#include <linux/types.h>
#include <net/sock.h>

struct gear_int_record {
	u64 tx_bytes;		/* bytes the port had transmitted, this segment included */
	u64 ts_ns;		/* when the segment left the queue (guest monotonic clock) */
	u32 end_seq;		/* the segment's end sequence: what an ACK covering it acks */
	u32 qlen_pkts;		/* egress queue behind it, packets */
	u32 qlen_bytes;		/* ... and bytes (the qdisc's backlog) */
	u32 rate_mbit;		/* the port's configured line rate bw */
};

/* A reader's place in its flow's records (one per socket, zeroed with it). */
struct gear_int_cursor {
	u64 next;
};

int gear_int_read(const struct sock *sk, u32 ack, struct gear_int_cursor *c,
		  struct gear_int_record *out);

#endif /* _GEAR_INT_H */
