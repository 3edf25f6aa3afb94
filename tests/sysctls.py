"""A directory laid out like /proc/sys/net/fusion, for agent tests on a machine that cannot
load the module: the agent reads and writes it as it would the kernel's sysctls."""

from __future__ import annotations

from pathlib import Path

from gemini_api.theta import load_spec

SPEC = load_spec()
MODULE_VERSION = "1"  # what the module's read-only `version` sysctl reads


def fusion_sysctls(parent: Path, *, version: bool = True) -> Path:
    """``parent``/net-fusion holding the spec's default θ (and the module's ``version``)."""
    root = parent / "net-fusion"
    root.mkdir()
    for name, value in SPEC.default().items():
        (root / name).write_text(f"{value}\n")
    if version:
        (root / "version").write_text(f"{MODULE_VERSION}\n")
    return root


def theta_in(root: Path) -> dict[str, int]:
    """The θ the directory holds now."""
    return {n: int((root / n).read_text()) for n in SPEC.names}
