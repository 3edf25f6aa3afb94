// SPDX-License-Identifier: GPL-2.0
/*
 * A module's generic netlink family (CC_TABLE_GENL_NAME: "fusion" for tcp_fusion, ABI in
 * fusion_uapi.h): installing the destination table of θ profiles, reading it and the counters
 * back, and multicasting one record per finished flow on the family's "flows" group. Every
 * module's family speaks the same ABI; only θ's length (CC_TABLE_NPARAMS) differs.
 *
 * A table write is validated as a whole before anything changes: every θ inside region Θ',
 * every prefix well formed (length within the family, no host bits) and given once, every rule
 * naming a profile of the same message, and no more than FUSION_MAX_PROFILES / FUSION_MAX_RULES.
 * The first fault is returned as an extack message naming it; the installed table is untouched.
 * The table's longest-prefix-match trie (fusion_lpm.c) is built here, once, in the same
 * allocation as the rules, before the table is published.
 *
 * Only a listener with CAP_NET_ADMIN may join the "flows" group (records carry addresses).
 * Records are sent from softirq context with GFP_ATOMIC. When a listener's receive buffer is
 * full the kernel cannot wait: the record is counted in "dropped" (and the listener's socket
 * sees ENOBUFS), never silently lost.
 */
#include <linux/inetdevice.h>
#include <linux/overflow.h>
#include <net/genetlink.h>
#include <net/ipv6.h>
#include <net/tcp.h>

#include "cc_table.h"

static const struct nla_policy fusion_profile_policy[FUSION_PROFILE_ATTR_MAX + 1] = {
	[FUSION_PROFILE_ATTR_ID] = { .type = NLA_U32 },
	[FUSION_PROFILE_ATTR_THETA] = NLA_POLICY_EXACT_LEN(CC_TABLE_NPARAMS * sizeof(u32)),
};

static const struct nla_policy fusion_rule_policy[FUSION_RULE_ATTR_MAX + 1] = {
	[FUSION_RULE_ATTR_FAMILY] = { .type = NLA_U8 },
	[FUSION_RULE_ATTR_ADDR] = { .type = NLA_BINARY, .len = sizeof(struct in6_addr) },
	[FUSION_RULE_ATTR_PREFIX_LEN] = { .type = NLA_U8 },
	[FUSION_RULE_ATTR_PROFILE_ID] = { .type = NLA_U32 },
};

static const struct nla_policy fusion_policy[FUSION_ATTR_MAX + 1] = {
	[FUSION_ATTR_PROFILE] = NLA_POLICY_NESTED(fusion_profile_policy),
	[FUSION_ATTR_RULE] = NLA_POLICY_NESTED(fusion_rule_policy),
};

static struct genl_family fusion_family;

/* ---- installing a table ------------------------------------------------------------- */

static int fusion_parse_profile(const struct nlattr *nla, struct fusion_table *t,
				struct netlink_ext_ack *extack)
{
	struct nlattr *tb[FUSION_PROFILE_ATTR_MAX + 1];
	struct fusion_profile *p;
	u32 i, id;
	int err;

	err = nla_parse_nested(tb, FUSION_PROFILE_ATTR_MAX, nla, fusion_profile_policy, extack);
	if (err)
		return err;
	if (!tb[FUSION_PROFILE_ATTR_ID] || !tb[FUSION_PROFILE_ATTR_THETA]) {
		NL_SET_ERR_MSG(extack, "profile needs an id and a theta");
		return -EINVAL;
	}
	id = nla_get_u32(tb[FUSION_PROFILE_ATTR_ID]);
	if (id == FUSION_DEFAULT_PROFILE) {
		NL_SET_ERR_MSG(extack, "profile id 0 is the sysctl default; use ids > 0");
		return -EINVAL;
	}
	for (i = 0; i < t->n_profiles; i++) {
		if (t->profiles[i].id == id) {
			NL_SET_ERR_MSG(extack, "profile id given twice");
			return -EINVAL;
		}
	}
	if (t->n_profiles == FUSION_MAX_PROFILES) {
		NL_SET_ERR_MSG(extack, "more profiles than FUSION_MAX_PROFILES");
		return -E2BIG;
	}
	p = &t->profiles[t->n_profiles];
	p->id = id;
	nla_memcpy(p->theta, tb[FUSION_PROFILE_ATTR_THETA], sizeof(p->theta));
	err = fusion_theta_check(p->theta);
	if (err >= 0) {
		if (extack)
			extack->_msg = fusion_theta_range_errors[err];
		return -EINVAL;
	}
	t->n_profiles++;
	return 0;
}

