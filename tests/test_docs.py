"""The docs stay true: case-study diagrams are up to date, and every `$ kvgeom ...` transcript in docs/
prints what it shows, and the docs site builds with `mkdocs build --strict`."""

from __future__ import annotations

import importlib.util
import re
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from kvgeom.cli import main

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
SVG = "{http://www.w3.org/2000/svg}"


def _make_diagrams():
    spec = importlib.util.spec_from_file_location("make_diagrams", DOCS / "make_diagrams.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_case_diagrams_are_up_to_date():
    # Fails when a committed SVG differs from what `kvgeom diagram` draws now: run python docs/make_diagrams.py.
    assert _make_diagrams().main(["--check"]) == 0


def test_every_case_diagram_is_used_and_has_lanes():
    module = _make_diagrams()
    pages = "".join(p.read_text(encoding="utf-8") for p in (DOCS / "cases").glob("*.md"))
    for name, *_ in module.DIAGRAMS:
        assert f"]({name})" in pages, name
        root = ET.parse(DOCS / "cases" / name).getroot()
        assert [g for g in root.iter(f"{SVG}g") if g.get("class") == "lane"]


def _transcripts() -> list[tuple[str, str, list[str]]]:
    """(page, command, expected output lines) for every `$ kvgeom` line of a ```text block in docs/."""
    found = []
    for page in sorted(DOCS.rglob("*.md")):
        for block in re.findall(r"```text\n(.*?)```", page.read_text(encoding="utf-8"), flags=re.S):
            lines = block.splitlines()
            for i, line in enumerate(lines):
                if not line.startswith("$ kvgeom "):
                    continue
                expected = []
                for nxt in lines[i + 1 :]:
                    if nxt.startswith("$ "):
                        break
                    expected.append(nxt)
                echo = lines[i + 1 + len(expected)] if i + 1 + len(expected) < len(lines) else ""
                code = lines[i + 2 + len(expected)] if echo == "$ echo $?" else None
                found.append((str(page.relative_to(ROOT)), line[2:], expected + ([f"exit {code}"] if code else [])))
    return found


TRANSCRIPTS = _transcripts()


def test_docs_have_transcripts():
    assert len(TRANSCRIPTS) >= 10


@pytest.mark.parametrize(("page", "command", "expected"), TRANSCRIPTS, ids=[f"{p}:{c}" for p, c, _ in TRANSCRIPTS])
def test_doc_transcript_is_what_kvgeom_prints(capsys, monkeypatch, page, command, expected):
    monkeypatch.chdir(ROOT)
    code = main(command.split()[1:])
    out, err = capsys.readouterr()
    actual = err.splitlines() + out.splitlines()
    if expected and expected[-1].startswith("exit "):
        assert code == int(expected.pop()[5:])
    if "..." in expected:  # an elided transcript: the shown lines appear in order
        shown = [line for line in expected if line != "..."]
        it = iter(actual)
        assert all(any(line == a for a in it) for line in shown), (shown, actual)
    else:
        assert actual == expected


def test_docs_site_builds_strict(tmp_path):
    # --strict fails on broken links and pages missing from the nav
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    out = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "--site-dir", str(tmp_path / "site")],
        cwd=root,
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stdout + out.stderr


# ----------------------------------------------------------------- a site people can read (issue 22)

NAV_GROUPS = (
    "Start here",
    "Connector authors",
    "Router authors",
    "Engine developers",
    "CI users",
    "Researchers",
    "Reference",
)


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """The site as `mkdocs build --strict` writes it (built once for the tests below)."""
    import subprocess
    import sys

    out = tmp_path_factory.mktemp("site") / "site"
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "--site-dir", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return out


def _pages(site: Path) -> list[Path]:
    return [p for p in sorted(site.rglob("*.html")) if p.name != "404.html"]


