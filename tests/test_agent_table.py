"""The agent at fleet scale: a real-size IP database (generated here with mmdb-writer, over
100,000 networks, IPv4 and IPv6), every flow mapped to its context, a kernel table compiled
within the module's limits, and a table the module refuses survived.

What is real and what stands in: the `.mmdb` file, maxminddb's reader, the CSV table, the
table compiler, the agent's metrics and Booster (real PostgreSQL, real gRPC) are real. The
kernel is not: this machine cannot load modules, so `StandInKernel` takes the place of
tcp_fusion behind the agent's `Kernel` interface. It writes the sysctls into a directory laid
out like /proc/sys/net/fusion, keeps the table it is given, and refuses a table past the limits
of fusion_uapi.h with the module's own words, raised as the real netlink client raises them
(FusionError). tests/test_lab_profiles.py has the real module refuse a table, in a real kernel.

Each table is checked by its meaning, not its shape: a longest-prefix match over its rules,
written here independently of the compiler, must give every probed address the θ of its place
when that place is installed, and the default otherwise.
"""

from __future__ import annotations

import ipaddress
import itertools
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

from gemini_agent.aggregator import Aggregator, Flow
from gemini_agent.config import AgentSettings
from gemini_agent.context import ContextResolver, MmdbTable, Place, PrefixTable
from gemini_agent.daemon import Agent
from gemini_agent.metrics import AgentMetrics
from gemini_agent.reporter import Reporter
from gemini_agent.spool import Spool
from gemini_agent.table import CompiledTable, Destinations, Limits, compile_table
from gemini_agent.writeback import Kernel, Plan, ThetaApplier
from gemini_api.aggregate import FlowStats
from gemini_api.fusion_genl import MAX_PROFILES, MAX_RULES, FusionError, Rule
from gemini_api.theta import load_spec
from gemini_booster.models import PolicyCreate
from gemini_booster.service.app import BoosterServer
from gemini_booster.storage import policies as policy_store
from tests.conftest import free_port, make_settings
from tests.sysctls import fusion_sysctls
from tests.test_agent import NOW, _settings

SPEC = load_spec()
DEFAULT = SPEC.default()
REGIONS, ISPS = 40, 8  # 320 places
V4_NETWORKS, V6_NETWORKS = 96_000, 6_000
BUSIEST_WHOLE = 55
SCATTERED_SHARE = 0.9  # of the runs: single networks of a fragmented place
PROBED_NETWORKS = 4_000
BRUTE_FORCE_PROBES = 300


@dataclass(frozen=True)
class World:
    mmdb: Path
    truth: list[tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, Place]]  # disjoint
    probes: dict[str, Place | None]  # address → its place (None: in no network)
    per_place: dict[Place, dict[str, int]]
    rank: list[Place]


