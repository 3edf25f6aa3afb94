// SPDX-License-Identifier: GPL-2.0
/*
 * gear_int: the lab's In-band Network Telemetry switch for Gear (tcp_gear.c).
 *
 * Gear (seed 002_3160f14936d8e845.txt) sets an intra-datacenter flow's window from what each
 * switch on its path writes into its data packets and the receiver echoes on the ACK: per hop
 * the egress queue length ql, the bytes the port has transmitted tx and a timestamp ts (the
 * line rate bw is configured). A sender then computes, per ACK and per hop i,
 *
 *   rate_i = (ack.tx_i − prev.tx_i) / (ack.ts_i − prev.ts_i)
 *   u_i    = rate_i / bw_i + ack.ql_i / (baseRTT · bw_i),              (Gear eq. 1, HPCC)
 *
 * Stock Linux switches do not stamp packets, and a tcp_congestion_ops module sees no packets.
 * The lab's User-Mode Linux guest, however, is one kernel for all its network namespaces: the
 * bottleneck router and the sender share this module's memory. So the "switch" is a packet tap
 * (dev_add_pack, ETH_P_ALL) on the bottleneck's egress device: the stack calls it for each
 * packet as the driver transmits it, i.e. as the packet leaves the real egress qdisc, which is
 * where an INT switch stamps (HPCC's qLen is the egress queue at dequeue). For each TCP data
 * segment it records
 *
 *   ql   the qdisc's backlog in packets and bytes (what is still queued behind it),
 *   tx   the bytes the device has transmitted, this segment included,
 *   ts   the guest's monotonic clock in ns (simulated under UML's time travel),
 *   bw   the configured line rate,
 *
 * keyed by (flow 4-tuple, end sequence). The sender's tcp_gear reads, per ACK, the record of
 * the highest segment the ACK covers (end sequence ≤ snd_una): the same telemetry, at the same
 * moment, that an in-band echo would bring, with the exact queue. What is not emulated is the
 * carriage: the 16–40 bytes of TCP option per data packet and ACK (Gear: 4 bytes per field per
 * hop, kind 253, 40-byte limit), so the emulated flows send that much more payload per packet
 * than Gear's would (about 1–3 % of a 1448-byte segment). One hop only (the lab's bottleneck);
 * Gear's "keep the hop with the largest ql/bw" (eq. 3) has one candidate.
 *
 * Attaching: write the device's name to /sys/module/gear_int/parameters/dev from a process in
 * the router's network namespace (the name is looked up in the writer's namespace); an empty
 * write detaches. The tap also detaches itself when the device goes away.
 *
 * Storage: GEAR_INT_FLOWS flow slots (a new flow takes the least recently seen one), each a
 * ring of GEAR_INT_RING records in transmission order; a reader keeps its own cursor
 * (struct gear_int_cursor), so reading per ACK is O(1) amortised. A window larger than the
 * ring loses its oldest records: the reader then gets none for those ACKs (-ENOENT).
 */
#include <linux/if_ether.h>
#include <linux/ip.h>
#include <linux/jhash.h>
#include <linux/module.h>
#include <linux/netdevice.h>
#include <linux/tcp.h>
#include <linux/vmalloc.h>
#include <net/net_namespace.h>
#include <net/sch_generic.h>
#include <net/tcp.h>

#include "gear_int.h"

#define GEAR_INT_FLOWS		64
#define GEAR_INT_RING		2048	/* records per flow: a 100 Mbit/s × 200 ms window */
#define GEAR_INT_IFNAME_LEN	IFNAMSIZ

struct gear_int_flow {
	__be32 saddr, daddr;
	__be16 sport, dport;
	u64 head;			/* records written; record i is at ring[i % GEAR_INT_RING] */
	u64 last_ns;			/* when the flow was last seen: the slot to reuse is the oldest */
	struct gear_int_record ring[GEAR_INT_RING];
};

static struct gear_int_flow *gear_int_flows;	/* vmalloc'd: GEAR_INT_FLOWS slots */
static DEFINE_SPINLOCK(gear_int_lock);		/* the flow table, from the tap and readers */
static DEFINE_MUTEX(gear_int_attach_lock);	/* attach/detach */
static u64 gear_int_tx_bytes;			/* bytes the tapped device has transmitted */
static struct packet_type gear_int_tap;
static bool gear_int_attached;
static char gear_int_ifname[GEAR_INT_IFNAME_LEN];

static unsigned int gear_int_rate_mbit = 100;
module_param_named(rate_mbit, gear_int_rate_mbit, uint, 0644);
MODULE_PARM_DESC(rate_mbit, "the tapped link's line rate bw (Mbit/s), reported with each record");

static unsigned long gear_int_records;
module_param_named(records, gear_int_records, ulong, 0444);
MODULE_PARM_DESC(records, "TCP data segments recorded since load (read-only)");