def test_site_links_the_bundled_css_on_every_page(site):
    # kvgeom.css makes tables wrap and fit; pygments.css colours the code the build highlighted.
    pages = _pages(site)
    assert len(pages) >= 30
    for page in pages:
        html = page.read_text(encoding="utf-8")
        assert re.search(r'href="[./]*css/kvgeom\.css"', html), page
        assert re.search(r'href="[./]*css/pygments\.css"', html), page
    assert (site / "css" / "kvgeom.css").is_file() and (site / "css" / "pygments.css").is_file()
    # code is highlighted at build time: Pygments' spans are in the HTML
    assert 'class="codehilite"' in (site / "connector" / "index.html").read_text(encoding="utf-8")


def test_site_loads_no_script_or_style_from_the_network(site):
    # Offline readers and offline builds: every script and stylesheet is in the site (no highlight.js CDN).
    external = re.compile(r'<(?:script[^>]*\ssrc|link[^>]*\shref)="(?:https?:)?//[^"]*"', re.I)
    for page in _pages(site):
        found = external.findall(page.read_text(encoding="utf-8"))
        assert not found, (page, found)
    for css in site.rglob("*.css"):
        assert not re.search(r"@import\s+(url\()?['\"]?(https?:)?//", css.read_text(encoding="utf-8")), css


def test_site_nav_is_grouped_by_role(site):
    html = (site / "index.html").read_text(encoding="utf-8")
    captions = re.findall(r'<p class="caption"><span class="caption-text">([^<]*)</span></p>', html)
    assert tuple(captions) == NAV_GROUPS
    glossary = (site / "glossary" / "index.html").read_text(encoding="utf-8")
    assert 'id="terms-of-art"' in glossary


def test_pages_fit_a_laptop_screen(site, monkeypatch):
    # Issue 22: the glossary, routing, speculative and a case-study page at 1280 px show every table column
    # (nothing wider than the text column, nothing hidden behind a scroll bar) and diagram text >= 11 px.
    spec = importlib.util.spec_from_file_location("check_pages", DOCS / "check_pages.py")
    assert spec is not None and spec.loader is not None
    check_pages = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "check_pages", check_pages)  # its dataclass looks itself up there
    spec.loader.exec_module(check_pages)
    if check_pages.chromium() is None:
        pytest.skip("no chromium on PATH: the layout is measured in a headless chromium (docs/check_pages.py)")
    reports = check_pages.check(site, width=1280)
    assert [r.page for r in reports] == list(check_pages.PAGES)
    assert sum(r.diagrams for r in reports) >= 2 and sum(r.tables for r in reports) >= 5
    assert [(r.page, r.problems) for r in reports if r.problems] == []


def test_every_vllm_marked_test_module_runs_in_ci():
    # a vllm-marked module skips in the main venv; it runs only if .ci/run's vLLM pytest list names it
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    marked = [p.name for p in sorted((ROOT / "tests").glob("test_*.py"))
              if re.search(r"^pytestmark = NEEDS_VLLM", p.read_text(encoding="utf-8"), flags=re.M)]
    assert "test_docs_vllm.py" in marked
    assert [name for name in marked if f"tests/{name}" not in ci] == []


def test_no_file_points_at_one_machines_paths():
    # benchmarks/README.md, benchmarks/vs_vllm.py and tests/test_adapters_vllm_real.py named one machine's vLLM
    # venv; the install script's default (.ci-vllm-venv, or $KVGEOM_VLLM_VENV) works everywhere
    import subprocess

    machine = "/" + "work/"
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True).stdout.split()
    if not tracked:  # not a git checkout (an sdist): read the tree
        tracked = [str(p.relative_to(ROOT)) for p in ROOT.rglob("*") if p.is_file()]
    found = []
    for name in tracked:
        path = ROOT / name
        text_file = path.suffix in {".py", ".md", ".sh", ".toml", ".yml", ".yaml", ".txt", ".cfg"} or name == ".ci/run"
        if text_file and path.is_file() and machine in path.read_text(encoding="utf-8", errors="replace"):
            found.append(name)
    assert found == []
