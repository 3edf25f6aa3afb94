// SPDX-License-Identifier: GPL-2.0
/*
 * Fusion: a white-box congestion control whose fixed logic is steered by θ.
 *
 * Gemini (Yang et al., "Divide-and-Conquer for Practical Learning-Based Internet Congestion
 * Control") splits congestion control in two: this module's control logic never changes, and a
 * central optimiser (Booster) tunes the seven numbers θ = {ω, α, γ, λ, l, δ, n} per network
 * context. Each flow takes its θ from the profile matching its destination when it starts
 * (fusion_profiles.c) and keeps it for life, so every flow's outcome is attributable to one θ.
 *
 * Measurements. Time is cut into sampling intervals of a quarter of the minimum RTT. For each
 * interval Fusion keeps the highest delivery rate (from the kernel's rate samples, tcp_rate.c)
 * and the lowest and highest RTT sample. A sliding window of the latest n intervals gives
 *   R^max  the highest delivery rate,
 *   T^min  the lowest RTT,           T^max  the highest RTT,
 * through windowed min/max filters (three samples each, as the kernel's win_minmax), and the
 * latest round trip (its four intervals) gives T^min_1, the current RTT with what jitter it
 * cannot hide (as Vegas takes a round trip's lowest sample for its current RTT). A queue
 * raises every sample of a round trip; jitter raises some, and within a single interval of a
 * small window, a handful of ACKs, it can raise them all: on a Wi-Fi-like hop (20 ms, ±5 ms
 * of jitter that does not reorder, 0.5 % loss) T^min_1 over one interval read the jitter as a
 * queue and the delay signal held the flow at 4.4 Mbit/s of 30 (with δ = 100 %, 28.2); over
 * the round trip, 27.4. Slow start keeps the latest interval: HyStart's bar guards it against
 * jitter already, and a round trip's lag there overshot the buffer (Ethernet: 354 segments
 * retransmitted against 183). The estimated BDP is R^max · T^min. The loss rate L is
 * packets marked lost over packets delivered or lost, over the current and previous round trip
 * and only of data sent since the latest reduction (see "One reduction per episode" below);
 * L > l is judged by a one-sided test (two standard deviations above a loss process at rate l),
 * so that a round of a few packets with one loss does not read as a loss rate of many percent.
 *
 * Congestion signal (eq. 1): L > l, or T^min_1 − T^min > δ · (T^max − T^min). δ = 100 %
 * therefore switches the delay signal off, and l = 0 makes any loss a signal. The default l is
 * 1 % (fusion.toml): at 0.5 %, below the satellite path's 0.74 % of random loss, the loss
 * signal kept the flow at 5.1 Mbit/s of 45; at 1 %, 29.0. The RTT range has
 * a floor of T^min / 16 (at least 1 ms): without it, a path with no queue at all would read its
 * own sub-millisecond jitter as a full queue and cut the window for nothing.
 *
 * Slow start (eq. 2): the window grows by the packets acknowledged, W ← W + acked, and never
 * below twice the estimated BDP: W' = max(2 · R^max · T^min, W), from W_0 = ω. Slow start ends
 * at a congestion signal or at a HyStart-style delay exit: the minimum of a round's first eight
 * RTT samples exceeds the flow's minimum RTT by an eighth of it (clamped to 4..16 ms). While in
 * slow start the RTT range is not learnt yet, so the delay signal also needs a rise past that
 * same bar: jitter of a few milliseconds must not end slow start at the initial window.
 *
 * Recovery (eq. 3): on a congestion signal, W' = λ · W. At the exit from slow start with a queue,
 * W' is also at most the estimated BDP: the exit test sees the queue a round trip late, when
 * slow start has doubled the window past the BDP, and a gentle λ would drain that overshoot
 * only one cut per round trip (BBR's DRAIN answers the same overshoot; fusion_reduced_cwnd).
 * A delay exit has seen a queue by its own bar, which on a path over 512 ms (HyStart's 16 ms
 * against T^min / 32) is below the queue bar of eq. 4's probe: on lowrate-lossy (600 ms,
 * 2 Mbit/s) exits between the two bars were cut by λ alone, from 218 packets to 193 against a
 * BDP of 100, so a delay exit drains to the estimate whatever the probe's bar says.
 * The reduction runs through the kernel's CWR or Recovery state and reaches W' by proportional
 * rate reduction (RFC 6937): the window follows the packets delivered instead of collapsing at
 * once. It ends when the socket leaves CWR or Recovery, or when what was sent before it is
 * acknowledged, whichever comes first: on a long lossy path one recovery episode follows the
 * next within a single ACK, and a reduction that waited for the socket to leave Recovery ran
 * PRR for the rest of the flow, the window falling by a segment per loss. At most one reduction
 * per round trip; a reduction the signal started for a loss is given back if the stack proves
 * the losses spurious (undo), one started for delay is not.
 *
 * Slow start's overshoot is no part of the RTT range. The exit sees the queue a round trip
 * late, so the window peaks near twice the BDP, and on a buffer of one BDP that is up to a
 * round trip of queue (lowrate-lossy: 250 packets against a BDP of 100, RTT samples up to
 * 1.1 s against 600 ms). Kept in T^max, that peak put eq. 1's delay bar at δ of some 450 ms
 * for n intervals (6 s at the default n), and the window crept from the BDP to 123 packets,
 * 120 ms of queue, before the signal fired. So the exit restarts T^max from T^min and holds
 * it there, and holds the delay signal too (the exit's reduction is draining that queue
 * already), until the overshoot has drained: until what was sent up to the end of the exit's
 * reduction is acknowledged, or FUSION_DRAIN_INTERVALS_MAX intervals at most. Restarting T^max
 * at the end of the reduction alone was too early: data sent during the reduction still
 * queued behind the peak, and its samples put T^max back at 1,070 ms a round trip later.
 *
 * One reduction per episode. Losses of data sent before a reduction belong to the congestion
 * that reduction answers, as in standard TCP (RFC 5681 and 6582's recovery point, the stack's
 * high_seq): from the cut until what was sent before it (snd_nxt then) is acknowledged, the
 * loss test tallies neither losses nor deliveries, and the cut clears the tallies of the two
 * round trips it read, which hold that episode's losses. Without this the two-round span read
 * one episode in the round of the cut and again in the next, and the losses the stack marks
 * late read once more: on a buffer of a fifth of the BDP (shallow-buffer) one overflow cut the
 * window three or four times within two round trips (114 → 96 → 85 → 72 packets against a BDP
 * of 83), so the window spent a round or two below the BDP after every overflow. Reading each
 * episode once, 1–2 cuts (96 → 81; a second one, a round later, is not the episode's losses)
 * and 47.3 Mbit/s of 50 instead of 45.3. The delay signal is not held back in an episode.
 *
 * Tolerated loss. Losses whose rate stays at or below l are no signal: they are repaired
 * without any reduction, and the window keeps growing by eqs. 2 and 4 meanwhile. The kernel
 * still enters Recovery to retransmit, but asks ssthresh() only how far to reduce; Fusion
 * answers "not at all" and, unlike the stack's own reduction (tcp_cwnd_reduction, and the
 * reset to ssthresh in tcp_end_cwnd_reduction, both skipped for a CC with cong_control), runs
 * PRR only while a reduction of its own is under way; an episode the stack starts within such
 * a reduction keeps the reduction's target (the stack asks ssthresh() again at each new
 * Recovery, and "not at all" lifted the target back to the window: on lowrate-lossy a
 * slow-start exit cut from 257 packets to the BDP of 89 ended at 148, and the flow queued
 * 78 ms on average instead of 30). The retransmissions go out within the
 * window, as BBR's do after its first round of recovery (bbr_set_cwnd_to_recover_or_restore),
 * and pacing (eq. 5) keeps them from bursting. Before this, a tolerated loss froze the window
 * for the whole of Recovery; on a long path with random loss (800 ms, 0.74 %, thousands of
 * packets in flight) nearly every round trip has a loss, so the window hardly ever grew.
 *
 * Avoidance (eq. 4): once per round trip, W' = max(α · R^max · T^min, W) + s: multiplicative
 * growth while the BDP estimate keeps rising, additive growth otherwise. R^max is what this
 * flow delivered over the latest n intervals, so it can never show capacity the window has not
 * yet used: when the path's capacity rises (a cellular link between rate changes), the
 * estimate is stale, α · R^max · T^min adds nothing beyond W, and γ packets per round alone
 * would take minutes to fill a long path. What tells a stale estimate from a full path is the
 * queue: while the latest round trip's minimum RTT stays within T^min / 32 (at least 1 ms) of
 * T^min, and the estimated BDP R^max · T^min rose since the round before (by a packet or
 * more: the window's last steps reached the receiver as delivery), the window is what limits
 * delivery, and the step s doubles each round trip, up to W / 8 per round. Once a queue
 * shows, or the estimate stops rising, s is γ again, and a congestion signal (eq. 1) resets
 * it too. A probe that doubled regardless of the queue filled buffers: on the Ethernet path
 * it raised mean queueing from 16 to 65 ms for 4 % more throughput. One that doubled on the
 * RTT alone doubled on stale news: those samples are a round trip old and miss the latest
 * steps, and after each cut, with W back at α · R^max · T^min, a full path's queue is still
 * under the bar. On lowrate-lossy it doubled to W / 8 (T^min / 8, 75 ms, of queue a round)
 * after every cut, 103 → 107 → 115 → 129 packets against a BDP of 100, and the flow queued
 * 49–60 ms on average; a full path's estimate does not rise, so the probe stays at γ there.
 *
 * Pacing (eq. 5): R = W / T^min, set as the socket's pacing rate with internal pacing
 * requested, so it holds with or without the fq qdisc.
 *
 * Fixed point: delivery rates are packets per microsecond scaled by 2^FUSION_BW_SCALE; θ stays
 * in the spec's integer units (α and λ in hundredths, l in tenths of a percent, δ in percent).
 */
