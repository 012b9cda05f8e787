"""The docs stand alone: no tracked file cites a document outside the repository, and every cited page exists.

Rules, checked on every tracked text file outside `data/`:

* No citation of the project's issue tracker (an issue number).
* No citation of a document outside the checkout: the design and reference notes the project was started
  from (by file name, directory or "reference" section number), the workspace beside the checkout, or any
  relative path that climbs out of the repository (`..` past its root; the repository root's parent in code).
* Every `docs/<page>.md` named anywhere exists. A section citation `<page>.md §N` (also `§N.M`, ranges
  `§N–M`, lists `§N, §M`) resolves to a numbered heading (`## N. Title`, `### N.M Title`) of that page. A bare
  `§N` is allowed only inside a `docs/` page, where it means that page's own section.
* Relative markdown links (`[text](path)`) resolve to a file, and their `#anchor` to a heading.

The facts the project relies on are restated in `docs/paper.md`, `docs/release_behaviour.md` and
`docs/dependencies.md`; this test keeps it that way. It also checks that `docs/paper.md`'s tables restate
`seal/report/paper_numbers.py` exactly.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from seal.report import paper_numbers as pn

REPO = Path(__file__).resolve().parents[1]

# Text that cites a document outside the repository. Each pattern is spelled so that its own source does not
# match it (this file is scanned too).
FORBIDDEN: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("the original design note", re.compile(r"\bARCHI[T]ECTURE")),
    ("the reference notes", re.compile(r"(?<![\w-])referenc[e]/")),
    ("a reference section", re.compile(r"\breferenc[e]\s*§", re.IGNORECASE)),
    ("the release-behaviour note", re.compile(r"seal-release-behavio[u]r", re.IGNORECASE)),
    ("the workspace beside the checkout", re.compile(r"\.\./share[d]\b|(?<![\w.-])share[d]/|/wor[k]/")),
    ("a path above the repository root", re.compile(r"\b(?:REPO|ROOT|REPO_ROOT)\.paren[t]\b")),
    # The repository stands without the project's tracker: a page says what it means, not which ticket asked.
    ("an issue of the tracker", re.compile(r"\bissu[e]s?\s*(?:no\.?\s*)?#?\s*\d+", re.IGNORECASE)),
)

_SECTION = r"§\s?\d+(?:\.\d+)*(?:\s?[–-]\s?§?\d+(?:\.\d+)*)?"
_SECTION_LIST = rf"{_SECTION}(?:\s?(?:,|and|/)\s?{_SECTION})*"
# A page path under docs (in single or double backticks or none), or a bare page name, optionally followed by a
# section list.
PAGE_CITATION = re.compile(rf"(?<![\w/.-])((?:[\w-]+/)*[\w-]+\.md)`{{0,2}}(?:\s({_SECTION_LIST}))?")
BARE_SECTION = re.compile(_SECTION)
SECTION_NUMBER = re.compile(r"\d+(?:\.\d+)*")
NUMBERED_HEADING = re.compile(r"^#{1,6}\s+(\d+(?:\.\d+)*)\.?\s", re.MULTILINE)
HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*$", re.MULTILINE)
MD_LINK = re.compile(r"\]\(([^)\s]+)\)")
CLIMBING_PATH = re.compile(r"(?<![\w.])((?:\.\./)+[\w.\-/]*)")


def tracked_text_files() -> dict[str, str]:
    """Repository-relative path -> text, for every tracked (or new, not ignored) text file outside data/."""
    try:
        cmd = ["git", "ls-files", "--cached", "--others", "--exclude-standard"]
        out = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, check=True).stdout
        paths = [p for p in out.splitlines() if p]
    except (OSError, subprocess.CalledProcessError):  # not a git checkout (e.g. an unpacked sdist)
        skip = {".git", ".venv", "runs", "__pycache__", ".pytest_cache", ".ruff_cache"}
        paths = [
            str(p.relative_to(REPO))
            for p in REPO.rglob("*")
            if p.is_file() and not skip & set(p.relative_to(REPO).parts)
        ]
    files = {}
    for rel in paths:
        if rel.startswith("data/") or not (REPO / rel).is_file():
            continue
        try:
            files[rel] = (REPO / rel).read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue  # binary
    return files


def _headings(text: str) -> tuple[set[str], set[str]]:
    """(section numbers, GitHub-style anchors) of a markdown page."""
    numbers = set(NUMBERED_HEADING.findall(text))
    anchors = set()
    for title in HEADING.findall(text):
        slug = re.sub(r"[^\w\- ]", "", title.strip().lower()).replace(" ", "-")
        anchors.add(slug)
    return numbers, anchors


class Pages:
    """The markdown pages a citation may point at: the repository's, or a planted set in the tests."""

    def __init__(self, texts: dict[str, str]):
        self.texts = texts

    def exists(self, rel: str) -> bool:
        return rel in self.texts

    def headings(self, rel: str) -> tuple[set[str], set[str]]:
        return _headings(self.texts[rel])


