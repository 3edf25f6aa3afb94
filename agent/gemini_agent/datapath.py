"""θ of a host-wide datapath (Linux CUBIC's module parameters, or the θ file of a user-space
transport such as FlashPass's) into place, checked first, restored on exit.

A datapath's spec (api/gemini_api/specs/<datapath>.toml) names where its θ goes (``target``:
for CUBIC /sys/module/tcp_cubic/parameters, one file per parameter) and its scope. Module
parameters are global to the kernel, so one θ runs per host, for every flow of that CC in every
namespace and on every route. Booster answers a θ per context; the agent runs the θ of the
busiest context it asked about (the first of its ranking with an answer; Booster's default when
there is none): the flows that θ governs are then mostly flows of the context it was planned
for, and every report of the host attributes its flows of that CC to the one θ that ran.

A θ is checked against the spec's wide region Θ' (what the parameters safely take) before any
file is written; the kernel's own values are read once, before the first write, and written
back by ``restore`` (the agent's clean exit, a policy that no longer targets the datapath, a
kernel-default arm of its CC; the agent closes the report interval first, so the flows that ran
the tuned θ are reported as its trials). A write that fails half-way puts back the values
written so far, so the module never holds a mix of two θ. When Booster has been silent longer
than ``staleness_s``, the agent writes the spec's default (the kernel's defaults, as the spec
records them) through the same checked write, as Fusion falls back to its safe default, and
Booster's θ again once it answers (gemini_agent.daemon).
"""

from __future__ import annotations

import logging
import os
import tempfile
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Protocol

from gemini_api.datapaths import Apply, Datapath
from gemini_api.theta import Bounds, ThetaError, ThetaSpec
from gemini_api.v1 import booster_pb2 as pb

log = logging.getLogger(__name__)


def host_theta(resp: pb.GetParametersResponse, datapath: str) -> dict[str, int] | None:
    """The one θ of ``datapath`` this host runs, from Booster's answer: the first context's
    (contexts are asked busiest first) that carries one, else the default; None without any."""
    for params in resp.parameters:
        if params.HasField("datapath_theta") and params.datapath_theta.datapath == datapath:
            return dict(params.datapath_theta.values)
    default = resp.default_datapath_theta
    if resp.HasField("default_datapath_theta") and default.datapath == datapath:
        return dict(default.values)
    return None


class ModuleParams:
    """A datapath's θ as files under its spec's ``target`` (``root`` overrides it)."""

    def __init__(self, spec: ThetaSpec, root: Path | None = None) -> None:
        if spec.scope != "host":
            raise ThetaError(f"datapath {spec.datapath!r} is not host-wide")
        self.spec = spec
        self.root = root or Path(spec.target)
        self.saved: dict[str, int] | None = None  # the kernel's values before the first write
        self.written: dict[str, int] | None = None

    def available(self) -> bool:
        return all((self.root / n).is_file() for n in self.spec.names)

    def read(self) -> dict[str, int]:
        return {n: int((self.root / n).read_text().strip()) for n in self.spec.names}

    def _write_all(self, theta: Mapping[str, int]) -> None:
        """Write every parameter; on a failure put back what was written, then raise."""
        before = self.read()
        done: list[str] = []
        try:
            for name in self.spec.names:
                if before[name] != theta[name]:
                    (self.root / name).write_text(f"{theta[name]}\n")
                    done.append(name)
            if self.read() != dict(theta):
                raise OSError(f"{self.root} reads {self.read()}, not {dict(theta)}")
        except OSError:
            for name in reversed(done):
                (self.root / name).write_text(f"{before[name]}\n")
            raise

    def write(self, theta: Mapping[str, int], bounds: Bounds | None = None) -> dict[str, int]:
        """Check ``theta`` against ``bounds`` (Θ' by default) and write it; ThetaError before
        any write when it does not fit, OSError (nothing changed) when the kernel refuses."""
        checked = self.spec.validate(theta, bounds or self.spec.limits)
        if self.saved is None:
            self.saved = self.read()
        if checked != self.written:
            self._write_all(checked)
            self.written = checked
        return checked

    def restore(self) -> None:
        """The kernel's own values back, as read before the first write."""
        if self.saved is None:
            return
        self._write_all(self.saved)
        log.info("%s parameters restored to %s", self.spec.datapath, self.saved)
        self.saved = self.written = None


class ConfigFile:
    """A datapath's θ as the file at its spec's ``target`` (``path`` overrides it), one
    ``name = units`` a line, which a user-space transport reads at each flow's start
    (``apply = "config_file"``). The file is replaced in one rename, so a flow starting
    during a write reads the old θ or the new one, never a mix or half a file."""

    def __init__(self, spec: ThetaSpec, path: Path | None = None) -> None:
        if spec.scope != "host":
            raise ThetaError(f"datapath {spec.datapath!r} is not host-wide")
        self.spec = spec
        self.path = path or Path(spec.target)
        self.saved: dict[str, int] | None = None  # the θ in force before the first write
        self.written: dict[str, int] | None = None
        self._before: str | None = None  # the file's text then (None: there was none)

    def available(self) -> bool:
        """Is the transport installed here? Its configuration directory is."""
        return self.path.parent.is_dir()

    def read(self) -> dict[str, int]:
        """The θ the next flow runs: the file's, the spec's default without one."""
        if not self.path.exists():
            return self.spec.default()
        return {k: int(v) for k, v in tomllib.loads(self.path.read_text()).items()}

    def _replace(self, text: str) -> None:
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=f".{self.path.name}.")
        try:
            with os.fdopen(fd, "w") as f:
                f.write(text)
            os.replace(tmp, self.path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    def write(self, theta: Mapping[str, int], bounds: Bounds | None = None) -> dict[str, int]:
        """Check ``theta`` against ``bounds`` (Θ' by default) and write it; ThetaError before
        any write when it does not fit."""
        checked = self.spec.validate(theta, bounds or self.spec.limits)
        if self.saved is None:
            self.saved = self.read()
            self._before = self.path.read_text() if self.path.exists() else None
        if checked != self.written:
            self._replace("".join(f"{n} = {checked[n]}\n" for n in self.spec.names))
            self.written = checked
        return checked

    def restore(self) -> None:
        """The file as it was before the first write (no file, if there was none)."""
        if self.saved is None:
            return
        if self._before is None:
            self.path.unlink(missing_ok=True)
        else:
            self._replace(self._before)
        log.info("%s θ file restored to %s", self.spec.datapath, self.saved)
        self.saved = self.written = self._before = None


class HostTheta(Protocol):
    """What the agent needs of a host-wide datapath's θ, however it is applied."""

    spec: ThetaSpec
    saved: dict[str, int] | None
    written: dict[str, int] | None

    def available(self) -> bool: ...
    def read(self) -> dict[str, int]: ...
    def write(self, theta: Mapping[str, int], bounds: Bounds | None = None) -> dict[str, int]: ...
    def restore(self) -> None: ...


HOST_WRITERS: dict[Apply, type[ModuleParams] | type[ConfigFile]] = {
    Apply.MODULE_PARAMS: ModuleParams,
    Apply.CONFIG_FILE: ConfigFile,
}


def host_writer(d: Datapath) -> HostTheta | None:
    """The writer of a host-wide datapath's θ, by its apply kind (None for the table's)."""
    writer = HOST_WRITERS.get(d.apply)
    return writer(d.spec) if writer else None


def datapath_message(spec: ThetaSpec, theta: Mapping[str, int]) -> pb.DatapathTheta:
    return pb.DatapathTheta(datapath=spec.datapath, values=dict(theta))
