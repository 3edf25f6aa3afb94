"""The kernel's side of θ and of the netlink ABI, checked against the Python side.

fusion-kmod/fusion_theta.h, gemini_theta.h and dcvegas_theta.h must be exactly what
scripts/gen_kmod_theta.py makes of their θ specs,
and the attribute tables of gemini_api.fusion_genl must list fusion_uapi.h's enums in order.
"""

from __future__ import annotations

import ipaddress
import re
import struct
import sys
from pathlib import Path
from typing import Any

import pytest

from gemini_api import fusion_genl
from gemini_api.datapaths import Datapath, datapath, registry
from gemini_api.theta import load_spec

ROOT = Path(__file__).resolve().parents[1]
UAPI = (ROOT / "fusion-kmod" / "fusion_uapi.h").read_text()


def _enum(name: str) -> list[str]:
    body = re.search(r"enum " + name + r" \{(.*?)\};", UAPI, re.S)
    assert body, f"enum {name} not in fusion_uapi.h"
    members = re.findall(r"^\s*(\w+)\s*,", body.group(1), re.M)
    return [m for m in members if not m.startswith("__")]


def _generator():
    import importlib.util

    if "gen_kmod_theta" in sys.modules:
        return sys.modules["gen_kmod_theta"]
    path = ROOT / "scripts" / "gen_kmod_theta.py"
    spec = importlib.util.spec_from_file_location("gen_kmod_theta", path)
    gen = importlib.util.module_from_spec(spec)
    sys.modules["gen_kmod_theta"] = gen  # its dataclass looks its module up there
    spec.loader.exec_module(gen)
    return gen


def test_kernel_theta_headers_are_generated_from_the_specs():
    """fusion_theta.h, gemini_theta.h, dcvegas_theta.h and gear_theta.h: each exactly its
    spec's rendering."""
    gen = _generator()
    assert gen.render(load_spec()) == (ROOT / "fusion-kmod" / "fusion_theta.h").read_text()
    assert [h.path.name for h in gen.HEADERS] == [
        "fusion_theta.h",
        "gemini_theta.h",
        "dcvegas_theta.h",
        "gear_theta.h",
    ]
    for header in gen.HEADERS:
        actual = header.path.read_text()
        assert actual == header.render(), f"{header.path.name} is stale: run `make kmod-theta`"


def test_kernel_theta_header_carries_names_and_wide_bounds():
    for header in _generator().HEADERS:
        text, spec, prefix = header.path.read_text(), header.spec(), header.prefix
        names = re.search(rf"#define {prefix}_THETA_NAMES \{{ (.*) \}}", text).group(1)
        assert names == ", ".join(f'"{n}"' for n in spec.names)
        lo = re.search(rf"#define {prefix}_THETA_MIN \{{ (.*) \}}", text).group(1)
        hi = re.search(rf"#define {prefix}_THETA_MAX \{{ (.*) \}}", text).group(1)
        assert [int(x) for x in lo.split(",")] == [p.wide[0] for p in spec.params]
        assert [int(x) for x in hi.split(",")] == [p.wide[1] for p in spec.params]


def _module_source(datapath: str) -> Path:
    """The congestion control's source: <name>_cc.c in a module that also compiles the θ table
    (<name>_table.c), tcp_<name>.c in a one-source module."""
    kmod = ROOT / "fusion-kmod"
    composite = kmod / f"{datapath}_cc.c"
    return composite if composite.exists() else kmod / f"tcp_{datapath}.c"


def test_module_parameter_headers_list_every_parameter_with_its_bounds():
    """The modules' module_param_cb list (the X-macro) is where Θ' is enforced on write."""
    for header in _generator().HEADERS[1:]:
        spec = header.spec()
        # the host's θ, which a table module's namespaces follow until their own is written
        assert spec.target == f"/sys/module/tcp_{spec.datapath}/parameters"
        entries = re.findall(
            rf"X\((\w+), {header.prefix}_THETA_(\w+), (\d+), (\d+), (\d+),",
            header.path.read_text(),
        )
        assert entries == [
            (p.name, p.name.upper(), str(p.default), str(p.wide[0]), str(p.wide[1]))
            for p in spec.params
        ]
        source = _module_source(spec.datapath).read_text()
        assert f"{header.prefix}_THETA_PARAMS({header.prefix}_MODULE_PARAM)" in source
        assert f"&{spec.datapath}_theta[idx], 0644" in source


def test_netlink_attribute_tables_match_the_uapi_header():
    assert [n for n, _ in fusion_genl.fusion_msg.nla_map] == _enum("fusion_attr")
    assert [n for n, _ in fusion_genl.profile_nla.nla_map] == _enum("fusion_profile_attr")
    assert [n for n, _ in fusion_genl.rule_nla.nla_map] == _enum("fusion_rule_attr")
    cmds = _enum("fusion_cmd")
    assert cmds.index("FUSION_CMD_SET_PROFILES") == fusion_genl.CMD_SET_PROFILES
    assert cmds.index("FUSION_CMD_GET_PROFILES") == fusion_genl.CMD_GET_PROFILES
    assert cmds.index("FUSION_CMD_GET_STATS") == fusion_genl.CMD_GET_STATS
    assert cmds.index("FUSION_CMD_FLOW_RECORD") == fusion_genl.CMD_FLOW_RECORD


