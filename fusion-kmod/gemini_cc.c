// SPDX-License-Identifier: GPL-2.0
/*
 * GEMINI: congestion control for cross-datacenter networks.
 *
 * Zeng et al., "Congestion Control for Cross-Datacenter Networks" (IEEE/ACM ToN; also ch. 3 of
 * Zeng's HKUST thesis). A flow between datacenters crosses two kinds of bottleneck: datacenter
 * switches with shallow buffers that mark ECN at a queue of K packets, and a WAN with deep
 * buffers and no ECN. No single signal serves both: ECN alone (DCTCP) never sees the WAN's
 * queue, and delay alone cannot tell a 50-packet datacenter queue from RTT noise. GEMINI runs
 * one window that answers each signal the way that part of the network needs:
 *
 *   congested_dcn = the ACK carries ECN-Echo,
 *   congested_wan = RTT_min > RTT_base + T,
 *
 * where RTT_min is the least RTT sample of the latest round (min-filtering hides delayed ACKs
 * and a transient datacenter queue) and RTT_base the least over a long window (the kernel's
 * tcp_min_rtt(), 300 s). On either signal, at most once per round trip,
 *
 *   cwnd ← cwnd · (1 − max(f_dcn, f_wan)),   f_dcn = min(α · F, f_dcn,max),   f_wan = β,
 *
 * with α the DCTCP estimate of the fraction of CE-marked packets (an EWMA per round, gain
 * g = 2^-shift) and F the paper's scale factor (Theorem 1, eq. 10):
 *
 *   F = 4K / (C · RTT_base + K),   at least F_min,
 *
 * the largest factor for which a window cut at a queue of K packets does not drain the queue
 * below zero, so the link stays busy (F = 1/2 at K = C·RTT/7, DCTCP's guideline). Long-RTT
 * flows get a small F and short ones a large F, which evens out the throughput of flows with
 * different RTTs sharing a datacenter bottleneck (Theorem 2). On an intra-datacenter path
 * F reaches 3 at the paper's defaults, so α · F could exceed 1: f_dcn,max caps the cut [ours].
 * Without a signal the window grows by h packets per round trip, h/cwnd per ACK,
 *
 *   h = H · C · RTT_base,   bounded to [h_min, h_max],
 *
 * proportional to RTT_base so that flows of different RTTs gain the same rate per unit time.
 * C is the bottleneck capacity, a constant of the network (module parameter capacity_mbit, not
 * θ); H is in packets per Gbit of C · RTT_base (the paper's 1.2e-7 per bit is 120).
 *
 * Kernel mapping. ECN: TCP_CONG_NEEDS_ECN makes the stack negotiate ECN for this CC and run
 * the receiver's exact CE echo (cc_common.h), so α sees the true marked fraction; a flow whose
 * peer did not agree to ECN stops sending ECT and keeps only the delay signal. An ECE ACK makes
 * the stack enter CWR itself (once per round: CWR lasts until what was sent before it is
 * acknowledged) and ask gemini_ssthresh() for the target. A delay signal enters CWR from
 * gemini_cong_avoid() with tcp_enter_cwr(), as tcp_cdg does, so proportional rate reduction
 * paces the cut either way. Slow start is Linux's and ends at the first signal. Loss keeps
 * TCP's fast recovery (the paper): entering Recovery, or an RTO, sets ssthresh to
 * cwnd · (1 − β_loss), and undo gives the window back if the loss proves spurious. Pacing:
 * the stack's internal pacing at its cwnd/RTT rate (the paper paces each flow).
 *
 * ss -i shows α as DCTCP's does ("dctcp:(ce_state,alpha,ab_ecn,ab_tot)", α in 1/1024): ss
 * asks for VEGASINFO, and so does getsockopt(TCP_CC_INFO). A sock_diag request that does not
 * (INET_DIAG_INFO alone, say; idiag_ext has 8 bits, so BBRINFO cannot be asked for by name)
 * gets the rest in BBR's record, there being no GEMINI record: bbr_min_rtt = RTT_base (µs),
 * bbr_bw_lo = RTT_min of the latest round (µs, 0 if none), bbr_bw_hi = the flow's delay cuts
 * << 16 | its ECN cuts (each saturating at 0xffff), bbr_pacing_gain = F (1/1024) and
 * bbr_cwnd_gain = h (1/100 packets per round trip).
 *
 * Fixed point: α in 1/CC_ALPHA_FINE_ONE (2^20, cc_common.h says why); F and every cut fraction
 * in 1/CC_ALPHA_ONE (1024); h in 1/GEMINI_H_FINE (10000) packets per round trip, its bounds
 * h_min and h_max in the spec's 1/100; θ in the spec's units.
 */
