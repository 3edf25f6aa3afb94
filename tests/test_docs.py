"""The repository's documentation holds together: README.md stays a map (short, every page of
docs/ reachable from it), every link and every repository path the README and docs/ name
resolves, and the index of benchmarks/results/ lists every recorded file with the command that
made it, its date and a commit. A file moved or renamed without its mentions fails here, not in
a reader's hands."""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = ROOT / "docs"
RESULTS = ROOT / "benchmarks" / "results"
INDEX = RESULTS / "README.md"

README_MAX_LINES = 200
IMAGE_SUFFIXES = (".png", ".svg", ".jpg", ".jpeg", ".gif")
# Top-level folders whose contents are generated or local, never in the repository.
NOT_IN_REPO = ("var", ".venv")

FENCE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", re.MULTILINE | re.DOTALL)
CODE_SPAN = re.compile(r"`([^`\n]+)`")
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$", re.MULTILINE)
SCHEME = re.compile(r"^[a-z][a-z0-9+.-]*:", re.IGNORECASE)
# A code span that names a repository path: no placeholders, wildcards or arguments in it.
PATH_LIKE = re.compile(r"^[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)*/?$")
DATE = re.compile(r"^\d{4}-\d{2}-\d{2}$")
COMMIT = re.compile(r"^[0-9a-f]{7,40}$")


def documents() -> list[Path]:
    """README.md, every page under docs/, and the results index."""
    return [README, *sorted(DOCS.rglob("*.md")), INDEX]


def prose(text: str) -> str:
    """The text outside fenced code blocks (shell examples hold no links)."""
    return FENCE.sub("", text)


def links(doc: Path) -> list[str]:
    """Every link and image target of a Markdown file, outside code."""
    return LINK.findall(CODE_SPAN.sub("", prose(doc.read_text())))


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = CODE_SPAN.sub(r"\1", heading).strip().lower()
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(doc: Path) -> set[str]:
    seen: dict[str, int] = {}
    found = set()
    for heading in HEADING.findall(prose(doc.read_text())):
        base = slug(heading)
        n = seen.get(base, 0)
        seen[base] = n + 1
        found.add(base if n == 0 else f"{base}-{n}")
    return found


def broken_link(doc: Path, target: str) -> str | None:
    """Why ``target`` (a link in ``doc``) does not resolve inside the repository, or None."""
    if SCHEME.match(target):
        return None  # a web address: not the repository's to check
    path_part, _, anchor = target.partition("#")
    resolved = (doc.parent / path_part).resolve() if path_part else doc
    if not resolved.is_relative_to(ROOT):
        return "points outside the repository"
    if not resolved.exists():
        return "no such file"
    if anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
        return f"{resolved.relative_to(ROOT)} has no heading #{anchor}"
    return None


def named_paths(doc: Path) -> Iterator[str]:
    """Code spans that name a path from the repository's root (e.g. `booster/gemini_booster/`)."""
    tops = {p.name for p in ROOT.iterdir() if p.is_dir() and p.name not in NOT_IN_REPO}
    for span in CODE_SPAN.findall(prose(doc.read_text())):
        if "/" in span and PATH_LIKE.match(span) and span.split("/", 1)[0] in tops:
            yield span


@dataclass(frozen=True)
class IndexRow:
    target: str
    command: str
    date: str
    commit: str


def cells(row: str) -> list[str]:
    """A table row's cells; a `|` inside a code span does not split."""
    out, cell, in_code = [], "", False
    for ch in row.strip().strip("|"):
        if ch == "`":
            in_code = not in_code
        if ch == "|" and not in_code:
            out.append(cell.strip())
            cell = ""
        else:
            cell += ch
    return [*out, cell.strip()]


def index_rows() -> list[IndexRow]:
    """The rows of the index's tables: | [file](file) | what | command | date | commit |."""
    rows = []
    for line in prose(INDEX.read_text()).splitlines():
        if not line.startswith("| ["):
            continue
        first, _what, command, date, commit = cells(line)
        target = LINK.findall(first)
        assert target, f"the index row {line[:60]!r} does not start with a link"
        rows.append(IndexRow(target[0], command, date, commit))
    return rows


def recorded_files() -> list[str]:
    """Every file under benchmarks/results/ that the index must list: all but the index itself
    and the images a record shows."""
    records = [p for p in RESULTS.rglob("*.md") if p != INDEX]
    shown = " ".join(p.read_text() for p in records)
    names = []
    for path in sorted(p for p in RESULTS.rglob("*") if p.is_file() and p != INDEX):
        name = path.relative_to(RESULTS).as_posix()
        if path.suffix.lower() in IMAGE_SUFFIXES and path.name in shown:
            continue
        names.append(name)
    return names


def test_readme_is_a_map_of_at_most_200_lines() -> None:
    lines = README.read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, (
        f"README.md has {len(lines)} lines; it is the map, at most {README_MAX_LINES}: "
        "move detail into a page under docs/ and link it"
    )


@pytest.mark.parametrize("doc", documents(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_link_resolves_inside_the_repository(doc: Path) -> None:
    broken = [f"{t}: {why}" for t in links(doc) if (why := broken_link(doc, t))]
    assert not broken, f"{doc.relative_to(ROOT)}: " + "; ".join(broken)


@pytest.mark.parametrize("doc", documents(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_repository_path_named_exists(doc: Path) -> None:
    missing = sorted({p for p in named_paths(doc) if not (ROOT / p).exists()})
    assert not missing, f"{doc.relative_to(ROOT)} names paths that do not exist: {missing}"


def test_every_docs_page_is_reachable_from_the_readme() -> None:
    reached, todo = {README.resolve()}, [README.resolve()]
    while todo:
        doc = todo.pop()
        for target in links(doc):
            path = (doc.parent / target.partition("#")[0]).resolve()
            if path.suffix == ".md" and path.is_file() and path not in reached:
                reached.add(path)
                todo.append(path)
    pages = {p.resolve() for p in DOCS.rglob("*.md")}
    unreached = sorted(str(p.relative_to(ROOT)) for p in pages - reached)
    assert not unreached, f"docs pages no link from README.md leads to: {unreached}"


def test_the_results_index_lists_every_recorded_file_with_its_command() -> None:
    rows = {row.target: row for row in index_rows()}
    missing = [name for name in recorded_files() if name not in rows]
    assert not missing, f"benchmarks/results/README.md does not list: {missing}"
    incomplete = [
        name
        for name, row in rows.items()
        if not CODE_SPAN.search(row.command)
        or not DATE.match(row.date)
        or not COMMIT.match(row.commit)
    ]
    assert not incomplete, (
        f"index rows without a command in backticks, a YYYY-MM-DD date or a commit: {incomplete}"
    )


def full_history() -> bool:
    """Whether this checkout is a git repository with its whole history (a CI clone may be
    shallow, and then old commits are not there to find)."""
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        return False
    shallow = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--is-shallow-repository"],
        capture_output=True,
        text=True,
        check=False,
    )
    return shallow.returncode == 0 and shallow.stdout.strip() == "false"


def test_the_results_index_names_commits_this_repository_has() -> None:
    if not full_history():
        pytest.skip("not a git checkout with its full history: the commits cannot be looked up")
    unknown = []
    for row in index_rows():
        found = subprocess.run(
            ["git", "-C", str(ROOT), "cat-file", "-e", f"{row.commit}^{{commit}}"],
            capture_output=True,
            check=False,
        )
        if found.returncode != 0:
            unknown.append(f"{row.target}: {row.commit}")
    assert not unknown, f"index rows naming commits this repository does not have: {unknown}"
