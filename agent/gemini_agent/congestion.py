"""The congestion control of an experiment's arm, set in the kernel and restored afterwards.

An arm runs its CC host-wide (``net.ipv4.tcp_congestion_control``, which is per network
namespace since Linux 4.15: the agent sets it for the namespace it runs in) or on the routes to
some destination prefixes only (the route's ``congctl`` attribute, which overrides the sysctl
for connections that take that route). Routes are written with ``ip route`` (iproute2): the
agent depends on no netlink library for this.

Every change is remembered as it is made, with what it replaced, so that the agent can put the
host back as it found it when the arm ends, the experiment stops, or the agent exits cleanly.
An arm is applied whole or not at all: a CC the kernel does not offer
(``tcp_available_congestion_control``) is refused before anything is written, and a failure
half-way undoes the changes already made. Either way the host runs what it ran before the arm,
and one log line and a counter say why.

Per-route: a route to exactly the prefix is replaced with the same route plus ``congctl``; when
there is none, the most specific route covering the prefix is copied to the prefix with
``congctl`` (so packets take the same path), and that added route is deleted on restore.
"""

from __future__ import annotations

import errno
import ipaddress
import json
import logging
import subprocess
from dataclasses import asdict, dataclass, field
from pathlib import Path

from gemini_agent.metrics import AgentMetrics
from gemini_api.v1 import booster_pb2 as pb

log = logging.getLogger(__name__)

NET_IPV4 = Path("/proc/sys/net/ipv4")
IP_COMMAND = "ip"
IP_TIMEOUT_S = 10.0
# Words `ip route show` prints that `ip route replace` does not take back (flags of the kernel's
# own making, and a route's remaining lifetime): dropped when a route is written again.
SHOW_ONLY_FLAGS = frozenset(
    {"linkdown", "dead", "offload", "trap", "rt_offload", "rt_trap", "rt_offload_failed", "notify"}
)
SHOW_ONLY_WITH_VALUE = frozenset({"expires"})
ROUTE_TYPES = frozenset({"unicast", "unreachable", "blackhole", "prohibit", "throw"})


class ArmRefused(Exception):
    """The arm cannot run here; ``reason`` is one of metrics.ARM_FAILURES."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class RouteLine:
    """One route as `ip -o route show` prints it, as words `ip route replace` takes."""

    family: int  # 4 or 6
    words: tuple[str, ...]

    @classmethod
    def parse(cls, family: int, line: str) -> RouteLine:
        words, out = line.split(), []
        i = 0
        while i < len(words):
            w = words[i]
            if w in SHOW_ONLY_FLAGS:
                i += 1
            elif w in SHOW_ONLY_WITH_VALUE:
                i += 2
            else:
                out.append(w)
                i += 1
        return cls(family, tuple(out))

    def _dst_index(self) -> int:
        return 1 if self.words and self.words[0] in ROUTE_TYPES else 0

    def with_dst(self, prefix: str) -> RouteLine:
        i = self._dst_index()
        return RouteLine(self.family, (*self.words[:i], prefix, *self.words[i + 1 :]))

    def prefix_length(self) -> int:
        dst = self.words[self._dst_index()]
        if dst == "default":
            return 0
        return ipaddress.ip_network(dst, strict=False).prefixlen

    def without_congctl(self) -> RouteLine:
        out, i = [], 0
        while i < len(self.words):
            if self.words[i] == "congctl":
                i += 3 if i + 1 < len(self.words) and self.words[i + 1] == "lock" else 2
                continue
            out.append(self.words[i])
            i += 1
        return RouteLine(self.family, tuple(out))

    def with_congctl(self, cc: str) -> RouteLine:
        return RouteLine(self.family, (*self.without_congctl().words, "congctl", cc))

    def congctl(self) -> str | None:
        words = self.words
        for i, w in enumerate(words[:-1]):
            if w == "congctl":
                return words[i + 2] if words[i + 1] == "lock" else words[i + 1]
        return None


def _family(prefix: str) -> int:
    return ipaddress.ip_network(prefix).version


class NetKernel:
    """The CC settings of the network namespace the agent runs in. Tests point ``net_ipv4`` at
    /proc/sys/net/ipv4 of a fresh namespace (``unshare -n``); nothing here is simulated."""

    def __init__(self, net_ipv4: Path = NET_IPV4, ip: str = IP_COMMAND) -> None:
        self.net_ipv4, self.ip = net_ipv4, ip

    def available(self) -> frozenset[str]:
        return frozenset((self.net_ipv4 / "tcp_available_congestion_control").read_text().split())

    def host_cc(self) -> str:
        return (self.net_ipv4 / "tcp_congestion_control").read_text().strip()

    def set_host_cc(self, cc: str) -> None:
        (self.net_ipv4 / "tcp_congestion_control").write_text(f"{cc}\n")
        if self.host_cc() != cc:
            raise OSError(f"net.ipv4.tcp_congestion_control reads {self.host_cc()!r}, not {cc!r}")

    def _run(self, family: int, *args: str) -> str:
        cmd = [self.ip, f"-{family}", *args]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=IP_TIMEOUT_S)
        if done.returncode != 0:
            raise OSError(f"{' '.join(cmd)}: {done.stderr.strip() or done.returncode}")
        return done.stdout

    def _routes(self, family: int, *selector: str) -> list[RouteLine]:
        out = self._run(family, "-o", "route", "show", "table", "main", *selector)
        return [RouteLine.parse(family, line) for line in out.splitlines() if line.strip()]

    def route(self, prefix: str) -> RouteLine | None:
        """The main table's route to exactly ``prefix`` (None: there is none)."""
        found = self._routes(_family(prefix), "exact", prefix)
        return found[0] if found else None

    def covering_route(self, prefix: str) -> RouteLine | None:
        """The most specific route of the main table that covers ``prefix``."""
        found = self._routes(_family(prefix), "match", prefix)
        return max(found, key=RouteLine.prefix_length, default=None)

    def replace_route(self, route: RouteLine) -> None:
        self._run(route.family, "route", "replace", *route.words)

    def delete_route(self, route: RouteLine) -> None:
        self._run(route.family, "route", "del", *route.words)


