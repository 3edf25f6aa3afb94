// SPDX-License-Identifier: GPL-2.0
/*
 * DC-Vegas: DCTCP's reaction driven by Vegas' queue estimate, with no ECN.
 *
 * Wang et al., "DC-Vegas: A delay-based TCP congestion control algorithm for datacenter
 * applications" (JNCA 2015). DCTCP keeps datacenter queues short and survives incast by
 * cutting the window in proportion to the fraction of packets the switches marked; it needs
 * switches that mark ECN and receivers that echo it. DC-Vegas computes that fraction at the
 * sender alone: every ACK's RTT sample tells how many of this flow's own packets sit in
 * queues (Vegas' estimate, eq. 1),
 *
 *   q = (w / RTT) · (RTT − RTT_min)   packets,
 *
 * the window w sent at rate w/RTT, for RTT − RTT_min of queueing. A sample is "marked" when
 * q > K_dcv, as a DCTCP switch marks at a queue of K. Per round (one window of data):
 *
 *   F = ACKs with q > K_dcv / all ACKs,          (eq. 6)
 *   α ← (1 − g) · α + g · F,   g = 2^-shift,
 *   w ← w − w · α / 2   if F > 0,   else   w ← w + 1.
 *
 * So a flow behaves like a DCTCP flow with the threshold N · K_dcv when N flows share the
 * bottleneck ("a distributed DCTCP"): the queue stays near N · K_dcv, the window saws by a
 * fraction that shrinks with α instead of halving, and in incast many small windows cut
 * gently instead of all timing out. K_dcv grows with the bandwidth-delay product (the paper's
 * 3 / 6 / 21 packets at 0.1 / 1 / 10 Gbit/s); it is the parameter to tune per environment.
 *
 * Kernel mapping (after Linux tcp_vegas.c). pkts_acked() classifies each ACK's RTT sample
 * against the current window and RTT_min, the kernel's windowed minimum RTT (tcp_min_rtt(),
 * 300 s); cong_avoid() ends the round once snd_una passes the snd_nxt at its start and applies
 * the cut or the +1. Slow start is Reno's, left early by the first round with F > 0 (the
 * paper keeps slow start "unchanged"; without that exit it would run on until a loss). Loss
 * halves the window and undo restores it, as Reno. Counting restarts when the socket returns
 * to Open and after an idle period (CA_EVENT_TX_START, CA_EVENT_CWND_RESTART), since samples
 * taken across those say nothing about the current window.
 *
 * ss -i shows α in DCTCP's record ("dctcp:(…,alpha,ab_ecn,ab_tot)", α in 1/1024), with
 * ab_ecn / ab_tot counting this round's ACKs over K_dcv / all ACKs (DCTCP counts bytes).
 *
 * Fixed point: α in 1/CC_ALPHA_FINE_ONE (2^20, cc_common.h says why), cut fractions in
 * 1/CC_ALPHA_ONE (1024); θ in the spec's units.
 */
#include <linux/inet_diag.h>
#include <linux/module.h>
#include <net/genetlink.h>
#include <net/tcp.h>

#include "cc_common.h"
#include "dcvegas_table.h"

#define DCVEGAS_INCREASE_PKTS	1	/* per round without a congested sample */
#define DCVEGAS_CUT_SHIFT	1	/* the cut is w · α / 2 */

static struct cc_param dcvegas_theta[DCVEGAS_THETA_NPARAMS] = {
	DCVEGAS_THETA_PARAMS(CC_THETA_ENTRY)
};

#define DCVEGAS_MODULE_PARAM(name, idx, def, lo, hi, desc)			\
	module_param_cb(name, &cc_param_ops, &dcvegas_theta[idx], 0644);	\
	MODULE_PARM_DESC(name, desc);
DCVEGAS_THETA_PARAMS(DCVEGAS_MODULE_PARAM)

struct dcvegas {
	struct cc_flow *flow;		/* first (cc_flow_release()): its θ and record; NULL: no
					 * memory, the host's θ */
	u32 alpha;			/* EWMA of the congested fraction, 1/CC_ALPHA_FINE_ONE */
	struct cc_round round;
	u32 acks;			/* ACKs with an RTT sample this round */
	u32 acks_over;			/* ...of which with q > K_dcv */
};

/*
 * The host's θ, the module parameters: what a namespace's default profile follows until one
 * of its net.dcvegas.* sysctls is written (cc_table.h), and what a flow without a cc_flow runs.
 */
void cc_table_host_theta(u32 theta[DCVEGAS_THETA_NPARAMS])
{
	cc_params_read(dcvegas_theta, theta, DCVEGAS_THETA_NPARAMS);
}

/* θ as this flow took it when it started: its destination's profile (cc_table.h). */
static u32 dcvegas_param(const struct dcvegas *ca, enum dcvegas_theta_param p)
{
	return ca->flow ? ca->flow->theta.theta[p] : cc_param(&dcvegas_theta[p]);
}

static void dcvegas_round_reset(struct dcvegas *ca, const struct tcp_sock *tp)
{
	cc_round_start(&ca->round, tp);
	ca->acks = 0;
	ca->acks_over = 0;
}

static void dcvegas_init(struct sock *sk)
{
	struct dcvegas *ca = inet_csk_ca(sk);

	ca->alpha = CC_ALPHA_FINE_ONE;	/* as DCTCP: the first congested round halves */
	dcvegas_round_reset(ca, tcp_sk(sk));
	/* the stack runs init once the flow is connected, so its destination is known */
	ca->flow = cc_flow_start(sk);
}


