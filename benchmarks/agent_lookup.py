"""Per-flow destination lookup: the agent's prefix tables against the linear scan they replace.

Every finished flow is looked up once to find its context. The tables are CSV prefix tables of
10⁴, 10⁵ and 10⁶ prefixes (IPv4 /24 to /32 and IPv6 /32 to /64, disjoint, random), looked up at
random addresses, two in three inside some prefix. Three ways, side by side:
  - `PrefixTable`, the agent's CSV table: one hash map per prefix length, longest first;
  - `MmdbTable`, the same prefixes as an `.mmdb` read by maxminddb (its search tree), at the
    sizes mmdb-writer builds in reasonable time (it is pure Python: see --mmdb-max);
  - the baseline, the previous CSV table: a scan of every prefix, longest first, per lookup.
The baseline is timed on fewer lookups as the table grows (it takes about a second per lookup
at 10⁶); the count used is in the table. The time to compile each table for the kernel
(gemini_agent.table, all places given a θ of their own) is shown alongside.

    python -m benchmarks.agent_lookup [--lookups 100000] [--mmdb-max 100000]
"""

from __future__ import annotations

import argparse
import ipaddress
import random
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from benchmarks.common import write_result
from gemini_agent.context import MmdbTable, Place, PrefixTable
from gemini_agent.table import Destinations, compile_table
from gemini_api.theta import load_spec

SIZES = (10_000, 100_000, 1_000_000)
PLACES = 300
V6_SHARE = 0.1  # of the prefixes
BASELINE_BUDGET_S = 10.0  # time the baseline gets per size, at most
BASELINE_MIN_LOOKUPS = 5


class LinearScanTable:
    """The previous CSV table, kept as the baseline: every prefix tried per lookup."""

    def __init__(self, rows: list[tuple[str, Place]]) -> None:
        nets = [(ipaddress.ip_network(p), place) for p, place in rows]
        self.rows = sorted(nets, key=lambda r: r[0].prefixlen, reverse=True)

    def lookup(self, addr: str) -> Place | None:
        ip = ipaddress.ip_address(addr)
        for net, place in self.rows:
            if ip.version == net.version and ip in net:
                return place
        return None


def _prefixes(n: int, rng: random.Random) -> list[tuple[str, Place]]:
    """n disjoint prefixes: each is carved from its own aligned block, so none overlaps."""
    places = [Place(f"region-{i % 60}", f"isp-{i % 7}") for i in range(PLACES)]
    n6 = int(n * V6_SHARE)
    rows = []
    for i, block in enumerate(rng.sample(range(1 << 24), n - n6)):  # distinct /24 blocks
        prefix = ipaddress.IPv4Network((block << 8, rng.randint(24, 32)))
        rows.append((str(prefix), places[i % PLACES]))
    for i, block in enumerate(rng.sample(range(1 << 28), n6)):  # distinct /32s under 2000::/4
        length = rng.randint(32, 64)
        start = ((0x2 << 28 | block) << 96) >> (128 - length) << (128 - length)
        rows.append((str(ipaddress.IPv6Network((start, length))), places[i % PLACES]))
    return rows


def _probes(rows: list[tuple[str, Place]], count: int, rng: random.Random) -> list[str]:
    out = []
    for _ in range(count):
        if rng.random() < 2 / 3:
            net = ipaddress.ip_network(rng.choice(rows)[0])
            out.append(str(net.network_address + rng.randrange(min(net.num_addresses, 1 << 16))))
        else:
            out.append(str(ipaddress.IPv4Address(rng.getrandbits(32))))
    return out


def _per_lookup_us(lookup: Callable[[str], object], probes: list[str]) -> float:
    started = time.perf_counter()
    for addr in probes:
        lookup(addr)
    return (time.perf_counter() - started) / len(probes) * 1e6


def _write_csv(rows: list[tuple[str, Place]], path: Path) -> None:
    path.write_text(
        "prefix,region,isp\n" + "".join(f"{p},{pl.region},{pl.isp}\n" for p, pl in rows)
    )


