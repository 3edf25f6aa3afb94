"""Conversion between DDSketch (the ``ddsketch`` library) and the API's QuantileSketch message.

Agents build one sketch per aggregate with the library (a logarithmic mapping of relative
accuracy 1 %); Booster merges them per trial on demand. The message has two encodings
(api/gemini_api/v1/booster.proto):

- **dense** (v1, ``to_proto``): every key of the 1 % mapping from the lowest to the highest
  present, as doubles. Sent by agents before the compact sketch, still accepted; a throughput
  spread over a few orders of magnitude costs kilobytes per sketch.
- **compact** (v2, ``to_compact_proto``, what agents send): only the bins that hold flows, each
  ``COMPACT_KEY_STRIDE`` keys of the 1 % mapping wide: a bitmap of the bins present from the
  lowest, and their whole-flow counts as varints, over at most ``COMPACT_MAX_SPAN`` bins. Bin
  ``b`` is the union of keys ``(b-1)·s+1 .. b·s``, a logarithmic mapping of γ^s: relative
  accuracy ``COMPACT_RELATIVE_ACCURACY`` (5.0 %). About 1.2 bytes per bin. DDSketch's own
  protobuf (``ddsketch.pb``) spends 8 bytes per key in its contiguous store and about 13 per
  bin in its sparse map: several times this (benchmarks/report_size.py prints it).

Both decode (``from_proto``) into the 1 % mapping, so that old and new sketches merge: a
compact bin's weight goes to the middle key of its stride, whose value is within
``COMPACT_READ_ERROR`` (5.1 %) of every value the bin holds. That is the stated accuracy of a
quantile read from compact sketches (tests/test_sketch_encoding.py); dense sketches keep 1 %.
"""

from __future__ import annotations

import math

from ddsketch import DDSketch
from ddsketch.mapping import LogarithmicMapping

from gemini_api.v1 import booster_pb2 as pb

RELATIVE_ACCURACY = 0.01
MAX_BUCKETS = 4096
# The keys the library's mapping produces for positive doubles (about ±35,000 at 1 %).
_MAPPING = LogarithmicMapping(RELATIVE_ACCURACY)
MIN_KEY = _MAPPING.key(_MAPPING.min_possible)
MAX_KEY = _MAPPING.key(_MAPPING.max_possible)
# Bucket weights are counts of flows; the tolerance only admits weights that are not whole
# numbers (a merged or scaled sketch) and their rounding.
WEIGHT_REL_TOL = 1e-9

