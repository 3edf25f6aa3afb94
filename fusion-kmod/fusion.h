/* SPDX-License-Identifier: GPL-2.0 */
/*
 * Declarations shared by the parts of tcp_fusion: the congestion control (tcp_fusion.c), the
 * per-namespace θ state and its sysctls (fusion_profiles.c), and the generic netlink family
 * that installs profiles and carries flow records (fusion_netlink.c).
 */
#ifndef _FUSION_H
#define _FUSION_H

#include <linux/in6.h>
#include <linux/mutex.h>
#include <linux/rcupdate.h>
#include <linux/types.h>
#include <net/net_namespace.h>
#include <net/sock.h>

#include "fusion_lpm.h"
#include "fusion_theta.h"
#include "fusion_uapi.h"

/* One θ profile: the parameters in spec units, and the version it was installed under. */
struct fusion_profile {
	u32 id;
	u32 version;
	u32 theta[FUSION_THETA_NPARAMS];
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

struct fusion_net {
	struct mutex lock;		/* serialises writers of dflt, table and version */
	u32 version;			/* bumped by every θ change in this namespace */
	struct fusion_profile __rcu *dflt;
	struct fusion_table __rcu *table;
	int sysctl_theta[FUSION_THETA_NPARAMS];	/* what the sysctls read: dflt's θ */
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
	u32 theta[FUSION_THETA_NPARAMS];
};

extern const u32 fusion_theta_min[FUSION_THETA_NPARAMS];
extern const u32 fusion_theta_max[FUSION_THETA_NPARAMS];

struct fusion_net *fusion_pernet(const struct net *net);
void fusion_profile_for(const struct sock *sk, struct fusion_profile *out);
extern const char *const fusion_theta_range_errors[FUSION_THETA_NPARAMS];
int fusion_theta_check(const u32 *theta);
u32 fusion_next_version(struct fusion_net *fn);

int fusion_profiles_init(void);
void fusion_profiles_exit(void);

int fusion_netlink_init(void);
void fusion_netlink_exit(void);
void fusion_endpoints_of(const struct sock *sk, struct fusion_endpoints *ends);
void fusion_record_emit(struct sock *sk, const struct fusion_record *rec);

#endif /* _FUSION_H */
