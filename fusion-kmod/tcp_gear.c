// SPDX-License-Identifier: GPL-2.0
/*
 * Gear: INT-based congestion control for intra- and cross-datacenter flows.
 *
 * Gear (seed 002_3160f14936d8e845.txt; DATAPATHS-SPEC.md section 3) sets a flow's window from
 * In-band Network Telemetry, as HPCC does, so that intra-datacenter (intra-DC) flows keep the
 * bottleneck at a target utilisation η and leave cross-datacenter (cross-DC) flows, whose
 * round trips are a hundred times longer, the bandwidth they should get. Per ACK, from the
 * bottleneck hop's queue ql, transmitted bytes tx and timestamp ts (gear_int.c brings them
 * here in the lab):
 *
 *   u = (tx − tx') / ((ts − ts') · bw) + ql / (T · bw)                       (eq. 1)
 *
 * averaged as HPCC does, u ← u·(T − τ)/T + u_new·τ/T with τ = ts − ts' ≤ T, T the network's
 * base RTT (dc_base_rtt_us: the paper's basertt; the same for every flow at a port).
 * Two windows (HPCC): the reference w^c, updated once per round (when the ACK passes the
 * snd_nxt of the last update), and the current w, per ACK (eq. 4, Algorithm 1):
 *
 *   w = w^c · η / u + W_AI     if u ≥ η or incStage ≥ maxStage   (then incStage ← 0)
 *   w = w^c + W_AI             otherwise                          (then incStage ← incStage + 1)
 *
 * and at a round's end w^c ← w. So a flow grows additively for maxStage rounds while the link
 * has room, then jumps multiplicatively to η of it; above η it cuts in proportion η/u at once.
 * Every other multiplicative round an intra-DC flow also takes over the cross-DC flows' part of
 * the move (eqs. 5–7): from u(t_prev) before its own move and u one IRTT later it solves
 *
 *   w_a^c + w_b^c = u(t_prev) · bw,  (η/u(t_prev)) · w_a^c + w_b^c = u(t) · bw          (eq. 5)
 *   w_b^c = u(t_prev) · (u(t) − η) / (u(t_prev) − η) · bw                                (eq. 6)
 *   w_a1^c = (η/u) · w_a1^c + (η/u − 1) · w_b^c · w_a1^c / w_a^c                          (eq. 7)
 *
 * for the cross-DC share w_b^c. Eq. 6 divides the noise in u(t) − η by u(t_prev) − η, and a
 * lone flow read that noise as a share and yielded it (0.53–0.68 of the line when built without
 * a bound). So the share is bounded by what the telemetry shows of other traffic: the port's
 * transmitted bytes less this flow's own (its end sequences between two records, with their
 * headers), averaged as u is. No other traffic, no share, and eq. 7 is eq. 4.
 *
 * The class: a flow is cross-DC when its base RTT ≥ k · the intra-DC base RTT (configured:
 * dc_base_rtt_us). A cross-DC flow (lines 17–22) keeps w^c for its round (a CRTT) and moves
 * twice what u asks, w = (2η/u − 1) · w^c + min(500, CRTT/IRTT) · W_AI (eqs. 8–9: the intra-DC
 * flows did its part meanwhile); at the round's end it takes that doubled move out of u
 * (eq. 10) and sets w^c = (η/u) · w^c + min(500, CRTT/IRTT) · W_AI: HPCC's right rate, W_AI
 * included as in the intra-DC rule (w^c = w(t)). Without the step in w^c (the paper's line 21
 * read literally) the additive step never accumulates, the cross-DC flow grows only when u < η,
 * and the intra-DC flows' own steps hold u ≥ η: in the lab it got 18 of 84 Mbit/s (share 3.65)
 * against 31 of 80 with it (1.6). Its window is also bounded by w_wan, an AIMD of its own
 * for congestion in the WAN where there is no INT (CUBIC's β = 0.7 on loss; slow start until
 * the first loss, then +1 per round): w ← min(w, w_wan). Not implemented: multi-hop INT (eq. 3;
 * the lab's switch is one hop) and the asynchronous model (eqs. 11–12).
 *
 * W_AI, the additive step, is a fraction of the bottleneck's BDP at the network's base RTT:
 * W_AI = ai_step_bdp · bw · IRTT, θ's ai_step_bdp in 1/GEAR_AI_STEP_BDP_SCALE (1/10000), bw
 * the line rate the INT record carries and IRTT = dc_base_rtt_us, the basertt of eq. 1.
 * The paper gives W_AI no value; HPCC, whose windows Gear keeps, sets W_AI = B · T · (1 − η)/N,
 * a fraction of the BDP too. A cross-DC flow's step, min(500, CRTT/IRTT) · W_AI, is then the
 * same fraction of its own BDP bw · CRTT (below the cap), whatever the port. In packets (θ
 * version 1) it was not: the step that made a pair fair at 100 Mbit/s and a 40 ms CRTT (1.4 of
 * its BDP a round) was 2.3 BDPs at 60 Mbit/s and 30 ms, and took twice the intra flow's rate.
 *
 * The window is paced at w / T and capped at 2 · bw · T, T here the flow's own base RTT.
 * (HPCC's cap W_max is bw · T; but T, the minimum RTT, misses the delayed ACKs and per-packet
 * serialisation that a window of data meets, and at the lab's 16-packet BDP a window of exactly bw · T ran the link at 78 %,
 * below any η: the cap then decided the rate, not u. u keeps the window near η · bw · T.)
 * Without INT (a path not through gear_int's tap) the window is w_wan alone.
 *
 * θ (η, k, W_AI, maxStage) are bounded module parameters generated from
 * api/gemini_api/specs/gear.toml (gear_theta.h); a write outside Θ' is refused.
 *
 * ss -i shows Gear's state in BBR's record: bw_lo = the last INT record's time (µs, low 32
 * bits of the guest's monotonic clock), bw_hi = its queue (bytes), min_rtt = u in 1/65536,
 * pacing_gain = w^c (packets), cwnd_gain = INT records read (bits 0–23), the others' share
 * of bw in percent (bits 24–30, eq. 6's bound) and bit 31: cross-DC.
 *
 * Fixed point: utilisation in 1/GEAR_U_ONE (2^16), windows in 1/GEAR_W_ONE packets (2^10),
 * W_AI's θ in 1/GEAR_AI_STEP_BDP_SCALE of the BDP (10^4).
 */