/* Eq. 1 against K_dcv: q = w · (RTT − RTT_min) / RTT > K, compared without dividing. */
static bool dcvegas_queue_over(const struct dcvegas *ca, const struct tcp_sock *tp,
			       u32 rtt_us)
{
	u32 base = cc_base_rtt_us(tp);

	if (!base || rtt_us <= base)
		return false;
	return (u64)tcp_snd_cwnd(tp) * (rtt_us - base) >
	       (u64)dcvegas_param(ca, DCVEGAS_THETA_QUEUE_THRESHOLD) * rtt_us;
}

static void dcvegas_pkts_acked(struct sock *sk, const struct ack_sample *sample)
{
	struct dcvegas *ca = inet_csk_ca(sk);

	if (ca->flow)
		cc_flow_ack(sk, ca->flow, sample);
	if (sample->rtt_us <= 0)
		return;
	ca->acks++;
	if (dcvegas_queue_over(ca, tcp_sk(sk), sample->rtt_us))
		ca->acks_over++;
}

/* End of a round: F and α (eq. 6), then w − w·α/2 if any sample was congested, else w + 1. */
static void dcvegas_end_round(struct sock *sk, struct dcvegas *ca)
{
	struct tcp_sock *tp = tcp_sk(sk);
	u32 cwnd = tcp_snd_cwnd(tp);

	if (ca->acks)
		WRITE_ONCE(ca->alpha,
			   cc_alpha_update(ca->alpha, ca->acks_over, ca->acks,
					   dcvegas_param(ca, DCVEGAS_THETA_EWMA_SHIFT)));
	if (ca->acks_over) {
		cwnd = cc_cut(cwnd, cc_alpha_frac(ca->alpha) >> DCVEGAS_CUT_SHIFT);
		tcp_snd_cwnd_set(tp, cwnd);
		tp->snd_ssthresh = min(tp->snd_ssthresh, cwnd);	/* ends slow start */
	} else if (!tcp_in_slow_start(tp) && tcp_is_cwnd_limited(sk)) {
		tcp_snd_cwnd_set(tp, min(cwnd + DCVEGAS_INCREASE_PKTS, tp->snd_cwnd_clamp));
	}
	dcvegas_round_reset(ca, tp);
}

static void dcvegas_cong_avoid(struct sock *sk, u32 ack, u32 acked)
{
	struct dcvegas *ca = inet_csk_ca(sk);
	struct tcp_sock *tp = tcp_sk(sk);

	if (cc_round_over(&ca->round, tp))
		dcvegas_end_round(sk, ca);	/* may end slow start */
	if (tcp_in_slow_start(tp) && tcp_is_cwnd_limited(sk))
		tcp_slow_start(tp, acked);
}

/* Samples taken outside Open (recovery, a reduction) are stale once the socket is back. */
static void dcvegas_set_state(struct sock *sk, u8 new_state)
{
	if (new_state == TCP_CA_Open && inet_csk(sk)->icsk_ca_state != TCP_CA_Open)
		dcvegas_round_reset(inet_csk_ca(sk), tcp_sk(sk));
}

static void dcvegas_cwnd_event(struct sock *sk, enum tcp_ca_event ev)
{
	if (ev == CA_EVENT_TX_START || ev == CA_EVENT_CWND_RESTART)
		dcvegas_round_reset(inet_csk_ca(sk), tcp_sk(sk));
}

/* ss -i: DCTCP's record (answered for VEGASINFO too, which is what ss asks for). */
static size_t dcvegas_get_info(struct sock *sk, u32 ext, int *attr, union tcp_cc_info *info)
{
	const struct dcvegas *ca = inet_csk_ca(sk);

	if (!(ext & (1 << (INET_DIAG_DCTCPINFO - 1))) && !(ext & (1 << (INET_DIAG_VEGASINFO - 1))))
		return 0;
	memset(&info->dctcp, 0, sizeof(info->dctcp));
	info->dctcp.dctcp_enabled = 1;
	info->dctcp.dctcp_alpha = cc_alpha_frac(READ_ONCE(ca->alpha));
	info->dctcp.dctcp_ab_ecn = ca->acks_over;
	info->dctcp.dctcp_ab_tot = ca->acks;
	*attr = INET_DIAG_DCTCPINFO;
	return sizeof(info->dctcp);
}

static struct tcp_congestion_ops dcvegas_cong_ops __read_mostly = {
	.name		= "dcvegas",
	.owner		= THIS_MODULE,
	.init		= dcvegas_init,
	.release	= cc_flow_release,
	.ssthresh	= tcp_reno_ssthresh,
	.undo_cwnd	= tcp_reno_undo_cwnd,
	.cong_avoid	= dcvegas_cong_avoid,
	.pkts_acked	= dcvegas_pkts_acked,
	.set_state	= dcvegas_set_state,
	.cwnd_event	= dcvegas_cwnd_event,
	.get_info	= dcvegas_get_info,
};

static int __init dcvegas_register(void)
{
	BUILD_BUG_ON(sizeof(struct dcvegas) > ICSK_CA_PRIV_SIZE);
	BUILD_BUG_ON(offsetof(struct dcvegas, flow) != 0);	/* cc_flow_release() */
	return cc_table_init(&dcvegas_cong_ops);
}

static void __exit dcvegas_unregister(void)
{
	cc_table_exit(&dcvegas_cong_ops);
}

module_init(dcvegas_register);
module_exit(dcvegas_unregister);

MODULE_AUTHOR("Gemini");
MODULE_LICENSE("GPL");
MODULE_DESCRIPTION("DC-Vegas: DCTCP-style congestion control on a Vegas queue estimate, no ECN");
MODULE_VERSION("0.1.0");
MODULE_ALIAS_GENL_FAMILY(DCVEGAS_GENL_NAME);
