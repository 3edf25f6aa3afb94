"""Ordinary failures as one line: what is wrong, never a traceback, never a secret."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..config import ConfigFileError

if TYPE_CHECKING:
    from pydantic import ValidationError


class CliError(Exception):
    """An ordinary failure, printed as one line."""


def _problems(e: ValidationError) -> str:
    """A validation error as one line: each field and what is wrong, never the input (which
    may be a secret)."""
    return "; ".join(
        f"{'.'.join(map(str, err['loc'])) or 'settings'}: {err['msg']}" for err in e.errors()
    )


def explain(e: BaseException) -> str | None:
    """One line for an ordinary failure; None for a bug (which keeps its traceback). The
    storage layer's exceptions are imported here, not above: a failure found in the arguments
    is explained without loading SQLAlchemy and Alembic."""
    if isinstance(e, CliError | ConfigFileError):
        return str(e)
    from pydantic import ValidationError
    from sqlalchemy.exc import ArgumentError, DBAPIError, NoSuchModuleError

    from ..storage.database import SchemaNotAtHead
    from ..storage.errors import Conflict, NotFound

    if isinstance(e, SchemaNotAtHead | NotFound | Conflict):
        return str(e)
    if isinstance(e, ValidationError):
        return f"invalid {e.title}: {_problems(e)}"
    if isinstance(e, ArgumentError | NoSuchModuleError):
        return "database_url: not a database URL SQLAlchemy can use (postgresql+psycopg://…)"
    if isinstance(e, DBAPIError):
        # The driver's first line says what failed (refused, no such user…); it never holds a
        # password, and the URL itself is not repeated.
        first = str(e.orig).strip().splitlines()[0] if e.orig is not None else ""
        return f"database: {type(e.orig).__name__}: {first}".rstrip(": ")
    if isinstance(e, ValueError | OSError):
        return str(e)
    return None
