"""The UML module cache keeps the newest builds, so a lab run that started on an older source
state (another checkout, a helper's edit) still finds the module it is about to load."""

import os
from pathlib import Path

import pytest

from gemini_lab import uml


def _build(cache: Path, name: str, mtime: int) -> Path:
    path = cache / name
    path.mkdir()
    (path / "tcp_fusion.ko").write_bytes(b"ko")
    os.utime(path, (mtime, mtime))
    return path


def test_prune_keeps_the_newest_builds_and_the_one_just_made(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(uml, "MODULE_CACHE", tmp_path)
    kept = uml.MODULE_BUILDS_KEPT
    builds = [_build(tmp_path, f"b{i:02d}", 1_000 + i) for i in range(kept + 3)]
    oldest_but_current = builds[0]
    partial = tmp_path / "b99.partial"
    partial.mkdir()
    uml._prune_module_builds(keep=oldest_but_current)
    left = {p.name for p in tmp_path.iterdir()}
    newest = {p.name for p in builds[-kept:]}
    assert left == newest | {oldest_but_current.name, partial.name}
