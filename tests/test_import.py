"""`import kvgeom` stays light: numpy and pydantic only (house style)."""

from __future__ import annotations

import subprocess
import sys


def test_import_pulls_in_no_heavy_dependency():
    code = (
        "import sys, kvgeom; "
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in "
        "{'hypothesis', 'vllm', 'torch', 'pytest', 'sglang', 'lmcache', 'jax'}); "
        "print(','.join(bad))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_conformance_is_never_imported_and_imports_no_engine():
    # `import kvgeom` leaves kvgeom.conformance alone; importing it pulls in neither vLLM, torch nor Hypothesis
    code = (
        "import sys, kvgeom; assert 'kvgeom.conformance' not in sys.modules; "
        "import kvgeom.conformance; "
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in {'hypothesis', 'vllm', 'torch'}); "
        "print(','.join(bad))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_python_m_kvgeom_explain_json_prints_default_report():
    out = subprocess.run(
        [sys.executable, "-m", "kvgeom", "explain", "--json"], capture_output=True, text=True, check=True
    )
    assert "scheduler_block_size" in out.stdout


def test_every_public_name_resolves():
    import kvgeom

    missing = [name for name in kvgeom.__all__ if not hasattr(kvgeom, name)]
    assert missing == []
    # functions that share a name with their submodule stay functions
    assert callable(kvgeom.compat) and callable(kvgeom.fingerprint)
    assert callable(kvgeom.resolve_block_sizes)  # loaded lazily on first access