#include <linux/inet_diag.h>
#include <linux/module.h>
#include <linux/slab.h>
#include <linux/version.h>
#include <net/genetlink.h>
#include <net/tcp.h>

#include "fusion.h"

#define FUSION_BW_SCALE		24
#define FUSION_BW_UNIT		(1 << FUSION_BW_SCALE)
#define FUSION_CWND_MIN		4		/* packets: keep the ACK clock alive */
#define FUSION_INTERVALS_PER_RTT	4	/* a sampling interval is a quarter RTT */
#define FUSION_SIGNAL_INTERVALS	FUSION_INTERVALS_PER_RTT	/* T^min_1: the latest round trip */
#define FUSION_INTERVAL_MIN_US	1000		/* ...but never shorter than this */
#define FUSION_RTT_UNKNOWN_US	100000		/* stand-in before any RTT sample */
#define FUSION_RTT_RANGE_MIN_SHIFT	4	/* RTT range floor: T^min / 16 ... */
#define FUSION_RTT_RANGE_MIN_US	1000		/* ...and at least 1 ms */
#define FUSION_HYSTART_SAMPLES	8
#define FUSION_HYSTART_DELAY_MIN_US	4000
#define FUSION_HYSTART_DELAY_MAX_US	16000
#define FUSION_HYSTART_DELAY_SHIFT	3	/* exit at min RTT + min RTT / 8 */
/* l counts tenths of a percent, so a loss rate compares against l / (100 · scale) */
#define FUSION_LOSS_DENOM	(100 * FUSION_LOSS_THRESHOLD_SCALE)
#define FUSION_LOSS_SIGMAS	2		/* one-sided test of L > l, see below */
#define FUSION_RTT_DENOM	(100 * FUSION_RTT_THRESHOLD_SCALE)
#define FUSION_GAIN_SHIFT	8		/* ss -i shows α as a gain << 8, as BBR's gains */
#define FUSION_PROBE_MAX_SHIFT	3		/* avoidance step at most W / 8 per round */
#define FUSION_PROBE_QUEUE_SHIFT	5	/* probe while the queue is under T^min / 32 */
/* after slow start's exit, T^max and the delay signal wait at most 8 round trips for the drain */
#define FUSION_DRAIN_INTERVALS_MAX	(8 * FUSION_INTERVALS_PER_RTT)

