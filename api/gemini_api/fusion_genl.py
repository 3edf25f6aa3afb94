"""User-space side of a θ-table module's generic netlink family (fusion-kmod/fusion_uapi.h).

Three things cross it: installing the destination table of θ profiles (atomically, as one
message), reading that table and the module's counters back, and receiving one record per
finished flow on the "flows" multicast group. Attribute numbers mirror fusion_uapi.h;
tests/test_fusion_abi.py checks them against the header.

Every module that carries the θ table (tcp_fusion, tcp_gemini, tcp_dcvegas: fusion-kmod/
cc_table.h) speaks this one ABI under a family of its own, with its own θ: a ``TableFamily``
names both, from the datapath registry (``TableFamily.of``). Without one, the client speaks
to Fusion's family, as it did before the other modules had a table.
"""

from __future__ import annotations

import errno
import ipaddress
import os
import socket
import struct
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import cache

from pyroute2.netlink import NLM_F_REQUEST, genlmsg, nla
from pyroute2.netlink.exceptions import NetlinkError
from pyroute2.netlink.generic import GenericNetlinkSocket

from gemini_api.datapaths import Datapath, registry

FAMILY = "fusion"  # Fusion's family (FUSION_GENL_NAME); TableFamily.of for any datapath's
MCGRP_FLOWS = "flows"
CMD_SET_PROFILES = 1
CMD_GET_PROFILES = 2
CMD_GET_STATS = 3
CMD_FLOW_RECORD = 4
DEFAULT_PROFILE = 0
# What one table may hold (FUSION_MAX_PROFILES, FUSION_MAX_RULES); the module refuses more.
MAX_PROFILES = 64
MAX_RULES = 4096
# Big enough for bursts of records at 10,000 flows/s while the reader is scheduled out.
RECORD_RCVBUF_BYTES = 32 * 1024 * 1024
SOL_NETLINK = 270
NETLINK_GENERIC = 16
NLMSG_HDRLEN = 16
GENL_HDRLEN = 4
NLA_HDRLEN = 4
NLA_TYPE_MASK = 0x3FFF  # without NLA_F_NESTED / NLA_F_NET_BYTEORDER
RECV_BYTES = 65536
NETLINK_EXT_ACK = 11


class profile_nla(nla):
    nla_map = (
        ("FUSION_PROFILE_ATTR_UNSPEC", "none"),
        ("FUSION_PROFILE_ATTR_ID", "uint32"),
        ("FUSION_PROFILE_ATTR_THETA", "cdata"),
    )


class rule_nla(nla):
    nla_map = (
        ("FUSION_RULE_ATTR_UNSPEC", "none"),
        ("FUSION_RULE_ATTR_FAMILY", "uint8"),
        ("FUSION_RULE_ATTR_ADDR", "cdata"),
        ("FUSION_RULE_ATTR_PREFIX_LEN", "uint8"),
        ("FUSION_RULE_ATTR_PROFILE_ID", "uint32"),
    )


class fusion_msg(genlmsg):
    prefix = "FUSION_ATTR_"
    nla_map = (
        ("FUSION_ATTR_UNSPEC", "none"),
        ("FUSION_ATTR_VERSION", "uint32"),
        ("FUSION_ATTR_PROFILE", "profile|nested"),
        ("FUSION_ATTR_RULE", "rule|nested"),
        ("FUSION_ATTR_STAT_FLOWS", "uint64"),
        ("FUSION_ATTR_STAT_RECORDS", "uint64"),
        ("FUSION_ATTR_STAT_DROPPED", "uint64"),
        ("FUSION_ATTR_STAT_UNHEARD", "uint64"),
        ("FUSION_ATTR_STAT_NOSTATE", "uint64"),
        ("FUSION_ATTR_REC_FAMILY", "uint8"),
        ("FUSION_ATTR_REC_SADDR", "cdata"),
        ("FUSION_ATTR_REC_DADDR", "cdata"),
        ("FUSION_ATTR_REC_SPORT", "uint16"),
        ("FUSION_ATTR_REC_DPORT", "uint16"),
        ("FUSION_ATTR_REC_BYTES_ACKED", "uint64"),
        ("FUSION_ATTR_REC_DURATION_US", "uint64"),
        ("FUSION_ATTR_REC_RTT_AVG_US", "uint32"),
        ("FUSION_ATTR_REC_RTT_MIN_US", "uint32"),
        ("FUSION_ATTR_REC_RETRANS", "uint32"),
        ("FUSION_ATTR_REC_SEGS_OUT", "uint32"),
        ("FUSION_ATTR_REC_PROFILE_ID", "uint32"),
        ("FUSION_ATTR_REC_PROFILE_VERSION", "uint32"),
        ("FUSION_ATTR_REC_THETA", "cdata"),
        ("FUSION_ATTR_PAD", "none"),
    )

    profile = profile_nla
    rule = rule_nla