#include <linux/inet_diag.h>
#include <linux/module.h>
#include <net/tcp.h>

#include "cc_common.h"
#include "gear_int.h"
#include "gear_theta.h"

#define GEAR_U_SHIFT		16
#define GEAR_U_ONE		(1U << GEAR_U_SHIFT)
#define GEAR_U_MIN		(GEAR_U_ONE >> 10)	/* η / u bounded: u read as ≥ 1/1024 */
#define GEAR_W_SHIFT		10
#define GEAR_W_ONE		(1U << GEAR_W_SHIFT)
#define GEAR_W_MIN_PKTS		2
#define GEAR_W_MAX_BDPS		2	/* the window's cap, in line-rate BDPs (bw · T) */
#define GEAR_AI_RATIO_MAX	500	/* cross-DC AI step ≤ 500 · W_AI (the paper's cap) */
#define GEAR_WAN_BETA_PERCENT	70	/* w_wan's cut on loss, CUBIC's β */
#define GEAR_PERCENT		100
#define GEAR_NS_PER_US		1000ULL
#define GEAR_CROSS_FLAG		BIT(31)
#define GEAR_INFO_RECORDS_MASK	GENMASK(23, 0)	/* get_info's cwnd_gain: records read, */
#define GEAR_INFO_OTHERS_SHIFT	24		/* ... the others' share in percent, */
#define GEAR_INFO_OTHERS_MAX	127		/* ... in 7 bits */

static struct cc_param gear_theta[GEAR_THETA_NPARAMS] = {
	GEAR_THETA_PARAMS(CC_THETA_ENTRY)
};

