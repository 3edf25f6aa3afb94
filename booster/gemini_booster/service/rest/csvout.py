"""CSV exports of the API's tables (``?format=csv``): the same rows as the JSON answer, nested
objects flattened into dotted columns (``context.src_region``, ``theta.mult_decrease``), so a
spreadsheet or pandas reads what the dashboard shows."""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable, Mapping
from typing import Annotated, Any, Literal

from fastapi import Query, Response

Format = Annotated[
    Literal["json", "csv"], Query(description="json (default), or csv: the same rows as a table")
]
CSV_MEDIA = "text/csv; charset=utf-8"


def flatten(row: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in row.items():
        name = f"{prefix}{k}"
        if isinstance(v, Mapping):
            out.update(flatten(v, f"{name}."))
        elif isinstance(v, list | tuple):
            out[name] = ";".join(str(x) for x in v)
        else:
            out[name] = v
    return out


def csv_response(rows: Iterable[Mapping[str, Any]], filename: str) -> Response:
    flat = [flatten(r) for r in rows]
    columns: list[str] = []
    for r in flat:
        columns.extend(c for c in r if c not in columns)
    buf = io.StringIO()
    writer = csv.DictWriter(buf, columns, lineterminator="\n")
    writer.writeheader()
    writer.writerows(flat)
    return Response(
        buf.getvalue(),
        media_type=CSV_MEDIA,
        headers={"content-disposition": f'attachment; filename="{filename}"'},
    )