@dataclass(frozen=True)
class Rule:
    prefix: str  # "10.1.0.0/16" or "2001:db8::/32"
    profile_id: int


@dataclass(frozen=True)
class FlowRecord:
    src: str
    dst: str
    sport: int
    dport: int
    bytes_acked: int
    duration_us: int
    rtt_avg_us: int
    rtt_min_us: int
    retrans: int
    segs_out: int
    profile_id: int
    profile_version: int
    theta: dict[str, int]


class FusionError(RuntimeError):
    """The module refused a request; the message is the kernel's own (extack)."""


@dataclass(frozen=True)
class TableFamily:
    """One module's generic netlink family and the θ its blobs hold, in spec order: the
    attributes are the same in every module (cc_table.h), the family name and θ are not."""

    name: str  # the generic netlink family (CC_TABLE_GENL_NAME)
    params: tuple[str, ...]  # θ's parameters in the order of its blob (the spec's)
    module: str  # the kernel module that registers it, for the error a missing one gives

    @classmethod
    def of(cls, d: Datapath) -> TableFamily:
        """The family of datapath ``d``; ValueError for one whose θ goes in no table."""
        if not d.genl_family:
            raise ValueError(f"datapath {d.name!r} has no θ table (apply {d.apply.value!r})")
        return cls(d.genl_family, d.spec.names, d.module)


@cache
def default_family() -> TableFamily:
    """The default datapath's family: Fusion's."""
    return TableFamily.of(registry().default)


def _names(family: TableFamily | None) -> tuple[str, ...]:
    return (family or default_family()).params


def _pack_theta(theta: Mapping[str, int], family: TableFamily | None = None) -> bytes:
    names = _names(family)
    missing = [n for n in names if n not in theta]
    if missing:
        raise ValueError(f"theta lacks {', '.join(missing)}")
    return struct.pack(f"={len(names)}I", *(int(theta[n]) for n in names))


def _unpack_theta(blob: bytes, family: TableFamily | None = None) -> dict[str, int]:
    names = _names(family)
    if len(blob) != 4 * len(names):
        raise ValueError(
            f"θ blob of {len(blob)} bytes; {len(names)} parameters take {4 * len(names)}"
        )
    return dict(zip(names, struct.unpack(f"={len(names)}I", blob), strict=True))


def _rule_attrs(rule: Rule) -> list:
    # Sent as written: the kernel is the one judge of prefix length and host bits, and says so.
    text, _, length = rule.prefix.partition("/")
    addr = ipaddress.ip_address(text)
    if not length.isdigit():
        raise ValueError(f"rule {rule.prefix!r}: expected address/length")
    family = socket.AF_INET if addr.version == 4 else socket.AF_INET6
    return [
        ("FUSION_RULE_ATTR_FAMILY", family),
        ("FUSION_RULE_ATTR_ADDR", addr.packed),
        ("FUSION_RULE_ATTR_PREFIX_LEN", min(int(length), 255)),
        ("FUSION_RULE_ATTR_PROFILE_ID", rule.profile_id),
    ]