enum fusion_mode {
	FUSION_SLOW_START,
	FUSION_AVOIDANCE,
};

/* Why Fusion reduces its window (eq. 1's two signals); NONE while it is not reducing. */
enum fusion_cut {
	FUSION_CUT_NONE,
	FUSION_CUT_LOSS,
	FUSION_CUT_DELAY,
};

/* Windowed min or max over the latest win intervals, after Kathleen Nichols' algorithm. */
struct fusion_minmax_sample {
	u32 t;
	u32 v;
};

struct fusion_minmax {
	struct fusion_minmax_sample s[3];
};

struct fusion_flow {
	struct fusion_profile theta;		/* snapshot taken when the flow started */

	struct fusion_minmax bw_max;		/* R^max over n intervals */
	struct fusion_minmax rtt_min;		/* T^min over n intervals */
	struct fusion_minmax rtt_max;		/* T^max over n intervals */
	u64 interval_start_us;
	u32 interval;				/* index of the current interval */
	u32 interval_bw;
	u32 interval_rtt_min_us;
	u32 interval_rtt_max_us;
	u32 recent_rtt_min_us[FUSION_SIGNAL_INTERVALS];	/* the latest round trip's */
	u32 recent_slot;

	u32 round;				/* round trips so far */
	u32 next_round_delivered;
	u32 round_delivered;
	u32 round_lost;
	u32 prev_round_delivered;
	u32 prev_round_lost;
	u32 cut_round;				/* round of the latest reduction, + 1 */
	u32 reduction_end_seq;			/* the reduction and its episode are over once acked */
	u32 probe_step;				/* eq. 4's additive step: γ, doubling */
	u32 probe_bdp;				/* R^max · T^min at the latest round's eq. 4 */
	u32 ss_rtt_min_us;			/* HyStart: min of this round's first samples */
	u8 ss_samples;
	u8 mode;
	u8 prev_ca_state;
	bool round_start;
	u8 cutting;				/* ssthresh() is asked on our own signal */
	u8 reduction;				/* the reduction (eq. 3) under way, if any */
	bool queue_free;			/* latest interval: no queue beyond the floor */
	bool queue_seen;			/* latest interval: RTT samples above the floor */
	bool episode;				/* data sent before the latest reduction unacked */
	bool exit_drain;			/* slow start's overshoot drains: T^max waits */
	u32 exit_interval;			/* the interval of slow start's exit */
	u32 drain_end_seq;			/* the drain is over once this is acked */
	bool drain_ending;			/* the exit's reduction is over: drain_end_seq set */

	/* for the flow record; counters mirrored per ACK, since an abortive close zeroes them */
	struct fusion_endpoints ends;
	u64 bytes_acked;
	u32 retrans;
	u32 segs_out;
	u64 start_us;
	u64 last_ack_us;
	u64 rtt_sum_us;
	u32 rtt_samples;
	u32 flow_rtt_min_us;
};

static struct kmem_cache *fusion_flow_cache __read_mostly;

static struct fusion_flow *fusion_flow(const struct sock *sk)
{
	return *(struct fusion_flow **)inet_csk_ca(sk);
}

static bool fusion_better(u32 a, u32 b, bool is_max)
{
	return is_max ? a >= b : a <= b;
}

static void fusion_minmax_reset(struct fusion_minmax *m, u32 t, u32 v)
{
	m->s[0].t = m->s[1].t = m->s[2].t = t;
	m->s[0].v = m->s[1].v = m->s[2].v = v;
}

/* Add sample v at interval t; keep the best of the latest win intervals in s[0]. */
static void fusion_minmax_update(struct fusion_minmax *m, u32 win, u32 t, u32 v, bool is_max)
{
	struct fusion_minmax_sample val = { .t = t, .v = v };
	u32 dt;

	if (fusion_better(v, m->s[0].v, is_max) || t - m->s[2].t > win) {
		fusion_minmax_reset(m, t, v);
		return;
	}
	if (fusion_better(v, m->s[1].v, is_max))
		m->s[2] = m->s[1] = val;
	else if (fusion_better(v, m->s[2].v, is_max))
		m->s[2] = val;

	/* age out the best sample; keep the second and third as later candidates */
	dt = t - m->s[0].t;
	if (dt > win) {
		m->s[0] = m->s[1];
		m->s[1] = m->s[2];
		m->s[2] = val;
		if (t - m->s[0].t > win) {
			m->s[0] = m->s[1];
			m->s[1] = m->s[2];
		}
	} else if (m->s[1].t == m->s[0].t && dt > win / 4) {
		m->s[2] = m->s[1] = val;
	} else if (m->s[2].t == m->s[1].t && dt > win / 2) {
		m->s[2] = val;
	}
}

static u32 fusion_theta(const struct fusion_flow *f, enum fusion_theta_param p)
{
	return f->theta.theta[p];
}

static u32 fusion_min_rtt_us(const struct fusion_flow *f)
{
	return f->rtt_min.s[0].v;
}

static bool fusion_have_rtt(const struct fusion_flow *f)
{
	return f->rtt_min.s[0].v != U32_MAX;
}

/* R^max · T^min in packets, times gain_num / gain_den. */
static u32 fusion_bdp(const struct fusion_flow *f, u32 gain_num, u32 gain_den)
{
	u64 bdp;

	if (!fusion_have_rtt(f))
		return 0;
	bdp = (u64)f->bw_max.s[0].v * fusion_min_rtt_us(f) * gain_num;
	return div_u64(bdp >> FUSION_BW_SCALE, gain_den);
}

/*
 * L > l over the current and the previous round trip, as a one-sided test: the losses must
 * exceed what a loss process at rate l would give by FUSION_LOSS_SIGMAS standard deviations
 * (Poisson), lost > l·N + k·sqrt(l·N). A round of ten packets with one loss is not a 10 % loss
 * rate; a burst from a full queue still is. With l = 0 any loss is a signal.
 */
