"""Conversion between DDSketch (the ``ddsketch`` library) and the API's QuantileSketch message.

Agents build one sketch per aggregate; Booster merges them per trial on demand. Both sides must
use the same relative accuracy for merges to be exact, so the default lives here.
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


def new_sketch() -> DDSketch:
    return DDSketch(relative_accuracy=RELATIVE_ACCURACY)


def to_proto(sketch: DDSketch) -> pb.QuantileSketch:
    """The message for ``sketch``; a sketch without values becomes no sketch at all (the empty
    message), the only form of emptiness Booster accepts."""
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


def sketch_errors(msg: pb.QuantileSketch, flow_count: int) -> list[str]:
    """Everything wrong with a received sketch of ``flow_count`` flows; empty when it can be
    stored and merged safely.

    A sketch is either absent (the empty message) or a sketch of exactly the aggregate's flows:
    the library's accuracy (merges are exact only then), keys the mapping can produce (so that
    merging cannot overflow or allocate without bound), and finite non-negative weights that add
    up to the flow count, one per flow.
    """
    if msg.ByteSize() == 0:
        return []
    errors = []
    if msg.relative_accuracy != RELATIVE_ACCURACY:
        errors.append(f"relative_accuracy {msg.relative_accuracy} != {RELATIVE_ACCURACY}")
    counts = msg.counts
    if len(counts) > MAX_BUCKETS:
        errors.append(f"{len(counts)} buckets > {MAX_BUCKETS}")
    last = msg.offset + max(len(counts), 1) - 1
    if msg.offset < MIN_KEY or last > MAX_KEY:
        errors.append(f"keys {msg.offset}..{last} outside the mapping's {MIN_KEY}..{MAX_KEY}")
    # Summed in C: NaN or ±inf anywhere leaves the sum not finite. Weights are whole numbers
    # of flows, which a double adds exactly far beyond any flow count.
    total = sum(counts, msg.zero_count)
    if not math.isfinite(total) or msg.zero_count < 0 or (counts and min(counts) < 0):
        bad = next((v for v in (*counts, msg.zero_count) if not math.isfinite(v) or v < 0), None)
        if bad is None:  # every weight finite, their sum not
            errors.append(f"total weight {total} is not finite")
        else:
            errors.append(f"bucket count {bad} is not a finite non-negative number")
        return errors
    if total == 0:
        errors.append("no weight: leave the sketch unset when it has no values")
    elif not math.isclose(total, flow_count, rel_tol=WEIGHT_REL_TOL):
        errors.append(f"total weight {total:g} != flow_count {flow_count} (one per flow)")
    return errors


def from_proto(msg: pb.QuantileSketch) -> DDSketch:
    sketch = new_sketch()
    for i, weight in enumerate(msg.counts):
        if weight > 0:
            sketch._store.add(msg.offset + i, weight)
            sketch._count += weight
    if msg.zero_count:
        sketch._zero_count += msg.zero_count
        sketch._count += msg.zero_count
    return sketch
