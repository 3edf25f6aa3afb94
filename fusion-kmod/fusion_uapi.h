/* SPDX-License-Identifier: GPL-2.0 WITH Linux-syscall-note */
/*
 * Fusion's user-space ABI: the generic netlink family "fusion".
 *
 * Commands (all per network namespace):
 *   FUSION_CMD_SET_PROFILES  replace the whole destination table at once (CAP_NET_ADMIN).
 *                            Attributes: any number of FUSION_ATTR_PROFILE and FUSION_ATTR_RULE.
 *                            Reply: FUSION_ATTR_VERSION of the new table.
 *   FUSION_CMD_GET_PROFILES  the installed table, in the same shape, plus its version.
 *   FUSION_CMD_GET_STATS     counters (FUSION_ATTR_STAT_*).
 *   FUSION_CMD_FLOW_RECORD   sent by the kernel on multicast group "flows" when a fusion flow
 *                            ends (FUSION_ATTR_REC_*).
 *
 * A profile is { FUSION_PROFILE_ATTR_ID (u32, > 0), FUSION_PROFILE_ATTR_THETA (binary:
 * FUSION_THETA_NPARAMS native-endian u32 in fusion_theta.h order and units) }.
 * A rule is { FUSION_RULE_ATTR_FAMILY (u8 AF_INET/AF_INET6), FUSION_RULE_ATTR_ADDR (4 or 16
 * bytes, network order, host bits zero), FUSION_RULE_ATTR_PREFIX_LEN (u8),
 * FUSION_RULE_ATTR_PROFILE_ID (u32) }. The longest matching prefix wins; a destination that
 * matches no rule runs the default profile (id 0), which is set through the net.fusion sysctls.
 */
#ifndef _FUSION_UAPI_H
#define _FUSION_UAPI_H

#define FUSION_GENL_NAME	"fusion"
#define FUSION_GENL_VERSION	1
#define FUSION_MCGRP_FLOWS	"flows"

#define FUSION_MAX_PROFILES	64
#define FUSION_MAX_RULES	4096
#define FUSION_DEFAULT_PROFILE	0

enum fusion_cmd {
	FUSION_CMD_UNSPEC,
	FUSION_CMD_SET_PROFILES,
	FUSION_CMD_GET_PROFILES,
	FUSION_CMD_GET_STATS,
	FUSION_CMD_FLOW_RECORD,
	__FUSION_CMD_MAX,
};
#define FUSION_CMD_MAX (__FUSION_CMD_MAX - 1)

enum fusion_attr {
	FUSION_ATTR_UNSPEC,
	FUSION_ATTR_VERSION,		/* u32 */
	FUSION_ATTR_PROFILE,		/* nested fusion_profile_attr */
	FUSION_ATTR_RULE,		/* nested fusion_rule_attr */
	FUSION_ATTR_STAT_FLOWS,		/* u64: flows that ran fusion */
	FUSION_ATTR_STAT_RECORDS,	/* u64: flow records delivered */
	FUSION_ATTR_STAT_DROPPED,	/* u64: records a listener had no room for */
	FUSION_ATTR_STAT_UNHEARD,	/* u64: records sent while nobody listened */
	FUSION_ATTR_STAT_NOSTATE,	/* u64: flows that got no per-flow state (no memory) */
	FUSION_ATTR_REC_FAMILY,		/* u8 */
	FUSION_ATTR_REC_SADDR,		/* 4 or 16 bytes */
	FUSION_ATTR_REC_DADDR,		/* 4 or 16 bytes */
	FUSION_ATTR_REC_SPORT,		/* u16, host order */
	FUSION_ATTR_REC_DPORT,		/* u16, host order */
	FUSION_ATTR_REC_BYTES_ACKED,	/* u64 */
	FUSION_ATTR_REC_DURATION_US,	/* u64: first to last acknowledgement of data */
	FUSION_ATTR_REC_RTT_AVG_US,	/* u32: mean of the flow's RTT samples */
	FUSION_ATTR_REC_RTT_MIN_US,	/* u32 */
	FUSION_ATTR_REC_RETRANS,	/* u32: segments retransmitted */
	FUSION_ATTR_REC_SEGS_OUT,	/* u32 */
	FUSION_ATTR_REC_PROFILE_ID,	/* u32 */
	FUSION_ATTR_REC_PROFILE_VERSION,/* u32 */
	FUSION_ATTR_REC_THETA,		/* binary, as FUSION_PROFILE_ATTR_THETA */
	FUSION_ATTR_PAD,
	__FUSION_ATTR_MAX,
};
#define FUSION_ATTR_MAX (__FUSION_ATTR_MAX - 1)

enum fusion_profile_attr {
	FUSION_PROFILE_ATTR_UNSPEC,
	FUSION_PROFILE_ATTR_ID,
	FUSION_PROFILE_ATTR_THETA,
	__FUSION_PROFILE_ATTR_MAX,
};
#define FUSION_PROFILE_ATTR_MAX (__FUSION_PROFILE_ATTR_MAX - 1)

enum fusion_rule_attr {
	FUSION_RULE_ATTR_UNSPEC,
	FUSION_RULE_ATTR_FAMILY,
	FUSION_RULE_ATTR_ADDR,
	FUSION_RULE_ATTR_PREFIX_LEN,
	FUSION_RULE_ATTR_PROFILE_ID,
	__FUSION_RULE_ATTR_MAX,
};
#define FUSION_RULE_ATTR_MAX (__FUSION_RULE_ATTR_MAX - 1)

#endif /* _FUSION_UAPI_H */