#include <linux/inet_diag.h>
#include <linux/module.h>
#include <net/genetlink.h>
#include <net/inet_ecn.h>
#include <net/tcp.h>

#include "cc_common.h"
#include "gemini_table.h"

#define GEMINI_F_NUM			4	/* F = 4K / (C·RTT_base + K) */
#define GEMINI_H_UNIT			GEMINI_INCREASE_MIN_SCALE	/* θ's h in 1/100 packet */
#define GEMINI_H_FINE_PER_UNIT		100	/* h itself in 1/10000 packet (see below) */
#define GEMINI_H_FINE			(GEMINI_H_UNIT * GEMINI_H_FINE_PER_UNIT)
#define GEMINI_H_PER_GBIT_DENOM		(1000000000ULL / GEMINI_H_FINE)	/* bits per Gbit */
#define GEMINI_RTT_MAX_US		(10 * USEC_PER_SEC)	/* clamp for fixed-point bounds */
#define GEMINI_CAPACITY_DEFAULT_MBIT	1000
#define GEMINI_CAPACITY_MIN_MBIT	1
#define GEMINI_CAPACITY_MAX_MBIT	1000000			/* 1 Tbit/s */
#define GEMINI_CWND_MIN			2
#define GEMINI_INFO_CUTS_SHIFT		16	/* bbr_bw_hi: delay cuts << 16 | ECN cuts */

static struct cc_param gemini_theta[GEMINI_THETA_NPARAMS] = {
	GEMINI_THETA_PARAMS(CC_THETA_ENTRY)
};

#define GEMINI_MODULE_PARAM(name, idx, def, lo, hi, desc)			\
	module_param_cb(name, &cc_param_ops, &gemini_theta[idx], 0644);	\
	MODULE_PARM_DESC(name, desc);
GEMINI_THETA_PARAMS(GEMINI_MODULE_PARAM)

/* Not θ: the bottleneck capacity C, a constant of the environment set per fleet. */
static struct cc_param gemini_capacity = CC_PARAM_INIT(GEMINI_CAPACITY_DEFAULT_MBIT,
						       GEMINI_CAPACITY_MIN_MBIT,
						       GEMINI_CAPACITY_MAX_MBIT);
module_param_cb(capacity_mbit, &cc_param_ops, &gemini_capacity, 0644);
MODULE_PARM_DESC(capacity_mbit, "C (Mbit/s): bottleneck capacity in F and h; not searched");

struct gemini {
	struct cc_flow *flow;		/* first (cc_flow_release()): its θ and record; NULL: no
					 * memory, the host's θ */
	u32 alpha;			/* fraction of CE-marked packets, 1/CC_ALPHA_FINE_ONE */
	u32 old_delivered;		/* tp->delivered at the round's start */
	u32 old_delivered_ce;		/* tp->delivered_ce at the round's start */
	struct cc_round round;		/* α's window and RTT_min's round */
	u32 round_rtt_min_us;		/* least RTT sample of this round so far */
	u32 rtt_min_us;			/* RTT_min: least RTT sample of the latest whole round */
	u32 cut_end_seq;		/* no other window cut until snd_una passes this */
	u32 loss_cwnd;			/* cwnd before the latest loss reduction, for undo */
	struct cc_ce_echo echo;		/* receiver side */
	u16 delay_cuts;			/* cuts with the WAN (delay) signal, for get_info */
	u16 ecn_cuts;			/* cuts with the DCN (ECN) signal */
	u8 ecn;				/* ECN negotiated: α and the ECN signal are live */
	u8 ece;				/* the ACK being processed carries ECN-Echo */
};

