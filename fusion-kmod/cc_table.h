/* SPDX-License-Identifier: GPL-2.0 */
/*
 * The θ table one congestion-control module carries: θ per network namespace behind the
 * net.<datapath>.* sysctls, a per-destination table of θ profiles matched by longest prefix
 * (installed over the module's own generic netlink family, ABI in fusion_uapi.h), and one
 * record per finished flow with the θ it ran. Fusion wrote it first, hence the fusion_ names;
 * tcp_fusion, tcp_gemini and tcp_dcvegas each carry the same code.
 *
 * Why each module carries its own copy of the object rather than sharing one: a module
 * loaded with insmod (as the lab does) cannot pull in a core module it depends on, and kbuild
 * compiles an object once, for one module (6.12 warns "is added to multiple modules"). So the
 * code is one source, generic over θ's length, and each module compiles it once in its
 * <datapath>_table.c, after the header that says which θ it is:
 *
 *   CC_TABLE_NPARAMS             θ's length
 *   CC_TABLE_THETA_MIN/MAX       region Θ' (initialisers, from the generated <datapath>_theta.h)
 *   CC_TABLE_THETA_NAMES         the sysctls' names
 *   CC_TABLE_THETA_RANGE_ERRORS  one extack message per parameter
 *   CC_TABLE_GENL_NAME           the generic netlink family (multicast group "flows" in it)
 *   CC_TABLE_SYSCTL_DIR          "net/<datapath>"
 */
#ifndef _CC_TABLE_H
#define _CC_TABLE_H

#if !defined(CC_TABLE_NPARAMS) || !defined(CC_TABLE_GENL_NAME) || !defined(CC_TABLE_SYSCTL_DIR)
#error "include the datapath's table header (fusion.h, gemini_table.h, ...) instead"
#endif

#include <linux/in6.h>
#include <linux/mutex.h>
#include <linux/rcupdate.h>
#include <linux/types.h>
#include <net/net_namespace.h>
#include <net/sock.h>
#include <net/tcp.h>

#include "fusion_lpm.h"
#include "fusion_uapi.h"

/* One θ profile: the parameters in spec units, and the version it was installed under. */
struct fusion_profile {
	u32 id;
	u32 version;
	u32 theta[CC_TABLE_NPARAMS];
};

struct fusion_rule {
	u8 family;
	u8 prefix_len;
	u16 profile_idx;		/* index into fusion_table.profiles */
	union {
		__be32 a4;
		struct in6_addr a6;
	} addr;
};

/* The destination table; replaced as a whole under RCU, so a flow never sees half of one. */
struct fusion_table {
	struct rcu_head rcu;
	u32 version;
	u32 n_profiles;
	u32 n_rules;
	struct fusion_profile profiles[FUSION_MAX_PROFILES];
	struct fusion_lpm lpm;		/* rules by longest prefix; its nodes follow rules[] */
	struct fusion_rule rules[];	/* as installed */
};

/*
 * A namespace's default profile (id 0), for destinations no rule matches. Until one of the
 * namespace's net.<datapath>.* sysctls is written it follows the host's θ, read when each flow
 * starts (cc_table_host_theta(): the spec's defaults for tcp_fusion, the module parameters for
 * tcp_gemini and tcp_dcvegas); the first write makes it the namespace's own.
 */
struct fusion_default {
	struct fusion_profile profile;
	bool own;			/* set through this namespace's sysctls */
};

struct fusion_net {
	struct mutex lock;		/* serialises writers of dflt, table and version */
	u32 version;			/* bumped by every θ change in this namespace */
	struct fusion_default __rcu *dflt;
	struct fusion_table __rcu *table;
	int sysctl_theta[CC_TABLE_NPARAMS];	/* each sysctl's data: its handler finds fn and
						 * the parameter from it; the value written last */
	int sysctl_version;
	struct ctl_table *sysctl_tbl;
	struct ctl_table_header *sysctl_hdr;
	atomic64_t flows;
	atomic64_t records;
	atomic64_t dropped;
	atomic64_t unheard;
	atomic64_t nostate;
};

/*
 * A flow's addresses and ports, taken when it starts: an abortive close (RST, SO_LINGER 0)
 * runs tcp_disconnect(), which clears the destination port and an unbound source address
 * before the congestion control is released, so the socket no longer knows them by then.
 */
struct fusion_endpoints {
	u8 family;
	__be16 sport;
	__be16 dport;
	union {
		__be32 a4;
		struct in6_addr a6;
	} saddr, daddr;
};

/* What a finished flow reports. */
struct fusion_record {
	struct fusion_endpoints ends;
	u64 bytes_acked;
	u64 duration_us;
	u32 rtt_avg_us;
	u32 rtt_min_us;
	u32 retrans;
	u32 segs_out;
	u32 profile_id;
	u32 profile_version;
	u32 theta[CC_TABLE_NPARAMS];
};

/*
 * A flow's θ and its ledger, for a congestion control that keeps no per-flow state of its own
 * outside the socket (tcp_gemini, tcp_dcvegas; cc_flow.c): the profile taken when the flow
 * started, and what its record needs, mirrored per ACK since an abortive close zeroes the
 * socket's counters before the flow is released.
 */
struct cc_flow {
	struct fusion_profile theta;
	struct fusion_endpoints ends;
	u64 start_us;
	u64 last_ack_us;
	u64 rtt_sum_us;
	u64 bytes_acked;
	u32 rtt_samples;
	u32 rtt_min_us;
	u32 retrans;
	u32 segs_out;
};

/* Each module defines it: the θ a namespace's default profile follows until its own is set. */
void cc_table_host_theta(u32 theta[CC_TABLE_NPARAMS]);

extern const u32 fusion_theta_min[CC_TABLE_NPARAMS];
extern const u32 fusion_theta_max[CC_TABLE_NPARAMS];

struct fusion_net *fusion_pernet(const struct net *net);
void fusion_profile_for(const struct sock *sk, struct fusion_profile *out);
extern const char *const fusion_theta_range_errors[CC_TABLE_NPARAMS];
int fusion_theta_check(const u32 *theta);
u32 fusion_next_version(struct fusion_net *fn);

int fusion_profiles_init(void);
void fusion_profiles_exit(void);

int fusion_netlink_init(void);
void fusion_netlink_exit(void);
void fusion_endpoints_of(const struct sock *sk, struct fusion_endpoints *ends);
void fusion_record_emit(struct sock *sk, const struct fusion_record *rec);

int cc_table_init(struct tcp_congestion_ops *ops);
void cc_table_exit(struct tcp_congestion_ops *ops);
struct cc_flow *cc_flow_start(struct sock *sk);
void cc_flow_ack(struct sock *sk, struct cc_flow *f, const struct ack_sample *sample);
void cc_flow_release(struct sock *sk);

#endif /* _CC_TABLE_H */