static u32 gear_int_hash(__be32 saddr, __be32 daddr, __be16 sport, __be16 dport)
{
	return jhash_3words((__force u32)saddr, (__force u32)daddr,
			    (__force u32)sport << 16 | (__force u32)dport, 0) % GEAR_INT_FLOWS;
}

static bool gear_int_is(const struct gear_int_flow *f, __be32 saddr, __be32 daddr,
			__be16 sport, __be16 dport)
{
	return f->head && f->saddr == saddr && f->daddr == daddr &&
	       f->sport == sport && f->dport == dport;
}

/* The flow's slot: linear probing from its hash; NULL if it has none. Under gear_int_lock. */
static struct gear_int_flow *gear_int_find(__be32 saddr, __be32 daddr, __be16 sport,
					   __be16 dport)
{
	u32 h = gear_int_hash(saddr, daddr, sport, dport), i;

	for (i = 0; i < GEAR_INT_FLOWS; i++) {
		struct gear_int_flow *f = &gear_int_flows[(h + i) % GEAR_INT_FLOWS];

		if (gear_int_is(f, saddr, daddr, sport, dport))
			return f;
	}
	return NULL;
}

/* A slot for a new flow: an empty one, else the least recently seen. Under gear_int_lock. */
static struct gear_int_flow *gear_int_claim(__be32 saddr, __be32 daddr, __be16 sport,
					    __be16 dport)
{
	struct gear_int_flow *oldest = NULL;
	u32 i;

	for (i = 0; i < GEAR_INT_FLOWS; i++) {
		struct gear_int_flow *f = &gear_int_flows[i];

		if (!f->head) {
			oldest = f;
			break;
		}
		if (!oldest || f->last_ns < oldest->last_ns)
			oldest = f;
	}
	oldest->saddr = saddr;
	oldest->daddr = daddr;
	oldest->sport = sport;
	oldest->dport = dport;
	oldest->head = 0;
	return oldest;
}

/* Queue depth behind the departing packet: the root qdisc's backlog (tbf counts its child's). */
static void gear_int_queue(const struct net_device *dev, struct gear_int_record *r)
{
	const struct Qdisc *q = rcu_dereference_bh(dev->qdisc);

	r->qlen_pkts = q ? READ_ONCE(q->q.qlen) : 0;
	r->qlen_bytes = q ? READ_ONCE(q->qstats.backlog) : 0;
}

static int gear_int_rcv(struct sk_buff *skb, struct net_device *dev, struct packet_type *pt,
			struct net_device *orig_dev)
{
	struct gear_int_record r = {};
	struct gear_int_flow *f;
	struct tcphdr _th;
	const struct tcphdr *th;
	struct iphdr _iph;
	const struct iphdr *iph;
	u32 payload;

	if (skb->pkt_type != PACKET_OUTGOING)	/* the tap also sees what the device receives */
		goto out;
	gear_int_tx_bytes += skb->len;		/* every departing byte, as a port's tx counter */
	if (skb->protocol != htons(ETH_P_IP))
		goto out;
	iph = skb_header_pointer(skb, skb_network_offset(skb), sizeof(_iph), &_iph);
	if (!iph || iph->protocol != IPPROTO_TCP || iph->ihl < 5)
		goto out;
	th = skb_header_pointer(skb, skb_network_offset(skb) + iph->ihl * 4, sizeof(_th), &_th);
	if (!th)
		goto out;
	payload = ntohs(iph->tot_len) - iph->ihl * 4 - th->doff * 4;
	if (!payload)				/* a pure ACK: nothing a sender's ACK would cover */
		goto out;

	r.end_seq = ntohl(th->seq) + payload;
	r.tx_bytes = gear_int_tx_bytes;
	r.ts_ns = ktime_get_ns();
	r.rate_mbit = READ_ONCE(gear_int_rate_mbit);
	gear_int_queue(dev, &r);

	spin_lock_bh(&gear_int_lock);
	f = gear_int_find(iph->saddr, iph->daddr, th->source, th->dest);
	if (!f)
		f = gear_int_claim(iph->saddr, iph->daddr, th->source, th->dest);
	f->ring[f->head % GEAR_INT_RING] = r;
	f->head++;
	f->last_ns = r.ts_ns;
	gear_int_records++;
	spin_unlock_bh(&gear_int_lock);
out:
	kfree_skb(skb);
	return 0;
}

/*
 * The record of the highest segment an ACK of @ack covers, for the sender's flow @sk (its
 * local address and port are the data's source). Records are read in transmission order from
 * @c, the caller's cursor; a retransmission is a later record with an earlier end sequence, so
 * the newest record at or below @ack wins. -ENOENT: none for this flow (not through the tap)
 * or none at or below @ack still in the ring.
 */
