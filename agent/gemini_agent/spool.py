"""A bounded on-disk queue of serialized reports: survives an agent restart and a Booster
outage, and is drained oldest first.

Each report is one file named by a zero-padded sequence number, written to a temporary name,
fsynced and renamed, so a crash leaves either the whole report or none of it. When the spool
would exceed its byte budget the oldest reports are dropped, and counted."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

SUFFIX = ".report"


class Spool:
    def __init__(self, directory: Path, max_bytes: int) -> None:
        self.dir = directory
        self.max_bytes = max_bytes
        self.dir.mkdir(parents=True, exist_ok=True)
        (self.dir / "rejected").mkdir(exist_ok=True)
        for tmp in self.dir.glob("*.tmp"):
            tmp.unlink()  # a write that never reached its rename
        self.dropped = 0

    def _files(self) -> list[Path]:
        return sorted(self.dir.glob(f"*{SUFFIX}"))

    def _next_seq(self) -> int:
        files = self._files()
        return int(files[-1].stem) + 1 if files else 1

    def put(self, payload: bytes) -> Path:
        path = self.dir / f"{self._next_seq():020d}{SUFFIX}"
        tmp = path.with_suffix(".tmp")
        with tmp.open("wb") as f:
            f.write(payload)
            f.flush()
            os.fsync(f.fileno())
        tmp.rename(path)
        self._enforce_budget()
        return path

    def _enforce_budget(self) -> None:
        files = self._files()
        total = sum(p.stat().st_size for p in files)
        while files and total > self.max_bytes:
            oldest = files.pop(0)
            total -= oldest.stat().st_size
            oldest.unlink()
            self.dropped += 1

    def pending(self) -> Iterator[tuple[Path, bytes]]:
        for path in self._files():
            yield path, path.read_bytes()

    def done(self, path: Path) -> None:
        path.unlink(missing_ok=True)

    def reject(self, path: Path) -> None:
        """Booster refused it for good (bad content): keep it aside for a human, stop retrying."""
        path.rename(self.dir / "rejected" / path.name)

    def __len__(self) -> int:
        return len(self._files())
