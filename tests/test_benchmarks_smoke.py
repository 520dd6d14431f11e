"""The benchmark runner works: `python benchmarks/run.py --quick` runs every case (no timing assertions)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_quick_benchmark_runs_every_case(tmp_path):
    out = tmp_path / "bench.json"
    scratch = tmp_path / "tmp"  # the runner's temp folder, to see what it leaves behind
    scratch.mkdir()
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "run.py"), "--quick", "--json", str(out)],
        capture_output=True, text=True, timeout=300, cwd=ROOT, env={**os.environ, "TMPDIR": str(scratch)},
    )
    assert proc.returncode == 0, proc.stderr
    assert list(scratch.iterdir()) == []  # issue 13: every run left a kvgeom-pycache-* directory
    results = json.loads(out.read_text())["results"]
    cases = {r["case"].split(" ")[0] for r in results}
    # every case family of issue 7 is present, each with its ratios against same-run baselines
    assert {"slot_mapping", "key_maps", "plan_stores", "lookup_hits", "scalar", "resolve()", "import",
            "scaling"} <= cases
    assert {"router", "kv"} <= cases  # issue 12: router scoring and KV-event ingest
    slot = [r for r in results if r["case"].startswith("slot_mapping")]
    assert len(slot) == 8 and all(r["speedup_vs_scalar"] > 0 and r["x_floor"] > 0 for r in slot)
    scaling = next(r for r in results if r["case"].startswith("scaling"))
    assert scaling["exponent_from_2_16"] > 0


def test_quick_router_against_dynamo_runs_without_dynamo(tmp_path):
    # issue 23: the side-by-side script runs kvgeom's side (scores, growth bound, hybrids) where Dynamo is absent
    out = tmp_path / "router.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "router_vs_dynamo.py"), "--quick", "--json", str(out)],
        capture_output=True, text=True, timeout=300, cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr
    results = json.loads(out.read_text())
    assert "not importable" in proc.stdout or results["dynamo"]
    assert results["attention_only"][0]["workers"] == 50 and results["attention_only"][0]["kv_p50_us"] > 0
    assert len(results["growth"]) == 4 and all(g["ratio"] <= 8 for g in results["growth"])
    assert [h["case"] for h in results["hybrid"]] == ["attention + Mamba", "attention + sliding window 256",
                                                     "attention (DCP 2, span 32) + Mamba"]