def arm_key(arm: pb.ExperimentArm | None) -> tuple | None:
    """What decides the kernel's settings for an arm (θ is applied elsewhere)."""
    if arm is None:
        return None
    return (arm.experiment, arm.arm, arm.cc, tuple(arm.destination_prefixes))


@dataclass(frozen=True)
class Undo:
    """One change to take back: ``sysctl`` (write ``value`` back), ``route`` (replace the route
    with ``words``, as it was) or ``added`` (delete the route of ``words``, which the arm added).
    Plain data, so that the journal can keep it across a crash of the agent."""

    kind: str
    value: str = ""
    family: int = 4
    words: tuple[str, ...] = ()

    def describe(self) -> str:
        if self.kind == "sysctl":
            return f"net.ipv4.tcp_congestion_control = {self.value}"
        return f"route {' '.join(self.words)} ({self.kind})"


@dataclass
class ArmApplier:
    """Applies one arm at a time and remembers how to undo it: in memory, and in ``journal``
    (a JSON file) when given, so that an agent that died with an arm applied restores the host
    when it starts again (``recover``)."""

    net: NetKernel
    metrics: AgentMetrics
    journal: Path | None = None
    applied: tuple | None = None
    _undo: list[Undo] = field(default_factory=list)

    def _remember(self, undo: Undo) -> None:
        self._undo.append(undo)
        self._save()

    def _save(self) -> None:
        if self.journal is None:
            return
        if not self._undo:
            self.journal.unlink(missing_ok=True)
            return
        tmp = self.journal.with_suffix(".tmp")
        tmp.write_text(json.dumps([asdict(u) for u in self._undo]))
        tmp.replace(self.journal)  # atomic: the journal is either the old list or the new

    def recover(self) -> None:
        """Undo what a previous run of the agent left applied (its journal), if anything."""
        if self.journal is None or not self.journal.exists():
            return
        try:
            entries = json.loads(self.journal.read_text())
            self._undo = [Undo(**{**e, "words": tuple(e["words"])}) for e in entries]
        except (ValueError, TypeError, KeyError) as exc:
            log.error("unreadable arm journal %s (%s): nothing restored", self.journal, exc)
            self.journal.unlink(missing_ok=True)
            return
        log.warning("an arm was left applied by a previous run: restoring the host")
        self.applied = ("recovered",)
        self.restore()

    def apply(self, arm: pb.ExperimentArm | None) -> bool:
        """Run ``arm`` (None: no arm, restore); False when it was refused and the host runs
        what it ran before any arm."""
        key = arm_key(arm)
        if key == self.applied:
            return True
        self.restore()
        if arm is None:
            return True
        try:
            self._apply(arm)
        except ArmRefused as exc:
            self.restore()
            self.metrics.arm_failures.labels(exc.reason).inc()
            log.error(
                "refusing arm %r of experiment %r (cc %s): %s; the host runs its own settings",
                arm.arm,
                arm.experiment,
                arm.cc,
                exc,
            )
            return False
        self.applied = key
        self.metrics.arm_active.set(1)
        self.metrics.arms_applied.inc()
        where = ", ".join(arm.destination_prefixes) or "host-wide"
        log.info("running arm %r of experiment %r: %s %s", arm.arm, arm.experiment, arm.cc, where)
        return True

    def _apply(self, arm: pb.ExperimentArm) -> None:
        try:
            offered = self.net.available()
        except OSError as exc:
            raise ArmRefused("kernel_error", f"cannot read the available CCs: {exc}") from exc
        if arm.cc not in offered:
            raise ArmRefused(
                "unavailable_cc",
                f"the kernel does not offer {arm.cc!r} (tcp_available_congestion_control: "
                f"{' '.join(sorted(offered))})",
            )
        try:
            if arm.destination_prefixes:
                for prefix in arm.destination_prefixes:
                    self._route_cc(prefix, arm.cc)
            else:
                self._host_cc(arm.cc)
        except PermissionError as exc:
            if exc.errno != errno.EPERM or arm.destination_prefixes:
                raise ArmRefused("kernel_error", str(exc)) from exc
            raise ArmRefused(
                "not_allowed",
                f"{exc}: outside the host's own network namespace the kernel takes only the CCs "
                "of net.ipv4.tcp_allowed_congestion_control (set in the host's namespace)",
            ) from exc
        except (OSError, ValueError, subprocess.SubprocessError) as exc:
            raise ArmRefused("kernel_error", str(exc)) from exc

    def _host_cc(self, cc: str) -> None:
        before = self.net.host_cc()
        # Undo first: a write whose read-back differs may still have changed the sysctl.
        self._remember(Undo("sysctl", value=before))
        self.net.set_host_cc(cc)

    def _route_cc(self, prefix: str, cc: str) -> None:
        before = self.net.route(prefix)
        # Each change is journalled before it is made (a crash in between restores a route to
        # what it already is); a route that could not be added has nothing to delete.
        if before is not None:
            self._remember(Undo("route", family=before.family, words=before.words))
            self.net.replace_route(before.with_congctl(cc))
            return
        covering = self.net.covering_route(prefix)
        if covering is None:
            raise OSError(f"no route covers {prefix}")
        added = covering.with_dst(prefix).with_congctl(cc)
        self._remember(Undo("added", family=added.family, words=added.words))
        try:
            self.net.replace_route(added)
        except OSError:
            self._undo.pop()
            self._save()
            raise

    def _take_back(self, undo: Undo) -> None:
        if undo.kind == "sysctl":
            self.net.set_host_cc(undo.value)
        elif undo.kind == "route":
            self.net.replace_route(RouteLine(undo.family, undo.words))
        else:
            self.net.delete_route(RouteLine(undo.family, undo.words))

    def restore(self) -> None:
        """Undo every change of the current arm, the last first; a step that fails is logged
        and the others still run."""
        while self._undo:
            undo = self._undo.pop()
            try:
                self._take_back(undo)
            except (OSError, subprocess.SubprocessError) as exc:
                self.metrics.arm_failures.labels("restore_error").inc()
                log.error("could not restore %s: %s", undo.describe(), exc)
            self._save()
        if self.applied is not None:
            log.info("arm ended: the host's own congestion control settings are back")
        self.applied = None
        self.metrics.arm_active.set(0)
