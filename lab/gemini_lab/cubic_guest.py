"""Guest side of ``gemini-lab cubic``: CUBIC's module parameters, read and (for the check of
what matters on a path) written, and bulk cubic flows at a fixed θ.

CUBIC's parameters are the kernel's, not a namespace's: /sys/module/tcp_cubic/parameters holds
one θ for every cubic socket in the guest. The check (``exp_cubic_check``) writes each β in
turn, runs back-to-back cubic flows on one path, and puts the kernel's own values back.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from gemini_api.datapaths import Apply, Datapath, load_datapath, registry
from gemini_api.fusion_genl import FusionNetlink, TableFamily
from gemini_lab.bulk import put
from gemini_lab.experiment import BASE_PORT
from gemini_lab.netem import python_in, receiver_addr, receiver_ns, sh, wait_listening

CHECK_PORT = BASE_PORT + 90


def module_params(name: str) -> dict[str, int]:
    """What the guest kernel runs now for datapath ``name`` (a ``module_params`` one): every
    parameter of its spec, read from its target in sysfs (empty while its module is not
    loaded, or for a kernel without those parameters)."""
    spec = load_datapath(name)
    root = Path(spec.target)
    if not root.is_dir():
        return {}
    return {n: int((root / n).read_text().strip()) for n in spec.names}


def write_module_params(name: str, theta: dict[str, int]) -> None:
    root = Path(load_datapath(name).target)
    for key, value in theta.items():
        (root / key).write_text(f"{value}\n")


def loaded_module_params() -> dict[str, dict[str, int]]:
    """Every ``module_params`` datapath whose module the guest runs: its parameters now."""
    out = {}
    for dp in registry():
        if dp.apply == Apply.MODULE_PARAMS:
            values = module_params(dp.name)
            if values:
                out[dp.name] = values
    return out


def _read_tables() -> list[Datapath]:
    """The table datapaths besides the default (Fusion, which the lab reads its own way) whose
    module the guest runs: GEMINI's and DC-Vegas's when a loop loaded them."""
    return [
        d
        for d in registry()
        if d.genl_family and d != registry().default and Path(f"/sys/module/{d.module}").is_dir()
    ]


def table_dump(d: Datapath) -> dict:
    """What table datapath ``d`` runs in this network namespace: its net.<name>.* sysctls (the
    default profile), and its profile table as the module gives it back over netlink, each
    rule with the θ of its profile."""
    root = d.sysctl_root()
    with FusionNetlink(TableFamily.of(d)) as nl:
        version, profiles, rules = nl.get_profiles()
    return {
        "sysctls": {n: int((root / n).read_text()) for n in d.spec.names},
        "version": version,
        "rules": [[r.prefix, profiles[r.profile_id]] for r in rules],
    }


def loaded_tables(ns: str) -> dict[str, dict]:
    """Every loaded table datapath's dump (``table_dump``) in lab host ``ns``: read there by a
    process of its own (netlink and /proc/sys/net answer for the reader's namespace); none is
    started while no such module is loaded."""
    if not _read_tables():
        return {}
    return json.loads(sh(*python_in(ns, "gemini_lab.cubic_guest", "tables")))


def cubic_params() -> dict[str, int]:
    """CUBIC's parameters now (gemini-lab cubic's readings)."""
    return module_params("cubic")


def write_cubic_params(theta: dict[str, int]) -> None:
    write_module_params("cubic", theta)


def _flow(path: int, size: int) -> dict:
    """One cubic transfer of ``size`` bytes: throughput over its whole life (Mbit/s) and the
    queueing delay its socket saw at the end (smoothed RTT − minimum RTT, ms), as the agent
    reads a finished flow of another CC."""
    start = time.monotonic()
    r = put(receiver_addr(path), CHECK_PORT, "cubic", size)
    seconds = time.monotonic() - start
    return {
        "cc": r["cc"],
        "seconds": seconds,
        "throughput_mbps": size * 8 / seconds / 1e6,
        "queue_delay_ms": max(0, r["rtt_us"] - r["min_rtt_us"]) / 1000,
        "retransmits": r["total_retrans"],
    }


def exp_cubic_check(e: dict, out: Path) -> dict:
    """For each θ of ``e["thetas"]`` (spec units, the rest at the kernel's values): write it,
    run ``e["flows"]`` cubic flows of ``e["flow_bytes"]`` bytes on path ``e["path"]`` one after
    another, and read the parameters back; the kernel's values are put back at the end."""
    from gemini_lab.bulk import parse_size

    path, size = e["path"], parse_size(e["flow_bytes"])
    before = cubic_params()
    receiver = subprocess.Popen(
        [
            *("ip", "netns", "exec", receiver_ns(path), sys.executable),
            *("-m", "gemini_lab.flowgen", "serve", str(CHECK_PORT)),
        ]
    )
    wait_listening(receiver_ns(path), CHECK_PORT)
    cells = []
    try:
        for theta in e["thetas"]:
            write_cubic_params({**before, **theta})
            flows = [_flow(path, size) for _ in range(e["flows"])]
            cells.append({"theta": theta, "read_back": cubic_params(), "flows": flows})
    finally:
        write_cubic_params(before)
        receiver.terminate()
    return {"before": before, "after": cubic_params(), "cells": cells}


if __name__ == "__main__":
    if sys.argv[1:] != ["tables"]:
        sys.exit("usage: python -m gemini_lab.cubic_guest tables")
    print(json.dumps({d.name: table_dump(d) for d in _read_tables()}))