static bool fusion_loss_signal(const struct fusion_flow *f)
{
	u64 lost = (u64)f->round_lost + f->prev_round_lost;
	u64 total = lost + f->round_delivered + f->prev_round_delivered;
	u64 expected = fusion_theta(f, FUSION_THETA_LOSS_THRESHOLD) * total;	/* x DENOM */
	u64 excess;

	if (!lost || lost * FUSION_LOSS_DENOM <= expected)
		return false;
	excess = lost * FUSION_LOSS_DENOM - expected;
	return excess * excess > FUSION_LOSS_SIGMAS * FUSION_LOSS_SIGMAS * FUSION_LOSS_DENOM * expected;
}

/* HyStart's bar for "the queue is growing": min RTT / 8, clamped to 4..16 ms. */
static u32 fusion_hystart_thresh_us(u32 base_us)
{
	return clamp_t(u32, base_us >> FUSION_HYSTART_DELAY_SHIFT,
		       FUSION_HYSTART_DELAY_MIN_US, FUSION_HYSTART_DELAY_MAX_US);
}

/*
 * T^min_1 − T^min > δ · (T^max − T^min), on the interval just closed. The RTT range is taken
 * as at least T^min / 2^FUSION_RTT_RANGE_MIN_SHIFT (and FUSION_RTT_RANGE_MIN_US): with an
 * empty queue the range is only timer and ACK jitter, and a share of jitter is no signal.
 * In slow start the range is not learnt yet, so the rise must also clear HyStart's bar: a
 * few milliseconds of jitter in the first round trips would otherwise end slow start at the
 * initial window, and on a long path avoidance takes many seconds to win that back.
 */
static bool fusion_delay_signal(const struct fusion_flow *f, u32 latest_min_us)
{
	u32 tmin = fusion_min_rtt_us(f), tmax = f->rtt_max.s[0].v;
	u32 range = max3(tmax > tmin ? tmax - tmin : 0, tmin >> FUSION_RTT_RANGE_MIN_SHIFT,
			 (u32)FUSION_RTT_RANGE_MIN_US);

	if (latest_min_us <= tmin)
		return false;
	if (f->mode == FUSION_SLOW_START &&
	    latest_min_us - tmin < fusion_hystart_thresh_us(tmin))
		return false;
	return (u64)(latest_min_us - tmin) * FUSION_RTT_DENOM >
	       (u64)fusion_theta(f, FUSION_THETA_RTT_THRESHOLD) * range;
}

/*
 * Eq. 3's target, λ · W. Leaving slow start with a queue, the target is also at most the
 * estimated BDP, R^max · T^min: the exit test sees a queue a round trip after it began, and
 * slow start doubles the window in that round trip, so the exit finds up to twice the BDP in
 * flight. Cut by λ alone, a gentle λ drained that one cut per round trip (ethernet, λ = 0.95:
 * from 371 packets to the BDP of 190 over 6 s). Once a queue shows, the bottleneck is busy and
 * the delivery rate is its rate, so R^max · T^min is what the path holds without a queue
 * (BBR drains its startup's queue to the same estimate, in DRAIN). Without a queue in the
 * latest interval's RTT samples (slow start ended by random loss, or no samples yet: a long
 * path's first intervals) the delivery rate is only what the window sent, a round trip ago,
 * and λ · W stands. A first version that took "no sample" for a queue cut a satellite flow's
 * window at 63 packets to half of that and cost it 12 Mbit/s. In avoidance W is taken as it
 * is, the delay signal keeping its queue small.
 */
static u32 fusion_reduced_cwnd(const struct sock *sk, const struct fusion_flow *f)
{
	u32 cwnd = tcp_snd_cwnd(tcp_sk(sk)), bdp = fusion_bdp(f, 1, 1);
	u32 target = cwnd * fusion_theta(f, FUSION_THETA_MULT_DECREASE) /
		     FUSION_MULT_DECREASE_SCALE;

	if (f->mode == FUSION_SLOW_START && (f->queue_seen || f->cutting == FUSION_CUT_DELAY) &&
	    bdp)
		target = min(target, bdp);
	return max_t(u32, target, FUSION_CWND_MIN);
}

/* The exit's reduction is over: once what it sent is acked, the overshoot has drained. */
static void fusion_drain_ends(struct fusion_flow *f, const struct tcp_sock *tp)
{
	if (f->exit_drain && !f->drain_ending) {
		f->drain_end_seq = tp->snd_nxt;
		f->drain_ending = true;
	}
}

/*
 * Eq. 3 decided: this round's reduction, its cause, and eq. 4's step back to γ. The reduction
 * lasts until what was sent before it is acknowledged (the stack's high_seq for its own
 * episodes), not until the socket leaves Recovery: on a long lossy path one recovery episode
 * ends and the next begins within a single ACK, the socket is never seen outside Recovery,
 * and a reduction waiting for that kept PRR running for the rest of the flow; with losses in
 * every ACK PRR sends only what is delivered, so the window followed the packets in flight
 * down (satellite: 1,970 to 1,284 segments over 28 s) and eq. 4 never ran again.
 */
static void fusion_note_cut(struct sock *sk, struct fusion_flow *f, enum fusion_cut cause)
{
	if (f->mode == FUSION_SLOW_START) {	/* the overshoot is no part of the RTT range */
		f->exit_drain = true;
		f->drain_ending = false;
		f->exit_interval = f->interval;
		fusion_minmax_reset(&f->rtt_max, f->interval, fusion_min_rtt_us(f));
	}
	f->mode = FUSION_AVOIDANCE;
	f->reduction = cause;
	f->reduction_end_seq = tcp_sk(sk)->snd_nxt;
	f->episode = true;		/* this cut answers the losses tallied so far */
	f->round_lost = f->prev_round_lost = 0;
	f->round_delivered = f->prev_round_delivered = 0;
	f->cut_round = f->round + 1;
	f->probe_step = fusion_theta(f, FUSION_THETA_ADD_INCREASE);
}

/*
 * A signal while the socket repairs tolerated losses in Recovery: the reduction starts here,
 * from the window reached meanwhile, with PRR's accounting begun afresh as the stack's own
 * tcp_init_cwnd_reduction() would have at the start of Recovery.
 */
static void fusion_start_prr(struct sock *sk, struct fusion_flow *f)
{
	struct tcp_sock *tp = tcp_sk(sk);

	tp->prior_cwnd = tcp_snd_cwnd(tp);
	tp->prr_delivered = 0;
	tp->prr_out = 0;
	tp->snd_ssthresh = fusion_reduced_cwnd(sk, f);
}