#define GEAR_MODULE_PARAM(name, idx, def, lo, hi, desc)			\
	module_param_cb(name, &cc_param_ops, &gear_theta[idx], 0644);		\
	MODULE_PARM_DESC(name, desc);
GEAR_THETA_PARAMS(GEAR_MODULE_PARAM)

/* The intra-DC base RTT the class is relative to: configured, as the paper's basertt. */
static struct cc_param gear_dc_base_rtt = CC_PARAM_INIT(2000, 1, 10000000);
module_param_cb(dc_base_rtt_us, &cc_param_ops, &gear_dc_base_rtt, 0644);
MODULE_PARM_DESC(dc_base_rtt_us, "intra-DC base RTT (µs): cross-DC is RTT ≥ k times this");

struct gear {
	struct gear_int_cursor cursor;	/* where this flow's INT records are read from */
	u64 prev_tx;			/* the previous record's tx bytes and time */
	u64 prev_ts_ns;
	u32 u;				/* utilisation, 1/GEAR_U_ONE (0: no INT yet) */
	u32 wc;				/* reference window w^c, 1/GEAR_W_ONE packets */
	u32 w_wan;			/* WAN AIMD window, packets */
	u32 last_update_seq;		/* w^c is updated when an ACK passes this */
	u32 ql_bytes;			/* the last record's queue, for get_info */
	u32 ts_us;			/* ... and its time */
	u32 records;			/* INT records read */
	u32 prev_end_seq;		/* the previous record's segment end: own bytes between */
	u32 others;			/* other flows' share of bw at the port, 1/GEAR_U_ONE */
	u32 u_prev;			/* u(t_prev): u at the end of an eq. 4 round (eq. 5) */
	u8 yield_round;			/* the next multiplicative round applies eq. 7 */
	u8 inc_stage;
	u8 cross;			/* the flow is cross-DC */
	u8 wan_ss;			/* w_wan in slow start (no loss yet) */
};

static u32 gear_param(enum gear_theta_param p)
{
	return cc_param(&gear_theta[p]);
}

static void gear_init(struct sock *sk)
{
	struct gear *ca = inet_csk_ca(sk);
	struct tcp_sock *tp = tcp_sk(sk);

	memset(ca, 0, sizeof(*ca));
	ca->wc = tcp_snd_cwnd(tp) << GEAR_W_SHIFT;
	ca->w_wan = tcp_snd_cwnd(tp);
	ca->wan_ss = 1;
	ca->last_update_seq = tp->snd_nxt;
	cmpxchg(&sk->sk_pacing_status, SK_PACING_NONE, SK_PACING_NEEDED);
}

/* T: the flow's base RTT (µs), 0 if not measured yet. */
static u32 gear_base_rtt_us(const struct tcp_sock *tp)
{
	return cc_base_rtt_us(tp);
}

/* The RTT class, corrected by every sample (the paper's "measured at the handshake and
 * corrected by later samples"): tcp_min_rtt follows the smallest RTT seen. */
static void gear_classify(struct gear *ca, u32 base_us)
{
	ca->cross = (u64)base_us >= (u64)gear_param(GEAR_THETA_CLASS_RTT_RATIO) *
				    cc_param(&gear_dc_base_rtt);
}

/* HPCC's average over time: x ← x · (T − τ)/T + x_new · τ/T, τ ≤ T. */
static u32 gear_average(u32 x, u64 x_new, u64 tau_ns, u64 t_ns)
{
	x_new = min_t(u64, x_new, U32_MAX);
	tau_ns = min(tau_ns, t_ns);
	return div64_u64((u64)x * (t_ns - tau_ns) + x_new * tau_ns, t_ns);
}

/* The wire bytes of this flow's own segments in @payload bytes of sequence (its headers
 * put back per segment), so that what else the port sent can be told from the INT record. */
