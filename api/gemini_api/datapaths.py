"""The registry of datapaths: every congestion control Booster tunes, and how each is run.

A datapath is four things (docs/datapaths.md is the recipe for adding one):

1. its θ spec, ``specs/<name>.toml`` — parameters, units, regions, defaults, and the keys below;
2. its kernel part — a ``tcp_congestion_ops`` module (``module``, CC name ``cc``);
3. how the agent applies θ and records flows — ``apply`` and ``records``, each one of a small
   set of kinds, so a new datapath that applies θ the way an existing one does needs no code:
   - ``apply = "profile_table"``: θ per destination prefix through the module's netlink
     table, and per network namespace through its sysctls net.<name>.* (Fusion, GEMINI,
     DC-Vegas: one table source, fusion-kmod/cc_table.h, compiled into each module). The
     table's generic netlink family is ``genl_family`` (the datapath's name unless the spec
     says otherwise), its ABI Fusion's (fusion-kmod/fusion_uapi.h) with the datapath's θ;
   - ``apply = "module_params"``: one θ per host, written to the module's parameters under
     ``target`` (CUBIC, GEMINI, DC-Vegas); the kernel refuses values outside Θ′;
   - ``apply = "config_file"``: one θ per host, written atomically to the file ``target``
     that a user-space transport reads at each flow's start (FlashPass's lab prototype; it
     has no kernel part, so its ``module`` names nothing to load); the transport refuses
     values outside Θ′;
   - ``records = "flow_records"``: the module reports each finished flow with the θ it ran;
   - ``records = "sock_diag"``: flows are read from sock_diag destroy events and attributed
     to the θ the host ran;
   - ``records = "flow_log"``: a user-space transport appends one JSON line per finished flow
     (with the θ it ran) to the log beside its θ file (``target`` with the suffix
     ``.flows``), which the agent tails (gemini_agent.flowlog);
4. its planning space in Booster — the spec's regions, searched by the same planner.

``message`` says which field of the wire protocol carries its θ: ``theta`` (the fixed Theta
message of the first datapath, kept for agents built before the registry) or
``datapath_theta`` (name + values, any datapath). ``ecn`` says whether its flows need an
ECN-capable path and receivers (GEMINI).

Every other module looks datapaths up here and branches on these kinds, never on a name
(tests/test_datapath_registry.py enforces it for booster/ and agent/).
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from functools import cache
from pathlib import Path

from gemini_api.theta import SPECS_DIR, ThetaError, ThetaSpec, parse_spec

# The datapath of a policy or arm that names none: the product's first, the paper's Fusion.
DEFAULT_DATAPATH = "fusion"
PROC_SYS_NET = Path("/proc/sys/net")


class Apply(StrEnum):
    """How the agent puts a datapath's θ into the kernel."""

    PROFILE_TABLE = "profile_table"
    MODULE_PARAMS = "module_params"
    CONFIG_FILE = "config_file"


class Records(StrEnum):
    """Where the agent reads a datapath's finished flows from."""

    FLOW_RECORDS = "flow_records"
    SOCK_DIAG = "sock_diag"
    FLOW_LOG = "flow_log"


class Message(StrEnum):
    """The wire field a datapath's θ travels in."""

    THETA = "theta"
    DATAPATH_THETA = "datapath_theta"


# What a spec's scope implies when the spec does not say: one θ per context needs the table.
_APPLY_BY_SCOPE = {"context": Apply.PROFILE_TABLE, "host": Apply.MODULE_PARAMS}
_RECORDS_BY_APPLY = {
    Apply.PROFILE_TABLE: Records.FLOW_RECORDS,
    Apply.MODULE_PARAMS: Records.SOCK_DIAG,
    Apply.CONFIG_FILE: Records.FLOW_LOG,
}


@dataclass(frozen=True)
class Datapath:
    name: str
    cc: str  # the kernel's name of its congestion control (tcp_congestion_ops.name)
    module: str  # its kernel module; "" where it has none (a user-space transport)
    spec: ThetaSpec
    apply: Apply
    records: Records
    message: Message
    ecn: bool = False
    genl_family: str = ""  # the θ table's generic netlink family; "" without a table

    def sysctl_root(self, net: Path = PROC_SYS_NET) -> Path:
        """Where a table datapath's θ per network namespace is: net.<name>.* (the modules'
        CC_TABLE_SYSCTL_DIR), under ``net`` (/proc/sys/net, or where a container mounts it)."""
        return net / self.name

    @property
    def per_destination(self) -> bool:
        """θ per destination context (the table), rather than one θ per host."""
        return self.apply is Apply.PROFILE_TABLE