/* Eq. 3: start a reduction to λ · W, at most once per round trip. */
static void fusion_congestion(struct sock *sk, struct fusion_flow *f, enum fusion_cut cause)
{
	struct tcp_sock *tp = tcp_sk(sk);
	u8 state = inet_csk(sk)->icsk_ca_state;

	/* the mode leaves slow start only once the target is set: it depends on it */
	if (f->cut_round == f->round + 1 || state == TCP_CA_Loss) {
		f->mode = FUSION_AVOIDANCE;	/* cut this round already; a timeout reduced */
		return;
	}
	if (state < TCP_CA_CWR) {
		f->cutting = cause;
		tcp_enter_cwr(sk);		/* asks fusion_ssthresh() for the target */
		f->cutting = FUSION_CUT_NONE;
		return;
	}
	f->cutting = cause;
	if (f->reduction)			/* reducing already: lower the target */
		tp->snd_ssthresh = min(tp->snd_ssthresh, fusion_reduced_cwnd(sk, f));
	else					/* repairing tolerated losses: reduce now */
		fusion_start_prr(sk, f);
	f->cutting = FUSION_CUT_NONE;
	fusion_note_cut(sk, f, cause);
}

static void fusion_sample_rtt(struct fusion_flow *f, u32 rtt_us)
{
	f->interval_rtt_min_us = min(f->interval_rtt_min_us, rtt_us);
	f->interval_rtt_max_us = max(f->interval_rtt_max_us, rtt_us);
	f->flow_rtt_min_us = min(f->flow_rtt_min_us, rtt_us);
	f->rtt_sum_us += rtt_us;
	f->rtt_samples++;
	if (f->ss_samples < FUSION_HYSTART_SAMPLES) {
		f->ss_rtt_min_us = min(f->ss_rtt_min_us, rtt_us);
		f->ss_samples++;
	}
}

static void fusion_start_round(struct fusion_flow *f, const struct tcp_sock *tp)
{
	f->next_round_delivered = tp->delivered;
	f->round++;
	f->round_start = true;
	f->prev_round_delivered = f->round_delivered;
	f->prev_round_lost = f->round_lost;
	f->round_delivered = 0;
	f->round_lost = 0;
	f->ss_rtt_min_us = U32_MAX;
	f->ss_samples = 0;
}

/* Per-ACK bookkeeping: RTT and delivery-rate samples, loss tallies, round trips. */
static void fusion_sample(struct fusion_flow *f, const struct tcp_sock *tp,
			  const struct rate_sample *rs)
{
	f->round_start = false;
	if (rs->rtt_us > 0)
		fusion_sample_rtt(f, rs->rtt_us);
	if (f->episode && !before(tp->snd_una, f->reduction_end_seq))
		f->episode = false;
	if (!f->episode) {	/* an episode's losses were answered by its reduction */
		f->round_delivered += rs->acked_sacked;
		f->round_lost += rs->losses;
	}
	if (rs->acked_sacked)
		f->last_ack_us = tp->tcp_mstamp;
	f->bytes_acked = tp->bytes_acked;
	f->retrans = tp->total_retrans;
	f->segs_out = tp->segs_out;
	if (rs->delivered <= 0 || rs->interval_us <= 0)
		return;
	if (!before(rs->prior_delivered, f->next_round_delivered))
		fusion_start_round(f, tp);
	/* app-limited samples understate the path; keep them only if they raise the max */
	if (!rs->is_app_limited || rs->delivered * (u64)FUSION_BW_UNIT >
	    (u64)f->bw_max.s[0].v * rs->interval_us)
		f->interval_bw = max_t(u32, f->interval_bw,
				       div_u64((u64)rs->delivered * FUSION_BW_UNIT, rs->interval_us));
}

/* T^min once measured; before that the smoothed RTT, or a stand-in before any sample. */
static u32 fusion_rtt_us(const struct fusion_flow *f, const struct tcp_sock *tp)
{
	if (fusion_have_rtt(f))
		return fusion_min_rtt_us(f);
	return tp->srtt_us ? tp->srtt_us >> 3 : FUSION_RTT_UNKNOWN_US;
}

static u32 fusion_interval_us(const struct fusion_flow *f, const struct tcp_sock *tp)
{
	return max_t(u32, fusion_rtt_us(f, tp) / FUSION_INTERVALS_PER_RTT, FUSION_INTERVAL_MIN_US);
}

/* No queue to speak of: T^min_1 (or an interval's minimum) within T^min / 32 (>= 1 ms) of T^min */
static bool fusion_queue_free(const struct fusion_flow *f, u32 latest_min_us)
{
	u32 tmin = fusion_min_rtt_us(f);
	u32 slack = max_t(u32, tmin >> FUSION_PROBE_QUEUE_SHIFT, FUSION_RTT_RANGE_MIN_US);

	return latest_min_us <= tmin + slack;
}

/*
 * T^min_1: the lowest RTT of the latest round trip (its FUSION_SIGNAL_INTERVALS intervals),
 * U32_MAX if none of them had a sample. A queue raises every sample of a round trip; jitter
 * raises only some, and within a quarter RTT (a handful of ACKs) it can raise them all.
 */
static u32 fusion_round_min_us(struct fusion_flow *f, u32 interval_min_us)
{
	u32 i, lowest = U32_MAX;

	f->recent_rtt_min_us[f->recent_slot++ % FUSION_SIGNAL_INTERVALS] = interval_min_us;
	for (i = 0; i < FUSION_SIGNAL_INTERVALS; i++)
		lowest = min(lowest, f->recent_rtt_min_us[i]);
	return lowest;
}

