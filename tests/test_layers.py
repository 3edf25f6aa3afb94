"""Layers import downward (doors → service → domain/policy; storage behind the service), read
from the source's own import statements (AST, nothing imported or run):

- no REST router (``service/rest/``) and not the gRPC door (``service/grpc_server.py``)
  imports ``storage``, and no router builds SQL (SQLAlchemy only for its exception types, which
  ``rest/errors.py`` maps to 503);
- the ``experiments`` package is domain: it imports neither ``storage`` nor the service layer
  (``LEGACY_REEXPORTS`` lists re-export names kept while a caller moves; none today);
- no lab module imports Booster's storage or builds SQL: the lab talks to Booster through its
  APIs or the service layer (``service/runs.py``), never its schema.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BOOSTER = ROOT / "booster" / "gemini_booster"
LAB = ROOT / "lab" / "gemini_lab"
STORAGE = "gemini_booster.storage"
SERVICE = "gemini_booster.service"
# Re-exports of service modules under their old names, for service/core.py (ArmCache) and
# service/guardrail_task.py (enforce_guardrail ...) until those import from the service layer.
LEGACY_REEXPORTS: set[str] = set()


def module_name(path: Path) -> str:
    """``booster/gemini_booster/service/rest/plans.py`` → ``gemini_booster.service.rest.plans``."""
    package_root = path.parents[len(path.relative_to(ROOT).parts) - 2]
    parts = list(path.relative_to(package_root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path, name: str | None = None) -> set[str]:
    """Every module ``path`` (module ``name``) imports, relative imports resolved, including
    ``from X import Y`` as ``X.Y`` (Y may be a module), at any depth (a function's lazy import
    counts)."""
    name = name or module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base]) if base else ".".join(anchor)
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return found


def reaches(path: Path, prefix: str, name: str | None = None) -> set[str]:
    return {m for m in imports(path, name) if m == prefix or m.startswith(prefix + ".")}


def sources(folder: Path) -> list[Path]:
    return sorted(folder.rglob("*.py"))


def test_import_resolution_reads_relative_and_lazy_imports(tmp_path):
    """The checker itself: a relative import inside a function, in a router's place, is seen
    as the storage module it names (so the rules below can fail)."""
    door = tmp_path / "door.py"
    door.write_text("def f():\n    from ...storage import repository\n")
    name = "gemini_booster.service.rest.door"
    assert reaches(door, STORAGE, name) == {STORAGE, f"{STORAGE}.repository"}
    plain = tmp_path / "plain.py"
    plain.write_text("import gemini_booster.storage.schema as s\nfrom ..trials import x\n")
    assert reaches(plain, STORAGE, name) == {f"{STORAGE}.schema"}
    assert "gemini_booster.service.trials.x" in imports(plain, name)
    assert module_name(BOOSTER / "service" / "rest" / "plans.py") == (
        "gemini_booster.service.rest.plans"
    )


@pytest.mark.parametrize(
    "path",
    [*sources(BOOSTER / "service" / "rest"), BOOSTER / "service" / "grpc_server.py"],
    ids=lambda p: str(p.relative_to(BOOSTER)),
)
def test_doors_reach_storage_only_through_the_service_layer(path):
    assert reaches(path, STORAGE) == set()


@pytest.mark.parametrize("path", sources(BOOSTER / "service" / "rest"), ids=lambda p: p.name)
def test_routers_build_no_sql(path):
    sql = {m for m in reaches(path, "sqlalchemy") if not m.startswith("sqlalchemy.exc")}
    assert sql == set()


@pytest.mark.parametrize("path", sources(BOOSTER / "experiments"), ids=lambda p: p.name)
def test_the_experiments_package_is_domain(path):
    assert reaches(path, STORAGE) == set()
    upward = reaches(path, SERVICE)
    if path.name in LEGACY_REEXPORTS:
        tree = ast.parse(path.read_text())
        own = [n for n in tree.body if isinstance(n, ast.FunctionDef | ast.ClassDef)]
        assert own == [], "a re-export name holds no code of its own"
        assert upward, "moved: drop it from LEGACY_REEXPORTS (and delete the file)"
    else:
        assert upward == set()


def schema_reaches(path: Path, name: str | None = None) -> set[str]:
    """What of Booster's schema ``path`` imports: its storage package, or SQL of its own."""
    return reaches(path, STORAGE, name) | reaches(path, "sqlalchemy", name)


def test_the_lab_rule_sees_a_lab_module_that_reads_the_schema(tmp_path):
    """The rule below can fail: a lab module as abtest.py, cubic.py and loop.py were before
    they moved onto service/runs.py (storage imported at the top, the schema inside a
    function) is caught on both counts; one through the service layer is not."""
    was = tmp_path / "was.py"
    was.write_text(
        "from gemini_booster.storage import repository as repo\n"
        "def sums():\n"
        "    from sqlalchemy import select\n"
        "    from gemini_booster.storage.schema import Report\n"
    )
    assert schema_reaches(was, "gemini_lab.was") == {
        STORAGE,
        f"{STORAGE}.repository",
        f"{STORAGE}.schema",
        f"{STORAGE}.schema.Report",
        "sqlalchemy",
        "sqlalchemy.select",
    }
    now = tmp_path / "now.py"
    now.write_text("from gemini_booster.service import runs\n")
    assert schema_reaches(now, "gemini_lab.now") == set()


@pytest.mark.parametrize("path", sources(LAB), ids=lambda p: str(p.relative_to(LAB)))
def test_the_lab_never_imports_booster_storage(path):
    assert schema_reaches(path) == set()


def test_the_re_export_list_names_files_that_exist():
    """Once core.py and guardrail_task.py import from the service layer and a re-export file
    is deleted, its name leaves ``LEGACY_REEXPORTS``: the exception does not outlive it."""
    assert {n for n in LEGACY_REEXPORTS if not (BOOSTER / "experiments" / n).exists()} == set()
