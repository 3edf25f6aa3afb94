"""`gemini-lab check` (make lab-check): a failed experiment, an ERROR traceback among them, makes
it exit 1, and each experiment is printed as the guest finishes it. The guest runs are replaced
by recorded results here (this checks the verdict and the output, not the lab; the lab's own
tests boot it)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gemini_lab import cli, plans, report

TRACEBACK = 'Traceback (most recent call last):\n  File "x"\nRuntimeError: flow still running'


def _results(plan: dict, *, error: str | None = None) -> dict:
    experiments = {e["label"]: {"elapsed_s": 1.0} for e in plan["experiments"]}
    if error:
        experiments[plan["experiments"][0]["label"]] = {"error": error}
    return {
        "experiments": experiments,
        "insmod": {"rc": 0, "err": ""},
        "rmmod": {"rc": 0, "err": ""},
        "kernel_problems": [],
        "guest_rc": 0,
    }


def test_failures_name_each_problem():
    plan = plans.outcome_plan()
    assert report.failures(plan, _results(plan)) == []
    broken = _results(plan, error=TRACEBACK)
    del broken["experiments"]["two-profiles"]
    broken["rmmod"] = {"rc": 1, "err": "in use"}
    broken["kernel_problems"] = ["WARNING: CPU: 0 PID: 1 at net/ipv4/tcp.c"]
    assert report.failures(plan, broken) == [
        "rmmod tcp_fusion failed: {'rc': 1, 'err': 'in use'}",
        "ethernet-default: ERROR RuntimeError: flow still running",
        "two-profiles: did not run",
        "kernel: WARNING: CPU: 0 PID: 1 at net/ipv4/tcp.c",
    ]


def _fake_lab(monkeypatch, error_in: str | None) -> list[str]:
    calls: list[str] = []

    def run_plan(plan: dict, out: Path, *, backend: str, progress) -> dict:
        calls.append(backend)
        results = _results(plan, error=TRACEBACK if backend == error_in else None)
        for label, result in results["experiments"].items():
            progress(label, result)
        return results

    monkeypatch.setattr(cli, "run_plan", run_plan)
    return calls


@pytest.mark.parametrize("error_in", ["uml", "qemu"])
def test_check_exits_1_when_an_experiment_fails(monkeypatch, tmp_path, capsys, error_in):
    calls = _fake_lab(monkeypatch, error_in)
    with pytest.raises(SystemExit) as exit_:
        cli.main(["check", "--out", str(tmp_path)])
    assert exit_.value.code == 1
    assert calls == ["uml", "qemu"]  # a failure in the first plan does not skip the second
    out = capsys.readouterr().out
    assert "FAILED (1)" in out and f"[{error_in}] " in out and "ERROR" in out


def test_check_prints_progress_and_exits_0_when_all_pass(monkeypatch, tmp_path, capsys):
    _fake_lab(monkeypatch, None)
    with pytest.raises(SystemExit) as exit_:
        cli.main(["check", "--out", str(tmp_path)])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    for e in plans.outcome_plan()["experiments"] + plans.module_plan()["experiments"]:
        assert f"  {e['label']}: done in" in out
    assert "all experiments passed" in out
