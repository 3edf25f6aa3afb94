/* SPDX-License-Identifier: GPL-2.0 */
/*
 * What the sender-side congestion controls beside Fusion share (tcp_gemini, tcp_dcvegas):
 *
 *  - θ as bounded module parameters. A datapath whose θ is one set per host takes it as module
 *    parameters (as CUBIC does), generated from its spec into <name>_theta.h together with
 *    region Θ' (the spec's "wide" bounds). A write outside Θ' is refused with -EINVAL, at load
 *    time (modprobe name=value) as through /sys/module/tcp_<name>/parameters/<name>: the kernel
 *    never runs a θ the optimiser could not have proposed.
 *
 *  - Rounds. A round ends when everything sent at its start is acknowledged: snd_una passes
 *    the snd_nxt taken when it began (DCTCP's next_seq, Vegas' beg_snd_nxt). One round is the
 *    "window" of DCTCP's α and the "RTT" of "at most one reduction per RTT".
 *
 *  - The DCTCP-style EWMA of a congested fraction, in fixed point with CC_ALPHA_FINE_ONE = 1:
 *        α ← (1 − g)·α + g·F,   g = 2^-shift,   F = marked / total over one round.
 *    GEMINI feeds it ECN: F = CE-marked over delivered packets. DC-Vegas feeds it its own
 *    queue estimate: F = ACKs whose queue exceeds K over all ACKs. α is kept in 1/2^20, not
 *    DCTCP's 1/1024: in 1/1024 the decay α >> shift is 0 once α < 2^shift units (16/1024 at
 *    g = 1/16), Linux's min_not_zero then zeroes α every round, and α reads about g·F
 *    truncated instead of F (0.003 for 5 % marks, measured in the lab): a switch that marks
 *    a few percent, as one does at its steady state, looked unmarked. In 1/2^20 α holds a
 *    fraction down to 2^shift / 2^20 (1.5e-5 at g = 1/16). Cuts and ss use 1/1024.
 *
 *  - The receiver's CE echo. DCTCP-style α needs the receiver to echo the fraction of CE
 *    marks exactly, not RFC 3168's "ECE until CWR": every change of the received packets' CE
 *    state gets an immediate ACK, and an ACK that was being delayed goes out first carrying
 *    the old state, so each ACK's ECE covers exactly the packets it acknowledges. The stack
 *    runs this only for a CC with TCP_CONG_NEEDS_ECN (CA_EVENT_ECN_IS_CE / _NO_CE), which is
 *    why GEMINI's receivers run gemini (or dctcp). The state machine is Linux's
 *    net/ipv4/tcp_dctcp.h, which a module outside the tree cannot include.
 *
 * Header-only (static inline): kbuild builds each module from its own objects, and one object
 * linked into two modules would be compiled for one KBUILD_MODNAME only.
 */
#ifndef _CC_COMMON_H
#define _CC_COMMON_H

#include <linux/kernel.h>
#include <linux/moduleparam.h>
#include <net/tcp.h>

/* ---- θ as module parameters, bounded to Θ' ---- */

struct cc_param {
	unsigned int val;
	unsigned int min;		/* Θ': writes outside [min, max] are refused */
	unsigned int max;
};

#define CC_PARAM_INIT(def, lo, hi)	{ .val = (def), .min = (lo), .max = (hi) }

/* Entries of a θ table from a generated <NAME>_THETA_PARAMS(X) list. */
#define CC_THETA_ENTRY(name, idx, def, lo, hi, desc)	[idx] = CC_PARAM_INIT(def, lo, hi),

static inline int cc_param_set(const char *val, const struct kernel_param *kp)
{
	struct cc_param *p = kp->arg;
	unsigned int v;
	int err;

	err = kstrtouint(val, 0, &v);
	if (err)
		return err;
	if (v < p->min || v > p->max)
		return -EINVAL;
	WRITE_ONCE(p->val, v);
	return 0;
}

static inline int cc_param_get(char *buffer, const struct kernel_param *kp)
{
	const struct cc_param *p = kp->arg;

	return scnprintf(buffer, PAGE_SIZE, "%u\n", READ_ONCE(p->val));
}

static const struct kernel_param_ops cc_param_ops = {
	.set = cc_param_set,
	.get = cc_param_get,
};

/* A parameter read on the datapath: a writer may change it at any time, so read it once. */
static inline u32 cc_param(const struct cc_param *p)
{
	return READ_ONCE(p->val);
}

/* All of a θ table's current values, in its order (the host's θ, for cc_table_host_theta()). */
static inline void cc_params_read(const struct cc_param *params, u32 *theta, int n)
{
	int i;

	for (i = 0; i < n; i++)
		theta[i] = cc_param(&params[i]);
}

/* ---- rounds ---- */

struct cc_round {
	u32 end_seq;			/* the round is over once snd_una passes this */
};

static inline void cc_round_start(struct cc_round *r, const struct tcp_sock *tp)
{
	r->end_seq = tp->snd_nxt;
}

static inline bool cc_round_over(const struct cc_round *r, const struct tcp_sock *tp)
{
	return !before(tp->snd_una, r->end_seq);
}

/* ---- α: EWMA of a congested fraction, in 1/CC_ALPHA_FINE_ONE ---- */

#define CC_ALPHA_SHIFT		10	/* cut fractions and ratios: 1/1024, as DCTCP's α */
#define CC_ALPHA_ONE		(1U << CC_ALPHA_SHIFT)
#define CC_ALPHA_FINE_SHIFT	20	/* α itself: 1/2^20 (see the top) */
#define CC_ALPHA_FINE_ONE	(1U << CC_ALPHA_FINE_SHIFT)
#define CC_ALPHA_SHIFT_MAX	CC_ALPHA_SHIFT	/* g = 2^-shift no finer than 1/1024 */

