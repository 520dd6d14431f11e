"""A small conformance pass against an installed vLLM 0.33 (marked ``vllm``).

Runs in the vLLM venv that ``scripts/install-vllm-cpu.sh`` builds (``.ci/run`` does it); everywhere
else every test here is skipped with the reason. The unit tests of the classifier, the reproducers and
the runner, which need no vLLM, are in ``tests/test_conformance_findings.py``.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from _vllm import NEEDS_VLLM

import kvgeom

pytestmark = NEEDS_VLLM

FA16_M24 = {"groups": [{"kind": "full_attention", "block_size": 16},
                       {"kind": "mamba", "block_size": 24, "mamba_cache_mode": "align"}], "offload": {}}


@pytest.fixture(scope="module")
def vllm_answers():
    from kvgeom.conformance.engines import load_engine

    engine = load_engine("vllm")
    assert engine.warning is None, engine.warning
    return engine.answer


def test_worked_example_vllm_restores_a_later_state(vllm_answers):
    # FA 16 + Mamba 24: store 73 tokens, look up 80. vLLM: hit 64, loads the Mamba key ending at 72.
    from kvgeom.conformance import classify, compare, kvgeom_answers

    g = kvgeom.resolve(FA16_M24)
    scenario = {"num_tokens": 80, "stored_tokens": 73, "local_computed_tokens": 0, "evict": []}
    engine, ours = vllm_answers(g, scenario), kvgeom_answers(g, scenario)
    assert (engine["hit_tokens"], engine["mamba_state_after"]) == (64, {"1": 72})
    assert (ours["hit_tokens"], ours["mamba_state_after"]) == (48, {"1": 48})
    diffs = compare(engine, ours)
    assert {d.question for d in diffs} == {"hit_tokens", "end_token", "load", "mamba_state_after"}
    assert classify(diffs, engine, ours) == "realign-after-clamp"


@pytest.mark.parametrize(
    "config",
    [
        kvgeom.DEFAULT_CONFIG,  # FA 16 + Mamba 16 under TP 2 / DCP 2 (vLLM #49964's geometry)
        FA16_M24,  # chunks that do not divide each other
        {"groups": [{"kind": "full_attention", "block_size": 16},  # sliding window beside full attention
                    {"kind": "sliding_window", "block_size": 16, "sliding_window": 33}], "offload": {}},
        {"groups": [{"kind": "mla", "block_size": 64}], "parallel": {"dcp": 4, "tp": 4},  # MLA under DCP
         "offload": {"blocks_per_chunk": 2}},
    ],
)
def test_geometry_and_keys_agree(vllm_answers, config):
    from kvgeom.conformance import compare, kvgeom_answers

    g = kvgeom.resolve(config)
    for n in (0, 1, g.scheduler_block_size, 3 * g.scheduler_block_size + 1):
        scenario = {"num_tokens": n, "stored_tokens": 0, "local_computed_tokens": 0, "evict": []}
        assert compare(vllm_answers(g, scenario), kvgeom_answers(g, scenario)) == []


def test_default_run_finds_and_classifies_the_realignment_hazard(vllm_answers):
    from kvgeom.conformance.run import run

    report = run(answer=vllm_answers, engine_version="0.33.0")
    assert report.exit_code == 0, report.render()
    assert report.new_findings == []
    assert report.deviations["realign-after-clamp"] > 0


def test_strict_run_shrinks_the_realignment_hazard(vllm_answers):
    from kvgeom.conformance.run import run

    report = run(answer=vllm_answers, engine_version="0.33.0", strict=True)
    assert report.exit_code == 1
    [f] = [f for f in report.findings if f.deviation == "realign-after-clamp"]
    kinds = [g["kind"] for g in f.config["groups"]]
    assert kinds == ["full_attention", "mamba"]
    # shrunk: small blocks, no parallelism, a short request; the hit ends off the Mamba grid or below
    # one attention chunk, and the state restored is not the state after the hit's end
    assert all(g["block_size"] <= 8 for g in f.config["groups"])
    assert f.config["parallel"] == {"dcp": 1, "tp": 1}
    assert f.scenario["num_tokens"] <= 24
    by_q = {d.question: d for d in f.differences}
    assert by_q["mamba_state_after"].engine != {"1": by_q["end_token"].engine}


def test_cli_json_report():
    out = subprocess.run([sys.executable, "-m", "kvgeom", "conform", "--examples", "40", "--json"],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["engine"] == "vllm" and report["engine_version"].startswith("0.33.")
    assert report["exit_code"] == 0 and report["findings"] == []


# ---------------------------------------------------------------- GPU prefix-cache hit (the coordinator)

_FA16_M16 = {"groups": [{"kind": "full_attention", "block_size": 16}, {"kind": "mamba", "block_size": 16}]}
_FA16_SW33 = {"groups": [{"kind": "full_attention", "block_size": 16},
                         {"kind": "sliding_window", "block_size": 16, "sliding_window": 33}]}
_DRAFTER = {"groups": [{"kind": "full_attention", "block_size": 16, "drafter": True},
                       {"kind": "mamba", "block_size": 16}],
            "speculative": {"method": "eagle", "num_speculative_tokens": 2, "lookahead_hashes": False}}


@pytest.mark.parametrize(
    "config, n, resident, hit",
    [
        # vLLM #46453's shape: Mamba holds 16 and 64, attention 16 and 32: the hit is the Mamba state at 16
        (_FA16_M16, 70, {"0": [16, 32], "1": [16, 64]}, 16),
        # DCP 2 (attention span 32, H = A = 16): a partial hash hit at 80 on both groups
        (kvgeom.DEFAULT_CONFIG, 100, {"0": [32, 64, 80], "1": [16, 48, 80]}, 80),
        # sliding window 33 needs 3 contiguous blocks ending on the hit: 96 (blocks 64, 80, 96)
        (_FA16_SW33, 130, {"0": [16, 32, 48, 64, 80, 96, 112, 128], "1": [16, 48, 64, 80, 96, 112]}, 112),
        # EAGLE drafter on attention: the drop takes the volatile block off the hit
        (_DRAFTER, 100, {"0": [16, 32, 48, 64, 80, 96], "1": [16, 32, 48, 64, 80, 96]}, 80),
    ],
)
def test_prefix_hit_agrees_with_the_coordinator(vllm_answers, config, n, resident, hit):
    from kvgeom.conformance import compare, kvgeom_answers

    g = kvgeom.resolve(config)
    scenario = {"num_tokens": n, "gpu_resident": resident}
    engine, ours = vllm_answers(g, scenario), kvgeom_answers(g, scenario)
    assert engine["prefix.hit_tokens"] == ours["prefix.hit_tokens"] == hit
    assert compare(engine, ours) == []


def test_declined_prefix_lookup_is_one_vllm_cannot_do(vllm_answers):
    # chunked local (span 47) beside DCP-2 full attention (span 94): vLLM's chunked-local manager
    # asserts even for an empty request; kvgeom declines; nothing is compared
    from kvgeom.conformance import compare, kvgeom_answers

    g = kvgeom.resolve({
        "groups": [{"kind": "chunked_local", "block_size": 47, "dcp_sharded": False, "attention_chunk_size": 731},
                   {"kind": "full_attention", "block_size": 47}],
        "parallel": {"dcp": 2, "tp": 2},
    })
    for n in (0, 200):
        scenario = {"num_tokens": n, "gpu_resident": {"0": [], "1": []}}
        engine, ours = vllm_answers(g, scenario), kvgeom_answers(g, scenario)
        assert "AssertionError" in engine["prefix.error"]
        assert ours["prefix.declined"] == "chunked_local_span_not_alignment"
        assert compare(engine, ours) == []


def test_prefix_question_has_teeth(vllm_answers, monkeypatch):
    # Reintroduce vLLM #45614 in kvgeom (a drafter group queried only up to the candidate, so the
    # drop lands one block short): the coordinator's answer exposes it on the shrunk case of a run.
    import kvgeom.prefix
    from kvgeom.conformance import compare, kvgeom_answers

    g = kvgeom.resolve({"groups": [{"kind": "full_attention", "block_size": 1, "drafter": True},
                                   {"kind": "full_attention", "block_size": 1}],
                        "speculative": {"method": "eagle", "num_speculative_tokens": 1, "lookahead_hashes": False}})
    scenario = {"num_tokens": 2, "gpu_resident": {"0": [1, 2], "1": [1, 2]}}
    assert compare(vllm_answers(g, scenario), kvgeom_answers(g, scenario)) == []
    monkeypatch.setattr(kvgeom.prefix, "_query_limit", lambda candidate, margin, drop, chain: candidate)
    diffs = compare(vllm_answers(g, scenario), kvgeom_answers(g, scenario))
    assert (diffs[0].question, diffs[0].engine, diffs[0].kvgeom) == ("prefix.hit_tokens", 1, 0)


def test_vllm_answers_invalid_where_a_block_holds_no_compressed_state(vllm_answers):
    # kvgeom refuses it (block_smaller_than_state), so only a geometry forced past resolve reaches the harness:
    # vLLM's planning divides by the 0-byte page, so its sheet must say invalid, or a kvgeom that accepted the
    # config again would pass conformance unseen
    import dataclasses

    from kvgeom.conformance import compare, kvgeom_answers

    cfg = {"groups": [{"kind": "full_attention", "block_size": 2, "tokens_per_state": 2}],
           "parallel": {"tp": 2, "dcp": 2}}
    geom = kvgeom.resolve(cfg)
    g = geom.groups[0]
    forced = dataclasses.replace(
        geom, groups=(dataclasses.replace(g, spec=g.spec.model_copy(update={"block_size": 1}), block_size=1, span=2),))
    scenario = {"num_tokens": 8, "stored_tokens": 0, "local_computed_tokens": 0, "evict": []}
    engine = vllm_answers(forced, scenario)
    assert engine["valid"] is False
    assert "1-token block holds no state at tokens_per_state 2" in engine["error"]
    assert [d.question for d in compare(engine, kvgeom_answers(forced, scenario))] == ["valid"]
    assert vllm_answers(geom, scenario)["valid"] is True  # one state per block: vLLM plans it