def _normalise(path: str) -> str:
    parts: list[str] = []
    for part in path.split("/"):
        if part in ("", "."):
            continue
        if part == "..":
            if not parts:
                return "../"  # above the repository root
            parts.pop()
        else:
            parts.append(part)
    return "/".join(parts)


def _resolve_page(citing: str, page: str, pages: Pages) -> str | None:
    """Repository path of a cited page: repository-relative, else relative to the citing file, else in docs/."""
    here = str(Path(citing).parent)
    for candidate in (page, _normalise(f"{here}/{page}"), f"docs/{page}"):
        if pages.exists(candidate):
            return candidate
    return None


def _section_numbers(section_list: str) -> list[str]:
    return SECTION_NUMBER.findall(section_list)


def citation_problems(rel: str, text: str, pages: Pages) -> list[str]:
    """Every problem in one file's text (`rel` is its repository path; `pages` the pages it may cite)."""
    problems = []

    def where(pos: int) -> str:
        return f"{rel}:{text.count(chr(10), 0, pos) + 1}"

    for what, pattern in FORBIDDEN:
        for m in pattern.finditer(text):
            problems.append(f"{where(m.start())}: cites {what} outside the repository: {m.group(0)!r}")

    for m in CLIMBING_PATH.finditer(text):
        target = _normalise(f"{Path(rel).parent}/{m.group(1)}")
        if target.startswith("../"):
            problems.append(f"{where(m.start())}: path climbs out of the checkout: {m.group(1)!r}")

    covered: set[int] = set()
    is_doc_page = rel.startswith("docs/") and rel.endswith(".md")
    for m in PAGE_CITATION.finditer(text):
        page, sections = m.group(1), m.group(2)
        if sections:
            covered.update(range(m.start(2), m.end(2)))
        is_docs_path = page.startswith("docs/")
        if not (is_docs_path or sections):
            continue  # a bare file name without a section (e.g. an output file `tables.md`) is no citation
        target = _resolve_page(rel, page, pages)
        if target is None:
            problems.append(f"{where(m.start())}: cites a page that does not exist: {page}")
            continue
        if sections:
            numbers, _ = pages.headings(target)
            for number in _section_numbers(sections):
                if number not in numbers:
                    problems.append(f"{where(m.start())}: {target} has no section §{number}")

    for m in BARE_SECTION.finditer(text):
        if m.start() in covered:
            continue
        if not is_doc_page:
            problems.append(f"{where(m.start())}: section {m.group(0)!r} names no page (write `docs/<page>.md §N`)")
            continue
        numbers, _ = pages.headings(rel)
        for number in _section_numbers(m.group(0)):
            if number not in numbers:
                problems.append(f"{where(m.start())}: {rel} has no section §{number} of its own")

    if rel.endswith(".md"):
        for m in MD_LINK.finditer(text):
            link = m.group(1)
            if re.match(r"[a-z][a-z0-9+.-]*:", link):
                continue  # http:, https:, mailto:
            path, _, anchor = link.partition("#")
            target = _normalise(f"{Path(rel).parent}/{path}") if path else rel
            if target.startswith("../") or not pages.exists(target) and not (REPO / target).exists():
                problems.append(f"{where(m.start())}: link to a missing file: {link}")
            elif anchor and target in pages.texts and anchor not in pages.headings(target)[1]:
                problems.append(f"{where(m.start())}: link to a missing heading: {link}")
    return problems