/*
 * α ← α − α·g + g·marked/total, g = 2^-shift (shift ≤ CC_ALPHA_SHIFT_MAX), α in
 * 1/CC_ALPHA_FINE_ONE. As Linux DCTCP, α decays by at least one unit while it is above zero,
 * so a path that stopped marking reaches α = 0 rather than stalling at α·g < 1 unit; the
 * fraction is added in 64 bits, so a window of millions of packets cannot overflow it.
 */
static inline u32 cc_alpha_update(u32 alpha, u32 marked, u32 total, u32 shift)
{
	shift = min_t(u32, shift, CC_ALPHA_SHIFT_MAX);
	alpha -= min_not_zero(alpha, alpha >> shift);
	if (marked) {
		u64 frac = div_u64((u64)marked << (CC_ALPHA_FINE_SHIFT - shift), max(total, 1U));

		alpha = min_t(u64, alpha + frac, CC_ALPHA_FINE_ONE);
	}
	return alpha;
}

/* α (1/CC_ALPHA_FINE_ONE) · x, in x's unit: α · F, or α as a fraction in 1/CC_ALPHA_ONE. */
static inline u32 cc_alpha_times(u32 alpha, u32 x)
{
	return ((u64)alpha * x) >> CC_ALPHA_FINE_SHIFT;
}

/* α in DCTCP's 1/1024, for cuts and for ss: rounded to the nearest unit, so that neither a cut
 * nor a reading of a small α is biased low by up to a unit (1/10 of a 1 % fraction). */
static inline u32 cc_alpha_frac(u32 alpha)
{
	return (alpha + (1U << (CC_ALPHA_FINE_SHIFT - CC_ALPHA_SHIFT - 1))) >>
	       (CC_ALPHA_FINE_SHIFT - CC_ALPHA_SHIFT);
}

/* cwnd reduced by the fraction f (in 1/CC_ALPHA_ONE), never below two packets. */
static inline u32 cc_cut(u32 cwnd, u32 f)
{
	return max_t(u32, cwnd - (u32)(((u64)cwnd * min(f, CC_ALPHA_ONE)) >> CC_ALPHA_SHIFT), 2U);
}

/* A ratio θ in 1/scale (β = 20 at scale 100) as a fraction in 1/CC_ALPHA_ONE. */
static inline u32 cc_ratio(u32 val, u32 scale)
{
	return div_u64((u64)val * CC_ALPHA_ONE, scale);
}

/* ---- RTT ---- */

/* The kernel's windowed minimum RTT (tcp_min_rtt_wlen, 300 s by default), 0 before a sample. */
static inline u32 cc_base_rtt_us(const struct tcp_sock *tp)
{
	u32 rtt = tcp_min_rtt(tp);

	return rtt == ~0U ? 0 : rtt;
}

/* ---- the receiver's exact CE echo (Linux net/ipv4/tcp_dctcp.h) ---- */

struct cc_ce_echo {
	u32 prior_rcv_nxt;		/* rcv_nxt when the CE state last changed */
	u32 ce_state;			/* 1: the latest data packet was CE-marked */
};

static inline void cc_ce_echo_init(struct cc_ce_echo *e, const struct tcp_sock *tp)
{
	e->prior_rcv_nxt = tp->rcv_nxt;
	e->ce_state = 0;
}

/* ECE on the ACKs we send from now on iff ce_state (TCP_ECN_DEMAND_CWR keeps it set). */
static inline void cc_ce_echo_demand(struct sock *sk, u32 ce_state)
{
	struct tcp_sock *tp = tcp_sk(sk);

	if (ce_state)
		tp->ecn_flags |= TCP_ECN_DEMAND_CWR;
	else
		tp->ecn_flags &= ~TCP_ECN_DEMAND_CWR;
}

/*
 * The pending delayed ACK, for the data up to prior_rcv_nxt. Kernels with AccECN's
 * __tcp_send_ack(sk, rcv_nxt, flags) (6.17, and stable kernels such as Debian's 6.12.1xx that
 * took the change) are told apart by Kbuild from the headers, not by version number.
 */
static inline void cc_send_ack(struct sock *sk, u32 rcv_nxt)
{
#ifdef CC_TCP_SEND_ACK_HAS_FLAGS
	__tcp_send_ack(sk, rcv_nxt, 0);
#else
	__tcp_send_ack(sk, rcv_nxt);
#endif
}

/* CA_EVENT_ECN_IS_CE / CA_EVENT_ECN_NO_CE: a data packet arrived with or without CE. */
static inline void cc_ce_echo_update(struct sock *sk, struct cc_ce_echo *e, enum tcp_ca_event ev)
{
	u32 ce_state = ev == CA_EVENT_ECN_IS_CE;

	if (e->ce_state != ce_state) {
		/* a delayed ACK covers packets of the old state: send it with the old ECE */
		if (inet_csk(sk)->icsk_ack.pending & ICSK_ACK_TIMER) {
			cc_ce_echo_demand(sk, e->ce_state);
			cc_send_ack(sk, e->prior_rcv_nxt);
		}
		inet_csk(sk)->icsk_ack.pending |= ICSK_ACK_NOW;	/* and this one at once */
	}
	e->prior_rcv_nxt = tcp_sk(sk)->rcv_nxt;
	e->ce_state = ce_state;
	cc_ce_echo_demand(sk, ce_state);
}

#endif /* _CC_COMMON_H */
