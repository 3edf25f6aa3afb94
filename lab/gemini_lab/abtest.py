"""An A/B experiment in the lab, end to end: Booster's experiments API drives lab hosts' kernels.

Booster runs here (embedded PostgreSQL, gRPC and REST); in the qemu guest, ``hosts`` lab hosts
(network namespaces, gemini_lab.fleet), each with its own agent, identity (a token bound to its
host id), default CC (``default_cc``, so that a restored host is told apart from both arms) and
its own copy of one of the loop's paths (its own bottleneck: the arms do not share queues, as
two groups of servers in different racks would not). An operator then creates,
through REST, an experiment whose control arm is CUBIC with the kernel's defaults and whose
other arm is Fusion tuned by a Booster policy, over compressed days (``day_s`` seconds) with a
crossover on day 1, and stops it during day 2. At fixed points of that schedule (mid-day 0,
mid-day 1, after the stop, after the agents exit) the guest reads what each host's kernel runs,
from the kernel; the results endpoint gives the arms' daily figures.

The day is compressed to minutes, so the figures are a rehearsal of the mechanics and of the
results' shape, not a measurement of the arms' difference: a lab day holds a dozen reporting
intervals of one host per arm.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from gemini_booster.config import Settings
from gemini_booster.models import PolicyCreate
from gemini_booster.service import runs
from gemini_booster.service.app import BoosterServer
from gemini_lab.driver import POLL_S, GuestDriver, fresh_guest_dir
from gemini_lab.loop import ACTOR, EPOCH, PATHS, LabPath, write_mmdb

CONTROL, TREATMENT = "cubic", "fusion"
REGION = "lab"  # the lab hosts' own region, the experiment's one stratum
RELAY_PORT = 50051  # where each lab host's agent finds Booster (gemini_lab.relay)
METRICS_PORT = 9465  # each agent's, on its own namespace's loopback
REST_TIMEOUT_S = 30


@dataclass
class AbConfig:
    """The schedule in compressed days: the experiment starts at the first day boundary (a
    multiple of ``day_s`` since the epoch) at least ``lead_s`` after every host has reported,
    crosses over at day 1 and is stopped ``stop_into_day2`` of the way into day 2."""

    hosts: int = 4  # two per sequence group, as the crossover estimate needs (statistics.py)
    day_s: int = 120
    interval_s: float = 8
    sigma: float = 0.1
    flow_bytes: str = "3M"
    default_cc: str = "reno"
    lead_s: float = 10
    stop_into_day2: float = 0.25
    boot_timeout_s: float = 600
    after_stop_s: float = 30  # flows after the stop has settled, on the hosts' own CC
    paths: tuple[LabPath, ...] = PATHS

    def settle_s(self) -> float:
        """How soon after a change of arm every new flow runs the new CC: agents learn of the
        change at their next θ refresh, within one interval (and one more for slack)."""
        return 2 * self.interval_s + 5


@dataclass
class AbResult:
    experiment: dict  # as REST returned it at creation
    readings: dict[str, dict[str, dict]]  # checkpoint → host → kernel reading
    expected: dict[str, dict[str, str]]  # checkpoint → host → CC Booster assigned
    results: dict  # the results endpoint's answer after the stop
    guest: dict
    schedule: dict[str, str] = field(default_factory=dict)  # checkpoint → when (ISO, host clock)
    record: Path | None = None


def host_ids(n: int) -> list[str]:
    return [f"lab-host-{k}" for k in range(n)]


def agent_toml(host: str, token: str, policy: str, cfg: AbConfig) -> str:
    return "\n".join(
        [
            f'host_id = "{host}"',
            f'policy = "{policy}"',
            f'booster_address = "127.0.0.1:{RELAY_PORT}"',
            f'token = "{token}"',
            f'src_region = "{REGION}"',
            'src_isp = "lab"',
            'geo_mmdb = "{out}/paths.mmdb"',
            f"interval_s = {cfg.interval_s}",
            f'spool_dir = "/tmp/gemini-agent-{host}/spool"',
            f'metrics_listen = "127.0.0.1:{METRICS_PORT}"',
            "sockdiag = true",  # flows of every CC: the cubic arm's and the hosts' own
            "retry_initial_s = 0.5",
            "retry_max_s = 2.0",
            "",
        ]
    )


def host_paths(cfg: AbConfig) -> list[LabPath]:
    """Lab host k's path: its own copy of the k-th of the paths (round robin), behind its own
    prefix 10.<k+1>.0.0/16, so no two hosts share a bottleneck and every path has hosts."""
    return [cfg.paths[k % len(cfg.paths)] for k in range(cfg.hosts)]


def guest_plan(cfg: AbConfig, agents: dict[str, str], booster_port: int) -> dict:
    return {
        "paths": [p.scenario.to_dict() for p in host_paths(cfg)],
        "experiments": [
            {
                "label": "fleet",
                "kind": "fleet",
                "hosts": [
                    {"id": host, "agent_toml": toml, "paths": [k]}
                    for k, (host, toml) in enumerate(agents.items())
                ],
                "default_cc": cfg.default_cc,
                "allowed_ccs": sorted({"reno", cfg.default_cc, CONTROL, TREATMENT}),
                "relay_port": RELAY_PORT,
                "booster_port": booster_port,
                "flow_bytes": cfg.flow_bytes,
                "duration_s": cfg.boot_timeout_s + 6 * cfg.day_s,  # a cap, should the run stall
            }
        ],
    }


def experiment_body(name: str, policy: str, hosts: list[str], start: dt.datetime, cfg: AbConfig):
    """CUBIC at the kernel's defaults (control) against Fusion tuned by ``policy``, host-wide,
    over three compressed days from ``start`` with a crossover at day 1."""
    day = dt.timedelta(seconds=cfg.day_s)
    return {
        "name": name,
        "description": "lab rehearsal: cubic (kernel defaults) vs fusion tuned by Booster",
        "arms": [
            {"name": CONTROL, "cc": CONTROL, "params": "kernel_default"},
            {"name": TREATMENT, "cc": TREATMENT, "params": "policy", "policy": policy},
        ],
        "control": CONTROL,
        "population": {"regions": {REGION: hosts}},
        "start": start.isoformat(),
        "end": (start + 3 * day).isoformat(),
        "crossover_day": (start.date() + dt.timedelta(days=1)).isoformat(),
        "day_seconds": cfg.day_s,
        "sigma": cfg.sigma,
    }


def next_boundary(after: dt.datetime, day_s: int) -> dt.datetime:
    """The first multiple of ``day_s`` seconds since the epoch at or after ``after``."""
    at = math.ceil(after.timestamp() / day_s) * day_s
    return dt.datetime.fromtimestamp(at, dt.UTC)


def _sleep_until(at: dt.datetime) -> None:
    time.sleep(max(0.0, (at - dt.datetime.now(dt.UTC)).total_seconds()))


def _wait_reports(engine, hosts: list[str], guest: GuestDriver, timeout_s: float) -> None:
    """Until every host's agent has stored a report: all agents are up and reach Booster."""
    deadline = time.monotonic() + timeout_s
    while any(runs.count_reports(engine, h, EPOCH) == 0 for h in hosts):
        if not guest.alive() or time.monotonic() > deadline:
            raise RuntimeError(f"not every lab host reported: {guest.box}")
        time.sleep(POLL_S)