static u64 gear_own_wire_bytes(const struct sock *sk, u32 payload)
{
	const struct tcp_sock *tp = tcp_sk(sk);
	u32 mss = max_t(u32, tp->mss_cache, 1);
	u32 hdr = ETH_HLEN + inet_csk(sk)->icsk_af_ops->net_header_len + tp->tcp_header_len;

	return payload + (u64)DIV_ROUND_UP(payload, mss) * hdr;
}

/* Other flows' share of bw in τ: the port's tx less this flow's own, 1/GEAR_U_ONE. */
static u64 gear_others(const struct sock *sk, const struct gear *ca,
		       const struct gear_int_record *r, u64 tau_ns, u64 bw)
{
	u32 payload = after(r->end_seq, ca->prev_end_seq) ? r->end_seq - ca->prev_end_seq : 0;
	u64 own = gear_own_wire_bytes(sk, payload), tx = r->tx_bytes - ca->prev_tx;

	if (tx <= own)
		return 0;
	return div64_u64((tx - own) * BITS_PER_BYTE * GEAR_NS_PER_US << GEAR_U_SHIFT, tau_ns * bw);
}

/*
 * Eq. 1 for one INT record, averaged over time τ as HPCC does; and the others' share. T is the
 * network's base RTT (the paper's baseRtt, the same basertt the class is relative to), not the
 * flow's: a cross-DC flow dividing the queue by its own CRTT read a 20 times smaller queue term
 * than the intra-DC flows at the same port (u 0.93 against 1.0–1.2) and kept growing.
 */
static void gear_measure(struct sock *sk, struct gear *ca, const struct gear_int_record *r,
			 u32 base_us)
{
	u64 tau_ns = r->ts_ns - ca->prev_ts_ns, t_ns = base_us * GEAR_NS_PER_US;
	u64 bw = max_t(u64, r->rate_mbit, 1);	/* bits per µs */
	u64 u_rate, u_queue, u_new, others;
	bool first = !ca->prev_ts_ns;

	ca->records++;
	ca->ql_bytes = r->qlen_bytes;
	ca->ts_us = (u32)div_u64(r->ts_ns, GEAR_NS_PER_US);
	if (!first && r->ts_ns > ca->prev_ts_ns && t_ns) {
		/* bits/ns · 1000 = bits/µs, over bw in bits/µs */
		u_rate = div64_u64((r->tx_bytes - ca->prev_tx) * BITS_PER_BYTE * GEAR_NS_PER_US
				   << GEAR_U_SHIFT, tau_ns * bw);
		u_queue = div64_u64((u64)r->qlen_bytes * BITS_PER_BYTE << GEAR_U_SHIFT,
				    (u64)base_us * bw);
		u_new = min_t(u64, u_rate + u_queue, U32_MAX);
		others = gear_others(sk, ca, r, tau_ns, bw);
		if (!ca->u) {
			ca->u = u_new;
			ca->others = min_t(u64, others, U32_MAX);
		} else {
			ca->u = gear_average(ca->u, u_new, tau_ns, t_ns);
			ca->others = gear_average(ca->others, others, tau_ns, t_ns);
		}
		ca->u = max_t(u32, ca->u, 1);
	}
	ca->prev_tx = r->tx_bytes;
	ca->prev_ts_ns = r->ts_ns;
	ca->prev_end_seq = r->end_seq;
}

/* The line rate's BDP bw · T in window units (at least one packet). */
static s64 gear_bdp(const struct sock *sk, u32 rate_mbit, u32 base_us)
{
	u64 bytes = div_u64((u64)rate_mbit * base_us, BITS_PER_BYTE);

	return max_t(s64, div_u64(bytes << GEAR_W_SHIFT, max_t(u32, tcp_sk(sk)->mss_cache, 1)),
		     GEAR_W_ONE);
}

/*
 * W_AI in window units: ai_step_bdp/GEAR_AI_STEP_BDP_SCALE of the BDP bw · IRTT, IRTT the
 * network's base RTT (dc_base_rtt_us); cross-DC flows scale it by min(500, CRTT/IRTT).
 */