static int fusion_profile_index(const struct fusion_table *t, u32 id)
{
	u32 i;

	for (i = 0; i < t->n_profiles; i++)
		if (t->profiles[i].id == id)
			return i;
	return -1;
}

static int fusion_check_prefix(struct fusion_rule *r, u32 addr_len,
			       struct netlink_ext_ack *extack)
{
	if (r->family == AF_INET && addr_len == sizeof(__be32)) {
		if (r->prefix_len > 32)
			goto bad_len;
		if (r->addr.a4 & ~inet_make_mask(r->prefix_len))
			goto host_bits;
		return 0;
	}
	if (r->family == AF_INET6 && addr_len == sizeof(struct in6_addr)) {
		struct in6_addr masked;

		if (r->prefix_len > 128)
			goto bad_len;
		ipv6_addr_prefix(&masked, &r->addr.a6, r->prefix_len);
		if (!ipv6_addr_equal(&masked, &r->addr.a6))
			goto host_bits;
		return 0;
	}
	NL_SET_ERR_MSG(extack, "rule family must be AF_INET (4-byte addr) or AF_INET6 (16-byte)");
	return -EINVAL;
bad_len:
	NL_SET_ERR_MSG(extack, "rule prefix_len longer than the address");
	return -EINVAL;
host_bits:
	NL_SET_ERR_MSG(extack, "rule address has bits set beyond prefix_len");
	return -EINVAL;
}

static int fusion_parse_rule(const struct nlattr *nla, struct fusion_table *t,
			     struct fusion_rule *r, struct netlink_ext_ack *extack)
{
	struct nlattr *tb[FUSION_RULE_ATTR_MAX + 1];
	int err, idx;

	err = nla_parse_nested(tb, FUSION_RULE_ATTR_MAX, nla, fusion_rule_policy, extack);
	if (err)
		return err;
	if (!tb[FUSION_RULE_ATTR_FAMILY] || !tb[FUSION_RULE_ATTR_ADDR] ||
	    !tb[FUSION_RULE_ATTR_PREFIX_LEN] || !tb[FUSION_RULE_ATTR_PROFILE_ID]) {
		NL_SET_ERR_MSG(extack, "rule needs family, addr, prefix_len and profile_id");
		return -EINVAL;
	}
	memset(r, 0, sizeof(*r));
	r->family = nla_get_u8(tb[FUSION_RULE_ATTR_FAMILY]);
	r->prefix_len = nla_get_u8(tb[FUSION_RULE_ATTR_PREFIX_LEN]);
	nla_memcpy(&r->addr, tb[FUSION_RULE_ATTR_ADDR], sizeof(r->addr));
	err = fusion_check_prefix(r, nla_len(tb[FUSION_RULE_ATTR_ADDR]), extack);
	if (err)
		return err;
	idx = fusion_profile_index(t, nla_get_u32(tb[FUSION_RULE_ATTR_PROFILE_ID]));
	if (idx < 0) {
		NL_SET_ERR_MSG(extack, "rule names a profile id not in this message");
		return -EINVAL;
	}
	r->profile_idx = idx;
	return 0;
}

