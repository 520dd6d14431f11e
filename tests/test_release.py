"""Release engineering (issue 22): one version source, the license in sdist and wheel, what the sdist carries,
the changelog and policies in the docs, pins that exist, and the engine-version warning.

The build test builds the sdist and the wheel once (``python -m build``, about 15 s) or, when ``KVGEOM_DIST``
names a folder that already holds them, reads those.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.metadata
import importlib.util
import os
import re
import subprocess
import sys
import tarfile
import tomllib
import types
import warnings
import zipfile
from pathlib import Path
from types import SimpleNamespace as NS

import pytest

import kvgeom
from kvgeom.adapters import vllm as adapter

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
PROJECT = PYPROJECT["project"]
#: SHA-256 of the Apache License 2.0 text as apache.org publishes it (LICENSE-2.0.txt).
APACHE_2_SHA256 = "cfc7749b96f63bd31c3c42b5c471bf756814053e847c10f3eb003417bc523d30"


# -- one version source ------------------------------------------------------------------------------------


def test_version_is_written_once():
    assert "version" not in PROJECT
    assert PROJECT["dynamic"] == ["version"]
    assert PYPROJECT["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "kvgeom.__version__"}
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    assert not re.search(r"""^\s*version\s*=\s*["']""", text, flags=re.M), "a second literal version"


def test_version_literal_is_static_and_pep440():
    # setuptools reads a plain string literal without importing kvgeom (so a build needs none of its deps).
    tree = ast.parse((ROOT / "kvgeom" / "__init__.py").read_text(encoding="utf-8"))
    values = [
        n.value
        for n in tree.body
        if isinstance(n, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__version__" for t in n.targets)
    ]
    assert len(values) == 1 and isinstance(values[0], ast.Constant)
    assert values[0].value == kvgeom.__version__
    assert re.fullmatch(r"\d+\.\d+\.\d+(\.dev\d+|rc\d+)?", kvgeom.__version__)


def test_python_m_kvgeom_version_without_install():
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [sys.executable, "-m", "kvgeom", "--version"], capture_output=True, text=True, env=env, cwd=ROOT, check=True
    )
    assert out.stdout.strip() == f"kvgeom {kvgeom.__version__}"


# -- metadata ----------------------------------------------------------------------------------------------


def test_license_is_a_pep639_expression_with_the_apache_text():
    assert PROJECT["license"] == "Apache-2.0"
    assert PROJECT["license-files"] == ["LICENSE"]
    assert not [c for c in PROJECT["classifiers"] if c.startswith("License ::")]
    assert any(re.fullmatch(r"setuptools>=(7[7-9]|[89]\d)(\.\d+)*", r) for r in PYPROJECT["build-system"]["requires"])
    assert hashlib.sha256((ROOT / "LICENSE").read_bytes()).hexdigest() == APACHE_2_SHA256


def test_urls_classifiers_keywords():
    assert set(PROJECT["urls"]) >= {"Homepage", "Documentation", "Changelog", "Issues"}
    assert all(u.startswith("https://github.com/kvgeom/kvgeom") for u in PROJECT["urls"].values())
    classifiers = set(PROJECT["classifiers"])
    assert {f"Programming Language :: Python :: 3.{m}" for m in (11, 12, 13)} <= classifiers
    assert {
        "Typing :: Typed",
        "Development Status :: 4 - Beta",
        "Topic :: Scientific/Engineering :: Artificial Intelligence",
    } <= classifiers
    assert PROJECT["keywords"]


# -- changelog, policies, pins -----------------------------------------------------------------------------


def _sections(text: str) -> dict[str, str]:
    parts = re.split(r"^## \[([^\]]+)\].*$", text, flags=re.M)
    return dict(zip(parts[1::2], parts[2::2], strict=True))