def _assigned(http: httpx.Client, token: str, hosts: list[str], default_cc: str) -> dict:
    """The CC Booster says each host runs now (its own default when in no arm)."""
    out = {}
    for h in hosts:
        r = http.get(f"/v1/hosts/{h}/experiment", headers={"authorization": f"Bearer {token}"})
        r.raise_for_status()
        held = r.json()["experiment"]
        out[h] = held["arm"]["cc"] if held else default_cc
    return out


def run_abtest(
    make_settings: Callable[[str], Settings],
    port: int,
    operator_token: str,
    out_dir: Path,
    cfg: AbConfig,
) -> AbResult:
    """The whole rehearsal (see the module docstring); writes ``abtest.json`` in ``out_dir``."""
    guest_dir = fresh_guest_dir(out_dir)
    hosts = host_ids(cfg.hosts)
    write_mmdb(guest_dir / "paths.mmdb", tuple(host_paths(cfg)))
    server = BoosterServer(make_settings(f"127.0.0.1:{port}")).start()
    http = httpx.Client(base_url=f"http://127.0.0.1:{server.http_port}", timeout=REST_TIMEOUT_S)
    auth = {"authorization": f"Bearer {operator_token}"}
    try:
        policy = f"lab-{uuid.uuid4().hex[:8]}"
        runs.create_policy(server.engine, PolicyCreate(name=policy, sigma=cfg.sigma), ACTOR)
        server.booster.reload_policies()
        agents = {
            h: agent_toml(
                h,
                runs.agent_token(server.engine, h, ACTOR),
                policy,
                cfg,
            )
            for h in hosts
        }
        timeout = cfg.boot_timeout_s + 8 * cfg.day_s
        guest = GuestDriver(guest_plan(cfg, agents, port), guest_dir, timeout)
        guest.start()
        try:
            result = _schedule(server, http, auth, guest, hosts, policy, cfg)
        finally:
            guest.stop()
        result.guest = guest.results()
        result.readings["after-exit"] = result.guest["experiments"]["fleet"].get("after_exit", {})
        result.expected["after-exit"] = dict.fromkeys(hosts, cfg.default_cc)
    finally:
        http.close()
        server.stop()
    result.record = out_dir / "abtest.json"
    result.record.write_text(json.dumps(_record(result, cfg), indent=1, default=str))
    return result