/* Index every rule in the table's trie; a prefix given twice is refused. */
static int fusion_index_rules(struct fusion_table *t, struct netlink_ext_ack *extack)
{
	u32 key[FUSION_LPM_KEY_WORDS];
	u32 i;
	int err;

	for (i = 0; i < t->n_rules; i++) {
		const struct fusion_rule *r = &t->rules[i];

		fusion_lpm_key_of(r->family, &r->addr, key);
		err = fusion_lpm_insert(&t->lpm,
					r->family == AF_INET6 ? FUSION_LPM_INET6 : FUSION_LPM_INET,
					key, r->prefix_len, r->profile_idx);
		if (err == -EEXIST) {
			NL_SET_ERR_MSG(extack, "rule prefix given twice");
			return -EINVAL;
		}
		if (err)
			return err;
	}
	return 0;
}

/* The table and its trie's nodes, in one allocation: freed together, never resized. */
static struct fusion_table *fusion_alloc_table(u32 n_rules)
{
	u32 max_nodes = fusion_lpm_nodes_for(n_rules);
	struct fusion_table *t;
	size_t rules_size = struct_size(t, rules, n_rules);

	t = kvzalloc(size_add(rules_size, array_size(max_nodes, sizeof(struct fusion_lpm_node))),
		     GFP_KERNEL);
	if (t)
		fusion_lpm_init(&t->lpm, (struct fusion_lpm_node *)((u8 *)t + rules_size),
				max_nodes);
	return t;
}

/* Count the rules, so the table is allocated once and never grows while parsing. */
static int fusion_count_rules(struct genl_info *info, struct netlink_ext_ack *extack)
{
	const struct nlattr *nla;
	int rem, n = 0;

	nlmsg_for_each_attr(nla, info->nlhdr, GENL_HDRLEN, rem)
		if (nla_type(nla) == FUSION_ATTR_RULE)
			n++;
	if (n > FUSION_MAX_RULES) {
		NL_SET_ERR_MSG(extack, "more rules than FUSION_MAX_RULES");
		return -E2BIG;
	}
	return n;
}

static struct fusion_table *fusion_parse_table(struct genl_info *info)
{
	struct netlink_ext_ack *extack = info->extack;
	struct fusion_table *t;
	const struct nlattr *nla;
	int rem, n_rules, err = 0;

	n_rules = fusion_count_rules(info, extack);
	if (n_rules < 0)
		return ERR_PTR(n_rules);
	t = fusion_alloc_table(n_rules);
	if (!t)
		return ERR_PTR(-ENOMEM);
	/* profiles first, so rules may come in any order relative to them */
	nlmsg_for_each_attr(nla, info->nlhdr, GENL_HDRLEN, rem) {
		if (nla_type(nla) == FUSION_ATTR_PROFILE)
			err = fusion_parse_profile(nla, t, extack);
		if (err)
			goto fail;
	}
	nlmsg_for_each_attr(nla, info->nlhdr, GENL_HDRLEN, rem) {
		if (nla_type(nla) == FUSION_ATTR_RULE)
			err = fusion_parse_rule(nla, t, &t->rules[t->n_rules++], extack);
		if (err)
			goto fail;
	}
	err = fusion_index_rules(t, extack);
	if (err)
		goto fail;
	return t;
fail:
	kvfree(t);
	return ERR_PTR(err);
}

static int fusion_reply_version(struct genl_info *info, u32 version)
{
	struct sk_buff *msg;
	void *hdr;

	msg = genlmsg_new(nla_total_size(sizeof(u32)), GFP_KERNEL);
	if (!msg)
		return -ENOMEM;
	hdr = genlmsg_put_reply(msg, info, &fusion_family, 0, info->genlhdr->cmd);
	if (!hdr || nla_put_u32(msg, FUSION_ATTR_VERSION, version)) {
		nlmsg_free(msg);
		return -EMSGSIZE;
	}
	genlmsg_end(msg, hdr);
	return genlmsg_reply(msg, info);
}

static void fusion_table_free_rcu(struct rcu_head *head)
{
	kvfree(container_of(head, struct fusion_table, rcu));
}

