"""The documentation's links hold: every relative link in README.md and docs/**/*.md names a file
that exists, and a link's #anchor names a heading of that page; every docs/ path cited in the
pages, in src/, tests/ and benches/ names a file or folder that exists, and so does every result
file (benches/results/NAME.EXT) cited; the site's nav (mkdocs.yml) lists every page; and
benches/results holds only what the pages cite.

An anchor must be the heading's id under GitHub's rules and under MkDocs' (which collapses runs
of dashes and drops non-ASCII letters), so that it works in both places. Reads files only (and
`git ls-files`): no imports of uma.
"""

from __future__ import annotations

import fnmatch
import re
import subprocess
import unicodedata
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]

# Citations not updated yet, each (file, cited path); every entry must still be present, so the
# entry goes once the file is fixed.
KNOWN_STALE: set[tuple[str, str]] = set()

FENCE = re.compile(r"^(```|~~~)")
CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1")
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(([^()\s]+)(?:\s+\"[^\"]*\")?\)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
CITED = re.compile(r"(?<![\w./-])"
                   r"(?:docs/[\w./-]*|benches/results/[a-z][\w.-]*\.(?:json|csv|png|txt))")


def github_slug(text: str) -> str:
    text = re.sub(r"[^\w\- ]", "", text.strip().lower())
    return text.replace(" ", "-")


def mkdocs_slug(text: str) -> str:
    text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii")
    text = re.sub(r"[^\w\s-]", "", text).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def heading_text(raw: str) -> str:
    """A heading as rendered: code spans and emphasis lose their marks, links their targets."""
    raw = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", raw)
    return raw.replace("`", "").replace("**", "").replace("__", "")


def prose_lines(text: str) -> list[tuple[int, str]]:
    """The lines outside fenced code blocks, numbered from 1."""
    out, fenced = [], False
    for number, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line.lstrip()):
            fenced = not fenced
            continue
        if not fenced:
            out.append((number, line))
    return out


def anchors(page: Path) -> dict[str, str]:
    """Each heading's GitHub id, mapped to its MkDocs id."""
    found: dict[str, str] = {}
    seen: dict[str, int] = {}
    for _, line in prose_lines(page.read_text(encoding="utf-8")):
        m = HEADING.match(line)
        if not m:
            continue
        text = heading_text(m.group(2))
        slug = github_slug(text)
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        found[slug if n == 0 else f"{slug}-{n}"] = mkdocs_slug(text) if n == 0 else ""
    return found


def link_problems(root: Path, page: Path) -> list[str]:
    problems = []
    where = page.relative_to(root)
    for number, line in prose_lines(page.read_text(encoding="utf-8")):
        for m in LINK.finditer(CODE_SPAN.sub("", line)):
            target = m.group(1)
            if re.match(r"[a-z][a-z0-9+.-]*:", target) or target.startswith("/"):
                continue
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            if not dest.exists():
                problems.append(f"{where}:{number}: {target}: no such file")
                continue
            if anchor and dest.suffix == ".md":
                ids = anchors(dest)
                if anchor not in ids:
                    problems.append(f"{where}:{number}: {target}: no heading with that id")
                elif ids[anchor] != anchor:
                    problems.append(f"{where}:{number}: {target}: MkDocs names that heading "
                                    f"#{ids[anchor]}")
    return problems


def citation_problems(root: Path, path: Path) -> list[str]:
    problems = []
    where = path.relative_to(root).as_posix()
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if path.suffix == ".md":
            line = LINK.sub("", line)  # link targets are the links' to check
        for m in CITED.finditer(line):
            cited = m.group(0).rstrip(".-/")
            if (where, cited) in KNOWN_STALE:
                continue
            if not (root / cited).exists():
                problems.append(f"{where}:{number}: {cited}: no such file or folder")
    return problems


def pages(root: Path) -> list[Path]:
    return [root / "README.md", *sorted((root / "docs").rglob("*.md"))]


def sources(root: Path) -> list[Path]:
    found = []
    for folder in ("src", "tests", "benches"):
        found += sorted((root / folder).rglob("*.py")) + sorted((root / folder).rglob("*.sh"))
    this = Path(__file__).resolve()  # whose examples below cite paths that do not exist
    return [path for path in found if path.resolve() != this]


def all_problems(root: Path) -> list[str]:
    problems = []
    for page in pages(root):
        problems += link_problems(root, page) + citation_problems(root, page)
    for source in sources(root):
        problems += citation_problems(root, source)
    return problems


def test_every_link_and_cited_docs_path_resolves():
    assert all_problems(ROOT) == []


def nav_pages(nav: object) -> list[str]:
    """The page paths of mkdocs.yml's nav, at any depth."""
    if isinstance(nav, str):
        return [nav]
    if isinstance(nav, list):
        return [page for item in nav for page in nav_pages(item)]
    if isinstance(nav, dict):
        return [page for value in nav.values() for page in nav_pages(value)]
    return []


def test_the_site_nav_lists_every_page_once():
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))
    listed = nav_pages(config["nav"])
    docs = ROOT / config.get("docs_dir", "docs")
    assert len(listed) == len(set(listed)), "a page is listed twice"
    assert sorted(listed) == sorted(p.relative_to(docs).as_posix() for p in docs.rglob("*.md"))


def test_the_known_stale_citations_are_still_there():
    for file, cited in KNOWN_STALE:
        assert cited in (ROOT / file).read_text(encoding="utf-8"), (
            f"{file} no longer cites {cited}: remove it from KNOWN_STALE")