static u32 gear_ai(const struct sock *sk, const struct gear *ca, u32 base_us, u32 rate_mbit)
{
	u32 irtt_us = cc_param(&gear_dc_base_rtt);
	u64 bdp = gear_bdp(sk, rate_mbit, irtt_us);
	u64 ai = div_u64(gear_param(GEAR_THETA_AI_STEP_BDP) * bdp, GEAR_AI_STEP_BDP_SCALE);

	if (ca->cross)
		ai *= clamp_t(u32, base_us / irtt_us, 1, GEAR_AI_RATIO_MAX);
	return min_t(u64, ai, U32_MAX);
}

static u32 gear_eta(void)
{
	return gear_param(GEAR_THETA_TARGET_UTIL) * GEAR_U_ONE / GEAR_PERCENT;
}

/* x · num / den for a window x and utilisations num, den (den ≥ GEAR_U_MIN). */
static s64 gear_scale(s64 x, s64 num, u32 den)
{
	return div64_s64(x * num, max(den, GEAR_U_MIN));
}

/*
 * Eq. 6: the cross-DC flows' window w_b^c, in window units, from u(t_prev) and u(t) one round
 * after this flow's eq. 4 move. 0 when the telemetry shows less than a packet per BDP of other
 * traffic, or when u(t_prev) − η is under a packet per BDP (u's resolution: the quotient is
 * then noise); at most what the others sent (a share is never more than the traffic it is).
 */
static s64 gear_cross_share(const struct gear *ca, u32 eta, s64 bdp)
{
	s64 resolution = div64_s64((s64)GEAR_U_ONE << GEAR_W_SHIFT, bdp);
	s64 den = (s64)ca->u_prev - eta, num = (s64)ca->u - eta, share;

	if (!ca->u_prev || (s64)ca->others * bdp < (s64)GEAR_W_ONE << GEAR_U_SHIFT ||
	    abs(den) < resolution)
		return 0;
	share = div64_s64(num << GEAR_U_SHIFT, den);	/* (u(t) − η)/(u(t_prev) − η) */
	share = clamp_t(s64, share, 0, GEAR_U_ONE);
	share = min_t(s64, (share * ca->u_prev) >> GEAR_U_SHIFT, ca->others);
	return (share * bdp) >> GEAR_U_SHIFT;
}

/* Eq. 7: η/u · w^c plus this flow's part (w^c / w_a^c) of the cross-DC flows' move. */
static s64 gear_yield_window(const struct gear *ca, u32 eta, s64 bdp)
{
	s64 w = gear_scale(ca->wc, eta, ca->u), wb = gear_cross_share(ca, eta, bdp), wa;

	if (!wb)
		return w;
	wa = max_t(s64, (((s64)ca->u_prev * bdp) >> GEAR_U_SHIFT) - wb, ca->wc);
	return w + div64_s64((gear_scale(wb, eta, ca->u) - wb) * ca->wc, max_t(s64, wa, 1));
}

/*
 * Algorithm 1, lines 1–16 (intra-DC): additive rounds while the link has room; multiplicative
 * rounds alternate between eq. 4 (which sets t_prev) and eq. 7 (which uses it).
 */
static s64 gear_intra_window(struct gear *ca, u32 eta, u32 ai, s64 bdp, bool round)
{
	bool mul = ca->u >= eta || ca->inc_stage >= gear_param(GEAR_THETA_MAX_STAGE);
	s64 w;

	if (!mul) {
		if (round)
			ca->inc_stage++;
		return (s64)ca->wc + ai;
	}
	w = ca->yield_round ? gear_yield_window(ca, eta, bdp) : gear_scale(ca->wc, eta, ca->u);
	if (round) {
		ca->inc_stage = 0;
		if (!ca->yield_round)
			ca->u_prev = ca->u;
		ca->yield_round = !ca->yield_round;
	}
	return w + ai;
}