static int fusion_set_profiles(struct sk_buff *skb, struct genl_info *info)
{
	struct fusion_net *fn = fusion_pernet(genl_info_net(info));
	struct fusion_table *t, *old;
	u32 i, version;

	t = fusion_parse_table(info);
	if (IS_ERR(t))
		return PTR_ERR(t);
	mutex_lock(&fn->lock);
	version = fusion_next_version(fn);
	t->version = version;
	for (i = 0; i < t->n_profiles; i++)
		t->profiles[i].version = version;
	old = rcu_dereference_protected(fn->table, lockdep_is_held(&fn->lock));
	rcu_assign_pointer(fn->table, t);
	mutex_unlock(&fn->lock);
	if (old)
		call_rcu(&old->rcu, fusion_table_free_rcu);
	return fusion_reply_version(info, version);
}

/* ---- reading the table and the counters back ---------------------------------------- */

static int fusion_put_profile(struct sk_buff *msg, const struct fusion_profile *p)
{
	struct nlattr *nest = nla_nest_start(msg, FUSION_ATTR_PROFILE);

	if (!nest || nla_put_u32(msg, FUSION_PROFILE_ATTR_ID, p->id) ||
	    nla_put(msg, FUSION_PROFILE_ATTR_THETA, sizeof(p->theta), p->theta))
		return -EMSGSIZE;
	nla_nest_end(msg, nest);
	return 0;
}

static int fusion_put_rule(struct sk_buff *msg, const struct fusion_table *t,
			   const struct fusion_rule *r)
{
	struct nlattr *nest = nla_nest_start(msg, FUSION_ATTR_RULE);
	int len = r->family == AF_INET ? sizeof(__be32) : sizeof(struct in6_addr);

	if (!nest || nla_put_u8(msg, FUSION_RULE_ATTR_FAMILY, r->family) ||
	    nla_put(msg, FUSION_RULE_ATTR_ADDR, len, &r->addr) ||
	    nla_put_u8(msg, FUSION_RULE_ATTR_PREFIX_LEN, r->prefix_len) ||
	    nla_put_u32(msg, FUSION_RULE_ATTR_PROFILE_ID, t->profiles[r->profile_idx].id))
		return -EMSGSIZE;
	nla_nest_end(msg, nest);
	return 0;
}

static int fusion_get_profiles(struct sk_buff *skb, struct genl_info *info)
{
	struct fusion_net *fn = fusion_pernet(genl_info_net(info));
	const struct fusion_table *t;
	struct sk_buff *msg;
	int err = 0;
	void *hdr;
	u32 i;

	mutex_lock(&fn->lock);
	t = rcu_dereference_protected(fn->table, lockdep_is_held(&fn->lock));
	msg = genlmsg_new(t ? (t->n_profiles + t->n_rules) * 64 + 64 : NLMSG_GOODSIZE,
			  GFP_KERNEL);
	if (!msg) {
		mutex_unlock(&fn->lock);
		return -ENOMEM;
	}
	hdr = genlmsg_put_reply(msg, info, &fusion_family, 0, FUSION_CMD_GET_PROFILES);
	if (!hdr || nla_put_u32(msg, FUSION_ATTR_VERSION, t ? t->version : 0))
		err = -EMSGSIZE;
	for (i = 0; !err && t && i < t->n_profiles; i++)
		err = fusion_put_profile(msg, &t->profiles[i]);
	for (i = 0; !err && t && i < t->n_rules; i++)
		err = fusion_put_rule(msg, t, &t->rules[i]);
	mutex_unlock(&fn->lock);
	if (err) {
		nlmsg_free(msg);
		return err;
	}
	genlmsg_end(msg, hdr);
	return genlmsg_reply(msg, info);
}