@pytest.mark.parametrize(("heading", "github", "mkdocs"), [
    ("The OpenAI-compatible HTTP API", "the-openai-compatible-http-api",
     "the-openai-compatible-http-api"),
    ("The prefix cache (`uma/engine/prefix_cache.py`)", "the-prefix-cache-umaengineprefix_cachepy",
     "the-prefix-cache-umaengineprefix_cachepy"),
    ('The latency bound (`policy = "bound"`, the default)',
     "the-latency-bound-policy--bound-the-default", "the-latency-bound-policy-bound-the-default"),
])
def test_heading_ids(heading, github, mkdocs):
    assert github_slug(heading_text(heading)) == github
    assert mkdocs_slug(heading_text(heading)) == mkdocs


def test_a_broken_link_anchor_or_citation_is_reported(tmp_path):
    (tmp_path / "docs" / "guide").mkdir(parents=True)
    (tmp_path / "src").mkdir()
    (tmp_path / "README.md").write_text(
        "[ok](docs/guide/a.md#a-heading) [gone](docs/guide/b.md) [anchor](docs/guide/a.md#nope)\n"
        "`[in code](nowhere.md)` and docs/guide/a.md, docs/guide/c.md\n"
        "```\n[fenced](nowhere.md)\n```\n")
    (tmp_path / "docs" / "guide" / "a.md").write_text(
        "# A heading\n\n## Two  spaces\n\n[self](#two--spaces) [site](https://example.com/x.md)\n")
    (tmp_path / "src" / "m.py").write_text('"""See docs/guide/a.md and docs/gone.md."""\n')
    assert sorted(all_problems(tmp_path)) == sorted([
        "README.md:1: docs/guide/b.md: no such file",
        "README.md:1: docs/guide/a.md#nope: no heading with that id",
        "README.md:2: docs/guide/c.md: no such file or folder",
        "docs/guide/a.md:5: #two--spaces: MkDocs names that heading #two-spaces",
        "src/m.py:1: docs/gone.md: no such file or folder",
    ])


RESULT_NAME = re.compile(r"[\w{},*-]*_[\w{},*.-]*")


def expand_citation(text: str) -> list[str]:
    """A cited result as names or patterns: `a_{1,2}` is a_1 and a_2, `a_1-3` is a_1 to a_3."""
    brace = re.search(r"\{([^{}]*)\}", text)
    if brace:
        return [name for alt in brace.group(1).split(",")
                for name in expand_citation(text[:brace.start()] + alt + text[brace.end():])]
    span = re.search(r"_(\d+)-(\d+)$", text)
    if span:
        return [f"{text[:span.start()]}_{i}" for i in range(int(span[1]), int(span[2]) + 1)]
    return [text]


def cites(citations: set[str], name: str) -> bool:
    """A result file is cited by its name, its stem (`run_1` for run_1.json and run_1.csv) or
    a pattern (`run_*`)."""
    stem = name.split(".")[0]
    return any(c in (name, stem) or ("*" in c and fnmatch.fnmatch(name, c)) for c in citations)


def uncited_results(root: Path) -> list[str]:
    text = "\n".join(page.read_text(encoding="utf-8") for page in pages(root))
    citations = {name for raw in RESULT_NAME.findall(text)
                 for name in expand_citation(raw.strip(".,-"))}
    folder = root / "benches" / "results"
    return sorted(f.name for f in folder.iterdir()
                  if f.is_file() and not cites(citations, f.name))


def test_benches_results_holds_only_what_the_docs_cite():
    """Summaries and plots the pages cite; raw timelines are regenerated by the commands."""
    committed = subprocess.run(["git", "ls-files", "benches/results"], cwd=ROOT, text=True,
                               capture_output=True, check=True).stdout.split()
    assert [f for f in committed if f.endswith(".timelines.json.xz")] == []
    uncited = set(uncited_results(ROOT))
    assert [f for f in committed if Path(f).name in uncited] == []


def test_citation_patterns_expand():
    assert expand_citation("run_{1,2}_x") == ["run_1_x", "run_2_x"]
    assert expand_citation("run_a1000_1-3") == ["run_a1000_1", "run_a1000_2", "run_a1000_3"]
    assert cites({"run_1"}, "run_1.csv") and cites({"run_*"}, "run_7.png")
    assert not cites({"run_1"}, "run_10.json")


PROVENANCE = re.compile(r"(?m)^> \*\*Measured\*\*.*(?:\n>.*)*")
PROVENANCE_FIELDS = ("**Measured**", "**recorded in**", "**machine**", "**model**",
                     "**command**")


def provenance_problems(root: Path) -> list[str]:
    """A results page's figures carry their date, commit, machine, model and command: each page
    opens its measurements with such a block, and every block names all five."""
    problems = []
    for page in sorted((root / "docs" / "results").glob("*.md")):
        if page.name == "README.md":
            continue
        blocks = PROVENANCE.findall(page.read_text(encoding="utf-8"))
        if not blocks:
            problems.append(f"{page.name}: no '> **Measured** ...' block")
        problems += [f"{page.name}: a block without {field}: {block[:60]!r}"
                     for block in blocks for field in PROVENANCE_FIELDS if field not in block]
    return problems


def test_every_results_page_says_where_its_figures_come_from():
    assert provenance_problems(ROOT) == []