def _write_mmdb(rows: list[tuple[str, Place]], path: Path) -> None:
    from mmdb_writer import MMDBWriter
    from netaddr import IPSet

    writer = MMDBWriter(ip_version=6, ipv4_compatible=True, database_type="gemini-bench")
    for n, (prefix, place) in enumerate(rows):
        writer.insert_network(IPSet([prefix]), {"region": place.region, "isp": place.isp, "n": n})
    writer.to_db_file(str(path))


def measure(n: int, lookups: int, mmdb_max: int, tmp: Path) -> dict:
    rng = random.Random(n)
    rows = _prefixes(n, rng)
    probes = _probes(rows, lookups, rng)
    csv_path = tmp / f"prefixes-{n}.csv"
    _write_csv(rows, csv_path)
    table = PrefixTable(csv_path)
    out: dict = {"n": n, "lookups": lookups, "csv_us": _per_lookup_us(table.lookup, probes)}
    mmdb = None
    if n <= mmdb_max:
        _write_mmdb(rows, tmp / f"prefixes-{n}.mmdb")
        mmdb = MmdbTable(tmp / f"prefixes-{n}.mmdb", "region", "isp")
        out["mmdb_us"] = _per_lookup_us(mmdb.lookup, probes)
    baseline = LinearScanTable(rows)
    for addr in probes[:200]:  # the new tables and the baseline agree
        assert table.lookup(addr) == baseline.lookup(addr), addr
        assert mmdb is None or mmdb.lookup(addr) == table.lookup(addr), addr
    one = _per_lookup_us(baseline.lookup, probes[:BASELINE_MIN_LOOKUPS])
    sampled = max(BASELINE_MIN_LOOKUPS, min(lookups, int(BASELINE_BUDGET_S * 1e6 / one)))
    out["baseline_lookups"] = sampled
    out["baseline_us"] = _per_lookup_us(baseline.lookup, probes[:sampled])
    spec = load_spec()
    started = time.perf_counter()
    dest = Destinations(table.networks())
    theta = {p: spec.default() | {"mult_decrease": 20 + i % 70} for i, p in enumerate(dest.places)}
    compiled = compile_table(dest, spec.default(), theta, dest.places)
    out["compile_s"] = time.perf_counter() - started
    out["rules"] = len(compiled.rules)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--lookups", type=int, default=100_000)
    ap.add_argument("--mmdb-max", type=int, default=100_000)
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="gemini-lookup-") as tmp:
        for n in SIZES:
            r = measure(n, args.lookups, args.mmdb_max, Path(tmp))
            rows.append(
                f"| {n:,} | {r['csv_us']:.2f} | "
                + (f"{r['mmdb_us']:.2f}" if "mmdb_us" in r else "not built")
                + f" | {r['baseline_us']:,.0f} ({r['baseline_lookups']:,} lookups) | "
                f"**{r['baseline_us'] / r['csv_us']:,.0f}×** | {r['compile_s']:.1f} s, "
                f"{r['rules']:,} rules |"
            )
            print(rows[-1], flush=True)
    lines = [
        f"{args.lookups:,} lookups per table at random addresses (two in three inside a "
        "prefix), one process. Prefixes: 90 % IPv4 (/24 to /32), 10 % IPv6 (/32 to /64), "
        f"disjoint, over {PLACES} places.",
        "",
        "| prefixes | CSV table µs/lookup | mmdb µs/lookup | baseline: linear scan µs/lookup "
        "| baseline ÷ CSV | compiling the kernel table |",
        "| --- | --- | --- | --- | --- | --- |",
        *rows,
        "",
        "The baseline (the previous CSV table, a scan per lookup) is timed on as many lookups "
        f"as fit in {BASELINE_BUDGET_S:.0f} s per size: fewer than the others at 10⁵ and 10⁶. "
        "The mmdb is built with mmdb-writer (pure Python) only up to "
        f"{args.mmdb_max:,} prefixes. Compiling: Destinations + compile_table for the module "
        "(every place its own θ, so the profile and rule limits bite), once per plan.",
    ]
    command = (
        f"python -m benchmarks.agent_lookup --lookups {args.lookups} --mmdb-max {args.mmdb_max}"
    )
    write_result("agent-lookup", command, lines)


if __name__ == "__main__":
    main()