/*
 * Algorithm 1, lines 17–22 (cross-DC): within a CRTT the intra-DC flows did this flow's move
 * Δ = (η/u − 1) · w^c (eq. 8), so it moves 2Δ (eq. 9); at the CRTT's end it takes its own
 * doubled move out of u (eq. 10: u − Δ/bw) and sets w^c to the right rate for that u. The
 * corrected u is the function's own (Algorithm 1 assigns CrossCmptWind's argument u(t)): the
 * measured average is not changed (changed, each round's correction stayed in it and pushed the
 * next round's the same way). w^c stays within what the flow can send (w_wan, the cap).
 */
static s64 gear_cross_window(struct gear *ca, u32 eta, u32 ai, s64 bdp, bool round)
{
	s64 w = 2 * gear_scale(ca->wc, eta, ca->u) - ca->wc + ai;
	s64 w_top = min_t(s64, (s64)ca->w_wan << GEAR_W_SHIFT, GEAR_W_MAX_BDPS * bdp);
	s64 delta, u;

	if (round) {
		ca->wc = min_t(s64, ca->wc, w_top);
		delta = gear_scale(ca->wc, eta, ca->u) - ca->wc;
		u = (s64)ca->u - div64_s64(delta << GEAR_U_SHIFT, bdp);	/* u − Δ / (bw · T) */
		u = clamp_t(s64, u, GEAR_U_MIN, U32_MAX);
		ca->wc = clamp_t(s64, gear_scale(ca->wc, eta, u) + ai, GEAR_W_MIN_PKTS << GEAR_W_SHIFT,
				 max_t(s64, w_top, GEAR_W_MIN_PKTS << GEAR_W_SHIFT));
	}
	return w;
}

/* The window this ACK sets, by the flow's class; w^c moves at a round's end. */
static u32 gear_window(struct sock *sk, struct gear *ca, u32 base_us, u32 rate_mbit, bool round)
{
	u32 eta = gear_eta(), ai = gear_ai(sk, ca, base_us, rate_mbit);
	s64 bdp = gear_bdp(sk, rate_mbit, base_us), w;

	if (ca->cross)
		w = gear_cross_window(ca, eta, ai, bdp, round);
	else
		w = gear_intra_window(ca, eta, ai, bdp, round);
	w = clamp_t(s64, w, GEAR_W_MIN_PKTS << GEAR_W_SHIFT, GEAR_W_MAX_BDPS * bdp);
	if (round && !ca->cross)
		ca->wc = w;
	return w >> GEAR_W_SHIFT;
}

/*
 * w_wan: slow start until the first loss, then +1 packet per round (cut in gear_ssthresh); a
 * limit the flow is not using grows to no more than twice the window it sends (RFC 7661's
 * rule: unbounded, the doubling overflowed a u32 within 30 rounds while the INT window held
 * the flow, and the wrapped w_wan of 0 then held a cross-DC flow at 2 packets).
 */
static void gear_wan_round(struct gear *ca, u32 cwnd)
{
	u32 grown = ca->wan_ss ? ca->w_wan * 2 : ca->w_wan + 1;

	ca->w_wan = min(grown, max_t(u32, 2 * cwnd, GEAR_W_MIN_PKTS));
}

static void gear_set_pacing(struct sock *sk, u32 cwnd, u32 base_us)
{
	u64 rate = (u64)cwnd * tcp_sk(sk)->mss_cache * USEC_PER_SEC;

	if (base_us)
		WRITE_ONCE(sk->sk_pacing_rate,
			   min_t(u64, div_u64(rate, base_us), READ_ONCE(sk->sk_max_pacing_rate)));
}