def table_attrs(
    profiles: Mapping[int, Mapping[str, int]], rules: Sequence[Rule], family: TableFamily
) -> list:
    """The attributes of a SET_PROFILES message: each profile's θ as ``family``'s blob, then
    the rules. ValueError naming what is wrong (a θ lacking a parameter, a bad prefix) before
    anything is sent."""
    attrs: list = []
    for pid, theta in profiles.items():
        blob = _pack_theta(theta, family)
        profile = [("FUSION_PROFILE_ATTR_ID", pid), ("FUSION_PROFILE_ATTR_THETA", blob)]
        attrs.append(("FUSION_ATTR_PROFILE", {"attrs": profile}))
    for rule in rules:
        attrs.append(("FUSION_ATTR_RULE", {"attrs": _rule_attrs(rule)}))
    return attrs


def _open_socket(family: TableFamily) -> GenericNetlinkSocket:
    sock = GenericNetlinkSocket()
    try:
        sock.bind(family.name, fusion_msg)
    except NetlinkError as exc:
        sock.close()
        raise FusionError(
            f"generic netlink family {family.name!r} not found: is {family.module} loaded?"
        ) from exc
    return sock


class FusionNetlink:
    """A connection to a module's family (Fusion's by default) in the caller's network
    namespace."""

    def __init__(self, family: TableFamily | None = None) -> None:
        self.family = family or default_family()
        self._sock = _open_socket(self.family)
        # extended ACKs carry the module's reason for a refusal
        self._sock.setsockopt(SOL_NETLINK, NETLINK_EXT_ACK, 1)

    def close(self) -> None:
        self._sock.close()

    def __enter__(self) -> FusionNetlink:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _request(self, cmd: int, attrs: list, flags: int = NLM_F_REQUEST) -> list:
        msg = fusion_msg()
        msg["cmd"] = cmd
        msg["version"] = 1
        msg["attrs"] = attrs
        try:
            return list(self._sock.nlm_request(msg, msg_type=self._sock.prid, msg_flags=flags))
        except NetlinkError as exc:
            raise FusionError(f"fusion refused the request: {exc}") from exc

    def set_profiles(self, profiles: Mapping[int, Mapping[str, int]], rules: Sequence[Rule]) -> int:
        """Replace the destination table; returns its version. All or nothing."""
        replies = self._request(CMD_SET_PROFILES, table_attrs(profiles, rules, self.family))
        return int(replies[0].get_attr("FUSION_ATTR_VERSION"))

    def get_profiles(self) -> tuple[int, dict[int, dict[str, int]], list[Rule]]:
        reply = self._request(CMD_GET_PROFILES, [])[0]
        profiles = {
            p.get_attr("FUSION_PROFILE_ATTR_ID"): _unpack_theta(
                p.get_attr("FUSION_PROFILE_ATTR_THETA"), self.family
            )
            for p in reply.get_attrs("FUSION_ATTR_PROFILE")
        }
        rules = []
        for r in reply.get_attrs("FUSION_ATTR_RULE"):
            addr = ipaddress.ip_address(bytes(r.get_attr("FUSION_RULE_ATTR_ADDR")))
            rules.append(
                Rule(
                    f"{addr}/{r.get_attr('FUSION_RULE_ATTR_PREFIX_LEN')}",
                    r.get_attr("FUSION_RULE_ATTR_PROFILE_ID"),
                )
            )
        return int(reply.get_attr("FUSION_ATTR_VERSION")), profiles, rules

    def stats(self) -> dict[str, int]:
        reply = self._request(CMD_GET_STATS, [])[0]
        keys = ("flows", "records", "dropped", "unheard", "nostate")
        out = {k: int(reply.get_attr(f"FUSION_ATTR_STAT_{k.upper()}")) for k in keys}
        out["version"] = int(reply.get_attr("FUSION_ATTR_VERSION"))
        return out