# The compact encoding: bins of 5 keys (odd, so that a bin has a middle key).
COMPACT_KEY_STRIDE = 5
_GAMMA = _MAPPING.gamma
_BIN_GAMMA = _GAMMA**COMPACT_KEY_STRIDE
COMPACT_RELATIVE_ACCURACY = (_BIN_GAMMA - 1) / (_BIN_GAMMA + 1)  # 4.996 %
# Read back into the 1 % mapping at the middle key m = b·s − (s−1)/2, whose value is
# γ^m·2/(1+γ); the bin spans (γ^(b·s−s), γ^(b·s)], so the farthest value is a bin end.
_MIDDLE = (COMPACT_KEY_STRIDE - 1) // 2
COMPACT_READ_ERROR = max(
    _GAMMA ** (_MIDDLE + 1) * 2 / (1 + _GAMMA) - 1,
    1 - _GAMMA ** (-_MIDDLE) * 2 / (1 + _GAMMA),
)  # 5.12 %
# Bins one sketch may span: 5.5 orders of magnitude in one aggregate. Beyond that the lowest
# bins fold into the lowest bin of the span (DDSketch's collapsing-lowest store), so only the
# lowest quantiles of such a spread lose their accuracy.
COMPACT_MAX_SPAN = 128
# The bins that keys of the mapping fall in.
MIN_BIN = -(-MIN_KEY // COMPACT_KEY_STRIDE)
MAX_BIN = -(-MAX_KEY // COMPACT_KEY_STRIDE)


def new_sketch() -> DDSketch:
    return DDSketch(relative_accuracy=RELATIVE_ACCURACY)


def to_proto(sketch: DDSketch) -> pb.QuantileSketch:
    """The dense (v1) message for ``sketch``, as agents before the compact sketch send it; a
    sketch without values becomes no sketch at all (the empty message), the only form of
    emptiness Booster accepts."""
    if sketch.count == 0:
        return pb.QuantileSketch()
    store = sketch._store  # ddsketch exposes no public accessor for the dense store
    msg = pb.QuantileSketch(
        relative_accuracy=sketch._relative_accuracy, zero_count=sketch._zero_count
    )
    if store.count:
        msg.offset = store.min_key
        msg.counts.extend(
            store.bins[k - store.offset] for k in range(store.min_key, store.max_key + 1)
        )
    return msg


def to_compact_proto(sketch: DDSketch) -> pb.QuantileSketch:
    """The compact (v2) message for ``sketch``, a sketch of whole flows at 1 % (``new_sketch``);
    the empty message when it has no values."""
    if sketch.count == 0:
        return pb.QuantileSketch()
    msg = pb.QuantileSketch(zero_count=sketch._zero_count, key_stride=COMPACT_KEY_STRIDE)
    store = sketch._store
    if not store.count:
        return msg
    bins: dict[int, float] = {}
    lo = store.min_key - store.offset
    for i, weight in enumerate(store.bins[lo : store.max_key - store.offset + 1]):
        if weight:
            b = -(-(store.min_key + i) // COMPACT_KEY_STRIDE)  # ⌈key / s⌉
            bins[b] = bins.get(b, 0.0) + weight
    last = max(bins)
    first = max(min(bins), last - COMPACT_MAX_SPAN + 1)
    folded = sum(w for b, w in bins.items() if b < first)
    if folded:
        bins = {b: w for b, w in bins.items() if b >= first}
        bins[first] = bins.get(first, 0.0) + folded
    keys = sorted(bins)
    msg.first_bin = first
    msg.bin_bitmap = sum(1 << (b - first) for b in keys).to_bytes((last - first) // 8 + 1, "little")
    msg.bin_counts.extend(round(bins[b]) for b in keys)
    return msg


def sketch_errors(msg: pb.QuantileSketch, flow_count: int) -> list[str]:
    """Everything wrong with a received sketch of ``flow_count`` flows; empty when it can be
    stored and merged safely.

    A sketch is either absent (the empty message) or a sketch of exactly the aggregate's flows:
    the library's accuracy (merges are exact only then), keys the mapping can produce (so that
    merging cannot overflow or allocate without bound), and finite non-negative weights that add
    up to the flow count, one per flow. Every check runs over the repeated fields in C (len, sum,
    min, max, the bitmap as one integer), never in a Python loop per bucket; a well-formed
    compact sketch passes one expression, and anything else is walked to name its problems.
    """
    if msg.key_stride == COMPACT_KEY_STRIDE:
        fast = _compact_fast(msg)
        zero = msg.zero_count
        if (
            fast is not None
            and 0 <= zero < math.inf
            and fast + zero > 0
            and math.isclose(fast + zero, flow_count, rel_tol=WEIGHT_REL_TOL)
        ):
            return []
    if msg.ByteSize() == 0:
        return []
    errors: list[str] = []
    total: float | None
    if msg.key_stride or msg.bin_bitmap or msg.bin_counts or msg.first_bin:
        total = _compact_weight(msg, errors)
    else:
        if msg.relative_accuracy != RELATIVE_ACCURACY:
            errors.append(f"relative_accuracy {msg.relative_accuracy} != {RELATIVE_ACCURACY}")
        total = _dense_weight(msg, errors)
    if total is None:
        return errors
    zero = msg.zero_count
    if not math.isfinite(zero) or zero < 0:
        errors.append(f"zero_count {zero} is not a finite non-negative number")
    elif not math.isfinite(total + zero):
        errors.append(f"total weight {total + zero} is not finite")
    elif total + zero == 0:
        errors.append("no weight: leave the sketch unset when it has no values")
    elif not math.isclose(total + zero, flow_count, rel_tol=WEIGHT_REL_TOL):
        errors.append(f"total weight {total + zero:g} != flow_count {flow_count} (one per flow)")
    return errors


def _dense_weight(msg: pb.QuantileSketch, errors: list[str]) -> float | None:
    """The weight of a dense sketch's keys, or None when they cannot be added up."""
    counts = msg.counts[:]  # one copy into a list, then C-level reductions over it
    if len(counts) > MAX_BUCKETS:
        errors.append(f"{len(counts)} buckets > {MAX_BUCKETS}")
    last = msg.offset + max(len(counts), 1) - 1
    if msg.offset < MIN_KEY or last > MAX_KEY:
        errors.append(f"keys {msg.offset}..{last} outside the mapping's {MIN_KEY}..{MAX_KEY}")
    if not counts:
        return 0.0
    # Summed in C: NaN or ±inf anywhere leaves the sum not finite. Weights are whole numbers
    # of flows, which a double adds exactly far beyond any flow count.
    total = sum(counts, 0.0)
    low = min(counts)
    if math.isfinite(total) and low >= 0:
        return total
    if math.isnan(total) or low < 0 or math.isinf(max(counts)):
        bad = next(v for v in counts if not math.isfinite(v) or v < 0)
        errors.append(f"bucket count {bad} is not a finite non-negative number")
    else:
        errors.append(f"total weight {total} is not finite")
    return None


def _compact_fast(msg: pb.QuantileSketch) -> int | None:
    """The weight of a well-formed compact sketch's bins; None for anything else (which
    ``_compact_weight`` then names)."""
    # One slice copies the field into a list in C; reading a repeated field element by element
    # costs far more per element than min and sum over a list.
    counts, bitmap, first = msg.bin_counts[:], msg.bin_bitmap, msg.first_bin
    if msg.relative_accuracy or msg.offset or msg.counts:
        return None
    if not counts:
        return None if bitmap or first else 0
    if len(bitmap) > COMPACT_MAX_SPAN // 8:
        return None
    present = int.from_bytes(bitmap, "little")
    span = present.bit_length()
    if (
        present & 1
        and present.bit_count() == len(counts)
        and len(bitmap) == (span + 7) // 8
        and first >= MIN_BIN
        and first + span - 1 <= MAX_BIN
        and min(counts) >= 1
    ):
        return sum(counts)
    return None


def _compact_weight(msg: pb.QuantileSketch, errors: list[str]) -> int | None:
    """The weight of a compact sketch's bins, or None when they cannot be added up."""
    counts, bitmap = msg.bin_counts[:], msg.bin_bitmap
    found = len(errors)
    if msg.key_stride != COMPACT_KEY_STRIDE:
        errors.append(f"key_stride {msg.key_stride} != {COMPACT_KEY_STRIDE}")
    if msg.relative_accuracy:
        errors.append("relative_accuracy: unset in a compact sketch (key_stride names its mapping)")
    if msg.counts or msg.offset:
        errors.append("both encodings: a compact sketch (key_stride) has no offset or counts")
    if len(bitmap) > COMPACT_MAX_SPAN // 8:
        errors.append(f"bin_bitmap: {len(bitmap)} bytes, bins span more than {COMPACT_MAX_SPAN}")
    if len(errors) > found:
        return None
    present = int.from_bytes(bitmap, "little")
    span = present.bit_length()
    if present.bit_count() != len(counts):
        errors.append(f"bin_bitmap: {present.bit_count()} bins for {len(counts)} bin_counts")
    elif counts and (not present & 1 or len(bitmap) != (span + 7) // 8):
        errors.append("bin_bitmap: bit 0 is first_bin's, and no byte after the last bin's")
    elif counts and not MIN_BIN <= msg.first_bin <= msg.first_bin + span - 1 <= MAX_BIN:
        errors.append(
            f"bins {msg.first_bin}..{msg.first_bin + span - 1} outside the mapping's "
            f"{MIN_BIN}..{MAX_BIN}"
        )
    elif counts and min(counts) < 1:
        errors.append("bin_counts: a bin without weight (send only bins that hold flows)")
    elif not counts and msg.first_bin:
        errors.append("first_bin: set without bins")
    if len(errors) > found:
        return None
    return sum(counts)  # Python's integers: exact whatever the counts


def compact_bins(msg: pb.QuantileSketch) -> list[tuple[int, int]]:
    """(bin, whole flows) of a compact sketch, lowest bin first."""
    present = int.from_bytes(msg.bin_bitmap, "little")
    bins = [msg.first_bin + i for i in range(present.bit_length()) if present >> i & 1]
    return list(zip(bins, msg.bin_counts, strict=True))


def from_proto(msg: pb.QuantileSketch) -> DDSketch:
    """A sketch in the 1 % mapping, from either encoding (checked by ``sketch_errors``); a
    compact bin's weight lands on the middle key of its stride."""
    sketch = new_sketch()
    if msg.key_stride:
        for b, count in compact_bins(msg):
            middle = min(max(b * COMPACT_KEY_STRIDE - _MIDDLE, MIN_KEY), MAX_KEY)
            sketch._store.add(middle, float(count))
            sketch._count += count
    else:
        for i, weight in enumerate(msg.counts):
            if weight > 0:
                sketch._store.add(msg.offset + i, weight)
                sketch._count += weight
    if msg.zero_count:
        sketch._zero_count += msg.zero_count
        sketch._count += msg.zero_count
    return sketch
