"""The agent port raises the process's open-file limit to its hard limit, since each agent
connection holds a descriptor (grpc_server.raise_open_file_limit)."""

from __future__ import annotations

import resource
from collections.abc import Iterator

import pytest

from gemini_booster.service.grpc_server import raise_open_file_limit

SHELL_DEFAULT = 1024


@pytest.fixture
def lowered() -> Iterator[int]:
    """The soft limit at a shell's default, below the hard limit; restored afterwards."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard <= SHELL_DEFAULT:
        pytest.skip(f"hard open-file limit {hard} leaves nothing to raise")
    resource.setrlimit(resource.RLIMIT_NOFILE, (SHELL_DEFAULT, hard))
    yield hard
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_soft_limit_is_raised_to_the_hard_limit(lowered: int) -> None:
    assert raise_open_file_limit() == lowered
    assert resource.getrlimit(resource.RLIMIT_NOFILE) == (lowered, lowered)


def test_a_soft_limit_already_at_the_hard_limit_is_kept(lowered: int) -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (lowered, lowered))
    assert raise_open_file_limit() == lowered
    assert resource.getrlimit(resource.RLIMIT_NOFILE) == (lowered, lowered)
