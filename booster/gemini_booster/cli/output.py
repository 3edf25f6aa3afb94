"""What list and show commands print: a JSON document for programs, an aligned table for people.

``-o json`` prints one JSON document (a list prints an array), the same fields the REST API
answers; ``-o table`` prints the columns an operator looks at first, one row per item, nested
values written compactly (``k=40 mult_decrease=70``). Without ``-o``, a terminal gets the
table and a pipe gets JSON, so scripts never parse a table by accident.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping, Sequence
from datetime import datetime
from enum import Enum
from typing import Any, TextIO


class Format(Enum):
    JSON = "json"
    TABLE = "table"


def choose(requested: str | None, stream: TextIO | None = None) -> Format:
    """The format asked for, else a table on a terminal and JSON elsewhere."""
    if requested is not None:
        return Format(requested)
    stream = stream or sys.stdout
    return Format.TABLE if stream.isatty() else Format.JSON


def cell(value: Any) -> str:
    """One value as a table cell: short, one line, nothing lost that a person needs."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, datetime):
        return value.isoformat(timespec="seconds")
    if isinstance(value, Mapping):
        return " ".join(f"{k}={cell(v)}" for k, v in value.items()) or "-"
    if isinstance(value, list | tuple):
        return ",".join(cell(v) for v in value) or "-"
    return str(value)


def table(rows: Sequence[Mapping[str, Any]], columns: Sequence[str]) -> str:
    """Rows as aligned columns under an upper-case header (kubectl's look)."""
    cells = [[c.upper() for c in columns]] + [[cell(r.get(c)) for c in columns] for r in rows]
    widths = [max(len(line[i]) for line in cells) for i in range(len(columns))]
    return "\n".join(
        "  ".join(v.ljust(w) for v, w in zip(line, widths, strict=True)).rstrip() for line in cells
    )


def emit(
    data: Any,
    fmt: Format,
    columns: Sequence[str],
    rows: Sequence[Mapping[str, Any]] | None = None,
    out: TextIO | None = None,
) -> None:
    """Print ``data`` as JSON, or ``rows`` (default: ``data`` itself, a list) as a table."""
    out = out or sys.stdout
    if fmt is Format.JSON:
        print(json.dumps(data, indent=2, default=str, ensure_ascii=False), file=out)
        return
    print(table(data if rows is None else rows, columns), file=out)
