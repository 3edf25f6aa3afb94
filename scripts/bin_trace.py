"""Bin a mahimahi link trace into a rate schedule for the lab's netem links.

A mahimahi trace has one line per 1500-byte delivery opportunity, the number being the
millisecond it happens in. The schedule has one row per bin: start_ms, rate_kbit.

    python scripts/bin_trace.py TRACE OUT.csv [--bin-ms 500]
"""

from __future__ import annotations

import argparse
from collections import Counter
from pathlib import Path

PACKET_BITS = 1500 * 8


def bin_trace(lines: list[str], bin_ms: int) -> list[tuple[int, int]]:
    stamps = [int(x) for x in lines if x.strip()]
    counts = Counter(t // bin_ms for t in stamps)
    n_bins = max(counts) + 1
    return [(i * bin_ms, counts.get(i, 0) * PACKET_BITS // bin_ms) for i in range(n_bins)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--bin-ms", type=int, default=500)
    args = ap.parse_args()
    rows = bin_trace(args.trace.read_text().splitlines(), args.bin_ms)
    text = "start_ms,rate_kbit\n" + "".join(f"{t},{r}\n" for t, r in rows)
    args.out.write_text(text)
    print(f"{len(rows)} bins of {args.bin_ms} ms -> {args.out}")


if __name__ == "__main__":
    main()