@pytest.fixture(scope="module")
def files() -> dict[str, str]:
    return tracked_text_files()


def test_files_are_found(files):
    # A guard against the test passing vacuously (wrong root, no git).
    assert "README.md" in files and "docs/release_behaviour.md" in files and "seal/core/apatch.py" in files
    assert not any(rel.startswith("data/") for rel in files)


def test_no_file_cites_outside_the_repository(files):
    pages = Pages({rel: text for rel, text in files.items() if rel.endswith(".md")})
    problems = [p for rel, text in sorted(files.items()) for p in citation_problems(rel, text, pages)]
    assert not problems, "\n".join(problems)


def test_the_restated_facts_have_their_pages(files):
    for page in ("docs/paper.md", "docs/release_behaviour.md", "docs/dependencies.md"):
        assert page in files
        numbers, _ = _headings(files[page])
        assert {"1", "2", "3"} <= numbers, page


# Planted texts are written with placeholders and expanded at run time, so that this file itself carries no bad
# citation: {D} docs/, {S} the section sign, {A} the design note's name, {R} "reference", {UP} "../",
# {SH} the workspace directory's name, {W} the workspace root, {RP} the repository root's parent in code, {RB} the
# release-behaviour note's name.
_PLACEHOLDERS = {
    "{D}": "docs" + "/",
    "{S}": chr(0xA7),
    "{A}": "ARCHI" + "TECTURE",
    "{R}": "refer" + "ence",
    "{UP}": "." + "./",
    "{SH}": "sha" + "red",
    "{W}": "/wo" + "rk/",
    "{RP}": "REPO" + ".parent",
    "{RB}": "seal-release-" + "behaviour",
    "{I}": "iss" + "ue",
}


def plant(text: str) -> str:
    for key, value in _PLACEHOLDERS.items():
        text = text.replace(key, value)
    return text


PLANTED_PAGES = {
    plant("{D}a.md"): "# A\n\n## 1. One\n\n### 1.2 Sub\n\n## 2. Two\n",
    "README.md": "# Readme\n",
}


@pytest.mark.parametrize(
    ("rel", "text", "needle"),
    [
        ("seal/x.py", "# wire protocol: {A}.md", "original design note"),
        ("seal/x.py", "# as the {A}'s protocol says", "original design note"),
        ("seal/x.py", '"""See {R}/paper.md."""', "reference notes"),
        ("seal/x.py", "# release behaviour ({R} {S}6.4)", "reference section"),
        ("seal/x.py", "# Reference {S}6.3 describes it", "reference section"),
        ("{D}b.md", "see `{R}/{RB}.md`", "release-behaviour note"),
        ("tests/t.py", 'SPLIT = "{UP}{SH}/data/bfcl_split_ids.json"', "workspace beside the checkout"),
        ("tests/t.py", "SPLIT = {RP} / '{SH}' / 'x.json'", "above the repository root"),
        ("{D}b.md", "the file at {W}{SH}/data/x.json", "workspace beside the checkout"),
        ("exp/x.yaml", "# see {UP}{UP}outside/notes.txt", "climbs out of the checkout"),
        ("{D}b.md", "## Extension ({I} 5, report scripts)", "an issue of the tracker"),
        ("seal/x.py", "# fixed in {I}s #12", "an issue of the tracker"),
        ("seal/x.py", "# see {D}nowhere.md", "does not exist: " + plant("{D}nowhere.md")),
        ("seal/x.py", "# see {D}a.md {S}3", "has no section " + chr(0xA7) + "3"),
        ("seal/x.py", "# see {D}a.md {S}1.1", "has no section " + chr(0xA7) + "1.1"),
        ("seal/x.py", "# see {D}a.md {S}1–3", "has no section " + chr(0xA7) + "3"),
        ("seal/x.py", "# see {D}a.md {S}1, {S}9", "has no section " + chr(0xA7) + "9"),
        ("seal/x.py", "# release ({S}7.2)", "names no page"),
        ("{D}a.md", "## 1. One\nsee {S}4\n", "of its own"),
        ("{D}b.md", "see a.md {S}5", plant("{D}a.md has no section")),
        ("{D}b.md", "[x]({UP}{UP}up.md)", "link to a missing file"),
        ("{D}b.md", "[x](c.md)", "link to a missing file"),
        ("{D}b.md", "[x](a.md#missing)", "link to a missing heading"),
    ],
)
def test_a_planted_bad_citation_fails(rel, text, needle):
    problems = citation_problems(plant(rel), plant(text), Pages(PLANTED_PAGES))
    assert any(needle in p for p in problems), problems