static int fusion_get_stats(struct sk_buff *skb, struct genl_info *info)
{
	struct fusion_net *fn = fusion_pernet(genl_info_net(info));
	struct sk_buff *msg;
	void *hdr;

	msg = genlmsg_new(NLMSG_GOODSIZE, GFP_KERNEL);
	if (!msg)
		return -ENOMEM;
	hdr = genlmsg_put_reply(msg, info, &fusion_family, 0, FUSION_CMD_GET_STATS);
	if (!hdr ||
	    nla_put_u32(msg, FUSION_ATTR_VERSION, READ_ONCE(fn->version)) ||
	    nla_put_u64_64bit(msg, FUSION_ATTR_STAT_FLOWS, atomic64_read(&fn->flows),
			      FUSION_ATTR_PAD) ||
	    nla_put_u64_64bit(msg, FUSION_ATTR_STAT_RECORDS, atomic64_read(&fn->records),
			      FUSION_ATTR_PAD) ||
	    nla_put_u64_64bit(msg, FUSION_ATTR_STAT_DROPPED, atomic64_read(&fn->dropped),
			      FUSION_ATTR_PAD) ||
	    nla_put_u64_64bit(msg, FUSION_ATTR_STAT_UNHEARD, atomic64_read(&fn->unheard),
			      FUSION_ATTR_PAD) ||
	    nla_put_u64_64bit(msg, FUSION_ATTR_STAT_NOSTATE, atomic64_read(&fn->nostate),
			      FUSION_ATTR_PAD)) {
		nlmsg_free(msg);
		return -EMSGSIZE;
	}
	genlmsg_end(msg, hdr);
	return genlmsg_reply(msg, info);
}

/* ---- flow records -------------------------------------------------------------------- */

static size_t fusion_record_size(void)
{
	return nla_total_size(sizeof(u8)) +			/* family */
	       2 * nla_total_size(sizeof(struct in6_addr)) +	/* addresses */
	       2 * nla_total_size(sizeof(u16)) +		/* ports */
	       2 * nla_total_size_64bit(sizeof(u64)) +		/* bytes, duration */
	       6 * nla_total_size(sizeof(u32)) +
	       nla_total_size(CC_TABLE_NPARAMS * sizeof(u32));
}

void fusion_endpoints_of(const struct sock *sk, struct fusion_endpoints *ends)
{
	const struct inet_sock *inet = inet_sk(sk);

	ends->sport = inet->inet_sport;
	ends->dport = inet->inet_dport;
#if IS_ENABLED(CONFIG_IPV6)
	if (sk->sk_family == AF_INET6 && !ipv6_addr_v4mapped(&sk->sk_v6_daddr)) {
		ends->family = AF_INET6;
		ends->saddr.a6 = sk->sk_v6_rcv_saddr;
		ends->daddr.a6 = sk->sk_v6_daddr;
		return;
	}
#endif
	ends->family = AF_INET;
	ends->saddr.a4 = inet->inet_saddr;
	ends->daddr.a4 = sk->sk_daddr;
}

static int fusion_put_endpoints(struct sk_buff *msg, const struct fusion_endpoints *ends)
{
	int err;

	if (ends->family == AF_INET6)
		err = nla_put_u8(msg, FUSION_ATTR_REC_FAMILY, AF_INET6) ||
		      nla_put_in6_addr(msg, FUSION_ATTR_REC_SADDR, &ends->saddr.a6) ||
		      nla_put_in6_addr(msg, FUSION_ATTR_REC_DADDR, &ends->daddr.a6);
	else
		err = nla_put_u8(msg, FUSION_ATTR_REC_FAMILY, AF_INET) ||
		      nla_put_in_addr(msg, FUSION_ATTR_REC_SADDR, ends->saddr.a4) ||
		      nla_put_in_addr(msg, FUSION_ATTR_REC_DADDR, ends->daddr.a4);
	return err ||
	       nla_put_u16(msg, FUSION_ATTR_REC_SPORT, ntohs(ends->sport)) ||
	       nla_put_u16(msg, FUSION_ATTR_REC_DPORT, ntohs(ends->dport));
}