class FlowRecordListener:
    """Receives flow records; an overflowed receive buffer shows up in `overruns`.

    pyroute2 resolves the family and joins the group; records are then read straight from the
    socket, every datagram the kernel queued, and decoded with the same message class (the
    library's own reader buffers messages out of sight of select())."""

    def __init__(
        self, rcvbuf_bytes: int = RECORD_RCVBUF_BYTES, family: TableFamily | None = None
    ) -> None:
        self.family = family or default_family()
        self._sock = _open_socket(self.family)
        SO_RCVBUFFORCE = 33
        try:
            self._sock.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, rcvbuf_bytes)
        except OSError:
            self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf_bytes)
        self._sock.add_membership(MCGRP_FLOWS)
        self._raw = socket.socket(
            socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_GENERIC, fileno=os.dup(self._sock.fileno())
        )
        self._raw.setblocking(False)
        self.overruns = 0

    def fileno(self) -> int:
        return self._raw.fileno()

    def close(self) -> None:
        self._raw.close()
        self._sock.close()

    def receive(self) -> Iterator[FlowRecord]:
        """The records queued on the socket now (none if nothing is queued)."""
        while True:
            try:
                data = self._raw.recv(RECV_BYTES)
            except BlockingIOError:
                return
            except OSError as exc:
                if exc.errno == errno.ENOBUFS:  # the kernel had to drop records for us
                    self.overruns += 1
                    continue
                raise
            yield from _records_in(data, self._sock.prid, self.family)


def _records_in(
    data: bytes, family_id: int, family: TableFamily | None = None
) -> Iterator[FlowRecord]:
    """Records in a buffer of netlink messages. Flow records are the hot path (thousands per
    second on a busy host), so their flat attributes are read with struct directly; the
    attribute numbers are fusion_msg's, which tests check against fusion_uapi.h."""
    offset = 0
    while offset + NLMSG_HDRLEN <= len(data):
        length, msg_type = struct.unpack_from("=IH", data, offset)
        if length < NLMSG_HDRLEN:
            return
        if msg_type == family_id and data[offset + NLMSG_HDRLEN] == CMD_FLOW_RECORD:
            start = offset + NLMSG_HDRLEN + GENL_HDRLEN
            yield _record(_flat_attrs(data, start, offset + length), family)
        offset += (length + 3) & ~3


def _flat_attrs(data: bytes, start: int, end: int) -> dict[str, bytes]:
    out = {}
    while start + NLA_HDRLEN <= end:
        alen, atype = struct.unpack_from("=HH", data, start)
        if alen < NLA_HDRLEN:
            break
        name = _ATTR_NAMES.get(atype & NLA_TYPE_MASK)
        if name:
            out[name] = data[start + NLA_HDRLEN : start + alen]
        start += (alen + 3) & ~3
    return out


def _record(a: dict[str, bytes], family: TableFamily | None = None) -> FlowRecord:
    def num(name: str) -> int:
        return int.from_bytes(a[f"FUSION_ATTR_REC_{name}"], sys.byteorder)

    return FlowRecord(
        src=str(ipaddress.ip_address(a["FUSION_ATTR_REC_SADDR"])),
        dst=str(ipaddress.ip_address(a["FUSION_ATTR_REC_DADDR"])),
        sport=num("SPORT"),
        dport=num("DPORT"),
        bytes_acked=num("BYTES_ACKED"),
        duration_us=num("DURATION_US"),
        rtt_avg_us=num("RTT_AVG_US"),
        rtt_min_us=num("RTT_MIN_US"),
        retrans=num("RETRANS"),
        segs_out=num("SEGS_OUT"),
        profile_id=num("PROFILE_ID"),
        profile_version=num("PROFILE_VERSION"),
        theta=_unpack_theta(a["FUSION_ATTR_REC_THETA"], family),
    )


_ATTR_NAMES = {i: name for i, (name, _) in enumerate(fusion_msg.nla_map)}
