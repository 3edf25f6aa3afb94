"""The context of a flow (Table II's hidden variables): source and destination region and ISP,
and the hour of day. Destinations are looked up in a MaxMind-format database or a CSV prefix
table; what neither knows lands in an explicit "unknown" bucket rather than being dropped.

Every finished flow is looked up once, so a lookup must not grow with the table: a real IP
database holds millions of networks. Both tables answer in O(prefix length):

- an `.mmdb` is already a binary search tree over address bits; maxminddb's reader walks it,
  one node per bit, at most 32 or 128 steps;
- a CSV table keeps one hash map per prefix length present, keyed by the address's leading
  `length` bits, and probes them longest first: at most one probe per distinct length (33 for
  IPv4, 129 for IPv6 at worst, a handful in practice), whatever the number of prefixes.
"""

from __future__ import annotations

import csv
import datetime as dt
import ipaddress
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import maxminddb

from gemini_api.v1 import booster_pb2 as pb

UNKNOWN = "unknown"
ADDRESS_BITS = {4: 32, 6: 128}


@dataclass(frozen=True, order=True)
class Place:
    region: str
    isp: str


@dataclass(frozen=True)
class Network:
    """One prefix of a destination table, as integers: what the table compiler works on."""

    version: int  # 4 or 6
    start: int  # first address of the prefix
    length: int  # prefix length in bits
    place: Place

    def __str__(self) -> str:
        return prefix_text(self.version, self.start, self.length)

    @classmethod
    def of(cls, prefix: ipaddress.IPv4Network | ipaddress.IPv6Network, place: Place) -> Network:
        return cls(prefix.version, int(prefix.network_address), prefix.prefixlen, place)


def prefix_text(version: int, start: int, length: int) -> str:
    kind = ipaddress.IPv4Network if version == 4 else ipaddress.IPv6Network
    return str(kind((start, length)))


def _address(addr: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    """The address a destination is looked up by: an IPv4-mapped IPv6 address is its IPv4."""
    ip = ipaddress.ip_address(addr)
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip


class PrefixTable:
    """CSV rows `prefix,region,isp`; the longest matching prefix wins, prefixes may nest."""

    def __init__(self, path: Path) -> None:
        self._networks: list[Network] = []
        # per IP version: (length, {leading bits: place}), longest length first
        self._by_length: dict[int, list[tuple[int, dict[int, Place]]]] = {4: [], 6: []}
        maps: dict[tuple[int, int], dict[int, Place]] = {}
        with path.open(newline="") as f:
            for line, row in enumerate(csv.reader(f), 1):
                if not row or row[0].lstrip().startswith("#") or row[0].strip() == "prefix":
                    continue
                net = _parse_row(path, line, row)
                bits = ADDRESS_BITS[net.version]
                known = maps.setdefault((net.version, net.length), {})
                key = net.start >> (bits - net.length)
                if key in known:
                    raise ValueError(f"{path}:{line}: prefix {net} given twice")
                known[key] = net.place
                self._networks.append(net)
        for (version, length), known in sorted(maps.items(), key=lambda kv: -kv[0][1]):
            self._by_length[version].append((length, known))

    def lookup(self, addr: str) -> Place | None:
        ip = _address(addr)
        value, bits = int(ip), ADDRESS_BITS[ip.version]
        for length, known in self._by_length[ip.version]:
            place = known.get(value >> (bits - length))
            if place is not None:
                return place
        return None

    def networks(self) -> list[Network]:
        return list(self._networks)


def _parse_row(path: Path, line: int, row: list[str]) -> Network:
    if len(row) != 3:
        raise ValueError(f"{path}:{line}: expected prefix,region,isp")
    try:
        prefix = ipaddress.ip_network(row[0].strip())  # strict: host bits set is an error
    except ValueError as exc:
        raise ValueError(f"{path}:{line}: {exc}") from None
    return Network.of(prefix, Place(row[1].strip(), row[2].strip()))


class MmdbTable:
    """A MaxMind-format database; `region_field` and `isp_field` name a record's fields, with
    dots for nested maps (e.g. `country.iso_code`, `autonomous_system_organization`)."""

    def __init__(self, path: Path, region_field: str, isp_field: str) -> None:
        self.reader = maxminddb.open_database(str(path))
        self.region_path = tuple(region_field.split("."))
        self.isp_path = tuple(isp_field.split("."))

    @staticmethod
    def _field(record: dict, path: tuple[str, ...]) -> str:
        value: object = record
        for key in path:
            if not isinstance(value, dict) or key not in value:
                return UNKNOWN
            value = value[key]
        return str(value)

    def _place(self, record: object) -> Place | None:
        if not isinstance(record, dict):
            return None
        return Place(self._field(record, self.region_path), self._field(record, self.isp_path))

    def lookup(self, addr: str) -> Place | None:
        return self._place(self.reader.get(str(_address(addr))))

    def networks(self) -> list[Network]:
        return list(self._iter_networks())

    def _iter_networks(self) -> Iterator[Network]:
        for prefix, record in self.reader:
            place = self._place(record)
            if place is not None:
                yield Network.of(prefix, place)


class ContextResolver:
    def __init__(self, src: Place, table: PrefixTable | MmdbTable | None) -> None:
        self.src, self.table = src, table

    def place(self, dst: str) -> Place:
        found = self.table.lookup(dst) if self.table else None
        return found or Place(UNKNOWN, UNKNOWN)

    def message(self, place: Place, hour: int) -> pb.Context:
        return pb.Context(
            src_region=self.src.region,
            src_isp=self.src.isp,
            dst_region=place.region,
            dst_isp=place.isp,
            hour=hour,
        )

    def context(self, dst: str, when: dt.datetime) -> pb.Context:
        return self.message(self.place(dst), when.hour)

    def networks(self) -> list[Network]:
        """Every network the table knows, for compiling the kernel's destination table."""
        return self.table.networks() if self.table else []