def _schedule(
    server: BoosterServer,
    http: httpx.Client,
    auth: dict[str, str],
    guest: GuestDriver,
    hosts: list[str],
    policy: str,
    cfg: AbConfig,
) -> AbResult:
    """Agents up; then the experiment, read at its checkpoints; then stopped and read again."""
    guest.wait_job_started()  # the deadline below is the job's, not the boot's
    _wait_reports(server.engine, hosts, guest, cfg.boot_timeout_s)
    token = auth["authorization"].removeprefix("Bearer ")
    readings, expected, schedule = {}, {}, {}

    def checkpoint(label: str) -> None:
        schedule[label] = dt.datetime.now(dt.UTC).isoformat()
        expected[label] = _assigned(http, token, hosts, cfg.default_cc)
        readings[label] = guest.reading(label)

    checkpoint("before")
    day = dt.timedelta(seconds=cfg.day_s)
    start = next_boundary(dt.datetime.now(dt.UTC) + dt.timedelta(seconds=cfg.lead_s), cfg.day_s)
    name = f"lab-ab-{uuid.uuid4().hex[:6]}"
    created = http.post(
        "/v1/experiments", json=experiment_body(name, policy, hosts, start, cfg), headers=auth
    )
    if created.status_code != 201:
        raise RuntimeError(f"creating the experiment: {created.status_code} {created.text}")
    for k in (0, 1):
        _sleep_until(start + k * day + day / 2)
        checkpoint(f"day-{k}")
    _sleep_until(start + 2 * day + cfg.stop_into_day2 * day)
    stopped = http.post(
        f"/v1/experiments/{name}/stop", json={"reason": "lab: end of rehearsal"}, headers=auth
    )
    stopped.raise_for_status()
    time.sleep(cfg.settle_s() + cfg.after_stop_s)
    checkpoint("stopped")
    results = http.get(f"/v1/experiments/{name}/results", headers=auth)
    results.raise_for_status()
    return AbResult(
        experiment=created.json(),
        readings=readings,
        expected=expected,
        results=results.json(),
        guest={},
        schedule=schedule,
    )


READ_SLACK_S = 5  # the guest sees a reading's request at most this long after it is made


def flows_in_checkpoints(result: AbResult, cfg: AbConfig) -> dict[str, dict[str, dict]]:
    """Per checkpoint and host, the finished flows by the CC their socket ran, of the flows
    that started where the checkpoint's CC surely held: on a day, from ``settle_s`` after its
    boundary until shortly before its end (a day is placed around its mid-day reading, in
    the guest's clock: when the guest saw the request); after the stop, in the
    ``after_stop_s`` before that reading."""
    log = result.guest.get("experiments", {}).get("fleet", {}).get("flow_log", {})
    half = cfg.day_s / 2
    out: dict[str, dict[str, dict]] = {}
    for label, hosts in result.readings.items():
        for host, reading in hosts.items():
            t = reading["requested"]
            if label.startswith("day-"):
                lo, hi = t - half + cfg.settle_s(), t + half - READ_SLACK_S
            elif label == "stopped":
                lo, hi = t - cfg.after_stop_s, t
            else:
                continue
            ran = Counter(cc for start, _, cc in log.get(host, []) if lo <= start <= hi)
            out.setdefault(label, {})[host] = dict(ran)
    return out


def _record(result: AbResult, cfg: AbConfig) -> dict:
    return {
        "config": {k: v for k, v in vars(cfg).items() if k != "paths"},
        "paths": {p.region: p.scenario.to_dict() for p in cfg.paths},
        "experiment": result.experiment,
        "schedule": result.schedule,
        "expected": result.expected,
        "readings": result.readings,
        "results": result.results,
        "flows": result.guest.get("experiments", {}).get("fleet", {}).get("flows"),
        "flows_in_checkpoints": flows_in_checkpoints(result, cfg),
        "flow_log": result.guest.get("experiments", {}).get("fleet", {}).get("flow_log"),
    }