/* Close the sampling interval: feed the window filters, then test eq. 1. */
static void fusion_close_interval(struct sock *sk, struct fusion_flow *f, u64 now)
{
	u32 n = fusion_theta(f, FUSION_THETA_WINDOW_INTERVALS);
	u32 len = fusion_interval_us(f, tcp_sk(sk));
	u32 elapsed = div_u64(now - f->interval_start_us, len);
	u32 interval_min = f->interval_rtt_min_us;
	u32 round_min = fusion_round_min_us(f, interval_min);
	u32 signal_min = f->mode == FUSION_SLOW_START ? interval_min : round_min;

	/* an idle gap ages the window by the intervals it spanned */
	f->interval += min(elapsed, n + 1);
	f->interval_start_us = now;
	if (f->interval_bw)
		fusion_minmax_update(&f->bw_max, n, f->interval, f->interval_bw, true);
	if (f->exit_drain && ((f->drain_ending && !before(tcp_sk(sk)->snd_una, f->drain_end_seq)) ||
			      f->interval - f->exit_interval > FUSION_DRAIN_INTERVALS_MAX)) {
		f->exit_drain = false;		/* drained: T^max restarts from T^min */
		fusion_minmax_reset(&f->rtt_max, f->interval, fusion_min_rtt_us(f));
	} else if (interval_min != U32_MAX && !f->exit_drain) {
		fusion_minmax_update(&f->rtt_max, n, f->interval, f->interval_rtt_max_us, true);
	}
	if (interval_min != U32_MAX)
		fusion_minmax_update(&f->rtt_min, n, f->interval, interval_min, false);
	f->interval_bw = 0;
	f->interval_rtt_min_us = U32_MAX;
	f->interval_rtt_max_us = 0;

	/*
	 * No samples show neither (a long path's first round trips). The probe waits for a whole
	 * round trip without a queue; slow start's exit drains on the latest interval's queue.
	 */
	f->queue_free = round_min != U32_MAX && fusion_queue_free(f, round_min);
	f->queue_seen = interval_min != U32_MAX && !fusion_queue_free(f, interval_min);
	if (fusion_loss_signal(f))
		fusion_congestion(sk, f, FUSION_CUT_LOSS);
	else if (!f->exit_drain && signal_min != U32_MAX && fusion_delay_signal(f, signal_min))
		fusion_congestion(sk, f, FUSION_CUT_DELAY);
}

/* HyStart-style delay exit from slow start, once a round has its first samples. */
static bool fusion_hystart_exit(struct fusion_flow *f)
{
	u32 base = f->flow_rtt_min_us;

	if (f->ss_samples != FUSION_HYSTART_SAMPLES || base == U32_MAX)
		return false;
	f->ss_samples++;			/* decide once per round */
	return f->ss_rtt_min_us >= base + fusion_hystart_thresh_us(base);
}

/* Proportional rate reduction (RFC 6937) toward snd_ssthresh while Fusion reduces (eq. 3). */
static u32 fusion_prr_cwnd(struct sock *sk, const struct rate_sample *rs)
{
	struct tcp_sock *tp = tcp_sk(sk);
	int in_flight = tcp_packets_in_flight(tp);
	int delta = (int)tp->snd_ssthresh - in_flight;
	int delivered = rs->acked_sacked;
	int sndcnt;

	if (delivered <= 0 || !tp->prior_cwnd)
		return tcp_snd_cwnd(tp);
	tp->prr_delivered += delivered;
	if (delta < 0) {
		u64 share = (u64)tp->snd_ssthresh * tp->prr_delivered + tp->prior_cwnd - 1;

		sndcnt = (int)div_u64(share, tp->prior_cwnd) - (int)tp->prr_out;
	} else {
		/* slow-start reduction bound: send no faster than the ACKs arrive */
		sndcnt = rs->losses ? delivered :
			 max_t(int, tp->prr_delivered - tp->prr_out, delivered);
		sndcnt = min(delta, sndcnt);
	}
	sndcnt = max(sndcnt, tp->prr_out ? 0 : 1);	/* let the fast retransmit out */
	return in_flight + sndcnt;
}

/*
 * Eq. 4 once per round: W' = max(α · R^max · T^min, W) + s; s doubles while no queue shows
 * and the estimated BDP keeps rising (by a packet or more since the round before).
 */
static u32 fusion_avoid_cwnd(struct fusion_flow *f, u32 cwnd)
{
	u32 gamma_pkts = fusion_theta(f, FUSION_THETA_ADD_INCREASE);
	u32 bdp = fusion_bdp(f, 1, 1);
	bool rising = bdp > f->probe_bdp;
	u32 step = f->queue_free ? f->probe_step : gamma_pkts;

	f->probe_bdp = bdp;
	cwnd = max(fusion_bdp(f, fusion_theta(f, FUSION_THETA_MULT_INCREASE),
			      FUSION_MULT_INCREASE_SCALE), cwnd) + step;
	f->probe_step = f->queue_free && rising ?
			max(min(step << 1, cwnd >> FUSION_PROBE_MAX_SHIFT), gamma_pkts) : gamma_pkts;
	return cwnd;
}

/* Slow start and avoidance: in Open and Disorder, and while tolerated losses are repaired. */
static u32 fusion_grow_cwnd(struct sock *sk, struct fusion_flow *f, u32 cwnd, u32 acked)
{
	if (!tcp_is_cwnd_limited(sk))
		return cwnd;
	if (f->mode == FUSION_SLOW_START) {
		cwnd = max(cwnd + acked, fusion_bdp(f, 2, 1));			/* eq. 2 */
		if (fusion_hystart_exit(f))
			fusion_congestion(sk, f, FUSION_CUT_DELAY);
		return cwnd;
	}
	if (f->round_start)
		cwnd = fusion_avoid_cwnd(f, cwnd);
	return cwnd;
}

/*
 * A reduction under way is over once the socket has left CWR and Recovery, or (short of a
 * timeout) once what was sent before the cut is acknowledged.
 */
static bool fusion_reduction_over(const struct tcp_sock *tp, const struct fusion_flow *f,
				  u8 state)
{
	if (!f->reduction)
		return false;
	if (state < TCP_CA_CWR)
		return true;
	return state != TCP_CA_Loss && !before(tp->snd_una, f->reduction_end_seq);
}

/*
 * The socket is back in Open or Disorder, or what was sent before the cut is acknowledged:
 * Fusion's reduction is over. Settle on its target
 * (tcp_end_cwnd_reduction() leaves that to a CC with cong_control), unless undo already
 * restored the window: fusion_undo_cwnd() clears the reduction then.
 */