/*
 * The host's θ, the module parameters: what a namespace's default profile follows until one
 * of its net.gemini.* sysctls is written (cc_table.h), and what a flow without a cc_flow runs.
 */
void cc_table_host_theta(u32 theta[GEMINI_THETA_NPARAMS])
{
	cc_params_read(gemini_theta, theta, GEMINI_THETA_NPARAMS);
}

/* θ as this flow took it when it started: its destination's profile (cc_table.h). */
static u32 gemini_param(const struct gemini *ca, enum gemini_theta_param p)
{
	return ca->flow ? ca->flow->theta.theta[p] : cc_param(&gemini_theta[p]);
}

/* RTT_base, clamped so that C · RTT_base stays within the fixed-point bounds; 0 if unknown. */
static u32 gemini_base_rtt_us(const struct tcp_sock *tp)
{
	return min_t(u32, cc_base_rtt_us(tp), GEMINI_RTT_MAX_US);
}

/* C · RTT_base in bits (Mbit/s · µs). */
static u64 gemini_bdp_bits(const struct tcp_sock *tp)
{
	return (u64)cc_param(&gemini_capacity) * gemini_base_rtt_us(tp);
}

/* F = 4K / (C · RTT_base + K), at least F_min; in 1/CC_ALPHA_ONE. */
static u32 gemini_scale_f(const struct gemini *ca, const struct tcp_sock *tp)
{
	u64 k_bits = (u64)gemini_param(ca, GEMINI_THETA_ECN_K) * tp->mss_cache * BITS_PER_BYTE;
	u32 f = div64_u64(GEMINI_F_NUM * k_bits << CC_ALPHA_SHIFT, gemini_bdp_bits(tp) + k_bits);

	return max(f, cc_ratio(gemini_param(ca, GEMINI_THETA_SCALE_F_MIN),
			       GEMINI_SCALE_F_MIN_SCALE));
}

/*
 * h = H · C · RTT_base in 1/GEMINI_H_FINE packets per round trip, within [h_min, h_max]. Finer
 * than θ's 1/100: an intra-datacenter flow's h is a few hundredths of a packet (0.024 at
 * 1 Gbit/s and 200 µs), which 1/100 would truncate by up to a half, and h ∝ RTT_base is what
 * makes flows of different RTTs share a link evenly (the paper's Theorem 2).
 */
static u32 gemini_increase(const struct gemini *ca, const struct tcp_sock *tp)
{
	u64 h = div64_u64(gemini_bdp_bits(tp) * gemini_param(ca, GEMINI_THETA_INCREASE_H),
			  GEMINI_H_PER_GBIT_DENOM);

	return clamp_t(u64, h,
		       (u64)gemini_param(ca, GEMINI_THETA_INCREASE_MIN) * GEMINI_H_FINE_PER_UNIT,
		       (u64)gemini_param(ca, GEMINI_THETA_INCREASE_MAX) * GEMINI_H_FINE_PER_UNIT);
}

/* f_dcn = min(α · F, f_dcn,max), in 1/CC_ALPHA_ONE. */
static u32 gemini_dcn_cut(const struct gemini *ca, const struct tcp_sock *tp)
{
	u32 f = cc_alpha_times(ca->alpha, gemini_scale_f(ca, tp));

	return min(f, cc_ratio(gemini_param(ca, GEMINI_THETA_DCN_CUT_MAX),
			       GEMINI_DCN_CUT_MAX_SCALE));
}

/* congested_wan: the latest round's least RTT exceeds RTT_base by more than T. */
static bool gemini_wan_congested(const struct gemini *ca, const struct tcp_sock *tp)
{
	u32 base = cc_base_rtt_us(tp);

	return base && ca->rtt_min_us != U32_MAX &&
	       ca->rtt_min_us > (u64)base + gemini_param(ca, GEMINI_THETA_DELAY_THRESHOLD_US);
}