@pytest.mark.parametrize(
    ("rel", "text"),
    [
        ("seal/x.py", "# see {D}a.md {S}1.2 and {D}a.md {S}1–2"),
        ("seal/x.py", "# see ``{D}a.md`` {S}2, {S}1.2"),
        ("{D}b.md", "see a.md {S}2 and `{D}a.md` {S}1.2; [a](a.md#2-two) [r]({UP}README.md)"),
        ("{D}a.md", "## 1. One\n## 2. Two\nsee {S}2 and {S}1–{S}2\n"),
        ("seal/x.py", "out = tmp_path / 'tables.md'  # an output file, not a citation"),
        ("seal/x.py", "# the {R} policy's parameters (a {R} model, not a document)"),
    ],
)
def test_a_good_citation_passes(rel, text):
    assert citation_problems(plant(rel), plant(text), Pages(PLANTED_PAGES)) == []


def test_a_missing_page_and_a_missing_section_fail():
    absent = Pages(PLANTED_PAGES)
    present = Pages({**PLANTED_PAGES, "docs/" + "protocol.md": "# Protocol\n\n## 1. Routes\n"})
    assert citation_problems("seal/x.py", plant("# {D}protocol.md {S}1"), absent)
    assert citation_problems("seal/x.py", plant("# {D}protocol.md {S}1"), present) == []
    assert citation_problems("seal/x.py", plant("# {D}protocol.md {S}2"), present)


# --- docs/paper.md restates paper_numbers exactly ------------------------------------------------


def _table_under(text: str, heading: str) -> list[list[str]]:
    """Body rows (cells) of the first markdown table after `heading`."""
    start = text.index(heading)
    rows, seen_table = [], False
    for line in text[start:].splitlines()[1:]:
        if line.startswith("|"):
            seen_table = True
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if not set("".join(cells)) <= set("-: "):
                rows.append(cells)
        elif seen_table:
            break
    return rows[1:]  # drop the header row


def _numbers_table(text: str, heading: str) -> dict[pn.Row, tuple[float, ...]]:
    return {pn.parse_row(cells[0]): tuple(float(c) for c in cells[1:]) for cells in _table_under(text, heading)}


@pytest.fixture(scope="module")
def paper_md() -> str:
    return (REPO / "docs" / "paper.md").read_text()


def test_paper_md_held_in_table_equals_paper_numbers(paper_md):
    table = _numbers_table(paper_md, "### 9.1 ")
    expected = {row: tuple(s.as_metrics().values()) for row, s in pn.HELD_IN.items()}
    assert table == expected


def test_paper_md_ood_table_equals_paper_numbers(paper_md):
    table = _numbers_table(paper_md, "### 9.2 ")
    expected = {row: tuple(s.as_metrics().values()) for row, s in pn.OOD.items()}
    assert table == expected


def test_paper_md_ablation_table_equals_paper_numbers(paper_md):
    table = _numbers_table(paper_md, "### 9.3 ")
    expected = {row: tuple(s.as_metrics().values()) for row, s in pn.ABLATION.items()}
    assert table == expected


def test_paper_md_reference_points_equal_paper_numbers(paper_md):
    rows = _table_under(paper_md, "### 9.5 ")
    assert {name: float(value) for name, value in rows} == dict(pn.REFERENCE_POINTS)


def test_paper_md_weights_equal_the_code(paper_md):
    from seal.core.weights import PROGRESS_WEIGHTS

    rows = _table_under(paper_md, "Utility weights ρ")
    assert {name.strip("`"): float(value) for name, value in rows} == dict(PROGRESS_WEIGHTS)