static u32 fusion_end_reduction(struct sock *sk, struct fusion_flow *f, u32 cwnd)
{
	const struct tcp_sock *tp = tcp_sk(sk);

	f->reduction = FUSION_CUT_NONE;
	fusion_drain_ends(f, tp);
	if (f->prev_ca_state == TCP_CA_CWR || f->prev_ca_state == TCP_CA_Recovery)
		return min(cwnd, tp->snd_ssthresh);
	return cwnd;
}

static void fusion_set_cwnd(struct sock *sk, struct fusion_flow *f, const struct rate_sample *rs)
{
	struct tcp_sock *tp = tcp_sk(sk);
	u8 state = inet_csk(sk)->icsk_ca_state;
	u32 cwnd = tcp_snd_cwnd(tp);

	if (fusion_reduction_over(tp, f, state))
		cwnd = fusion_end_reduction(sk, f, cwnd);
	if (state == TCP_CA_Loss) {
		if (cwnd < tp->snd_ssthresh)	/* after a timeout: back up to ssthresh */
			cwnd = min(cwnd + rs->acked_sacked, tp->snd_ssthresh);
	} else if (f->reduction) {
		cwnd = fusion_prr_cwnd(sk, rs);				/* eq. 3 */
	} else {
		cwnd = fusion_grow_cwnd(sk, f, cwnd, rs->acked_sacked);
	}
	cwnd = clamp_t(u32, cwnd, FUSION_CWND_MIN, tp->snd_cwnd_clamp);
	tcp_snd_cwnd_set(tp, cwnd);
}

/* Eq. 5: R = W / T^min, in bytes per second. */
static void fusion_set_pacing_rate(struct sock *sk, const struct fusion_flow *f)
{
	const struct tcp_sock *tp = tcp_sk(sk);
	u64 rate = (u64)tcp_snd_cwnd(tp) * tp->mss_cache * USEC_PER_SEC;

	rate = div_u64(rate, max_t(u32, fusion_rtt_us(f, tp), 1));
	WRITE_ONCE(sk->sk_pacing_rate,
		   min_t(u64, rate, READ_ONCE(sk->sk_max_pacing_rate)));
}

/* Without per-flow state (no memory at start) the flow runs plain Reno, and is counted. */
static void fusion_fallback(struct sock *sk, const struct rate_sample *rs)
{
	struct tcp_sock *tp = tcp_sk(sk);
	u8 state = inet_csk(sk)->icsk_ca_state;

	if (state == TCP_CA_CWR || state == TCP_CA_Recovery)
		tcp_snd_cwnd_set(tp, max_t(u32, fusion_prr_cwnd(sk, rs), FUSION_CWND_MIN));
	else
		tcp_reno_cong_avoid(sk, 0, rs->acked_sacked);
}

/* Every ACK: measure, test eq. 1 when an interval closes, then set W and R (eqs. 2–5). */
static void fusion_on_ack(struct sock *sk, const struct rate_sample *rs)
{
	struct tcp_sock *tp = tcp_sk(sk);
	struct fusion_flow *f = fusion_flow(sk);

	if (!f) {
		fusion_fallback(sk, rs);
		return;
	}
	fusion_sample(f, tp, rs);
	if (tp->tcp_mstamp - f->interval_start_us >= fusion_interval_us(f, tp))
		fusion_close_interval(sk, f, tp->tcp_mstamp);
	fusion_set_cwnd(sk, f, rs);
	fusion_set_pacing_rate(sk, f);
	f->prev_ca_state = inet_csk(sk)->icsk_ca_state;
}

/* Linux 6.10 passes the ACK's sequence and flags to cong_control; Fusion needs neither. */
#if LINUX_VERSION_CODE >= KERNEL_VERSION(6, 10, 0)
static void fusion_cong_control(struct sock *sk, u32 ack, int flag, const struct rate_sample *rs)
{
	fusion_on_ack(sk, rs);
}
#else
static void fusion_cong_control(struct sock *sk, const struct rate_sample *rs)
{
	fusion_on_ack(sk, rs);
}
#endif

/*
 * The kernel asks on entering Recovery, Loss or CWR: how far to reduce. On Fusion's own signal
 * (tcp_enter_cwr() from fusion_congestion()), or when the losses exceed l, to λ · W (eq. 3);
 * for losses within l, not at all: they are repaired while the window keeps growing, or, while
 * a reduction of Fusion's own is under way, to that reduction's target, which stands.
 */
static u32 fusion_ssthresh(struct sock *sk)
{
	struct tcp_sock *tp = tcp_sk(sk);
	struct fusion_flow *f = fusion_flow(sk);
	u32 target;

	if (!f)
		return max(tcp_snd_cwnd(tp) >> 1, 2U);
	if (!f->cutting && !fusion_loss_signal(f))	/* loss within tolerance l: */
		return f->reduction ? min(tcp_snd_cwnd(tp), tp->snd_ssthresh)	/* ours stands */
				    : tcp_snd_cwnd(tp);			/* no reduction */
	target = fusion_reduced_cwnd(sk, f);	/* before the cut ends slow start */
	fusion_note_cut(sk, f, f->cutting ? f->cutting : FUSION_CUT_LOSS);
	return target;
}

/*
 * The stack found the losses spurious (reordering, a too-early timeout): give back what a loss
 * cut took, as cubic and reno do. A delay signal stands whatever the losses were, so a delay
 * cut keeps its window.
 */
static u32 fusion_undo_cwnd(struct sock *sk)
{
	const struct tcp_sock *tp = tcp_sk(sk);
	struct fusion_flow *f = fusion_flow(sk);
	u32 cwnd = tcp_snd_cwnd(tp);

	if (!f)
		return max(cwnd, tp->prior_cwnd);
	if (f->reduction == FUSION_CUT_DELAY)
		return cwnd;
	f->reduction = FUSION_CUT_NONE;
	fusion_drain_ends(f, tp);
	return max(cwnd, tp->prior_cwnd);
}