/* One window cut per round trip: the latest one is over once what it saw sent is acked. */
static bool gemini_may_cut(const struct gemini *ca, const struct tcp_sock *tp)
{
	return !before(tp->snd_una, ca->cut_end_seq);
}

static void gemini_round_reset(struct gemini *ca, const struct tcp_sock *tp)
{
	cc_round_start(&ca->round, tp);
	ca->old_delivered = tp->delivered;
	ca->old_delivered_ce = tp->delivered_ce;
	ca->round_rtt_min_us = U32_MAX;
}

static void gemini_init(struct sock *sk)
{
	struct tcp_sock *tp = tcp_sk(sk);
	struct gemini *ca = inet_csk_ca(sk);

	/* a listener or unconnected socket has not negotiated yet: be ready for ECN */
	ca->ecn = (tp->ecn_flags & TCP_ECN_OK) || sk->sk_state == TCP_LISTEN ||
		  sk->sk_state == TCP_CLOSE;
	if (!ca->ecn)
		INET_ECN_dontxmit(sk);	/* ECT was set for the handshake: stop sending it */
	ca->alpha = CC_ALPHA_FINE_ONE;	/* as DCTCP: the first ECN cut is α · F at α = 1 */
	ca->ece = 0;
	ca->rtt_min_us = U32_MAX;
	ca->cut_end_seq = tp->snd_una;
	ca->loss_cwnd = 0;
	ca->delay_cuts = 0;
	ca->ecn_cuts = 0;
	cc_ce_echo_init(&ca->echo, tp);
	gemini_round_reset(ca, tp);
	cmpxchg(&sk->sk_pacing_status, SK_PACING_NONE, SK_PACING_NEEDED);
	/* the stack runs init once the flow is connected, so its destination is known */
	ca->flow = cc_flow_start(sk);
}


/* End of a round: α from the round's CE fraction, and the round's least RTT becomes RTT_min. */
static void gemini_end_round(struct sock *sk, struct gemini *ca)
{
	const struct tcp_sock *tp = tcp_sk(sk);

	if (ca->ecn)
		WRITE_ONCE(ca->alpha,
			   cc_alpha_update(ca->alpha, tp->delivered_ce - ca->old_delivered_ce,
					   tp->delivered - ca->old_delivered,
					   gemini_param(ca, GEMINI_THETA_ECN_GAIN_SHIFT)));
	ca->rtt_min_us = ca->round_rtt_min_us;
	gemini_round_reset(ca, tp);
}

/* Before the stack acts on an ACK: note its ECE, and close the round it completes. */
static void gemini_in_ack_event(struct sock *sk, u32 flags)
{
	struct gemini *ca = inet_csk_ca(sk);

	ca->ece = ca->ecn && (flags & CA_ACK_ECE);
	if (cc_round_over(&ca->round, tcp_sk(sk)))
		gemini_end_round(sk, ca);
}

static void gemini_pkts_acked(struct sock *sk, const struct ack_sample *sample)
{
	struct gemini *ca = inet_csk_ca(sk);

	if (sample->rtt_us > 0)
		ca->round_rtt_min_us = min_t(u32, ca->round_rtt_min_us, sample->rtt_us);
	if (ca->flow)
		cc_flow_ack(sk, ca->flow, sample);
}

static void gemini_count(u16 *counter)
{
	if (*counter < U16_MAX)
		(*counter)++;
}

/*
 * The target of a window cut, asked by the stack on entering CWR (our delay signal, or its
 * own on an ECE ACK), Recovery or Loss: cwnd · (1 − max(f_dcn, f_wan)). A loss is answered
 * afterwards by gemini_set_state() / CA_EVENT_LOSS, which overwrite this target.
 */
