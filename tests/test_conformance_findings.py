"""Conformance checker pieces that run without vLLM: comparison, classification, reproducers, the
Hypothesis runner against stand-in engines, engine loading and the CLI exit codes."""

from __future__ import annotations

import importlib.util
import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

import kvgeom
from kvgeom.cli import main
from kvgeom.conformance import (
    QUESTIONS,
    RULES,
    Difference,
    EngineError,
    Finding,
    classify,
    compare,
    kvgeom_answers,
    load_engine,
    tier_contents,
    version_warning,
)
from kvgeom.conformance.answers import check_scenario
from kvgeom.conformance.run import run
from kvgeom.deviations import DEVIATIONS

HAS_VLLM = importlib.util.find_spec("vllm") is not None
FA16_M24 = {"groups": [{"kind": "full_attention", "block_size": 16},
                       {"kind": "mamba", "block_size": 24, "mamba_cache_mode": "align"}], "offload": {}}


def _sheet(**kw):
    base = {"valid": True, "hit_tokens": 48, "end_token": 48, "offload.mamba_align_size": 24,
            "offload.groups": [[0, 16, 16, 2, None], [1, 24, 24, 3, 1]]}
    return {**base, **kw}


# --------------------------------------------------------------------------- compare


def test_identical_sheets_have_no_difference():
    s = kvgeom_answers(kvgeom.resolve(FA16_M24), {"num_tokens": 80, "stored_tokens": 73})
    assert compare(s, dict(s)) == []


def test_differences_come_in_question_order():
    ours = _sheet()
    engine = _sheet(end_token=64, hit_tokens=64)
    assert [d.question for d in compare(engine, ours)] == ["hit_tokens", "end_token"]
    assert QUESTIONS.index("hit_tokens") < QUESTIONS.index("end_token")


def test_a_rejected_geometry_is_compared_on_validity_only():
    assert compare({"valid": False, "error": "x"}, _sheet()) == [Difference("valid", False, True)]


def test_a_connector_crash_is_always_a_difference():
    diffs = compare(_sheet(lookup_error="AssertionError"), _sheet())
    assert [d.question for d in diffs] == ["lookup_error"]
    assert classify(diffs, _sheet(lookup_error="AssertionError"), _sheet()) is None


# --------------------------------------------------------------------------- classify


@pytest.mark.parametrize(
    ("engine", "ours", "expected"),
    [
        # vLLM 0.33 worked example: FA 16 + Mamba 24, store 73, look up 80 -> 64, off the Mamba grid
        (_sheet(hit_tokens=64, end_token=64, mamba_state_after={"1": 72}),
         _sheet(mamba_state_after={"1": 48}), "realign-after-clamp"),
        # a windowed group lowered the hit below one attention chunk (32) after the attention check
        (_sheet(hit_tokens=24, end_token=24, **{"offload.mamba_align_size": 12,
                                                "offload.groups": [[0, 16, 32, 8, None], [1, 6, 12, 3, 1]]}),
         _sheet(hit_tokens=0, end_token=0, **{"offload.mamba_align_size": 12,
                                              "offload.groups": [[0, 16, 32, 8, None], [1, 6, 12, 3, 1]]}),
         "realign-after-clamp"),
        # engine's hit on the Mamba grid and at least one attention chunk: not this deviation
        (_sheet(hit_tokens=72, end_token=72), _sheet(), None),
        # engine's hit SHORTER than kvgeom's: never explained by re-aligning (kvgeom only lowers hits)
        (_sheet(hit_tokens=40, end_token=40), _sheet(), None),
        # no Mamba group: nothing to re-align
        (_sheet(hit_tokens=64, end_token=64, **{"offload.mamba_align_size": None}), _sheet(), None),
        # a key difference next to the hit difference: the deviation does not explain keys
        (_sheet(hit_tokens=64, end_token=64, keys={"0": [[16, 1]]}), _sheet(keys={"0": [[16, 0]]}), None),
    ],
)
def test_realign_rule(engine, ours, expected):
    assert classify(compare(engine, ours), engine, ours) == expected


def test_interleave_rejection_is_the_documented_deviation():
    engine = {"valid": False, "error": "VllmConfig.validate_block_size: AssertionError: Block_size(1) should be "
              "greater than or equal to and divisible by cp_kv_cache_interleave_size (2)."}
    assert classify(compare(engine, _sheet()), engine, _sheet()) == "interleave-per-sharded-group"