def estimate_text(estimate: dict, digits: int = 2) -> str:
    """An estimate of the results endpoint: its mean, and its 95 % interval where it has one."""
    mean = estimate.get("mean")
    if mean is None:
        return "—"
    low, high = estimate.get("low"), estimate.get("high")
    text = f"{mean:.{digits}f}"
    return text if low is None else f"{text} [{low:.{digits}f}, {high:.{digits}f}]"


ArmColumn = tuple[str, Callable[[dict], str]]  # a header, and its cell from one arm's day


def days_table(results: dict, columns: list[ArmColumn], align: str = "---") -> list[str]:
    """The results endpoint's days as markdown: day, period and arm, then ``columns``
    (``align``: their separator, ``---:`` to right-align)."""
    heads = ["day", "period", "arm", *(head for head, _ in columns)]
    lines = ["| " + " | ".join(heads) + " |", "|---|---|---|" + f"{align}|" * len(columns)]
    for day in results.get("days", []):
        for arm in day["arms"]:
            cells = [day["day"], day["period"], arm["arm"], *(cell(arm) for _, cell in columns)]
            lines.append("| " + " | ".join(map(str, cells)) + " |")
    return lines


ENDPOINT_COLUMNS: list[ArmColumn] = [
    ("hosts", lambda arm: str(arm["hosts"])),
    ("flows", lambda arm: str(arm["flows"])),
    ("utility", lambda arm: estimate_text(arm["utility"])),
    ("throughput Mbit/s", lambda arm: estimate_text(arm["throughput_mbps"])),
    ("queueing ms", lambda arm: estimate_text(arm["queue_delay_ms"])),
    ("slow-flow share", lambda arm: estimate_text(arm["slow_flow_share"])),
]


def render(result: AbResult, cfg: AbConfig, command: str) -> str:
    """Markdown: what each host's kernel ran at each checkpoint against what Booster assigned,
    the flows each host finished by CC, and the results endpoint's days and arms."""
    e = result.experiment
    lines = [
        "# A/B experiment in the lab: cubic (kernel defaults) vs fusion tuned by Booster",
        "",
        f"Command: `{command}`; experiment `{e.get('name')}` from {e.get('start')} to "
        f"{e.get('end')}, days of {e.get('day_seconds')} s, crossover on {e.get('crossover_day')}, "
        "stopped during day 2. Kernel: Debian's stock kernel under qemu (the module in a real "
        "kernel; the wall clock, so the figures are a rehearsal of the mechanics).",
        "",
        "## What each host's kernel ran (read from the kernel)",
        "",
        "| checkpoint | host | Booster assigned | net.ipv4.tcp_congestion_control | live "
        "connections (ss -ti) | routes with congctl | flows started while it held, by CC |",
        "|---|---|---|---|---|---|---|",
    ]
    held = flows_in_checkpoints(result, cfg)
    for label, hosts in result.readings.items():
        for host, r in sorted(hosts.items()):
            lines.append(
                f"| {label} | {host} | {result.expected.get(label, {}).get(host, '?')} | "
                f"{r.get('sysctl')} | {_by_cc(Counter(r.get('connections', [])))} | "
                f"{len(r.get('congctl_routes', []))} | "
                f"{_by_cc(held.get(label, {}).get(host, {}))} |"
            )
    flows = result.guest.get("experiments", {}).get("fleet", {}).get("flows", {})
    lines += ["", "## Flows each host finished, by the CC their socket ran", ""]
    lines += [f"- {host}: {_by_cc(ccs)}" for host, ccs in sorted(flows.items())]
    lines += [
        "",
        f"## Results endpoint (σ = {result.results.get('sigma')}; mean [95 % interval])",
        "",
        *days_table(result.results, ENDPOINT_COLUMNS),
    ]
    for d in result.results.get("overall", {}).get("differences", []):
        lines.append(
            f"\nOverall {d['arm']} − {d['control']} ({d['method']}, {d['hosts']} hosts): "
            f"utility {estimate_text(d['utility'])}, "
            f"throughput {estimate_text(d['throughput_mbps'])} Mbit/s, "
            f"queueing {estimate_text(d['queue_delay_ms'])} ms."
        )
    return "\n".join(lines) + "\n"


def _by_cc(counts: dict[str, int]) -> str:
    return ", ".join(f"{cc} {n}" for cc, n in sorted(counts.items())) or "—"
