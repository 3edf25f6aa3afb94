// SPDX-License-Identifier: GPL-2.0
/*
 * θ state per network namespace: the default profile behind the net.<datapath>.* sysctls, the
 * destination table installed over netlink, and the version that changes with every θ change.
 * Generic over θ's length (CC_TABLE_NPARAMS): each module compiles it in its
 * <datapath>_table.c (see cc_table.h).
 *
 * Readers (a flow starting) take one RCU-protected snapshot; writers build a new object, check
 * every parameter against region Θ' first, and publish it with one pointer store. A rejected
 * write therefore changes nothing, and a flow sees either the old θ or the new one, never a mix.
 */
#include <linux/slab.h>
#include <linux/sysctl.h>
#include <linux/version.h>
#include <net/ipv6.h>
#include <net/netns/generic.h>

#include "cc_table.h"

const u32 fusion_theta_min[CC_TABLE_NPARAMS] = CC_TABLE_THETA_MIN;
const u32 fusion_theta_max[CC_TABLE_NPARAMS] = CC_TABLE_THETA_MAX;
static const char *const fusion_theta_names[CC_TABLE_NPARAMS] = CC_TABLE_THETA_NAMES;

/* proc_dointvec_minmax wants int bounds. */
static int fusion_sysctl_min[CC_TABLE_NPARAMS] = CC_TABLE_THETA_MIN;
static int fusion_sysctl_max[CC_TABLE_NPARAMS] = CC_TABLE_THETA_MAX;

static unsigned int fusion_net_id __read_mostly;

struct fusion_net *fusion_pernet(const struct net *net)
{
	return net_generic(net, fusion_net_id);
}

const char *const fusion_theta_range_errors[CC_TABLE_NPARAMS] = CC_TABLE_THETA_RANGE_ERRORS;

/* Index of the first parameter outside region Θ', or -1 when all are inside. */
int fusion_theta_check(const u32 *theta)
{
	int i;

	for (i = 0; i < CC_TABLE_NPARAMS; i++)
		if (theta[i] < fusion_theta_min[i] || theta[i] > fusion_theta_max[i])
			return i;
	return -1;
}

/* Caller holds fn->lock. */
u32 fusion_next_version(struct fusion_net *fn)
{
	fn->version++;
	WRITE_ONCE(fn->sysctl_version, fn->version);
	return fn->version;
}

/* sk's destination as a trie key; an IPv4-mapped IPv6 peer is looked up as IPv4. */
static enum fusion_lpm_family fusion_dest_key(const struct sock *sk,
					      u32 key[FUSION_LPM_KEY_WORDS])
{
#if IS_ENABLED(CONFIG_IPV6)
	if (sk->sk_family == AF_INET6 && !ipv6_addr_v4mapped(&sk->sk_v6_daddr)) {
		fusion_lpm_key_of(AF_INET6, &sk->sk_v6_daddr, key);
		return FUSION_LPM_INET6;
	}
#endif
	fusion_lpm_key_of(AF_INET, &sk->sk_daddr, key);
	return FUSION_LPM_INET;
}

/*
 * The θ a new flow to sk's destination runs: the longest matching rule's profile, else the
 * default. One walk down the table's trie, never a scan of its rules.
 */
void fusion_profile_for(const struct sock *sk, struct fusion_profile *out)
{
	struct fusion_net *fn = fusion_pernet(sock_net(sk));
	u32 key[FUSION_LPM_KEY_WORDS];
	enum fusion_lpm_family family = fusion_dest_key(sk, key);
	const struct fusion_table *t;
	int idx = -1;

	rcu_read_lock();
	t = rcu_dereference(fn->table);
	if (t)
		idx = fusion_lpm_lookup(&t->lpm, family, key);
	if (idx >= 0) {
		*out = t->profiles[idx];
	} else {
		const struct fusion_default *d = rcu_dereference(fn->dflt);

		*out = d->profile;
		if (!d->own)
			cc_table_host_theta(out->theta);
	}
	rcu_read_unlock();
}

/* What net.<datapath>.<param> reads: the default profile's θ, the host's until it is own. */
static int fusion_default_value(struct fusion_net *fn, int idx)
{
	u32 theta[CC_TABLE_NPARAMS];
	const struct fusion_default *d;
	bool own;

	rcu_read_lock();
	d = rcu_dereference(fn->dflt);
	memcpy(theta, d->profile.theta, sizeof(theta));
	own = d->own;
	rcu_read_unlock();
	if (!own)
		cc_table_host_theta(theta);
	return theta[idx];
}

/* Linux 6.11 passes sysctl handlers their table as const. */
#if LINUX_VERSION_CODE >= KERNEL_VERSION(6, 11, 0)
#define FUSION_CTL_TABLE const struct ctl_table
#else
#define FUSION_CTL_TABLE struct ctl_table
#endif

/*
 * A write to net.<datapath>.<param>: bounds checked by proc_dointvec_minmax against Θ' (EINVAL and
 * no change when outside), then a new default profile is published with a new version. The
 * first write makes the default the namespace's own: the host's θ with this parameter changed.
 */