def test_other_rejections_are_new_findings():
    engine = {"valid": False, "error": "resolve_kv_cache_block_sizes: ValueError: Invalid prefix_match_unit=8"}
    assert classify(compare(engine, _sheet()), engine, _sheet()) is None


def test_every_rule_names_a_registered_deviation():
    assert set(RULES) <= set(DEVIATIONS)


# --------------------------------------------------------------------------- tier and findings


def test_tier_holds_chunks_up_to_stored_tokens_minus_evicted():
    g = kvgeom.resolve(FA16_M24)
    # FA keys 16..64 (73 // 16 = 4), Mamba keys 24, 48, 72; evict the second FA key (32)
    assert tier_contents(g, {"num_tokens": 80, "stored_tokens": 73, "evict": [False, True]}) == {
        0: [16, 48, 64], 1: [24, 48, 72]}


def _finding(dev=None):
    return Finding(FA16_M24, {"num_tokens": 80, "stored_tokens": 73, "local_computed_tokens": 0, "evict": []},
                   (Difference("hit_tokens", 64, 48), Difference("mamba_state_after", {"1": 72}, {"1": 48})),
                   dev, "vllm", "0.33.0")


def test_reproducer_rebuilds_the_same_geometry_and_scenario():
    code = _finding().reproducer()
    namespace: dict = {}
    # run the snippet up to the engine call, without the vLLM import (vLLM may be missing here)
    head = code.split("engine, ours =")[0]
    exec("\n".join(x for x in head.splitlines() if "vllm_engine" not in x), namespace)
    assert namespace["config"] == FA16_M24
    assert namespace["scenario"]["stored_tokens"] == 73
    assert namespace["geom"] == kvgeom.resolve(FA16_M24)
    assert "['hit_tokens', 'mamba_state_after']" in code


def test_finding_json_round_trips_and_names_the_deviation():
    d = json.loads(json.dumps(_finding("realign-after-clamp").to_dict()))
    assert d["new"] is False and d["deviation"] == "realign-after-clamp"
    assert d["differences"][0] == {"question": "hit_tokens", "engine": 64, "kvgeom": 48}
    assert "realign-after-clamp" in _finding("realign-after-clamp").render()
    assert _finding().render().startswith("NEW FINDING")


# --------------------------------------------------------------------------- the runner, stand-in engines


def test_an_engine_that_agrees_yields_nothing():
    r = run(examples=40, seed=1, answer=kvgeom_answers, engine="kvgeom")
    assert r.findings == [] and not r.deviations and r.exit_code == 0
    assert r.cases_checked > 10


def _off_by_one(geom, scenario):
    sheet = kvgeom_answers(geom, scenario)
    if sheet.get("hit_tokens"):
        sheet["hit_tokens"] += 1
    return sheet


def test_a_new_finding_is_shrunk_to_the_smallest_case():
    r = run(examples=200, seed=3, answer=_off_by_one, engine="planted")
    assert r.exit_code == 1
    [f] = r.new_findings
    assert [d.question for d in f.differences] == ["hit_tokens"]
    # shrunk to the smallest case with a hit: blocks of 1, no parallelism, the shortest request that hits
    # (1 token, or 2 with a Mamba group: the last token is always recomputed), fully stored, nothing evicted,
    # the GPU cache holding the whole chain in every group
    assert {g["block_size"] for g in f.config["groups"]} == {1}
    assert f.config["parallel"] == {"dcp": 1, "tp": 1} and f.config.get("offload") == {}
    shortest = 2 if any(g["kind"] == "mamba" for g in f.config["groups"]) else 1
    whole = {str(i): list(range(1, shortest + 1)) for i in range(len(f.config["groups"]))}
    assert f.scenario == {"num_tokens": shortest, "stored_tokens": shortest, "local_computed_tokens": 0,
                          "evict": [], "gpu_resident": whole}


def _interleave_strict(geom, scenario):
    if geom.config.parallel.dcp > 1:
        return {"valid": False, "error": "cp_kv_cache_interleave_size (planted)"}
    return kvgeom_answers(geom, scenario)