def test_changelog_keeps_a_changelog_from_0_1_and_marks_breaking_changes():
    sections = _sections((ROOT / "CHANGELOG.md").read_text(encoding="utf-8"))
    assert list(sections)[:3] == ["Unreleased", "0.2.0", "0.1.0"]
    breaking = sections["0.2.0"]
    assert "**Breaking:** `geometry_from_vllm`" in breaking and "parallel_layout_unknown" in breaking
    assert re.search(r"\*\*Breaking:\*\* fingerprints moved from `kvg1-` to `kvg2-`", breaking)
    assert "**Breaking:**" in sections["Unreleased"] and "mamba_store_points" in sections["Unreleased"]
    # The version on main is the next release (a .dev of it), or a released version with its own section.
    version = kvgeom.__version__
    if ".dev" in version:
        assert version.split(".dev")[0] not in sections, "bump past a released version"
    else:
        assert version in sections


def test_docs_changelog_is_the_changelog():
    spec = importlib.util.spec_from_file_location("sync_changelog", ROOT / "scripts" / "sync-changelog.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.main(["sync-changelog.py", "--check"]) == 0, "run python scripts/sync-changelog.py"


def test_changelog_and_policies_are_in_the_site_nav():
    nav = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    assert "changelog.md" in nav and "policies.md" in nav
    policies = (ROOT / "docs" / "policies.md").read_text(encoding="utf-8")
    assert "vLLM | LMCache | SGLang" in policies and adapter.CHECKED_VLLM in policies
    assert "EngineVersionWarning" in policies and "bumps the minor version" in policies


@pytest.mark.parametrize("path", ["docs/ci.md", ".pre-commit-hooks.yaml"])
def test_docs_pin_only_what_exists(path):
    # No release is tagged yet: a pin is a commit; a tag form is allowed only where it says it waits for the tag.
    for line in (ROOT / path).read_text(encoding="utf-8").splitlines():
        if re.search(r"(@|rev:\s*)v\d+\.\d+", line):
            assert "once" in line.lower(), line


# -- engine version: a clear warning, not silence ----------------------------------------------------------

_KV = NS(kv_cache_groups=[NS(kv_cache_spec=type("MambaSpec", (NS,), {})(block_size=16, mamba_cache_mode="align"))])


@pytest.mark.parametrize("entry", [adapter.geometry_from_vllm, adapter.config_from_vllm])
def test_adapter_warns_on_an_unchecked_vllm(monkeypatch, entry):
    monkeypatch.setattr(adapter, "installed_vllm_version", lambda: "0.34.1")
    with pytest.warns(adapter.EngineVersionWarning) as record:
        entry(_KV, parallel={"tp": 1, "dcp": 1}, cache={})
    [w] = record
    message = str(w.message)
    assert "vllm 0.34.1 is installed" in message and "vllm 0.33.x" in message
    assert "kvgeom conform" in message and "Install vllm 0.33.x" in message
    assert w.filename == __file__  # points at the caller's line, not at kvgeom


@pytest.mark.parametrize("version", ["0.33.0", "0.33.7", None])
def test_adapter_is_quiet_on_the_checked_vllm(monkeypatch, version):
    monkeypatch.setattr(adapter, "installed_vllm_version", lambda: version)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        adapter.geometry_from_vllm(_KV, parallel={"tp": 1, "dcp": 1}, cache={})


def test_engine_version_message_names_both_versions():
    assert adapter.engine_version_message("vllm", "0.330.1", "0.33") is not None
    assert adapter.engine_version_message("vllm", "0.33", "0.33") is None
    message = adapter.engine_version_message("vllm", "0.32.0", "0.33") or ""
    assert "0.32.0" in message and "0.33.x" in message and "docs/policies.md" in message


def test_installed_vllm_version_reads_metadata():
    try:
        expected: str | None = importlib.metadata.version("vllm")
    except importlib.metadata.PackageNotFoundError:
        expected = None
    assert adapter.installed_vllm_version() == expected


def test_load_engine_warns_on_an_unchecked_vllm(monkeypatch):
    from kvgeom.conformance import engines

    def answers(geometry, scenario):  # pragma: no cover - never called
        return {}

    fake = types.ModuleType("kvgeom.conformance.vllm_engine")
    fake.vllm_answers = answers  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "kvgeom.conformance.vllm_engine", fake)
    monkeypatch.setattr(engines.importlib.metadata, "version", lambda name: "0.35.0")
    with pytest.warns(adapter.EngineVersionWarning, match="vllm 0.35.0 is installed"):
        engine = engines.load_engine("vllm")
    assert engine.version == "0.35.0" and engine.warning is not None and "0.33.x" in engine.warning
    monkeypatch.setattr(engines.importlib.metadata, "version", lambda name: "0.33.0")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert engines.load_engine("vllm").warning is None