static int fusion_put_record(struct sk_buff *msg, const struct fusion_record *rec)
{
	return fusion_put_endpoints(msg, &rec->ends) ||
	       nla_put_u64_64bit(msg, FUSION_ATTR_REC_BYTES_ACKED, rec->bytes_acked,
				 FUSION_ATTR_PAD) ||
	       nla_put_u64_64bit(msg, FUSION_ATTR_REC_DURATION_US, rec->duration_us,
				 FUSION_ATTR_PAD) ||
	       nla_put_u32(msg, FUSION_ATTR_REC_RTT_AVG_US, rec->rtt_avg_us) ||
	       nla_put_u32(msg, FUSION_ATTR_REC_RTT_MIN_US, rec->rtt_min_us) ||
	       nla_put_u32(msg, FUSION_ATTR_REC_RETRANS, rec->retrans) ||
	       nla_put_u32(msg, FUSION_ATTR_REC_SEGS_OUT, rec->segs_out) ||
	       nla_put_u32(msg, FUSION_ATTR_REC_PROFILE_ID, rec->profile_id) ||
	       nla_put_u32(msg, FUSION_ATTR_REC_PROFILE_VERSION, rec->profile_version) ||
	       nla_put(msg, FUSION_ATTR_REC_THETA, sizeof(rec->theta), rec->theta);
}

void fusion_record_emit(struct sock *sk, const struct fusion_record *rec)
{
	struct net *net = sock_net(sk);
	struct fusion_net *fn = fusion_pernet(net);
	struct sk_buff *msg;
	void *hdr;
	int err;

	if (!genl_has_listeners(&fusion_family, net, 0)) {
		atomic64_inc(&fn->unheard);
		return;
	}
	msg = genlmsg_new(fusion_record_size(), GFP_ATOMIC);
	if (!msg)
		goto drop;
	hdr = genlmsg_put(msg, 0, 0, &fusion_family, 0, FUSION_CMD_FLOW_RECORD);
	if (!hdr || fusion_put_record(msg, rec)) {
		nlmsg_free(msg);
		goto drop;
	}
	genlmsg_end(msg, hdr);
	err = genlmsg_multicast_netns(&fusion_family, net, msg, 0, 0, GFP_ATOMIC);
	if (err == -ESRCH) {
		atomic64_inc(&fn->unheard);
		return;
	}
	if (err)
		goto drop;
	atomic64_inc(&fn->records);
	return;
drop:
	atomic64_inc(&fn->dropped);
}

/* ---- the family ------------------------------------------------------------------------ */

static const struct genl_small_ops fusion_ops[] = {
	{
		.cmd = FUSION_CMD_SET_PROFILES,
		.doit = fusion_set_profiles,
		.flags = GENL_UNS_ADMIN_PERM,
	},
	{
		.cmd = FUSION_CMD_GET_PROFILES,
		.doit = fusion_get_profiles,
	},
	{
		.cmd = FUSION_CMD_GET_STATS,
		.doit = fusion_get_stats,
	},
};

/*
 * A record names both ends of a connection and what it carried, so only a listener with
 * CAP_NET_ADMIN over the namespace (the agent) may join the group, as for writing the table.
 * The flag came to 6.1 and 6.6 through the stable series; a kernel without it lets any local
 * user listen, and this build says so.
 */
#ifdef GENL_MCAST_CAP_NET_ADMIN
#define FUSION_MCGRP_FLOWS_FLAGS GENL_MCAST_CAP_NET_ADMIN
#else
#warning "genetlink without GENL_MCAST_CAP_NET_ADMIN: any local user can read flow records"
#define FUSION_MCGRP_FLOWS_FLAGS 0
#endif

static const struct genl_multicast_group fusion_mcgrps[] = {
	{ .name = FUSION_MCGRP_FLOWS, .flags = FUSION_MCGRP_FLOWS_FLAGS },
};

static struct genl_family fusion_family __ro_after_init = {
	.name = CC_TABLE_GENL_NAME,
	.version = FUSION_GENL_VERSION,
	.maxattr = FUSION_ATTR_MAX,
	.policy = fusion_policy,
	.netnsok = true,
	.module = THIS_MODULE,
	.small_ops = fusion_ops,
	.n_small_ops = ARRAY_SIZE(fusion_ops),
	.resv_start_op = FUSION_CMD_SET_PROFILES,
	.mcgrps = fusion_mcgrps,
	.n_mcgrps = ARRAY_SIZE(fusion_mcgrps),
};

int fusion_netlink_init(void)
{
	return genl_register_family(&fusion_family);
}

void fusion_netlink_exit(void)
{
	genl_unregister_family(&fusion_family);
}
