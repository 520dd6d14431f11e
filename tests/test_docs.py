"""The docs stay true: case-study diagrams are up to date, and every `$ kvgeom ...` transcript in docs/
prints what it shows, and the docs site builds with `mkdocs build --strict`."""

from __future__ import annotations

import importlib.util
import re
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
