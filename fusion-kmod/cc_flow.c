// SPDX-License-Identifier: GPL-2.0
/*
 * A flow's θ and its record, for a congestion control whose state lives in the socket's
 * private area (tcp_gemini, tcp_dcvegas): that area is too small for a θ snapshot and the
 * record's ledger, so each flow gets a struct cc_flow from a cache, and the private area keeps
 * a pointer to it.
 *
 *   cc_flow_start()    when the flow starts: its destination's profile (cc_table.h) and
 *                      its endpoints; NULL when there is no memory (counted in "nostate";
 *                      the flow then runs the host's θ and sends no record);
 *   cc_flow_ack()      on each ACK: the ledger;
 *   cc_flow_release()  the congestion control's .release, for a private state that starts
 *                      with its struct cc_flow pointer: the flow's record, with the θ it
 *                      ran, on the module's "flows" group (fusion_record_emit()); the
 *                      cc_flow is freed.
 *
 * cc_table_init() and cc_table_exit() bring such a module up and down in the one order that
 * is safe: the cache, the namespaces' θ and the family before the congestion control, which
 * starts flows that use them, and the reverse on the way down.
 */
#include <linux/slab.h>
#include <net/tcp.h>

#include "cc_table.h"

static struct kmem_cache *cc_flow_cache;

int cc_table_init(struct tcp_congestion_ops *ops)
{
	int err;

	cc_flow_cache = KMEM_CACHE(cc_flow, 0);
	if (!cc_flow_cache)
		return -ENOMEM;
	err = fusion_profiles_init();
	if (err)
		goto free_cache;
	err = fusion_netlink_init();
	if (err)
		goto profiles;
	err = tcp_register_congestion_control(ops);
	if (err)
		goto netlink;
	return 0;
netlink:
	fusion_netlink_exit();
profiles:
	fusion_profiles_exit();
free_cache:
	kmem_cache_destroy(cc_flow_cache);
	return err;
}

void cc_table_exit(struct tcp_congestion_ops *ops)
{
	tcp_unregister_congestion_control(ops);
	fusion_netlink_exit();
	fusion_profiles_exit();
	rcu_barrier();		/* tables freed by call_rcu must be gone before our code is */
	kmem_cache_destroy(cc_flow_cache);
}

struct cc_flow *cc_flow_start(struct sock *sk)
{
	struct fusion_net *fn = fusion_pernet(sock_net(sk));
	const struct tcp_sock *tp = tcp_sk(sk);
	struct cc_flow *f;

	atomic64_inc(&fn->flows);
	f = kmem_cache_zalloc(cc_flow_cache, GFP_ATOMIC | __GFP_NOWARN);
	if (!f) {
		atomic64_inc(&fn->nostate);
		return NULL;
	}
	fusion_profile_for(sk, &f->theta);
	fusion_endpoints_of(sk, &f->ends);
	f->start_us = tp->tcp_mstamp;
	f->last_ack_us = tp->tcp_mstamp;
	f->rtt_min_us = U32_MAX;
	return f;
}

void cc_flow_ack(struct sock *sk, struct cc_flow *f, const struct ack_sample *sample)
{
	const struct tcp_sock *tp = tcp_sk(sk);

	f->last_ack_us = tp->tcp_mstamp;
	f->bytes_acked = max(f->bytes_acked, tp->bytes_acked);
	f->retrans = max(f->retrans, tp->total_retrans);
	f->segs_out = max(f->segs_out, tp->segs_out);
	if (sample->rtt_us > 0) {
		f->rtt_sum_us += sample->rtt_us;
		f->rtt_samples++;
		f->rtt_min_us = min_t(u32, f->rtt_min_us, sample->rtt_us);
	}
}

void cc_flow_release(struct sock *sk)
{
	struct cc_flow **slot = inet_csk_ca(sk);
	struct cc_flow *f = *slot;
	const struct tcp_sock *tp = tcp_sk(sk);
	struct fusion_record rec;

	if (!f)
		return;		/* never started, or no memory */
	rec = (struct fusion_record) {
		.ends = f->ends,
		.bytes_acked = max(tp->bytes_acked, f->bytes_acked),
		.duration_us = f->last_ack_us - f->start_us,
		.rtt_avg_us = f->rtt_samples ? div_u64(f->rtt_sum_us, f->rtt_samples) : 0,
		.rtt_min_us = f->rtt_min_us == U32_MAX ? 0 : f->rtt_min_us,
		.retrans = max(tp->total_retrans, f->retrans),
		.segs_out = max(tp->segs_out, f->segs_out),
		.profile_id = f->theta.id,
		.profile_version = f->theta.version,
	};

	memcpy(rec.theta, f->theta.theta, sizeof(rec.theta));
	fusion_record_emit(sk, &rec);
	kmem_cache_free(cc_flow_cache, f);
	*slot = NULL;
}
