"""The one guest driver of the studies that run Booster on this host (the closed loop, the A/B
rehearsal, the CUBIC and datapath experiments): the qemu guest boots in a thread while this
host's Booster answers its agents, and the host asks the guest for kernel readings at the
checkpoints of its schedule.

qemu and not UML: the agent in the guest talks to a Booster outside the guest, and UML's
simulated clock would jump over the agent's network deadlines while it waits on that process.
The shared directory is the channel both ways: ``probe-<label>`` asks for a reading,
``reading-<label>.json`` answers it, ``stop`` ends the guest's flows.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

from gemini_lab.fleet import PROBE_PREFIX
from gemini_lab.host import run_plan
from gemini_lab.vm import JOB_LOG

READING_TIMEOUT_S = 120
POLL_S = 0.5
STOP_FILE = "stop"


def fresh_guest_dir(out_dir: Path) -> Path:
    """``out_dir``/guest, shared with the guest, without a previous run's probes, readings,
    stop file or job log (a stale one would answer for this run)."""
    guest_dir = out_dir / "guest"
    guest_dir.mkdir(parents=True, exist_ok=True)
    for stale in [
        *guest_dir.glob(f"{PROBE_PREFIX}*"),
        *guest_dir.glob("reading-*"),
        guest_dir / STOP_FILE,
        guest_dir / JOB_LOG,
    ]:
        stale.unlink(missing_ok=True)
    return guest_dir


class GuestDriver:
    """The guest's plan run in a thread; its results (or the error it raised) once stopped."""

    def __init__(self, plan: dict, out: Path, timeout_s: float) -> None:
        self.out = out
        self.box: dict[str, Any] = {}
        self.thread = threading.Thread(target=self._run, args=(plan, timeout_s))

    def _run(self, plan: dict, timeout_s: float) -> None:
        try:
            self.box["results"] = run_plan(plan, self.out, timeout_s=timeout_s, backend="qemu")
        except Exception as exc:
            self.box["error"] = exc

    def start(self) -> None:
        self.thread.start()

    def alive(self) -> bool:
        return self.thread.is_alive()

    def wait_job_started(self) -> None:
        """Until the guest's job has started, i.e. its boot is over. The VM runner bounds the
        boot itself (its boot timeout, a retry after a panic), so a study's deadlines for what
        the job does count from here: a host slowed by other work stretches the boot, and the
        boot must not eat the time the job's first steps are given."""
        while not (self.out / JOB_LOG).exists():
            if not self.alive():
                raise RuntimeError(f"the guest ended before its job started: {self.box}")
            time.sleep(POLL_S)

    def stop(self) -> None:
        """Tell the guest to end its flows, and wait until it has shut down."""
        (self.out / STOP_FILE).touch()
        self.thread.join()

    def results(self) -> dict:
        """What the guest's plan returned; the guest's own error if it failed."""
        if "error" in self.box:
            raise self.box["error"]
        return self.box["results"]

    def reading(self, label: str) -> dict[str, dict]:
        """Ask the guest to read every host's kernel now, and wait for the reading."""
        (self.out / f"{PROBE_PREFIX}{label}").touch()
        path = self.out / f"reading-{label}.json"
        deadline = time.monotonic() + READING_TIMEOUT_S
        while not path.exists():
            if not self.alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the guest gave no reading {label!r}: {self.box}")
            time.sleep(POLL_S)
        return json.loads(path.read_text())  # renamed into place whole (fleet.Prober)