static void fusion_init(struct sock *sk)
{
	struct tcp_sock *tp = tcp_sk(sk);
	struct fusion_net *fn = fusion_pernet(sock_net(sk));
	struct fusion_flow *f;

	atomic64_inc(&fn->flows);
	f = kmem_cache_zalloc(fusion_flow_cache, GFP_ATOMIC | __GFP_NOWARN);
	*(struct fusion_flow **)inet_csk_ca(sk) = f;
	if (!f) {
		atomic64_inc(&fn->nostate);
		return;
	}
	fusion_profile_for(sk, &f->theta);
	fusion_endpoints_of(sk, &f->ends);
	fusion_minmax_reset(&f->bw_max, 0, 0);
	fusion_minmax_reset(&f->rtt_min, 0, U32_MAX);
	fusion_minmax_reset(&f->rtt_max, 0, 0);
	f->interval_rtt_min_us = U32_MAX;
	memset(f->recent_rtt_min_us, 0xff, sizeof(f->recent_rtt_min_us));
	f->flow_rtt_min_us = U32_MAX;
	f->ss_rtt_min_us = U32_MAX;
	f->interval_start_us = tp->tcp_mstamp;
	f->start_us = tp->tcp_mstamp;
	f->last_ack_us = tp->tcp_mstamp;
	f->next_round_delivered = tp->delivered;
	f->mode = FUSION_SLOW_START;
	f->prev_ca_state = TCP_CA_Open;
	f->probe_step = fusion_theta(f, FUSION_THETA_ADD_INCREASE);

	tcp_snd_cwnd_set(tp, fusion_theta(f, FUSION_THETA_INIT_CWND));	/* W_0 = ω */
	tp->snd_ssthresh = TCP_INFINITE_SSTHRESH;
	cmpxchg(&sk->sk_pacing_status, SK_PACING_NONE, SK_PACING_NEEDED);
	fusion_set_pacing_rate(sk, f);
}

static void fusion_release(struct sock *sk)
{
	struct fusion_flow **slot = inet_csk_ca(sk);
	struct fusion_flow *f = *slot;
	const struct tcp_sock *tp = tcp_sk(sk);
	struct fusion_record rec;

	if (!f)
		return;
	rec = (struct fusion_record) {
		.ends = f->ends,
		.bytes_acked = max(tp->bytes_acked, f->bytes_acked),
		.duration_us = f->last_ack_us - f->start_us,
		.rtt_avg_us = f->rtt_samples ? div_u64(f->rtt_sum_us, f->rtt_samples) : 0,
		.rtt_min_us = f->flow_rtt_min_us == U32_MAX ? 0 : f->flow_rtt_min_us,
		.retrans = max(tp->total_retrans, f->retrans),
		.segs_out = max(tp->segs_out, f->segs_out),
		.profile_id = f->theta.id,
		.profile_version = f->theta.version,
	};
	memcpy(rec.theta, f->theta.theta, sizeof(rec.theta));
	fusion_record_emit(sk, &rec);
	kmem_cache_free(fusion_flow_cache, f);
	*slot = NULL;
}

/* ss -i: there is no fusion struct in inet_diag, so the BBR one carries R^max, T^min and α. */
static size_t fusion_get_info(struct sock *sk, u32 ext, int *attr, union tcp_cc_info *info)
{
	const struct fusion_flow *f = fusion_flow(sk);
	u64 bw;

	/* ss asks for VEGASINFO; answer that request too, as BBR does */
	if (!f || !(ext & (1 << (INET_DIAG_BBRINFO - 1)) || ext & (1 << (INET_DIAG_VEGASINFO - 1))))
		return 0;
	bw = (u64)f->bw_max.s[0].v * tcp_sk(sk)->mss_cache * USEC_PER_SEC >> FUSION_BW_SCALE;
	memset(&info->bbr, 0, sizeof(info->bbr));
	info->bbr.bbr_bw_lo = (u32)bw;
	info->bbr.bbr_bw_hi = (u32)(bw >> 32);
	info->bbr.bbr_min_rtt = fusion_have_rtt(f) ? fusion_min_rtt_us(f) : 0;
	info->bbr.bbr_pacing_gain = 1 << FUSION_GAIN_SHIFT;
	info->bbr.bbr_cwnd_gain = (fusion_theta(f, FUSION_THETA_MULT_INCREASE) << FUSION_GAIN_SHIFT) /
				  FUSION_MULT_INCREASE_SCALE;
	*attr = INET_DIAG_BBRINFO;
	return sizeof(info->bbr);
}

static struct tcp_congestion_ops fusion_cong_ops __read_mostly = {
	.name = "fusion",
	.owner = THIS_MODULE,
	.init = fusion_init,
	.release = fusion_release,
	.cong_control = fusion_cong_control,
	.ssthresh = fusion_ssthresh,
	.undo_cwnd = fusion_undo_cwnd,
	.get_info = fusion_get_info,
};

static int __init fusion_register(void)
{
	int err;

	BUILD_BUG_ON(sizeof(struct fusion_flow *) > ICSK_CA_PRIV_SIZE);
	fusion_flow_cache = KMEM_CACHE(fusion_flow, 0);
	if (!fusion_flow_cache)
		return -ENOMEM;
	err = fusion_profiles_init();
	if (err)
		goto free_cache;
	err = fusion_netlink_init();
	if (err)
		goto profiles;
	err = tcp_register_congestion_control(&fusion_cong_ops);
	if (err)
		goto netlink;
	return 0;
netlink:
	fusion_netlink_exit();
profiles:
	fusion_profiles_exit();
free_cache:
	kmem_cache_destroy(fusion_flow_cache);
	return err;
}

static void __exit fusion_unregister(void)
{
	tcp_unregister_congestion_control(&fusion_cong_ops);
	fusion_netlink_exit();
	fusion_profiles_exit();
	rcu_barrier();		/* tables freed by call_rcu must be gone before our code is */
	kmem_cache_destroy(fusion_flow_cache);
}

module_init(fusion_register);
module_exit(fusion_unregister);

MODULE_AUTHOR("Gemini");
MODULE_LICENSE("GPL");
MODULE_DESCRIPTION("Fusion: parameterised TCP congestion control steered by Gemini's Booster");
MODULE_VERSION("0.1.0");
MODULE_ALIAS_GENL_FAMILY(FUSION_GENL_NAME);
