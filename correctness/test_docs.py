"""The documentation's references resolve, and each kind of page holds what it is for.

- Every `docs/...md` path named in code (comments, docstrings, help texts, the Makefile, the
  workflows, CI, the measuring scripts) or in a page other than a dated note is a file, and every
  relative link of a markdown page (README.md, docs/**/*.md, examples/README.md) is a file or a
  folder. An `#anchor` must name a heading of the page it points to.
- The README's table links every guide, and the notes index (docs/notes/README.md) every note.
- A guide (docs/guide/) states the rules as they are now: dated history (a date, a session told,
  a commit run on) goes to docs/notes/.

A failure lists every broken reference as `file:line -> target`, so one run shows them all.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# Where code names documentation. Folders are walked; files are read as they are.
CODE_PLACES = ("mgpu", "mgpu_perf", "correctness", "scriptcheck_tests", "perf", "mgpu_perf_tests", "examples", ".github", ".ci",
               "docs", "Makefile", "pyproject.toml", "conftest.py", "pytest.ini", "README.md")
TEXT_SUFFIXES = {".py", ".md", ".sh", ".yml", ".yaml", ".toml", ".ini", ".cfg", ".txt", ""}
SKIP_DIRS = {"__pycache__", ".git", ".venv", ".pytest_cache", ".hypothesis", "node_modules"}
MAX_BYTES = 2_000_000

# `docs/<path>.md`, optionally `#anchor`, not as the tail of a longer path (`x/docs/a.md`).
DOC_PATH = re.compile(r"(?<![\w./-])(docs/[\w./-]+?\.md)(?:#([\w-]+))?(?![\w])")
# Inline links and images: [text](target) or [text](target "title"); reference definitions: [id]: target.
INLINE_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*(<[^>]*>|[^)\s]+)(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE_DEF = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*(<[^>]*>|\S+)")
FENCE = re.compile(r"^\s*(```|~~~)")
CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1")
SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")


def _text_files(root: Path = ROOT, places=CODE_PLACES):
    for name in places:
        path = root / name
        if path.is_file():
            yield path
        elif path.is_dir():
            for p in sorted(path.rglob("*")):
                parts = p.relative_to(root).parts
                if p.is_file() and not SKIP_DIRS.intersection(parts) \
                        and not any(part.endswith(".egg-info") for part in parts) \
                        and p.suffix in TEXT_SUFFIXES and p.stat().st_size <= MAX_BYTES:
                    yield p


def markdown_pages(root: Path = ROOT) -> list[Path]:
    """README.md, every page under docs/, and examples/README.md."""
    pages = [root / "README.md", *sorted((root / "docs").rglob("*.md")), root / "examples" / "README.md"]
    return [p for p in pages if p.is_file()]


def _lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8", errors="replace").splitlines()


def _where(path: Path, lineno: int, root: Path = ROOT) -> str:
    return f"{path.relative_to(root).as_posix()}:{lineno}"


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, code marks and punctuation dropped, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    found, seen, in_fence = set(), {}, False
    for line in _lines(page):
        if FENCE.match(line):
            in_fence = not in_fence
            continue
        m = re.match(r"^\s{0,3}#{1,6}\s+(.*?)\s*#*\s*$", line)
        if m and not in_fence:
            s = slug(m.group(1))
            n = seen.get(s, 0)
            seen[s] = n + 1
            found.add(s if n == 0 else f"{s}-{n}")
    return found


def _check_target(target: Path, anchor: str | None, dirs_ok: bool) -> str | None:
    """None when target (and its anchor) exist, else what is wrong."""
    if not (target.is_file() or (dirs_ok and target.is_dir())):
        return "no such file"
    if anchor and target.suffix == ".md" and anchor.lower() not in anchors(target):
        return f"no heading #{anchor} in it"
    return None


def _names_the_tree_of_today(path: Path, root: Path) -> bool:
    """False for this file (its examples) and for the notes' pages: a dated note names paths as they
    were that day ("then docs/gate.md section 4, now ..."); its links are checked all the same."""
    rel = path.relative_to(root).as_posix()
    return rel != "correctness/test_docs.py" and not (rel.startswith("docs/notes/") and path.suffix == ".md")


def doc_path_mentions(root: Path = ROOT) -> list[tuple[str, str, str | None]]:
    """Every `docs/...md` named in CODE_PLACES under root: (file:line, target, problem)."""
    out = []
    for path in _text_files(root):
        if not _names_the_tree_of_today(path, root):
            continue
        for lineno, line in enumerate(_lines(path), start=1):
            for m in DOC_PATH.finditer(line):
                target, anchor = m.group(1), m.group(2)
                shown = target + (f"#{anchor}" if anchor else "")
                out.append((_where(path, lineno, root), shown, _check_target(root / target, anchor, dirs_ok=False)))
    return out


def relative_links(page: Path, root: Path = ROOT) -> list[tuple[str, str, str | None]]:
    """Every relative link of a markdown page outside code: (file:line, target, problem)."""
    out, in_fence = [], False
    for lineno, line in enumerate(_lines(page), start=1):
        if FENCE.match(line):
            in_fence = not in_fence
            continue
        if in_fence:
            continue
        prose = CODE_SPAN.sub("", line)
        targets = [m.group(1) for m in INLINE_LINK.finditer(prose)]
        ref = REFERENCE_DEF.match(prose)
        if ref:
            targets.append(ref.group(1))
        for raw in targets:
            target = raw[1:-1] if raw.startswith("<") else raw
            if SCHEME.match(target):
                continue  # http:, https:, mailto:
            file_part, _, anchor = target.partition("#")
            if not file_part:
                resolved = page
            elif file_part.startswith("/"):
                resolved = root / file_part.lstrip("/")
            else:
                resolved = page.parent / file_part
            out.append((_where(page, lineno, root), target, _check_target(resolved, anchor or None, dirs_ok=True)))
    return out


def _report(found: list[tuple[str, str, str | None]], what: str) -> None:
    broken = [(where, target, problem) for where, target, problem in found if problem]
    if broken:
        pytest.fail(f"{len(broken)} {what} do not resolve:\n" + "\n".join(
            f"  {where} -> {target} ({problem})" for where, target, problem in broken), pytrace=False)


# -- references resolve ----------------------------------------------------------------------------------------

def test_every_docs_path_named_in_code_and_pages_is_a_file():
    found = doc_path_mentions()
    assert len(found) > 20, f"the scan found only {len(found)} docs/ paths: is DOC_PATH still right?"
    _report(found, "docs/ paths named in code or pages")


def test_every_relative_link_of_a_markdown_page_resolves():
    found = [link for page in markdown_pages() for link in relative_links(page)]
    assert len(found) > 50, f"the scan found only {len(found)} relative links: is INLINE_LINK still right?"
    _report(found, "relative links")


def test_the_scans_catch_a_broken_reference(tmp_path):
    """The checks above cannot pass by seeing nothing: in a small tree, planted mistakes are caught
    and good references pass."""
    (tmp_path / "docs" / "guide").mkdir(parents=True)
    (tmp_path / "docs" / "guide" / "gate.md").write_text("# The gate\n\n## 2. On one GPU\n", encoding="utf-8")
    (tmp_path / "mgpu").mkdir()
    missing = "docs/" + "guide/no-such-page.md"
    (tmp_path / "mgpu" / "plant.py").write_text(
        f"import os\n# see {missing}, docs/guide/gate.md#2-on-one-gpu and x/{missing}\n", encoding="utf-8")
    page = tmp_path / "docs" / "page.md"
    page.write_text("[ok](guide/gate.md) [bad](guide/nope.md) [site](https://x.org/a.md)\n"
                    "`[in code](nope.md)`\n```\n[in a fence](nope.md)\n```\n"
                    "[anchor ok](guide/gate.md#the-gate) [anchor bad](guide/gate.md#nowhere) [here](#nowhere)\n"
                    "[folder](guide/) [root](/docs/guide/gate.md)\n", encoding="utf-8")
    mentions = doc_path_mentions(tmp_path)
    assert [(w, t, bool(p)) for w, t, p in mentions] == [
        ("mgpu/plant.py:2", missing, True), ("mgpu/plant.py:2", "docs/guide/gate.md#2-on-one-gpu", False)]
    links = relative_links(page, tmp_path)
    assert [(w, t, bool(p)) for w, t, p in links] == [
        ("docs/page.md:1", "guide/gate.md", False), ("docs/page.md:1", "guide/nope.md", True),
        ("docs/page.md:6", "guide/gate.md#the-gate", False), ("docs/page.md:6", "guide/gate.md#nowhere", True),
        ("docs/page.md:6", "#nowhere", True),
        ("docs/page.md:7", "guide/", False), ("docs/page.md:7", "/docs/guide/gate.md", False)]
    with pytest.raises(pytest.fail.Exception, match=r"(?s)3 relative links do not resolve:.*docs/page.md:1 -> guide/nope.md"):
        _report(links, "relative links")


# -- the indexes -----------------------------------------------------------------------------------------------

def _table_links(page: Path, first_cell: str | None = None) -> set[Path]:
    """The files linked from the table rows (lines starting with `|`) of a page, resolved; only from
    the rows whose first cell is first_cell, if given."""
    links = set()
    for line in _lines(page):
        cells = [c.strip() for c in line.strip().split("|")]
        if line.lstrip().startswith("|") and (first_cell is None or cells[1] == first_cell):
            for m in INLINE_LINK.finditer(line):
                links.add((page.parent / m.group(1).partition("#")[0]).resolve())
    return links


def test_the_readme_table_links_every_guide():
    linked = _table_links(ROOT / "README.md", first_cell="`docs/guide/`")
    guides = sorted((ROOT / "docs" / "guide").glob("*.md"))
    assert guides
    missing = [g.relative_to(ROOT).as_posix() for g in guides if g.resolve() not in linked]
    assert not missing, f"README.md's table (the docs/guide/ row) does not link: {', '.join(missing)}"


def test_the_notes_index_links_every_note():
    notes = ROOT / "docs" / "notes"
    linked = _table_links(notes / "README.md")
    missing = [p.relative_to(ROOT).as_posix() for p in sorted(notes.glob("*.md"))
               if p.name != "README.md" and p.resolve() not in linked]
    assert not missing, f"docs/notes/README.md's table does not list: {', '.join(missing)}"


def test_docs_has_no_pages_outside_guide_design_and_notes():
    """docs/ is three kinds of page: a page at its top (as docs/gpu.md was) is neither rule nor history."""
    stray = [p.relative_to(ROOT).as_posix() for p in sorted((ROOT / "docs").glob("*.md"))]
    assert not stray, f"pages at docs/'s top, move them into guide/, design/ or notes/: {', '.join(stray)}"


# -- guides state rules, notes hold history ---------------------------------------------------------------------

HISTORY = [
    (re.compile(r"\b(?:19|20)\d\d-[01]\d(?:-[0-3]\d)?\b"), "a date"),
    (re.compile(r"\b(?:January|February|March|April|May|June|July|August|September|October|November|December)"
                r"\s+(?:\d{1,2},?\s+)?(?:19|20)\d\d\b"), "a date"),
    (re.compile(r"\b(?:first|second|third|fourth|fifth|sixth|later|earlier|last|previous|next|same|this|that|"
                r"today's|yesterday's|one|two|three|four|five|\d+(?:st|nd|rd|th)?)\s+sessions?\b"
                r"|\bsessions?\s+(?:\d|of\b)", re.IGNORECASE), "a session told"),
    (re.compile(r"\b(?:on|at|after|before|since|until)\s+commit\s+[0-9a-f]{7,40}\b", re.IGNORECASE),
     "a run on a commit"),
    (re.compile(r"^\s{0,3}#{1,6}\s.*\bhistory\b", re.IGNORECASE), "a history heading"),
]


def history_lines(page: Path) -> list[tuple[str, str, str]]:
    """Lines of a page that tell dated history: (file:line, what, the line)."""
    out = []
    for lineno, line in enumerate(_lines(page), start=1):
        for pattern, what in HISTORY:
            if pattern.search(line):
                out.append((_where(page, lineno), what, line.strip()))
                break
    return out


def test_guides_hold_no_dated_history():
    guides = sorted((ROOT / "docs" / "guide").glob("*.md"))
    found = [h for g in guides for h in history_lines(g)]
    if found:
        pytest.fail("docs/guide/ states the rules as they are now; dated history goes to docs/notes/ "
                    f"(linked from the guide without the date). {len(found)} lines:\n"
                    + "\n".join(f"  {where} ({what}): {line[:120]}" for where, what, line in found), pytrace=False)


@pytest.mark.parametrize("note", sorted(p.name for p in (ROOT / "docs" / "notes").glob("*.md") if p.name != "README.md"))
def test_the_history_rule_would_catch_a_note_pasted_into_a_guide(note):
    """Each dated note, pasted into a guide, would fail the rule above."""
    assert history_lines(ROOT / "docs" / "notes" / note), f"docs/notes/{note} tells no dated history the rule sees"