static void gear_on_ack(struct sock *sk)
{
	struct gear *ca = inet_csk_ca(sk);
	struct tcp_sock *tp = tcp_sk(sk);
	u32 base_us = gear_base_rtt_us(tp), cwnd = tcp_snd_cwnd(tp);
	bool round = !before(tp->snd_una, ca->last_update_seq);
	struct gear_int_record r;
	bool have_int = false;

	if (!base_us)
		return;
	gear_classify(ca, base_us);
	if (!gear_int_read(sk, tp->snd_una, &ca->cursor, &r)) {
		gear_measure(sk, ca, &r, cc_param(&gear_dc_base_rtt));
		have_int = ca->u;
	}
	if (round) {
		ca->last_update_seq = tp->snd_nxt;
		gear_wan_round(ca, cwnd);
	}
	if (have_int)
		cwnd = gear_window(sk, ca, base_us, r.rate_mbit, round);
	else if (!ca->u)
		cwnd = ca->w_wan;		/* no INT on this path */
	if (ca->cross || !ca->u)
		cwnd = min(cwnd, ca->w_wan);
	cwnd = clamp_t(u32, cwnd, GEAR_W_MIN_PKTS, tp->snd_cwnd_clamp);
	tcp_snd_cwnd_set(tp, cwnd);
	gear_set_pacing(sk, cwnd, base_us);
}

#ifdef CC_CONG_CONTROL_HAS_ACK
static void gear_cong_control(struct sock *sk, u32 ack, int flag, const struct rate_sample *rs)
#else
static void gear_cong_control(struct sock *sk, const struct rate_sample *rs)
#endif
{
	gear_on_ack(sk);
}

/* A loss is WAN congestion to w_wan (an INT-controlled queue does not overflow at η < 1). */
static u32 gear_ssthresh(struct sock *sk)
{
	struct gear *ca = inet_csk_ca(sk);

	ca->wan_ss = 0;
	ca->w_wan = max_t(u32, ca->w_wan * GEAR_WAN_BETA_PERCENT / GEAR_PERCENT, GEAR_W_MIN_PKTS);
	return max_t(u32, tcp_snd_cwnd(tcp_sk(sk)) * GEAR_WAN_BETA_PERCENT / GEAR_PERCENT,
		     GEAR_W_MIN_PKTS);
}

static u32 gear_undo_cwnd(struct sock *sk)
{
	return tcp_snd_cwnd(tcp_sk(sk));
}

static size_t gear_get_info(struct sock *sk, u32 ext, int *attr, union tcp_cc_info *info)
{
	const struct gear *ca = inet_csk_ca(sk);
	u32 others;

	if (!ext)
		return 0;
	memset(&info->bbr, 0, sizeof(info->bbr));
	info->bbr.bbr_bw_lo = ca->ts_us;
	info->bbr.bbr_bw_hi = ca->ql_bytes;
	info->bbr.bbr_min_rtt = ca->u;
	info->bbr.bbr_pacing_gain = ca->wc >> GEAR_W_SHIFT;
	others = min_t(u32, ((u64)ca->others * GEAR_PERCENT) >> GEAR_U_SHIFT, GEAR_INFO_OTHERS_MAX);
	info->bbr.bbr_cwnd_gain = (ca->records & GEAR_INFO_RECORDS_MASK) |
				  others << GEAR_INFO_OTHERS_SHIFT |
				  (ca->cross ? GEAR_CROSS_FLAG : 0);
	*attr = INET_DIAG_BBRINFO;
	return sizeof(info->bbr);
}

static struct tcp_congestion_ops gear_cong_ops __read_mostly = {
	.name		= "gear",
	.owner		= THIS_MODULE,
	.init		= gear_init,
	.cong_control	= gear_cong_control,
	.ssthresh	= gear_ssthresh,
	.undo_cwnd	= gear_undo_cwnd,
	.get_info	= gear_get_info,
};

static int __init gear_register(void)
{
	BUILD_BUG_ON(sizeof(struct gear) > ICSK_CA_PRIV_SIZE);
	return tcp_register_congestion_control(&gear_cong_ops);
}

static void __exit gear_unregister(void)
{
	tcp_unregister_congestion_control(&gear_cong_ops);
}

module_init(gear_register);
module_exit(gear_unregister);

MODULE_AUTHOR("Gemini");
MODULE_LICENSE("GPL");
MODULE_DESCRIPTION("Gear: INT-driven windows for intra- and cross-datacenter flows");
MODULE_VERSION("0.1.0");