def _kind(enum: type[StrEnum], raw: Mapping, key: str, default: StrEnum, name: str) -> StrEnum:
    value = raw.get(key, default.value)
    try:
        return enum(value)
    except ValueError:
        choices = [e.value for e in enum]
        raise ThetaError(f"specs/{name}.toml: {key} {value!r}; expected one of {choices}") from None


def _default_module(apply: Apply, name: str) -> str:
    """``tcp_<name>`` for a kernel datapath; none ("") for a user-space transport's."""
    return "" if apply is Apply.CONFIG_FILE else f"tcp_{name}"


def parse_datapath(raw: Mapping, file_stem: str) -> Datapath:
    """A datapath from its spec file's table; ThetaError naming the file and key when wrong."""
    spec = parse_spec(raw)
    if spec.datapath != file_stem:
        raise ThetaError(f"specs/{file_stem}.toml declares datapath {spec.datapath!r}")
    apply = _kind(Apply, raw, "apply", _APPLY_BY_SCOPE[spec.scope], file_stem)
    if (apply is Apply.PROFILE_TABLE) != (spec.scope == "context"):
        raise ThetaError(f"specs/{file_stem}.toml: apply {apply.value!r} with scope {spec.scope!r}")
    records = _kind(Records, raw, "records", _RECORDS_BY_APPLY[Apply(apply)], file_stem)
    message = _kind(Message, raw, "message", Message.DATAPATH_THETA, file_stem)
    family = str(raw.get("genl_family", spec.datapath)) if apply is Apply.PROFILE_TABLE else ""
    if "genl_family" in raw and not family:
        raise ThetaError(f"specs/{file_stem}.toml: genl_family without apply 'profile_table'")
    return Datapath(
        name=spec.datapath,
        cc=str(raw.get("cc", spec.datapath)),
        module=str(raw.get("module", _default_module(Apply(apply), spec.datapath))),
        spec=spec,
        apply=Apply(apply),
        records=Records(records),
        message=Message(message),
        ecn=bool(raw.get("ecn", False)),
        genl_family=family,
    )


class Registry:
    """The datapaths by name and by CC; the default first, then by name."""

    def __init__(self, datapaths: list[Datapath]) -> None:
        self._by_name = {d.name: d for d in datapaths}
        self._by_cc = {d.cc: d for d in datapaths}
        if len(self._by_cc) != len(datapaths):
            raise ThetaError("two datapaths share a congestion-control name")
        if DEFAULT_DATAPATH not in self._by_name:
            raise ThetaError(f"no spec for the default datapath {DEFAULT_DATAPATH!r}")
        if sum(d.message is Message.THETA for d in datapaths) > 1:
            raise ThetaError("only one datapath can travel in the Theta message")

    def names(self) -> tuple[str, ...]:
        return (DEFAULT_DATAPATH, *sorted(set(self._by_name) - {DEFAULT_DATAPATH}))

    def __iter__(self):
        return (self._by_name[n] for n in self.names())

    def get(self, name: str) -> Datapath:
        """The datapath ``name``; ThetaError naming the ones there are when it is unknown."""
        try:
            return self._by_name[name]
        except KeyError:
            raise ThetaError(f"no datapath {name!r}; have {list(self.names())}") from None

    def for_cc(self, cc: str) -> Datapath | None:
        """The datapath whose flows run congestion control ``cc``; None for an untuned CC."""
        return self._by_cc.get(cc)

    def answered(self, target_cc: str) -> Datapath | None:
        """The datapath Booster's answer tunes, by its ``target_cc``; an answer without one
        (Boosters before the field, and tests' bare answers) tunes the default datapath."""
        return self.for_cc(target_cc) if target_cc else self.default

    @property
    def default(self) -> Datapath:
        return self._by_name[DEFAULT_DATAPATH]


def load_registry(specs_dir: Path = SPECS_DIR) -> Registry:
    """Every ``specs/*.toml`` as a datapath (not cached: tests build registries of their own)."""
    datapaths = []
    for path in sorted(specs_dir.glob("*.toml")):
        with path.open("rb") as f:
            datapaths.append(parse_datapath(tomllib.load(f), path.stem))
    return Registry(datapaths)


@cache
def registry() -> Registry:
    """The datapaths this installation ships (the package's ``specs/``)."""
    return load_registry()


def datapath(name: str) -> Datapath:
    return registry().get(name)


def load_datapath(name: str) -> ThetaSpec:
    """The θ spec of datapath ``name``; ThetaError when there is none."""
    return registry().get(name).spec


def datapaths() -> tuple[str, ...]:
    """Every datapath's name, the default first."""
    return registry().names()