static u32 gemini_ssthresh(struct sock *sk)
{
	struct gemini *ca = inet_csk_ca(sk);
	struct tcp_sock *tp = tcp_sk(sk);
	u32 cwnd = tcp_snd_cwnd(tp), f = 0;

	if (!gemini_may_cut(ca, tp))
		return cwnd;			/* cut once already this round trip */
	if (ca->ece) {
		f = gemini_dcn_cut(ca, tp);
		gemini_count(&ca->ecn_cuts);
	}
	if (gemini_wan_congested(ca, tp)) {
		f = max(f, cc_ratio(gemini_param(ca, GEMINI_THETA_WAN_DECREASE),
				    GEMINI_WAN_DECREASE_SCALE));
		gemini_count(&ca->delay_cuts);
	}
	ca->cut_end_seq = tp->snd_nxt;
	return cc_cut(cwnd, f);
}

/* Loss: TCP's fast recovery with the window cut to cwnd · (1 − β_loss). */
static void gemini_react_to_loss(struct sock *sk)
{
	struct gemini *ca = inet_csk_ca(sk);
	struct tcp_sock *tp = tcp_sk(sk);

	ca->loss_cwnd = tcp_snd_cwnd(tp);
	ca->cut_end_seq = tp->snd_nxt;
	tp->snd_ssthresh = cc_cut(tcp_snd_cwnd(tp),
				  cc_ratio(gemini_param(ca, GEMINI_THETA_LOSS_DECREASE),
					   GEMINI_LOSS_DECREASE_SCALE));
}

static void gemini_set_state(struct sock *sk, u8 new_state)
{
	if (new_state == TCP_CA_Recovery && new_state != inet_csk(sk)->icsk_ca_state)
		gemini_react_to_loss(sk);
	/* an RTO is answered in gemini_cwnd_event(): one loss reduction per episode */
}

/* Additive increase: h packets per round trip, h/cwnd per ACK (tcp_cong_avoid_ai counts). */
static void gemini_increase_cwnd(const struct gemini *ca, struct tcp_sock *tp, u32 acked)
{
	u64 w = div_u64((u64)tcp_snd_cwnd(tp) * GEMINI_H_FINE, gemini_increase(ca, tp));

	tcp_cong_avoid_ai(tp, clamp_t(u64, w, 1, U32_MAX), acked);
}

/*
 * In Open and Disorder, on each ACK that delivers data: on a congestion signal cut (the
 * delay cut here; the stack has already entered CWR on ECE) and do not grow; otherwise slow
 * start below ssthresh, then h per round trip.
 */
static void gemini_cong_avoid(struct sock *sk, u32 ack, u32 acked)
{
	struct gemini *ca = inet_csk_ca(sk);
	struct tcp_sock *tp = tcp_sk(sk);

	if (gemini_wan_congested(ca, tp)) {
		if (gemini_may_cut(ca, tp))
			tcp_enter_cwr(sk);	/* asks gemini_ssthresh(); PRR paces the cut */
		return;
	}
	if (ca->ece || !tcp_is_cwnd_limited(sk))
		return;
	if (tcp_in_slow_start(tp)) {
		acked = tcp_slow_start(tp, acked);
		if (!acked)
			return;
	}
	gemini_increase_cwnd(ca, tp, acked);
}

static void gemini_cwnd_event(struct sock *sk, enum tcp_ca_event ev)
{
	struct gemini *ca = inet_csk_ca(sk);

	switch (ev) {
	case CA_EVENT_ECN_IS_CE:
	case CA_EVENT_ECN_NO_CE:
		cc_ce_echo_update(sk, &ca->echo, ev);
		break;
	case CA_EVENT_LOSS:
		gemini_react_to_loss(sk);
		break;
	default:
		break;
	}
}

static u32 gemini_undo_cwnd(struct sock *sk)
{
	const struct gemini *ca = inet_csk_ca(sk);

	return max(tcp_snd_cwnd(tcp_sk(sk)), ca->loss_cwnd);
}

