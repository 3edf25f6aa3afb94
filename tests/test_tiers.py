"""The CI tiers: tests/conftest.py marks each test with the resources it reaches (postgres,
browser, lab, tools) or `unit` when it reaches none, whatever route it takes to them (a fixture,
a helper of its own, a script or a tool's path), and a `unit` test that starts a tier's
executable anyway fails."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TIERS = ("unit", "postgres", "browser", "lab", "tools")

# Collect in a pytest of its own (the marking is done at collection) and print each test's tiers.
_COLLECT = f"""
import json, sys, pytest
class Dump:
    def pytest_collection_finish(self, session):
        self.tiers = {{
            i.nodeid: sorted({{m.name for m in i.iter_markers() if m.name in {TIERS!r}}})
            for i in session.items
        }}
dump = Dump()
args = ["--collect-only", "-q", "-p", "no:cacheprovider", *sys.argv[1:]]
code = pytest.main(args, plugins=[dump])
print("TIERS " + json.dumps(dump.tiers))
sys.exit(code)
"""


@cache
def collected() -> dict[str, list[str]]:
    """Every test of the suite → its tiers."""
    out = subprocess.run(
        [sys.executable, "-c", _COLLECT], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    (line,) = [x for x in out.stdout.splitlines() if x.startswith("TIERS ")]
    return json.loads(line.removeprefix("TIERS "))


def test_every_test_is_unit_or_in_resource_tiers():
    tiers = collected()
    assert len(tiers) > 600
    for nodeid, marks in tiers.items():
        assert marks, f"{nodeid} has no tier"
        assert marks == ["unit"] or "unit" not in marks, (nodeid, marks)


def test_the_makefiles_tiers_run_every_test_once():
    """.ci/run runs `make test-tier TIER=…` for each of TIERS: together, what `make test` runs."""
    from _pytest.mark.expression import Expression

    makefile = (ROOT / "Makefile").read_text()
    names = re.search(r"^TIERS := (.*)$", makefile, re.M)
    assert names, "no TIERS in the Makefile"
    expressions = {
        tier: Expression.compile(re.search(rf"^TIER_{tier} := (.*)$", makefile, re.M).group(1))
        for tier in names.group(1).split()
    }
    assert set(expressions) == set(TIERS)
    counts = dict.fromkeys(expressions, 0)
    for nodeid, marks in collected().items():

        def marked(name: str, /, _marks: list[str] = marks, **_: object) -> bool:
            return name in _marks

        chosen = [t for t, e in expressions.items() if e.evaluate(marked)]
        assert len(chosen) == 1, f"{nodeid} ({marks}) runs in tiers {chosen}"
        counts[chosen[0]] += 1
    print(counts, sum(counts.values()))
    assert sum(counts.values()) == len(collected())


@pytest.mark.parametrize(
    "nodeid,expected",
    [
        # pure computation
        ("tests/test_theta_spec.py::test_default_is_inside_production_region", ["unit"]),
        ("tests/test_model.py::test_context_kernel_is_psd_and_its_gradient_is_right", ["unit"]),
        # the booster fixture (db_url → pg_admin_url)
        ("tests/test_rest.py::test_operator_creates_and_updates_a_policy", ["postgres"]),
        # a module-scoped fixture of its own that calls new_database(pg_admin_url)
        ("tests/test_grpc_limits.py::test_unknown_policy_is_not_found", ["postgres"]),
        # PostgreSQL started by the test's own helper, not by the shared fixture
        ("tests/test_outage.py::test_postgres_stopped_for_30_s_under_load", ["postgres"]),
        # a fake token table: no database at all, in the same file
        ("tests/test_outage.py::test_operator_tokens_are_not_agent_tokens", ["unit"]),
        # headless Chromium on a real Booster
        (
            "tests/test_dashboard.py::test_refused_changes_are_named_and_change_nothing",
            ["browser", "postgres"],
        ),
        # helm through test_helm's tool()
        ("tests/test_helm.py::test_lint_strict[agent-only]", ["tools"]),
        # promtool by a path held in a module constant, on a real Booster
        ("tests/test_metrics.py::test_promtool_accepts_the_exposition", ["postgres", "tools"]),
        # a build script held in a module constant (a Path)
        ("tests/test_kmod_build.py::test_builds_warning_free_with_w1_on_6_12", ["tools"]),
        ("tests/test_kmod_build.py::test_dkms_package_version_is_the_modules_version", ["unit"]),
        # guests booted by a module fixture calling run_abtest on a database of its own
        (
            "tests/test_lab_abtest.py::test_results_give_both_arms_on_both_days",
            ["lab", "postgres"],
        ),
        ("tests/test_lab_abtest.py::test_the_experiment_starts_on_a_day_boundary", ["unit"]),
        # a guest booted through the file's own _run helper; `lab` by hand on the whole file too
        ("tests/test_lab_fusion.py::test_ss_shows_fusion_state", ["lab"]),
    ],
)
def test_known_tests_are_in_their_tiers(nodeid: str, expected: list[str]):
    tiers = collected()
    assert nodeid in tiers, f"{nodeid} is no longer in the suite: update this list"
    assert tiers[nodeid] == expected


# The commands are parameters, not constants of the test's code: that would put the test itself
# in their tiers, and its guard off.
@pytest.mark.parametrize(
    "command,refusal",
    [
        ([str(ROOT / "var/tools/bin/helm"), "version"], "runs '.*/helm' \\(tools tier\\)"),
        ("make -C /nonexistent", "runs 'make' \\(tools tier\\)"),
        (["qemu-system-x86_64", "-version"], "runs 'qemu-system-x86_64' \\(lab tier\\)"),
    ],
)
def test_a_unit_test_that_runs_a_tiers_executable_fails(command, refusal):
    assert subprocess.Popen.__name__ == "_UnitGuard", "this test is not marked unit"
    with pytest.raises(pytest.fail.Exception, match=refusal):
        subprocess.run(command, shell=isinstance(command, str), capture_output=True)
    # Python itself runs as before
    out = subprocess.run([sys.executable, "-c", "print(42)"], capture_output=True, text=True)
    assert out.stdout == "42\n"


@pytest.mark.parametrize("start", ["start_embedded"])
def test_a_unit_test_that_starts_postgresql_fails(start, tmp_path):
    from gemini_booster.storage import database

    with pytest.raises(pytest.fail.Exception, match="a test marked unit starts PostgreSQL"):
        getattr(database, start)(tmp_path)