def _define(name: str) -> int:
    found = re.search(r"^#define " + name + r"\s+(\d+)\s*$", UAPI, re.M)
    assert found, f"{name} not defined in fusion_uapi.h"
    return int(found.group(1))


def test_table_limits_and_default_profile_match_the_uapi_header():
    """The agent sizes its table by these: a copy that drifted would make the module refuse it."""
    assert _define("FUSION_MAX_PROFILES") == fusion_genl.MAX_PROFILES
    assert _define("FUSION_MAX_RULES") == fusion_genl.MAX_RULES
    assert _define("FUSION_DEFAULT_PROFILE") == fusion_genl.DEFAULT_PROFILE


# Every module with the θ table speaks Fusion's ABI with its own θ: Fusion's seven parameters,
# DC-Vegas's two (its spec's order), GEMINI's ten.
TABLES = [d for d in registry() if d.genl_family]


def _family(d: Datapath) -> fusion_genl.TableFamily:
    return fusion_genl.TableFamily.of(d)


def test_the_table_datapaths_are_the_modules_that_compile_the_table():
    assert {d.name for d in TABLES} == set(TABLE_MODULES)
    assert all(d.genl_family == d.name for d in TABLES)  # CC_TABLE_GENL_NAME: checked below
    assert fusion_genl.default_family() == _family(datapath("fusion"))
    with pytest.raises(ValueError, match="'cubic' has no θ table"):
        fusion_genl.TableFamily.of(datapath("cubic"))


@pytest.mark.parametrize("d", TABLES, ids=lambda d: d.name)
def test_theta_blob_round_trips_in_spec_order(d: Datapath):
    family = _family(d)
    theta = d.spec.default()
    blob = fusion_genl._pack_theta(theta, family)
    assert len(blob) == 4 * len(theta)
    assert blob[:4] == struct.pack("=I", theta[d.spec.names[0]])
    assert fusion_genl._unpack_theta(blob, family) == theta


def test_a_blob_of_another_length_is_refused_not_misread():
    dcvegas = _family(datapath("dcvegas"))
    two = fusion_genl._pack_theta(datapath("dcvegas").spec.default(), dcvegas)
    with pytest.raises(ValueError, match="8 bytes; 7 parameters take 28"):
        fusion_genl._unpack_theta(two)  # Fusion's θ is seven parameters
    with pytest.raises(ValueError, match="theta lacks ewma_shift"):
        fusion_genl._pack_theta({"queue_threshold": 6}, dcvegas)


def test_a_two_parameter_table_message_carries_dcvegas_theta_in_spec_order():
    """The SET_PROFILES message the agent sends tcp_dcvegas, decoded as the kernel's policy
    reads it: each profile's θ an 8-byte blob in the spec's order, the rules as for Fusion."""
    dcvegas = _family(datapath("dcvegas"))
    profiles = {
        1: {"queue_threshold": 6, "ewma_shift": 4},
        2: {"ewma_shift": 3, "queue_threshold": 21},
    }
    rules = [fusion_genl.Rule("0.0.0.0/0", 1), fusion_genl.Rule("10.2.0.0/16", 2)]
    msg = fusion_genl.fusion_msg()
    msg["cmd"], msg["version"] = fusion_genl.CMD_SET_PROFILES, 1
    msg["attrs"] = fusion_genl.table_attrs(profiles, rules, dcvegas)
    msg.encode()
    back = fusion_genl.fusion_msg(bytes(msg.data))
    back.decode()
    blobs = {
        p.get_attr("FUSION_PROFILE_ATTR_ID"): bytes(p.get_attr("FUSION_PROFILE_ATTR_THETA"))
        for p in back.get_attrs("FUSION_ATTR_PROFILE")
    }
    assert blobs == {1: struct.pack("=2I", 6, 4), 2: struct.pack("=2I", 21, 3)}
    got = [
        (bytes(r.get_attr("FUSION_RULE_ATTR_ADDR")), r.get_attr("FUSION_RULE_ATTR_PREFIX_LEN"))
        for r in back.get_attrs("FUSION_ATTR_RULE")
    ]
    assert got == [(bytes(4), 0), (bytes([10, 2, 0, 0]), 16)]


RECORD_FAMILY_ID = 0x1F  # the generic netlink family id a record message carries here