int gear_int_read(const struct sock *sk, u32 ack, struct gear_int_cursor *c,
		  struct gear_int_record *out)
{
	const struct inet_sock *inet = inet_sk(sk);
	struct gear_int_flow *f;
	bool found = false;

	spin_lock_bh(&gear_int_lock);
	f = gear_int_find(inet->inet_saddr, inet->inet_daddr, inet->inet_sport,
			  inet->inet_dport);
	if (!f)
		goto unlock;
	if (c->next + GEAR_INT_RING < f->head || c->next > f->head)
		c->next = f->head > GEAR_INT_RING ? f->head - GEAR_INT_RING : 0;
	while (c->next < f->head) {
		const struct gear_int_record *r = &f->ring[c->next % GEAR_INT_RING];

		if (after(r->end_seq, ack))
			break;
		*out = *r;
		found = true;
		c->next++;
	}
unlock:
	spin_unlock_bh(&gear_int_lock);
	return found ? 0 : -ENOENT;
}
EXPORT_SYMBOL_GPL(gear_int_read);

/* Under gear_int_attach_lock. */
static void gear_int_detach(void)
{
	if (!gear_int_attached)
		return;
	dev_remove_pack(&gear_int_tap);		/* waits for the taps in flight */
	dev_put(gear_int_tap.dev);
	gear_int_tap.dev = NULL;
	gear_int_attached = false;
	gear_int_ifname[0] = '\0';
}

/* Under gear_int_attach_lock: tap @name in the writer's own network namespace. */
static int gear_int_attach(const char *name)
{
	struct net_device *dev;

	dev = dev_get_by_name(current->nsproxy->net_ns, name);
	if (!dev)
		return -ENODEV;
	spin_lock_bh(&gear_int_lock);
	memset(gear_int_flows, 0, sizeof(*gear_int_flows) * GEAR_INT_FLOWS);
	gear_int_tx_bytes = 0;
	spin_unlock_bh(&gear_int_lock);
	gear_int_tap.type = htons(ETH_P_ALL);
	gear_int_tap.func = gear_int_rcv;
	gear_int_tap.dev = dev;
	dev_add_pack(&gear_int_tap);
	gear_int_attached = true;
	strscpy(gear_int_ifname, name, sizeof(gear_int_ifname));
	return 0;
}

static int gear_int_dev_set(const char *val, const struct kernel_param *kp)
{
	char name[GEAR_INT_IFNAME_LEN];
	int err = 0;

	if (strscpy(name, val, sizeof(name)) < 0)
		return -EINVAL;
	strim(name);
	mutex_lock(&gear_int_attach_lock);
	gear_int_detach();
	if (name[0])
		err = gear_int_attach(name);
	mutex_unlock(&gear_int_attach_lock);
	return err;
}

static int gear_int_dev_get(char *buffer, const struct kernel_param *kp)
{
	return scnprintf(buffer, PAGE_SIZE, "%s\n", gear_int_ifname);
}

static const struct kernel_param_ops gear_int_dev_ops = {
	.set = gear_int_dev_set,
	.get = gear_int_dev_get,
};
module_param_cb(dev, &gear_int_dev_ops, NULL, 0644);
MODULE_PARM_DESC(dev, "the bottleneck's egress device, named from its own network namespace");

/* The tapped device going away (its namespace deleted) detaches the tap first. */
static int gear_int_netdev_event(struct notifier_block *nb, unsigned long event, void *ptr)
{
	struct net_device *dev = netdev_notifier_info_to_dev(ptr);

	if (event != NETDEV_UNREGISTER)
		return NOTIFY_DONE;
	mutex_lock(&gear_int_attach_lock);
	if (gear_int_attached && gear_int_tap.dev == dev)
		gear_int_detach();
	mutex_unlock(&gear_int_attach_lock);
	return NOTIFY_DONE;
}

static struct notifier_block gear_int_notifier = {
	.notifier_call = gear_int_netdev_event,
};

static int __init gear_int_init(void)
{
	int err;

	gear_int_flows = vzalloc(sizeof(*gear_int_flows) * GEAR_INT_FLOWS);
	if (!gear_int_flows)
		return -ENOMEM;
	err = register_netdevice_notifier(&gear_int_notifier);
	if (err)
		vfree(gear_int_flows);
	return err;
}

static void __exit gear_int_exit(void)
{
	unregister_netdevice_notifier(&gear_int_notifier);
	mutex_lock(&gear_int_attach_lock);
	gear_int_detach();
	mutex_unlock(&gear_int_attach_lock);
	vfree(gear_int_flows);
}

module_init(gear_int_init);
module_exit(gear_int_exit);

MODULE_AUTHOR("Gemini");
MODULE_LICENSE("GPL");
MODULE_DESCRIPTION("Gear's INT switch in the lab: per-segment egress queue, tx bytes, time");
MODULE_VERSION("0.1.0");