# -- sdist and wheel ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, str]:
    """(sdist, wheel, build log) of this checkout: from ``KVGEOM_DIST`` when set, else built now."""
    given = os.environ.get("KVGEOM_DIST")
    if given:
        out, log = Path(given), ""
    else:
        pytest.importorskip("build", reason="pip install build (the test extra has it)")
        out = tmp_path_factory.mktemp("dist")
        done = subprocess.run(
            [sys.executable, "-m", "build", "--outdir", str(out), str(ROOT)],
            capture_output=True,
            text=True,
            timeout=300,
        )
        log = done.stdout + done.stderr
        assert done.returncode == 0, log[-3000:]
    [sdist] = out.glob(f"kvgeom-{kvgeom.__version__}.tar.gz")
    [wheel] = out.glob(f"kvgeom-{kvgeom.__version__}-py3-none-any.whl")
    return sdist, wheel, log


def _package_files() -> set[str]:
    pkg = ROOT / "kvgeom"
    wanted = [p for p in pkg.rglob("*") if p.is_file() and (p.suffix in {".py", ".toml"} or p.name == "py.typed")]
    return {p.relative_to(ROOT).as_posix() for p in wanted if "__pycache__" not in p.parts}


def test_build_has_no_license_deprecation(dist):
    log = dist[2]
    assert "project.license" not in log and "License classifiers are deprecated" not in log


def test_sdist_carries_the_package_and_license_but_no_tests(dist):
    sdist = dist[0]
    top = f"kvgeom-{kvgeom.__version__}/"
    with tarfile.open(sdist) as tar:
        names = {m.name[len(top) :] for m in tar.getmembers() if m.isfile()}
        pkg_info = tar.extractfile(top + "PKG-INFO").read().decode()  # type: ignore[union-attr]
    assert {"LICENSE", "README.md", "CHANGELOG.md", "pyproject.toml", "PKG-INFO"} <= names
    assert _package_files() <= names
    # The decision (MANIFEST.in): no test suite in the sdist, not half of one.
    assert not [n for n in names if n.startswith(("tests/", "docs/", "examples/", "benchmarks/"))]
    assert "conftest.py" not in names and "mkdocs.yml" not in names
    assert f"Version: {kvgeom.__version__}\n" in pkg_info and "License-Expression: Apache-2.0\n" in pkg_info


def test_wheel_carries_the_license_and_the_package(dist):
    wheel = dist[1]
    info = f"kvgeom-{kvgeom.__version__}.dist-info/"
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        metadata = zf.read(info + "METADATA").decode()
        license_text = zf.read(info + "licenses/LICENSE")
    assert hashlib.sha256(license_text).hexdigest() == APACHE_2_SHA256
    assert _package_files() <= names
    assert {n.split("/")[0] for n in names} == {"kvgeom", info.rstrip("/")}
    assert "License-Expression: Apache-2.0\n" in metadata and "License-File: LICENSE\n" in metadata
    assert "Classifier: Typing :: Typed\n" in metadata and "Project-URL: Changelog, " in metadata
