"""What the lab tests share: where the lab cannot run here (no guest kernel, no UML build, a
missing tool), a lab test is skipped with the lab's own reason instead of failing; any other
lab error still fails the test."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from gemini_lab.host import Backend, run_plan
from gemini_lab.vm import GuestKernel, LabError, find_kernel

# words in a LabError's text that say the lab is not installed here, not that a run went wrong
MISSING = ("missing",)


def guest_kernel() -> GuestKernel:
    """The installed guest kernel; the test is skipped where none is installed."""
    try:
        return find_kernel()
    except LabError as exc:
        pytest.skip(str(exc))


@contextmanager
def skip_if_lab_missing(*also: str) -> Iterator[None]:
    """Skip the test on a LabError that says a lab part is missing (or any word of ``also``);
    re-raise any other LabError."""
    try:
        yield
    except LabError as exc:
        if any(word in str(exc) for word in MISSING + also):
            pytest.skip(str(exc))
        raise


def lab_plan(plan: dict, out: Path, backend: Backend | None = None) -> dict:
    """``run_plan``'s results, on the lab's default backend unless ``backend`` is named; the
    test is skipped where a lab part is missing."""
    with skip_if_lab_missing():
        if backend is None:
            return run_plan(plan, out)
        return run_plan(plan, out, backend=backend)