/* ss -i: α in DCTCP's record (answered for VEGASINFO too, which is what ss asks for). */
static size_t gemini_dctcp_info(struct sock *sk, int *attr, union tcp_cc_info *info)
{
	const struct gemini *ca = inet_csk_ca(sk);
	const struct tcp_sock *tp = tcp_sk(sk);

	memset(&info->dctcp, 0, sizeof(info->dctcp));
	info->dctcp.dctcp_enabled = ca->ecn;
	info->dctcp.dctcp_ce_state = (u16)ca->echo.ce_state;
	info->dctcp.dctcp_alpha = cc_alpha_frac(READ_ONCE(ca->alpha));
	info->dctcp.dctcp_ab_ecn = tp->mss_cache * (tp->delivered_ce - ca->old_delivered_ce);
	info->dctcp.dctcp_ab_tot = tp->mss_cache * (tp->delivered - ca->old_delivered);
	*attr = INET_DIAG_DCTCPINFO;
	return sizeof(info->dctcp);
}

/* Asked for anything but VEGASINFO: RTT_base, RTT_min, cuts by signal, F and h (see the top). */
static size_t gemini_bbr_info(struct sock *sk, int *attr, union tcp_cc_info *info)
{
	const struct gemini *ca = inet_csk_ca(sk);
	const struct tcp_sock *tp = tcp_sk(sk);

	memset(&info->bbr, 0, sizeof(info->bbr));
	info->bbr.bbr_bw_lo = ca->rtt_min_us == U32_MAX ? 0 : ca->rtt_min_us;
	info->bbr.bbr_bw_hi = (u32)ca->delay_cuts << GEMINI_INFO_CUTS_SHIFT | ca->ecn_cuts;
	info->bbr.bbr_min_rtt = cc_base_rtt_us(tp);
	info->bbr.bbr_pacing_gain = gemini_scale_f(ca, tp);
	info->bbr.bbr_cwnd_gain = gemini_increase(ca, tp) / GEMINI_H_FINE_PER_UNIT;
	*attr = INET_DIAG_BBRINFO;
	return sizeof(info->bbr);
}

static size_t gemini_get_info(struct sock *sk, u32 ext, int *attr, union tcp_cc_info *info)
{
	if (ext & (1 << (INET_DIAG_DCTCPINFO - 1)) || ext & (1 << (INET_DIAG_VEGASINFO - 1)))
		return gemini_dctcp_info(sk, attr, info);
	return ext ? gemini_bbr_info(sk, attr, info) : 0;
}

static struct tcp_congestion_ops gemini_cong_ops __read_mostly = {
	.name		= "gemini",
	.owner		= THIS_MODULE,
	.flags		= TCP_CONG_NEEDS_ECN,
	.init		= gemini_init,
	.release	= cc_flow_release,
	.ssthresh	= gemini_ssthresh,
	.cong_avoid	= gemini_cong_avoid,
	.set_state	= gemini_set_state,
	.cwnd_event	= gemini_cwnd_event,
	.in_ack_event	= gemini_in_ack_event,
	.pkts_acked	= gemini_pkts_acked,
	.undo_cwnd	= gemini_undo_cwnd,
	.get_info	= gemini_get_info,
};

static int __init gemini_register(void)
{
	BUILD_BUG_ON(sizeof(struct gemini) > ICSK_CA_PRIV_SIZE);
	BUILD_BUG_ON(offsetof(struct gemini, flow) != 0);	/* cc_flow_release() */
	BUILD_BUG_ON(GEMINI_INCREASE_MIN_SCALE != GEMINI_INCREASE_MAX_SCALE);
	return cc_table_init(&gemini_cong_ops);
}

static void __exit gemini_unregister(void)
{
	cc_table_exit(&gemini_cong_ops);
}

module_init(gemini_register);
module_exit(gemini_unregister);

MODULE_AUTHOR("Gemini");
MODULE_LICENSE("GPL");
MODULE_DESCRIPTION("GEMINI: ECN and delay congestion control for cross-datacenter networks");
MODULE_VERSION("0.1.0");
MODULE_ALIAS_GENL_FAMILY(GEMINI_GENL_NAME);