def record_message(theta: dict[str, int], family: fusion_genl.TableFamily) -> bytes:
    """A flow record as a module multicasts it (10.0.0.2:40001 → 10.1.0.2:5201, profile 2 of
    table version 7), ``theta`` as ``family``'s blob, encoded by pyroute2."""
    msg = fusion_genl.fusion_msg()
    msg["cmd"] = fusion_genl.CMD_FLOW_RECORD
    msg["version"] = 1
    msg["header"]["type"] = RECORD_FAMILY_ID
    msg["attrs"] = [
        ("FUSION_ATTR_REC_FAMILY", 2),
        ("FUSION_ATTR_REC_SADDR", bytes([10, 0, 0, 2])),
        ("FUSION_ATTR_REC_DADDR", bytes([10, 1, 0, 2])),
        ("FUSION_ATTR_REC_SPORT", 40001),
        ("FUSION_ATTR_REC_DPORT", 5201),
        ("FUSION_ATTR_REC_BYTES_ACKED", 123_456_789_012),
        ("FUSION_ATTR_REC_DURATION_US", 2_000_000),
        ("FUSION_ATTR_REC_RTT_AVG_US", 41_000),
        ("FUSION_ATTR_REC_RTT_MIN_US", 40_000),
        ("FUSION_ATTR_REC_RETRANS", 3),
        ("FUSION_ATTR_REC_SEGS_OUT", 900),
        ("FUSION_ATTR_REC_PROFILE_ID", 2),
        ("FUSION_ATTR_REC_PROFILE_VERSION", 7),
        ("FUSION_ATTR_REC_THETA", fusion_genl._pack_theta(theta, family)),
    ]
    msg.encode()
    return bytes(msg.data)


@pytest.mark.parametrize("d", TABLES, ids=lambda d: d.name)
def test_flow_record_fast_parser_agrees_with_pyroute2(d: Datapath):
    family = _family(d)
    first = d.spec.params[0]
    theta = d.spec.default() | {first.name: first.wide[1]}
    data = record_message(theta, family)
    slow = fusion_genl.fusion_msg(data)
    slow.decode()

    def attr(name: str) -> Any:
        return slow.get_attr(f"FUSION_ATTR_REC_{name}")

    # what pyroute2 decodes, every field of the record
    decoded = fusion_genl.FlowRecord(
        src=str(ipaddress.ip_address(attr("SADDR"))),
        dst=str(ipaddress.ip_address(attr("DADDR"))),
        sport=attr("SPORT"),
        dport=attr("DPORT"),
        bytes_acked=attr("BYTES_ACKED"),
        duration_us=attr("DURATION_US"),
        rtt_avg_us=attr("RTT_AVG_US"),
        rtt_min_us=attr("RTT_MIN_US"),
        retrans=attr("RETRANS"),
        segs_out=attr("SEGS_OUT"),
        profile_id=attr("PROFILE_ID"),
        profile_version=attr("PROFILE_VERSION"),
        theta=fusion_genl._unpack_theta(attr("THETA"), family),
    )
    assert decoded == fusion_genl.FlowRecord(
        "10.0.0.2", "10.1.0.2", 40001, 5201, 123_456_789_012, 2_000_000,
        41_000, 40_000, 3, 900, 2, 7, theta,
    )  # fmt: skip
    # a receive buffer holds many messages: two records around another family's message whose
    # length is not a multiple of 4 (the next message starts at the aligned offset)
    other = struct.pack("=IHHII", 21, 0x20, 0, 1, 0) + bytes([fusion_genl.CMD_FLOW_RECORD, 1, 0, 0])
    other += b"\x07" + bytes(3)
    records = list(fusion_genl._records_in(data + other + data, RECORD_FAMILY_ID, family))
    assert records == [decoded, decoded]
    assert list(fusion_genl._records_in(data, 0x20, family)) == []  # another family's message


TABLE_MODULES = {"fusion": "fusion.h", "gemini": "gemini_table.h", "dcvegas": "dcvegas_table.h"}


def test_each_module_compiles_its_own_copy_of_the_table_under_its_own_names():
    """One table source, an object per module (Kbuild), and per module its own generic netlink
    family and net.<name> sysctl directory, named after the datapath (docs/datapaths.md)."""
    kmod = ROOT / "fusion-kmod"
    kbuild = (kmod / "Kbuild").read_text()
    for name, header in TABLE_MODULES.items():
        assert re.search(rf"^tcp_{name}-y := {name}_cc\.o {name}_table\.o$", kbuild, re.M), name
        wrapper = (kmod / f"{name}_table.c").read_text()
        for shared in ("fusion_lpm.c", "fusion_profiles.c", "fusion_netlink.c"):
            assert f'#include "{shared}"' in wrapper, (name, shared)
        text = (kmod / header).read_text()
        assert re.search(r'#define CC_TABLE_SYSCTL_DIR\s+"net/' + name + '"', text), name
        family = re.search(r"#define CC_TABLE_GENL_NAME\s+(\w+)", text)
        assert family, name
        assert re.search(rf'#define {family.group(1)}\s+"{name}"', text + _uapi()), name


def _uapi() -> str:
    return (ROOT / "fusion-kmod" / "fusion_uapi.h").read_text()
