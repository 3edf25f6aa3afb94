"""The kernel's side of θ and of the netlink ABI, checked against the Python side.

fusion-kmod/fusion_theta.h must be exactly what scripts/gen_kmod_theta.py makes of the θ spec,
and the attribute tables of gemini_api.fusion_genl must list fusion_uapi.h's enums in order.
"""

from __future__ import annotations

import re
from pathlib import Path

from gemini_api import fusion_genl
from gemini_api.theta import load_spec

ROOT = Path(__file__).resolve().parents[1]
UAPI = (ROOT / "fusion-kmod" / "fusion_uapi.h").read_text()


def _enum(name: str) -> list[str]:
    body = re.search(r"enum " + name + r" \{(.*?)\};", UAPI, re.S)
    assert body, f"enum {name} not in fusion_uapi.h"
    members = re.findall(r"^\s*(\w+)\s*,", body.group(1), re.M)
    return [m for m in members if not m.startswith("__")]


def test_kernel_theta_header_is_generated_from_the_spec():
    import importlib.util

    spec = importlib.util.spec_from_file_location("gen", ROOT / "scripts" / "gen_kmod_theta.py")
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    expected = gen.render(load_spec())
    actual = (ROOT / "fusion-kmod" / "fusion_theta.h").read_text()
    assert actual == expected, "fusion_theta.h is stale: run `make kmod-theta`"


def test_kernel_theta_header_carries_names_and_wide_bounds():
    header = (ROOT / "fusion-kmod" / "fusion_theta.h").read_text()
    spec = load_spec()
    names = re.search(r"#define FUSION_THETA_NAMES \{ (.*) \}", header).group(1)
    assert names == ", ".join(f'"{n}"' for n in spec.names)
    lo = re.search(r"#define FUSION_THETA_MIN \{ (.*) \}", header).group(1)
    hi = re.search(r"#define FUSION_THETA_MAX \{ (.*) \}", header).group(1)
    assert [int(x) for x in lo.split(",")] == [p.wide[0] for p in spec.params]
    assert [int(x) for x in hi.split(",")] == [p.wide[1] for p in spec.params]


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


def test_theta_blob_round_trips_in_spec_order():
    theta = load_spec().default()
    blob = fusion_genl._pack_theta(theta)
    assert len(blob) == 4 * len(theta)
    assert fusion_genl._unpack_theta(blob) == theta


def test_flow_record_fast_parser_agrees_with_pyroute2():
    theta = load_spec().default() | {"mult_decrease": 61}
    msg = fusion_genl.fusion_msg()
    msg["cmd"] = fusion_genl.CMD_FLOW_RECORD
    msg["version"] = 1
    msg["header"]["type"] = 0x1F
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
        ("FUSION_ATTR_REC_THETA", fusion_genl._pack_theta(theta)),
    ]
    msg.encode()
    data = bytes(msg.data)
    (fast,) = fusion_genl._records_in(data + data[:0], 0x1F)
    slow = fusion_genl.fusion_msg(data)
    slow.decode()
    assert fast.bytes_acked == slow.get_attr("FUSION_ATTR_REC_BYTES_ACKED") == 123_456_789_012
    assert (fast.src, fast.dst, fast.sport, fast.dport) == ("10.0.0.2", "10.1.0.2", 40001, 5201)
    assert (fast.rtt_avg_us, fast.rtt_min_us, fast.retrans, fast.segs_out) == (41000, 40000, 3, 900)
    assert (fast.profile_id, fast.profile_version, fast.theta) == (2, 7, theta)
    assert list(fusion_genl._records_in(data, 0x20)) == []  # another family's message