def test_documented_deviations_pass_by_default_and_fail_under_strict():
    lenient = run(examples=80, seed=2, answer=_interleave_strict, engine="planted")
    assert lenient.exit_code == 0 and lenient.deviations["interleave-per-sharded-group"] > 0
    strict = run(examples=80, seed=2, answer=_interleave_strict, engine="planted", strict=True)
    assert strict.exit_code == 1
    [f] = strict.findings
    assert f.deviation == "interleave-per-sharded-group" and f.config["parallel"]["dcp"] == 2


def test_runs_are_reproducible():
    a = run(examples=60, seed=5, answer=_off_by_one, engine="planted").to_dict()
    b = run(examples=60, seed=5, answer=_off_by_one, engine="planted").to_dict()
    assert a == b


@pytest.mark.parametrize("kwargs", [{"examples": 0}, {"examples": "10"}, {"seed": -1}])
def test_bad_run_arguments_are_query_errors(kwargs):
    with pytest.raises(kvgeom.QueryError):
        run(answer=kvgeom_answers, **kwargs)


# --------------------------------------------------------------------------- engines and the command


def test_version_warning_names_the_version():
    assert version_warning("vllm", "0.33.2") is None
    assert "0.32.0" in (version_warning("vllm", "0.32.0") or "")
    assert version_warning("vllm", "0.330.0") is not None


def test_unknown_engine_is_an_engine_error():
    with pytest.raises(EngineError) as e:
        load_engine("sglang")
    assert e.value.code == "unknown_engine"


def test_cli_exit_2_for_an_unknown_engine():
    err = io.StringIO()
    sys_err, sys.stderr = sys.stderr, err
    try:
        assert main(["conform", "--engine", "tensorrt-llm"]) == 2
    finally:
        sys.stderr = sys_err
    assert "unknown_engine" in err.getvalue()


@pytest.mark.skipif(HAS_VLLM, reason="vLLM is installed here; this checks the message without it")
def test_cli_exit_2_without_vllm():
    out = subprocess.run([sys.executable, "-m", "kvgeom", "conform"], capture_output=True, text=True)
    assert out.returncode == 2
    assert "engine_not_installed" in out.stderr


@pytest.mark.parametrize(
    "bad",
    [
        None,  # not a mapping
        {},  # no num_tokens
        {"num_tokens": -1},  # negative
        {"num_tokens": 4, "local_computed_tokens": 5},  # local prefix past the request
        {"num_tokens": 4, "evict": "yes"},  # evict is not a list of booleans
        {"num_tokens": 4, "stored": {}},  # unknown key
    ],
)
def test_bad_scenarios_are_query_errors(bad):
    with pytest.raises(kvgeom.QueryError):
        check_scenario(bad)


def test_conform_says_an_unchecked_engine_version_once(monkeypatch, capsys):
    # command.py printed "warning: ..." and load_engine's EngineVersionWarning was shown too: twice
    import warnings

    from kvgeom.adapters.vllm import EngineVersionWarning
    from kvgeom.conformance import engines
    from kvgeom.conformance.engines import Engine

    text = version_warning("vllm", "0.34.0")
    assert text is not None

    def answer(geom, scenario):
        warnings.warn(text, EngineVersionWarning, stacklevel=2)  # as geometry_from_vllm does on vLLM 0.34
        return kvgeom_answers(geom, scenario)

    def load(name="vllm"):
        warnings.warn(text, EngineVersionWarning, stacklevel=2)
        return Engine("vllm", "0.34.0", text, answer)

    monkeypatch.setattr(engines, "load_engine", load)
    with warnings.catch_warnings(record=True) as shown:
        warnings.simplefilter("always")
        assert main(["conform", "--examples", "2"]) == 0
    out, err = capsys.readouterr()
    assert [w for w in shown if issubclass(w.category, EngineVersionWarning)] == []
    assert (out + err).count(text) == 2  # the warning: line, and the report's record of it
    assert err == f"warning: {text}\n"


def test_conform_hint_points_at_the_cpu_install_script():
    from kvgeom.conformance.command import INSTALL_HINT

    assert "scripts/install-vllm-cpu.sh" in INSTALL_HINT and "pip install" not in INSTALL_HINT
    source = (Path(__file__).resolve().parents[1] / "kvgeom" / "conformance" / "command.py").read_text()
    assert "kvgeom[vllm]" not in source