def _theta(i: int) -> dict[str, int]:
    """θ number i: distinct for distinct i, inside Θ′, the default for i == 0."""
    if i == 0:
        return dict(DEFAULT)
    return DEFAULT | {"mult_decrease": 10 + i % 90, "window_intervals": 1 + i // 90}


def _fragmented(place: Place) -> bool:
    return place.isp == "isp-0"


def _allocations(rng: random.Random, places: list[Place]) -> list[tuple[object, Place]]:
    """Networks as registries hand them out: runs of adjacent networks per place, with
    unallocated gaps between some runs. The places of one ISP in eight are fragmented, single
    networks scattered everywhere (many rules each); the others hold long runs (few rules)."""
    scattered = [p for p in places if _fragmented(p)]
    whole = [p for p in places if not _fragmented(p)]
    out: list[tuple[object, Place]] = []
    cursor = int(ipaddress.ip_address("11.0.0.0")) >> 8  # in /24s
    while len(out) < V4_NETWORKS:
        if rng.random() < SCATTERED_SHARE:
            place, run = rng.choice(scattered), 1
        else:
            place, run = rng.choice(whole), min(int(rng.expovariate(1 / 64)) + 1, 256)
        for _ in range(run):
            out.append((ipaddress.IPv4Network((cursor << 8, 24)), place))
            cursor += 1
        cursor += rng.choice((0, 0, 1, 7))  # a gap, sometimes
    cursor = int(ipaddress.ip_address("2a00::")) >> 80  # in /48s
    while len(out) < V4_NETWORKS + V6_NETWORKS:
        place, run = rng.choice(places), int(rng.expovariate(1 / 8)) + 1
        for _ in range(run):
            out.append((ipaddress.IPv6Network((cursor << 80, 48)), place))
            cursor += 1
        cursor += rng.choice((0, 3))
    return out


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> World:
    from mmdb_writer import MMDBWriter
    from netaddr import IPSet

    rng = random.Random(2024)
    places = [Place(f"region-{r}", f"isp-{i}") for r in range(REGIONS) for i in range(ISPS)]
    truth = _allocations(rng, places)
    writer = MMDBWriter(ip_version=6, ipv4_compatible=True, database_type="gemini-test-geo")
    for n, (net, place) in enumerate(truth):
        # each network its own record, as in a city database: nothing merges in the file
        writer.insert_network(
            IPSet([str(net)]), {"region": place.region, "isp": place.isp, "network_id": n}
        )
    path = tmp_path_factory.mktemp("geo") / "world.mmdb"
    writer.to_db_file(str(path))
    probes: dict[str, Place | None] = {}
    for net, place in rng.sample(truth, PROBED_NETWORKS):
        for offset in (0, net.num_addresses - 1, rng.randrange(net.num_addresses)):
            probes[str(net.network_address + offset)] = place
    for addr in ("10.0.0.1", "100.64.0.1", "2a00:ffff::1", "2001:db8::1", "::1"):  # none
        probes[addr] = None
    ends = [(net, place) for net, place in truth if net.version == 4]
    for (a, _), (b, _) in itertools.pairwise(ends):
        if int(b.network_address) > int(a.broadcast_address) + 1:  # a gap between runs
            probes[str(a.broadcast_address + 1)] = None
    # a θ of its own for each place but every tenth, which runs the default
    per_place = {p: _theta(0 if i % 10 == 0 else i) for i, p in enumerate(places)}
    # busiest first: some contiguous places, the fragmented ones, the other contiguous ones;
    # with these, the profile limit and the rule limit both leave places out (asserted)
    fragmented = rng.sample([p for p in places if _fragmented(p)], REGIONS)
    whole = rng.sample([p for p in places if not _fragmented(p)], len(places) - REGIONS)
    rank = whole[:BUSIEST_WHOLE] + fragmented + whole[BUSIEST_WHOLE:]
    return World(path, truth, probes, per_place, rank)


def _brute_force(truth: Sequence[tuple[object, Place]], addr: str) -> Place | None:
    ip = ipaddress.ip_address(addr)
    found = [(net.prefixlen, place) for net, place in truth if ip in net]  # type: ignore[attr-defined]
    return max(found, key=lambda f: f[0])[1] if found else None


def test_every_flow_maps_to_its_context_in_a_real_size_mmdb(world):
    table = MmdbTable(world.mmdb, "region", "isp")
    assert sum(1 for _ in table.reader) >= 100_000
    resolver = ContextResolver(Place("src", "own"), table)
    unknown = Place("unknown", "unknown")
    for addr, place in world.probes.items():
        assert resolver.place(addr) == (place or unknown), addr
    # and against a scan of every network, for a sample
    for addr in random.Random(7).sample(sorted(world.probes), BRUTE_FORCE_PROBES):
        assert resolver.place(addr) == (_brute_force(world.truth, addr) or unknown), addr


def _lpm_theta(table: CompiledTable, addr: str) -> dict[str, int]:
    """The θ a flow to addr runs under `table`: longest matching rule, as the module does."""
    ip = ipaddress.ip_address(addr)
    best, best_len = None, -1
    for rule in table.rules:
        net = ipaddress.ip_network(rule.prefix)
        if net.version == ip.version and net.prefixlen > best_len and ip in net:
            best, best_len = rule.profile_id, net.prefixlen
    assert best is not None, f"no rule matches {addr}: the catch-alls are missing"
    return table.profiles[best]


def _assert_well_formed(table: CompiledTable, limits: Limits | None = None) -> None:
    limits = limits or Limits()
    assert len(table.rules) <= limits.max_rules and len(table.profiles) <= limits.max_profiles
    prefixes = [ipaddress.ip_network(r.prefix) for r in table.rules]  # strict: no host bits
    assert len(set(prefixes)) == len(prefixes), "a prefix twice"
    assert {"0.0.0.0/0", "::/0"} <= {r.prefix for r in table.rules}
    assert {r.profile_id for r in table.rules} <= set(table.profiles)
    assert all(pid > 0 for pid in table.profiles)


def _index_rules(table: CompiledTable) -> dict[int, list[tuple[int, dict[int, int]]]]:
    """Rules by IP version and prefix length, longest first: the brute-force match's index."""
    by: dict[tuple[int, int], dict[int, int]] = {}
    for rule in table.rules:
        net = ipaddress.ip_network(rule.prefix)
        bits = net.max_prefixlen
        by.setdefault((net.version, net.prefixlen), {})[
            int(net.network_address) >> (bits - net.prefixlen)
        ] = rule.profile_id
    out: dict[int, list[tuple[int, dict[int, int]]]] = {4: [], 6: []}
    for (version, length), known in sorted(by.items(), key=lambda kv: -kv[0][1]):
        out[version].append((length, known))
    return out


def _theta_under(table: CompiledTable, index: dict, addr: str) -> dict[str, int]:
    ip = ipaddress.ip_address(addr)
    value, bits = int(ip), ip.max_prefixlen
    for length, known in index[ip.version]:
        pid = known.get(value >> (bits - length) if length else 0)
        if pid is not None:
            return table.profiles[pid]
    raise AssertionError(f"no rule matches {addr}")


def test_the_table_fits_the_modules_limits_and_runs_each_place_its_theta(world):
    resolver = ContextResolver(Place("src", "own"), MmdbTable(world.mmdb, "region", "isp"))
    started = time.monotonic()
    dest = Destinations(resolver.networks())
    table = compile_table(dest, DEFAULT, world.per_place, world.rank)
    elapsed = time.monotonic() - started
    _assert_well_formed(table)
    # this world is past both limits: the test exercises both choices
    assert table.left_out["profiles"] > 0 and table.left_out["rules"] > 0
    assert len(table.installed) + sum(table.left_out.values()) == len(world.per_place)
    busiest_left_out = next(p for p in world.rank if p not in table.installed)
    assert all(p in table.installed for p in world.rank[: world.rank.index(busiest_left_out)])
    index = _index_rules(table)
    for addr, place in world.probes.items():
        want = world.per_place[place] if place in table.installed else DEFAULT
        assert _theta_under(table, index, addr) == want, (addr, place)
    for addr in random.Random(3).sample(sorted(world.probes), 50):  # the index, checked too
        assert _lpm_theta(table, addr) == _theta_under(table, index, addr)
    print(f"compiled {len(table.rules)} rules, {len(table.profiles)} profiles in {elapsed:.2f} s")


def _nested_csv(tmp_path: Path, rng: random.Random) -> tuple[Path, list[tuple[str, Place]]]:
    places = [Place(f"r{i}", f"i{i % 3}") for i in range(12)]
    rows: dict[str, Place] = {}
    while len(rows) < 2_000:
        length = rng.randint(16, 30)
        start = (int(ipaddress.ip_address("10.0.0.0")) + rng.getrandbits(16)) >> (32 - length)
        net = ipaddress.IPv4Network((start << (32 - length), length))
        rows.setdefault(str(net), rng.choice(places))
    rows["2001:db8::/32"], rows["2001:db8:1::/48"] = places[0], places[1]
    path = tmp_path / "nested.csv"
    path.write_text(
        "prefix,region,isp\n" + "".join(f"{p},{pl.region},{pl.isp}\n" for p, pl in rows.items())
    )
    return path, list(rows.items())


def test_csv_prefixes_nest_longest_first_and_compile_within_tight_limits(tmp_path):
    rng = random.Random(5)
    path, rows = _nested_csv(tmp_path, rng)
    csv_table = PrefixTable(path)
    truth = [(ipaddress.ip_network(p), place) for p, place in rows]
    probes = [str(ipaddress.IPv4Address(0x0A000000 + rng.getrandbits(16))) for _ in range(3_000)]
    probes += ["2001:db8:1::5", "2001:db8:2::5", "2001:db9::1", "::ffff:10.0.3.4"]
    for addr in probes:
        ip = ipaddress.ip_address(addr)
        plain = str(ip.ipv4_mapped) if getattr(ip, "ipv4_mapped", None) else addr
        assert csv_table.lookup(addr) == _brute_force(truth, plain), addr
    places = sorted({place for _, place in rows})
    # some places run the default: where they nest inside another place, they must override it
    per_place = {p: _theta(i % 4) for i, p in enumerate(places)}
    limits = Limits(max_profiles=3, max_rules=200)
    table = compile_table(Destinations(csv_table.networks()), DEFAULT, per_place, places, limits)
    _assert_well_formed(table, limits)
    assert table.left_out["profiles"] + table.left_out["rules"] > 0
    index = _index_rules(table)
    for addr in probes:
        place = csv_table.lookup(addr)
        want = per_place[place] if place in table.installed else DEFAULT
        assert _theta_under(table, index, addr) == want, addr


def test_duplicate_and_malformed_csv_rows_are_named(tmp_path):
    dup = tmp_path / "dup.csv"
    dup.write_text("10.1.0.0/16,a,b\n10.2.0.0/16,a,b\n10.1.0.0/16,c,d\n")
    with pytest.raises(ValueError, match=r"dup.csv:3: prefix 10.1.0.0/16 given twice"):
        PrefixTable(dup)
    short = tmp_path / "short.csv"
    short.write_text("10.1.0.0/16,a\n")
    with pytest.raises(ValueError, match=r"short.csv:1: expected prefix,region,isp"):
        PrefixTable(short)


class StandInKernel(Kernel):
    """tcp_fusion's place behind the agent's Kernel interface (see the module docstring)."""

    def __init__(self, sysctl_root: Path, refuse_all: bool = False) -> None:
        super().__init__(sysctl_root, use_netlink=False)
        self.refuse_all = refuse_all
        self.tables: list[tuple[dict[int, dict[str, int]], list[Rule]]] = []
        self.drops = {"kernel": 0, "unheard": 0}

    def write_table(self, profiles: dict[int, dict[str, int]], rules: Sequence[Rule]) -> None:
        if self.refuse_all:
            raise FusionError("generic netlink family 'fusion' not found: is tcp_fusion loaded?")
        if len(profiles) > MAX_PROFILES:
            raise FusionError("fusion refused the request: more profiles than FUSION_MAX_PROFILES")
        if len(rules) > MAX_RULES:
            raise FusionError("fusion refused the request: more rules than FUSION_MAX_RULES")
        self.tables.append((dict(profiles), list(rules)))

    def record_drops(self) -> dict[str, int]:
        return dict(self.drops)


@pytest.fixture
def sysctl_dir(tmp_path) -> Path:
    """Where StandInKernel keeps the sysctls: a directory laid out like /proc/sys/net/fusion."""
    return fusion_sysctls(tmp_path)


def _sample(metrics: AgentMetrics, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(name, labels)


def test_a_refused_table_leaves_every_destination_on_the_default_and_is_counted(world, sysctl_dir):
    kernel = StandInKernel(sysctl_dir)
    metrics = AgentMetrics()
    # an agent that believes the module holds ten times the rules it does
    applier = ThetaApplier(kernel, metrics, 60.0, SPEC, Limits(max_rules=10 * MAX_RULES))
    dest = Destinations(MmdbTable(world.mmdb, "region", "isp").networks())
    plan = Plan(DEFAULT | {"mult_decrease": 70}, world.per_place)
    installed = applier.apply(plan, dest, world.rank)  # no exception: the agent carries on
    profiles, rules = kernel.tables[-1]
    assert [r.prefix for r in rules] == ["0.0.0.0/0", "::/0"]
    assert all(profiles[r.profile_id] == plan.default for r in rules)
    assert {n: int((sysctl_dir / n).read_text()) for n in SPEC.names} == plan.default
    assert installed.installed == frozenset()
    assert _sample(metrics, "gemini_agent_tables_refused_total") == 1
    assert _sample(metrics, "gemini_agent_fallbacks_total", reason="table_refused") == 1
    refused = _sample(metrics, "gemini_agent_contexts_on_catch_all", reason="refused")
    assert refused == len(world.per_place)
    # the same agent with the module's real limits: accepted, and the gauges follow
    applier.limits = Limits()
    installed = applier.apply(plan, dest, world.rank)
    assert len(kernel.tables[-1][1]) <= MAX_RULES and installed.installed
    assert _sample(metrics, "gemini_agent_tables_refused_total") == 1
    assert _sample(metrics, "gemini_agent_contexts_on_catch_all", reason="refused") == 0
    assert _sample(metrics, "gemini_agent_table_rules") == len(kernel.tables[-1][1])


def _agent_settings(tmp_path: Path, target: str, **kw) -> AgentSettings:
    return _settings(tmp_path, target, metrics_listen=f"127.0.0.1:{free_port()}", **kw)


def test_the_daemon_keeps_running_when_the_module_refuses_every_table(
    world, tmp_path, sysctl_dir, db_url
):
    """The whole agent against a real Booster, with the real-size database: each interval's
    table is refused (the module is gone), and the daemon goes on to the next interval."""
    server = BoosterServer(make_settings(db_url)).start()
    policy_store.create_policy(server.engine, PolicyCreate(name="default"), actor="test")
    server.booster.reload_policies()
    try:
        settings = _agent_settings(
            tmp_path, f"127.0.0.1:{server.grpc_port}", geo_mmdb=world.mmdb, max_contexts=100
        )
        kernel = StandInKernel(sysctl_dir, refuse_all=True)
        agent = Agent(settings, kernel=kernel)
        busy = world.rank[0]
        network = next(net for net, place in world.truth if place == busy)
        flow = Flow(
            str(network.network_address + 1),
            FlowStats(2_000_000, 1_000_000, 60_000, 40_000),
            DEFAULT,
            1,
            NOW,
        )
        agent.aggregator.add(flow)
        agent.tick()  # closes, reports, asks for θ, has the table refused: no exception
        assert agent.ranked_places()[0] == busy  # the flows seen come first
        agent.tick()  # and the next interval goes the same way
        metrics = agent.metrics
        assert _sample(metrics, "gemini_agent_tables_refused_total") == 2
        assert _sample(metrics, "gemini_agent_reports_total", outcome="sent") == 1
        unasked = _sample(metrics, "gemini_agent_contexts_on_catch_all", reason="unasked")
        assert unasked == len(agent.destinations.places) - 100
        assert {n: int((sysctl_dir / n).read_text()) for n in SPEC.names} == DEFAULT
    finally:
        server.stop()


def test_busiest_places_are_ranked_per_interval_and_decay():
    agg = Aggregator(ContextResolver(Place("s", "o"), None), "h", "p")
    stats = FlowStats(1_000_000, 1_000_000, 50_000, 40_000)
    for _ in range(3):
        agg.add(Flow("10.0.0.1", stats, DEFAULT, 1, NOW))
    assert agg.busiest_places() == []  # ranked when the interval closes
    agg.close_interval(0, 1)
    assert agg.busiest_places() == [Place("unknown", "unknown")]  # 3, then halved to 1
    agg.close_interval(1, 2)
    assert agg.busiest_places() == [Place("unknown", "unknown")]  # 1, then halved to 0
    agg.close_interval(2, 3)
    assert agg.busiest_places() == []  # forgotten


def test_spool_and_kernel_record_drops_are_counted(tmp_path, sysctl_dir):
    metrics = AgentMetrics()
    settings = _agent_settings(tmp_path, "127.0.0.1:1")
    reporter = Reporter(settings, Spool(tmp_path / "spool", max_bytes=300), metrics)
    agg = Aggregator(ContextResolver(Place("s", "o"), None), "h", "p")
    stats = FlowStats(1_000_000, 1_000_000, 50_000, 40_000)
    for i in range(4):
        agg.add(Flow("10.0.0.1", stats, DEFAULT, 1, NOW))
        reporter.submit(agg.close_interval(i, i + 1))
    dropped = _sample(metrics, "gemini_agent_spool_dropped_reports_total")
    assert dropped == reporter.spool.dropped > 0
    kernel = StandInKernel(sysctl_dir)
    agent = Agent(_agent_settings(tmp_path, "127.0.0.1:1"), kernel=kernel)
    kernel.drops = {"kernel": 5, "unheard": 2}
    agent.count_kernel_drops()
    kernel.drops = {"kernel": 7, "unheard": 2}
    agent.count_kernel_drops()
    assert _sample(agent.metrics, "gemini_agent_records_dropped_total", where="kernel") == 7
    assert _sample(agent.metrics, "gemini_agent_records_dropped_total", where="unheard") == 2


def test_metrics_follow_prometheus_conventions_with_bounded_cardinality(world, sysctl_dir):
    from prometheus_client.exposition import generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    metrics = AgentMetrics()
    applier = ThetaApplier(StandInKernel(sysctl_dir), metrics, 60.0)
    dest = Destinations(MmdbTable(world.mmdb, "region", "isp").networks())
    applier.apply(Plan(DEFAULT, world.per_place), dest, world.rank)
    families = list(text_string_to_metric_families(generate_latest(metrics.registry).decode()))
    names = {f.name for f in families}
    assert "gemini_agent_build_info" in names
    series = 0
    for family in families:
        assert family.name.startswith("gemini_agent_"), family.name
        for sample in family.samples:
            if family.type == "counter":
                assert sample.name.endswith(("_total", "_created")), sample.name
            # no label carries a place, prefix or θ: 320 places made no series of their own
            assert not any("region-" in v or "/" in v for v in sample.labels.values()), sample
            series += 1
    assert series < 80, series
    (info,) = [f for f in families if f.name == "gemini_agent_build_info"]
    assert info.samples[0].value == 1 and info.samples[0].labels["version"]


def test_the_same_table_is_not_written_twice(world, sysctl_dir):
    """Each write bumps the kernel's θ version, which splits an interval's aggregates: an
    unchanged plan leaves the module alone; a changed one is written."""
    kernel = StandInKernel(sysctl_dir)
    applier = ThetaApplier(kernel, AgentMetrics(), 60.0)
    dest = Destinations(MmdbTable(world.mmdb, "region", "isp").networks())
    plan = Plan(DEFAULT, world.per_place)
    first = applier.apply(plan, dest, world.rank)
    assert applier.apply(plan, dest, world.rank) is first  # not even compiled again
    assert len(kernel.tables) == 1
    applier.apply(Plan(DEFAULT | {"mult_decrease": 60}, world.per_place), dest, world.rank)
    assert len(kernel.tables) == 2
