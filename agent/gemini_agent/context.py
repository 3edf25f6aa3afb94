"""The context of a flow (Table II's hidden variables): source and destination region and ISP,
and the hour of day. Destinations are looked up in a MaxMind-format database or a CSV prefix
table; what neither knows lands in an explicit "unknown" bucket rather than being dropped."""

from __future__ import annotations

import csv
import datetime as dt
import ipaddress
from dataclasses import dataclass
from pathlib import Path

import maxminddb

from gemini_api.v1 import booster_pb2 as pb

UNKNOWN = "unknown"


@dataclass(frozen=True)
class Place:
    region: str
    isp: str


class PrefixTable:
    """CSV rows `prefix,region,isp`; the longest matching prefix wins."""

    def __init__(self, path: Path) -> None:
        rows = []
        with path.open() as f:
            for i, row in enumerate(csv.reader(f), 1):
                if not row or row[0].startswith("#") or row[0] == "prefix":
                    continue
                if len(row) != 3:
                    raise ValueError(f"{path}:{i}: expected prefix,region,isp")
                rows.append(
                    (ipaddress.ip_network(row[0].strip()), Place(row[1].strip(), row[2].strip()))
                )
        self.rows = sorted(rows, key=lambda r: r[0].prefixlen, reverse=True)

    def lookup(self, addr: str) -> Place | None:
        ip = ipaddress.ip_address(addr)
        for net, place in self.rows:
            if ip.version == net.version and ip in net:
                return place
        return None

    def prefixes(self) -> list[tuple[str, Place]]:
        return [(str(net), place) for net, place in self.rows]


class MmdbTable:
    def __init__(self, path: Path, region_field: str, isp_field: str) -> None:
        self.reader = maxminddb.open_database(str(path))
        self.region_field, self.isp_field = region_field, isp_field

    def _place(self, record: object) -> Place | None:
        if not isinstance(record, dict):
            return None
        return Place(
            str(record.get(self.region_field, UNKNOWN)), str(record.get(self.isp_field, UNKNOWN))
        )

    def lookup(self, addr: str) -> Place | None:
        return self._place(self.reader.get(addr))

    def prefixes(self) -> list[tuple[str, Place]]:
        out = []
        for network, record in self.reader:
            place = self._place(record)
            if place is not None:
                out.append((str(network), place))
        return out


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

    def served_prefixes(self) -> list[tuple[str, Place]]:
        """Every prefix the table knows, for installing per-context profiles."""
        return self.table.prefixes() if self.table else []
