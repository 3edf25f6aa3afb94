"""The closed loop (agent → Booster → agent → kernel) for any datapath of the registry:
``gemini-lab datapath-loop --datapath NAME``.

gemini_lab.cubic runs it for CUBIC; nothing in it is CUBIC's but its defaults, so this module
only chooses, per datapath, a path where the datapath's signals occur and which θ parameter to
search, and runs gemini_lab.cubic's loop with ``CubicConfig.datapath`` set. The guest loads the
datapath's module first (experiment kind ``datapath_load``: ours from the build beside
tcp_fusion.ko) and the lab host's namespace runs its CC. The agent applies θ as the datapath's
spec says: GEMINI and DC-Vegas are table datapaths, so it installs Booster's θ per context in
the module's profile table and net.<name>.* sysctls of the lab host's namespace and reports the
flows from the module's records, each with the θ it ran; at each checkpoint the guest dumps
that namespace's table and sysctls back (gemini_lab.fleet.probe, cubic_guest.table_dump). A
host-wide datapath's θ goes into /sys/module/<module>/parameters and is read back from there.

The path for GEMINI and DC-Vegas is a small datacenter-like one that qemu's emulation keeps up
with: 20 Mbit/s, 10 ms, a 100-packet queue marking ECN from 20 packets, dctcp receivers (so a
GEMINI flow negotiates ECN and gets DCTCP's exact echo; DC-Vegas asks for no ECN and is never
marked). The parameter searched is the one each paper says to set per environment: GEMINI's
K (what its F assumes of the switches), DC-Vegas's K_dcv.
"""

from __future__ import annotations

from dataclasses import replace

from gemini_lab import scenario
from gemini_lab.cubic import CubicConfig
from gemini_lab.loop import LabPath

ECN_PATH = LabPath(scenario.load("dc-ecn"), "dc", "isp-b")
# per datapath: the path and the θ parameter searched (the rest pinned at the spec's defaults)
LOOPS: dict[str, tuple[LabPath, tuple[str, ...]]] = {
    "gemini": (ECN_PATH, ("ecn_k",)),
    "dcvegas": (ECN_PATH, ("queue_threshold",)),
}


def loop_config(name: str, base: CubicConfig | None = None) -> CubicConfig:
    """gemini_lab.cubic's configuration for datapath ``name`` (``base`` for the timings)."""
    path, tuned = LOOPS[name]
    return replace(base or CubicConfig(), datapath=name, path=path, tuned=tuned)