static int fusion_sysctl_theta(FUSION_CTL_TABLE *table, int write, void *buffer,
			       size_t *lenp, loff_t *ppos)
{
	int idx = (int *)table->extra1 - fusion_sysctl_min;
	struct fusion_net *fn = container_of((int *)table->data - idx, struct fusion_net,
					     sysctl_theta[0]);
	struct fusion_default *next, *prev;
	struct ctl_table tmp = *table;
	int val, err;

	tmp.data = &val;
	val = fusion_default_value(fn, idx);
	if (!write)
		return proc_dointvec(&tmp, write, buffer, lenp, ppos);
	err = proc_dointvec_minmax(&tmp, write, buffer, lenp, ppos);
	if (err)
		return err;

	next = kmalloc(sizeof(*next), GFP_KERNEL);
	if (!next)
		return -ENOMEM;
	mutex_lock(&fn->lock);
	prev = rcu_dereference_protected(fn->dflt, lockdep_is_held(&fn->lock));
	*next = *prev;
	if (!prev->own)
		cc_table_host_theta(next->profile.theta);
	next->own = true;
	next->profile.theta[idx] = val;
	next->profile.version = fusion_next_version(fn);
	rcu_assign_pointer(fn->dflt, next);
	WRITE_ONCE(fn->sysctl_theta[idx], val);
	mutex_unlock(&fn->lock);
	synchronize_rcu();	/* sysctl writes are rare; let readers of prev finish */
	kfree(prev);
	return 0;
}

static struct ctl_table *fusion_sysctl_template(void)
{
	struct ctl_table *tbl;
	int i;

	/* one entry per parameter, the version, and the terminator */
	tbl = kcalloc(CC_TABLE_NPARAMS + 2, sizeof(*tbl), GFP_KERNEL);
	if (!tbl)
		return NULL;
	for (i = 0; i < CC_TABLE_NPARAMS; i++) {
		tbl[i].procname = fusion_theta_names[i];
		tbl[i].maxlen = sizeof(int);
		tbl[i].mode = 0644;
		tbl[i].proc_handler = fusion_sysctl_theta;
		tbl[i].extra1 = &fusion_sysctl_min[i];
		tbl[i].extra2 = &fusion_sysctl_max[i];
	}
	tbl[i].procname = "version";
	tbl[i].maxlen = sizeof(int);
	tbl[i].mode = 0444;
	tbl[i].proc_handler = proc_dointvec;
	return tbl;
}

static int __net_init fusion_net_init(struct net *net)
{
	struct fusion_net *fn = fusion_pernet(net);
	struct fusion_default *dflt;
	int i;

	mutex_init(&fn->lock);
	dflt = kzalloc(sizeof(*dflt), GFP_KERNEL);
	fn->sysctl_tbl = fusion_sysctl_template();
	if (!dflt || !fn->sysctl_tbl)
		goto fail;
	dflt->profile.id = FUSION_DEFAULT_PROFILE;
	dflt->profile.version = fusion_next_version(fn);
	cc_table_host_theta(dflt->profile.theta);
	for (i = 0; i < CC_TABLE_NPARAMS; i++) {
		fn->sysctl_theta[i] = dflt->profile.theta[i];
		fn->sysctl_tbl[i].data = &fn->sysctl_theta[i];
	}
	fn->sysctl_tbl[CC_TABLE_NPARAMS].data = &fn->sysctl_version;
	RCU_INIT_POINTER(fn->dflt, dflt);
	/* since 6.6 a table reached through a pointer is registered with its size */
#if LINUX_VERSION_CODE >= KERNEL_VERSION(6, 6, 0)
	fn->sysctl_hdr = register_net_sysctl_sz(net, CC_TABLE_SYSCTL_DIR, fn->sysctl_tbl,
						CC_TABLE_NPARAMS + 1);
#else
	fn->sysctl_hdr = register_net_sysctl(net, CC_TABLE_SYSCTL_DIR, fn->sysctl_tbl);
#endif
	if (!fn->sysctl_hdr)
		goto fail;
	return 0;
fail:
	kfree(fn->sysctl_tbl);
	kfree(dflt);
	RCU_INIT_POINTER(fn->dflt, NULL);
	return -ENOMEM;
}

static void __net_exit fusion_net_exit(struct net *net)
{
	struct fusion_net *fn = fusion_pernet(net);

	unregister_net_sysctl_table(fn->sysctl_hdr);
	kfree(fn->sysctl_tbl);
	/* No flow of this namespace is left to read these: free at once. */
	kfree(rcu_dereference_protected(fn->dflt, true));
	kvfree(rcu_dereference_protected(fn->table, true));	/* kvzalloc()ed */
}

static struct pernet_operations fusion_net_ops = {
	.init = fusion_net_init,
	.exit = fusion_net_exit,
	.id = &fusion_net_id,
	.size = sizeof(struct fusion_net),
};

int fusion_profiles_init(void)
{
	return register_pernet_subsys(&fusion_net_ops);
}

void fusion_profiles_exit(void)
{
	unregister_pernet_subsys(&fusion_net_ops);
}
