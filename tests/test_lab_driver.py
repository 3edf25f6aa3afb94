"""The guest driver (gemini_lab.driver) against the guest's own side of the protocol,
fleet.Prober, on this host: no guest is booted. ``host.run_plan``'s boot is replaced by the
Prober running until the stop file appears, as the guest's fleet experiment does, and a lab
host's kernel reading (``fleet.probe``, which needs the guest's network namespaces) by a dict
that names the namespace and when it was asked."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from gemini_lab import driver, fleet
from gemini_lab.vm import JOB_LOG, LabError

HOSTS = {"lab-host-0": "h0", "lab-host-1": "h1"}  # host id → namespace
BOOT_TIMEOUT_S = 60


def _prober_guest(plan: dict, out: Path, *, timeout_s: float, backend: str) -> dict:
    """The guest's side: answer probes until told to stop, then return what it read."""
    prober = fleet.Prober(HOSTS, out)
    prober.start()
    deadline = time.monotonic() + timeout_s
    while not (out / driver.STOP_FILE).exists():
        if time.monotonic() > deadline:
            raise TimeoutError("the host never wrote the stop file")
        time.sleep(0.05)
    prober.stop()
    return {"backend": backend, "plan": plan, "readings": prober.readings}


@pytest.fixture
def guest(tmp_path, monkeypatch) -> driver.GuestDriver:
    monkeypatch.setattr(fleet, "probe", lambda ns, asked: {"ns": ns, "asked": asked})
    monkeypatch.setattr(driver, "run_plan", _prober_guest)
    return driver.GuestDriver({"experiments": []}, tmp_path, BOOT_TIMEOUT_S)


def test_a_probe_gets_every_hosts_reading_and_the_stop_ends_the_guest(guest):
    guest.start()
    asked = time.time()
    first = guest.reading("day-0")
    assert {h: r["ns"] for h, r in first.items()} == HOSTS
    assert all(r["asked"] >= asked for r in first.values())
    assert not list(guest.out.glob(".reading-*"))  # renamed into place, nothing half-written
    second = guest.reading("day-1")
    assert second != first  # asked again, read again
    guest.stop()
    assert not guest.alive()
    assert guest.results() == {
        "backend": "qemu",  # Booster on this host: the agent must reach it from the guest
        "plan": {"experiments": []},
        "readings": {"day-0": first, "day-1": second},
    }


def test_a_guest_that_failed_gives_no_reading_and_its_own_error(guest, monkeypatch):
    def panics(plan: dict, out: Path, *, timeout_s: float, backend: str) -> dict:
        raise LabError("guest kernel panicked")

    monkeypatch.setattr(driver, "run_plan", panics)
    failed = driver.GuestDriver({}, guest.out, BOOT_TIMEOUT_S)
    failed.start()
    failed.thread.join(BOOT_TIMEOUT_S)
    with pytest.raises(RuntimeError, match=r"no reading 'day-0'.*panicked"):
        failed.reading("day-0")
    failed.stop()
    with pytest.raises(LabError, match="panicked"):
        failed.results()


def test_a_fresh_guest_dir_drops_the_last_runs_probes_readings_stop_and_job_log(tmp_path):
    old = tmp_path / "guest"
    old.mkdir()
    stale = [f"{fleet.PROBE_PREFIX}day-0", "reading-day-0.json", driver.STOP_FILE, JOB_LOG]
    for name in [*stale, "paths.mmdb"]:
        (old / name).write_text("last run")
    assert driver.fresh_guest_dir(tmp_path) == old
    assert sorted(p.name for p in old.iterdir()) == ["paths.mmdb"]


def test_the_job_start_wait_returns_once_the_guest_logs_its_job(guest, monkeypatch):
    def boots_then_starts(plan: dict, out: Path, *, timeout_s: float, backend: str) -> dict:
        (out / JOB_LOG).write_text("job started\n")
        return _prober_guest(plan, out, timeout_s=timeout_s, backend=backend)

    monkeypatch.setattr(driver, "run_plan", boots_then_starts)
    booting = driver.GuestDriver({}, guest.out, BOOT_TIMEOUT_S)
    booting.start()
    booting.wait_job_started()
    assert (guest.out / JOB_LOG).exists()
    assert booting.alive()  # it returned on the log, not on the guest's end
    booting.stop()


def test_a_guest_that_never_started_its_job_fails_the_wait_with_its_error(guest, monkeypatch):
    def boot_fails(plan: dict, out: Path, *, timeout_s: float, backend: str) -> dict:
        raise LabError("the guest did not start the job within the boot timeout")

    monkeypatch.setattr(driver, "run_plan", boot_fails)
    failed = driver.GuestDriver({}, guest.out, BOOT_TIMEOUT_S)
    failed.start()
    with pytest.raises(RuntimeError, match=r"ended before its job started.*boot timeout"):
        failed.wait_job_started()
