"""Conversion between DDSketch (the ``ddsketch`` library) and the API's QuantileSketch message.

Agents build one sketch per aggregate; Booster merges them per trial on demand. Both sides must
use the same relative accuracy for merges to be exact, so the default lives here.
"""

from __future__ import annotations

import math

from ddsketch import DDSketch

from gemini_api.v1 import booster_pb2 as pb

RELATIVE_ACCURACY = 0.01
MAX_BUCKETS = 4096


def new_sketch() -> DDSketch:
    return DDSketch(relative_accuracy=RELATIVE_ACCURACY)


def to_proto(sketch: DDSketch) -> pb.QuantileSketch:
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


def sketch_errors(msg: pb.QuantileSketch) -> list[str]:
    """Everything wrong with a received sketch; empty when it can be merged safely."""
    errors = []
    if not math.isclose(msg.relative_accuracy, RELATIVE_ACCURACY) and (
        msg.counts or msg.zero_count
    ):
        errors.append(f"relative_accuracy {msg.relative_accuracy} != {RELATIVE_ACCURACY}")
    if len(msg.counts) > MAX_BUCKETS:
        errors.append(f"{len(msg.counts)} buckets > {MAX_BUCKETS}")
    counts = msg.counts
    total = sum(counts, msg.zero_count)  # NaN or ±inf anywhere leaves the sum not finite
    if not math.isfinite(total) or (counts and min(counts) < 0) or msg.zero_count < 0:
        bad = next((v for v in (*counts, msg.zero_count) if not math.isfinite(v) or v < 0), total)
        errors.append(f"bucket count {bad} is not a finite non-negative number")
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
