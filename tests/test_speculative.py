"""Example tables for the ``speculative`` config section: what ``kvgeom.resolve`` decides for a drafter.

The section's schema and refusals, the effective switches (``block_drop``, ``lookahead_hashes``, ``gpu_drop``,
the prefill lookahead P), the eagle groups and proof margins, the drafter checks, the warnings and the CLI text.
Query-time rules that apply a drafter's settings live with their own modules' tables: the prefill split and
the Mamba checkpoint in ``test_prefill.py``, the eagle pop in ``test_hits.py``, the store hold-back in
``test_store_plans.py``, partial tails in ``test_handoff.py``.

The rows marked "(vLLM run)" restate results of running vLLM 0.33 itself on the same deployment.
"""

from __future__ import annotations

import math

import pytest
from _drafter_rows import DRAFT16, FA16, M16, roundtrip, spec

import kvgeom
from kvgeom.prefill import mamba_checkpoint

# ----------------------------------------------------------------------------------- config


def test_no_section_resolves_as_before():
    g = kvgeom.resolve(kvgeom.DEFAULT_CONFIG)
    assert g.speculative is None and g.to_report()["speculative"] is None
    assert not any(x.eagle_group or x.proof_margin for x in g.groups)


@pytest.mark.parametrize(
    ("section", "code", "words"),
    [
        ({"method": "eagle"}, "invalid_value", "num_speculative_tokens must be provided"),  # vLLM: K missing
        (spec(k=0), "invalid_value", "greater than zero"),  # vLLM: K <= 0
        (spec(k=-2), "invalid_value", "greater than zero"),  # negative K
        (spec(method="medusa"), "invalid_choice", "medusa"),  # a method vLLM 0.33 does not have in this schema
        (spec(mtp_modules=0), "out_of_range", "mtp_modules"),  # no MTP module at all
        ({**spec(), "draft_tp": 2}, "unknown_key", "draft_tp"),  # unknown key
    ],
)
def test_bad_speculative_sections(section, code, words):
    with pytest.raises(kvgeom.ConfigError) as e:
        kvgeom.resolve({"groups": [FA16], "speculative": section})
    p = e.value.problems[0]
    assert p.code == code and p.field.startswith("speculative")
    assert words in str(e.value)


@pytest.mark.parametrize(
    ("cfg", "code", "field"),
    [
        # a drafter flag with no drafter configured
        ({"groups": [{**FA16, "drafter": True}]}, "drafter_without_speculative", "groups[0].drafter"),
        # drafters add attention layers only
        ({"groups": [FA16, {**M16, "drafter": True}], "speculative": spec()}, "drafter_mamba_group",
         "groups[1].drafter"),
        # vLLM KVCacheCoordinator: multi-module MTP needs L >= K (L = 2 < K = 3)
        ({"groups": [{"kind": "full_attention", "block_size": 2}],
          "cache": {"prefix_caching": True}, "speculative": spec("mtp", 3, mtp_modules=3, lookahead_hashes=False)},
         "multi_module_mtp_scheduler_block", "speculative.num_speculative_tokens"),
        # vLLM ChunkedLocalAttentionManager asserts when a chunked-local group drops (no flag: all groups drop)
        ({"groups": [FA16, {"kind": "chunked_local", "block_size": 16, "attention_chunk_size": 64}],
          "offload": {}, "speculative": spec()}, "eagle_chunked_local", "groups[1]"),
    ],
)
def test_configurations_vllm_rejects(cfg, code, field):
    with pytest.raises(kvgeom.GeometryError) as e:
        kvgeom.resolve(cfg)
    assert [(p.code, p.field) for p in e.value.problems] == [(code, field)]


def test_multi_module_mtp_without_eagle_group_is_accepted():
    # the same L < K with the drop disabled: no eagle group, so vLLM's coordinator does not check
    cfg = {"groups": [{"kind": "full_attention", "block_size": 2}],
           "speculative": spec("mtp", 3, mtp_modules=3, eagle_block_drop=False)}
    assert kvgeom.resolve(cfg).speculative.prefill_lookahead_tokens == 3


def test_same_schema_for_dict_json_and_toml(tmp_path):
    cfg = kvgeom.load_config({"groups": [FA16, M16, DRAFT16], "speculative": spec("mtp", 3, mtp_modules=2)})
    (tmp_path / "c.toml").write_text(cfg.to_toml())
    import json

    (tmp_path / "c.json").write_text(json.dumps(cfg.to_dict()))
    assert kvgeom.load_config(tmp_path / "c.toml") == cfg == kvgeom.load_config(tmp_path / "c.json")
    from kvgeom.cli import config_schema

    schema = config_schema()
    assert "speculative" in schema["properties"]
    import jsonschema

    jsonschema.validate(cfg.to_dict(), schema)


def test_mamba_speculative_blocks_default_to_k():
    # vLLM run (K = 3): block-table rows of 5 and 6 entries instead of 2 and 3 -> row width grows by K
    base = {"groups": [FA16, M16], "cache": {"max_model_len": 32}}
    plain = kvgeom.resolve(base)
    with_k = kvgeom.resolve({**base, "speculative": spec("eagle", 3)})
    assert with_k.groups[1].row_width == plain.groups[1].row_width + 3 == math.ceil(32 / 16) + 3
    assert with_k.groups[1].spec.num_speculative_blocks == 3
    # an explicit value wins (ReplaySSM uses 0)
    explicit = kvgeom.resolve({**base, "groups": [FA16, {**M16, "num_speculative_blocks": 0}],
                               "speculative": spec("eagle", 3)})
    assert explicit.groups[1].row_width == plain.groups[1].row_width


@pytest.mark.parametrize(
    ("section", "extra"),
    [
        (spec("eagle", 3), 0),  # P = 1: nothing extra retained
        (spec("mtp", 3, mtp_modules=3), 2),  # multi-module MTP: P = K = 3, extra = K - 1
        (spec("mtp", 3, mtp_modules=2), 2),  # min(2, 3) > 1: still multi-module, P = K
        (spec("mtp", 1, mtp_modules=3), 0),  # min(3, 1) = 1: single module
        (spec("ngram", 3), 0),  # not drafting from hidden states: P = 0
        (spec("mtp", 3, mtp_modules=3, eagle_block_drop=False), 2),  # the drop switch keeps P
    ],
)
def test_sliding_window_extra_retained_tokens(section, extra):
    g = kvgeom.resolve({"groups": [{"kind": "sliding_window", "block_size": 16, "sliding_window": 64}],
                        "speculative": section})
    assert g.groups[0].spec.extra_retained_tokens == extra


# ----------------------------------------------------------------------------------- resolve


@pytest.mark.parametrize(
    ("groups", "extra", "section", "flags", "margins", "effective"),
    [
        # default: prefix caching, no connector -> lookahead hashes, no GPU drop; flags stay
        ([FA16, M16, DRAFT16], {}, spec(), [False, False, True], [None, None, None], (True, True, False, 1)),
        # lookahead hashes disabled -> the GPU drops; H = L = 16, margin one span
        ([FA16, M16, DRAFT16], {}, spec(lookahead_hashes=False), [False, False, True], [None, None, 16],
         (True, False, True, 1)),
        # an offload section is a KV connector: legacy hashes, GPU drop; DCP 2 -> span 32, partial hits -> H
        ([FA16, M16, DRAFT16], {"parallel": {"tp": 2, "dcp": 2}, "offload": {}}, spec(),
         [False, False, True], [None, None, 16], (True, False, True, 1)),
        # drafter with the target's spec: one lookup group with the target, both drop (vLLM example 12)
        ([FA16, M16, {**FA16, "drafter": True}], {"offload": {}}, spec(), [False, False, True], [16, None, 16],
         (True, False, True, 1)),
        # no group flagged: the GPU coordinator drops for every group (Mamba never has a margin)
        ([FA16, M16], {"offload": {}}, spec(), [False, False], [16, None], (True, False, True, 1)),
        # prefix caching off: no GPU lookup, so no GPU margin (the connector still flags and pops)
        ([FA16, {**M16, "mamba_cache_mode": "align"}, DRAFT16],
         {"parallel": {"tp": 2, "dcp": 2}, "cache": {"prefix_caching": False}, "offload": {}}, spec(),
         [False, False, True], [None, None, None], (True, False, False, 1)),
        # the drop disabled: no flags, no margins
        ([FA16, M16, DRAFT16], {"offload": {}}, spec(eagle_block_drop=False), [False] * 3, [None] * 3,
         (False, False, False, 1)),
        # dflash drafts from hidden states (P = 1) but never drops
        ([FA16, M16, DRAFT16], {"offload": {}}, spec("dflash"), [False] * 3, [None] * 3, (False, False, False, 1)),
        # ngram: nothing
        ([FA16, M16, DRAFT16], {"offload": {}}, spec("ngram"), [False] * 3, [None] * 3, (False, False, False, 0)),
    ],
)
def test_eagle_groups_and_margins(groups, extra, section, flags, margins, effective):
    g = kvgeom.resolve({"groups": groups, **extra, "speculative": section})
    assert [x.eagle_group for x in g.groups] == flags
    assert [x.proof_margin for x in g.groups] == margins
    s = g.speculative
    assert (s.block_drop, s.lookahead_hashes, s.gpu_drop, s.prefill_lookahead_tokens) == effective
    r = g.to_report()
    assert r["speculative"]["block_drop"] == effective[0] and r["speculative"]["lookahead_hashes"] == effective[1]
    assert [x["proof_margin"] for x in r["groups"]] == margins


def test_fine_grained_margin_under_dcp_2_is_one_hash_unit():
    # span 32 > H 16 with partial hash hits on: the margin is H (vLLM eagle_proof_margin)
    g = kvgeom.resolve({"groups": [FA16, M16, DRAFT16], "parallel": {"tp": 2, "dcp": 2},
                        "speculative": spec(lookahead_hashes=False)})
    assert g.partial_hash_hits and g.groups[2].span == 32 and g.groups[2].proof_margin == 16


def test_offload_eagle_groups_have_no_fallback():
    # the connector flags exactly the drafter groups; none flagged -> none (vLLM #52735)
    flagged = kvgeom.resolve({"groups": [FA16, M16, DRAFT16], "offload": {}, "speculative": spec()})
    unflagged = kvgeom.resolve({"groups": [FA16, M16], "offload": {}, "speculative": spec()})
    assert [og.eagle_group for og in flagged.offload.groups] == [False, False, True]
    assert [og.eagle_group for og in unflagged.offload.groups] == [False, False]


def test_offload_partial_tail_margin():
    # one span 32, H 8, DCP 1, k 1: partial tails on; the eagle attention group keys its tail at b + 8
    g = kvgeom.resolve({"groups": [{"kind": "full_attention", "block_size": 32, "drafter": True},
                                   {"kind": "mamba", "block_size": 32}],
                        "cache": {"prefix_match_unit": 8}, "offload": {}, "speculative": spec()})
    assert g.offload.supports_partial_tail
    assert [og.proof_margin for og in g.offload.groups] == [8, None]
    assert [og["proof_margin"] for og in g.to_report()["offload"]["groups"]] == [8, None]


# ----------------------------------------------------------------------------------- warnings


def codes(geom):
    return {w.code: w.message for w in geom.warnings}


@pytest.mark.parametrize(
    ("groups", "dcp", "k", "A", "C", "why"),
    [
        # DCP 2: H = gcd(32, 16, 32) = 16, Mamba 16 >= H under DCP -> partial hits, A = 16; C = 16 * 2 * 1
        ([FA16, M16, DRAFT16], 2, 1, 16, 32, "dcp=2"),
        # k = 2: H = 16, no partial hits (Mamba 16 is not > H), A = L = 16; C = 16 * 2
        ([FA16, M16, DRAFT16], 1, 2, 16, 32, "blocks_per_chunk=2"),
        # Mamba block wider than A: H = 16, Mamba 32 > H -> A = 16; the Mamba chunk 32 does not divide 16
        ([FA16, {"kind": "mamba", "block_size": 32}, DRAFT16], 1, 1, 16, 16, "Mamba chunk 32"),
    ],
)
def test_pop_vs_mamba_shift_warning(groups, dcp, k, A, C, why):
    cfg = {"groups": groups, "parallel": {"tp": dcp, "dcp": dcp}, "offload": {"blocks_per_chunk": k},
           "speculative": spec()}
    g = kvgeom.resolve(cfg)
    msg = codes(g)["speculative_pop_vs_mamba_shift"]
    assert f"A={A} " in msg and f"C={C} " in msg and why in msg
    # and the hazard is real: some prompt whose checkpoint is at least a chunk resends to a hit of 0
    lost = [p for p in range(1, 200) if roundtrip(g, p).end_token == 0 and mamba_checkpoint(g, p).position >= C]
    assert lost


def test_no_pop_warning_when_chunks_match():
    g = kvgeom.resolve({"groups": [FA16, M16, DRAFT16], "offload": {}, "speculative": spec()})
    assert "speculative_pop_vs_mamba_shift" not in codes(g)


def test_sliding_drafter_offload_warning():
    # window 40, block 16, k 1: the window needs max(cdiv(40, 16), cdiv(40 - 1 + 0, 16)) = 3 chunks, plus the pop
    sw = {"kind": "sliding_window", "block_size": 16, "sliding_window": 40, "drafter": True}
    g = kvgeom.resolve({"groups": [FA16, M16, sw], "offload": {}, "speculative": spec()})
    need = max(-(-40 // 16), -(-(40 - 1) // 16)) + 1
    msg = codes(g)["speculative_sliding_drafter_offload"]
    # the kept window stops reaching token 0 at need * C + the connector alignment (the attention chunk 16)
    start = need * 16 + 16
    assert f"needs {need} consecutive chunks of 16 tokens" in msg and f"prompt of {start} tokens or more" in msg
    # and the hazard is real: from there on a stored prompt's resend (or a longer request sharing it) never
    # hits unless the prompt reaches the chunk past its aligned replay boundary (n - rdown(n - 1, 16) < 16:
    # every length but the multiples of 16; vLLM 0.33 keeps that chunk, issue 19); shorter prompts can hit
    # through a run that reaches the start of the scan
    assert "n - rdown(n - 1, 16) < 16" in msg
    short = [p for p in range(start, 400) if p - (p - 1) // 16 * 16 < 16]
    assert all(roundtrip(g, p).end_token == 0 and roundtrip(g, p, p + 50).end_token == 0 for p in short)
    assert any(roundtrip(g, p).end_token for p in range(1, start))
    # not flagged -> not an eagle group -> no warning
    plain = kvgeom.resolve({"groups": [FA16, M16, {**sw, "drafter": False}], "offload": {}, "speculative": spec()})
    assert "speculative_sliding_drafter_offload" not in codes(plain)
    # dense retention stores every block: the window plus one is there, no warning
    dense = kvgeom.resolve({"groups": [FA16, M16, sw], "offload": {}, "cache": {"retention_interval": None},
                            "speculative": spec()})
    assert "speculative_sliding_drafter_offload" not in codes(dense) and roundtrip(dense, 200).end_token == 176


def _stalls(n, block, P):
    """vLLM's scheduler loop for one prompt, restated: the Mamba split ends a chunk at the checkpoint
    rdown(n - 1, block) (no drop, legacy hashes), and the lookahead reserve never ends a chunk within P of the
    prefill end. True when a step schedules nothing before the prompt is done."""
    computed = 0
    for _ in range(4 * n + 4):
        if computed >= n:
            return False
        end = n
        checkpoint = (n - 1) // block * block
        if computed < checkpoint < end:
            end = checkpoint
        if end < n and end > n - P:
            end = n - P
        if end <= computed:
            return True
        computed = end
    raise AssertionError("no progress")


def test_mtp_prefill_stall_warning():
    cfg = {"groups": [FA16, M16], "speculative": spec("mtp", 3, mtp_modules=3, eagle_block_drop=False)}
    msg = codes(kvgeom.resolve(cfg))["speculative_mtp_prefill_stall"]
    stalled = [n for n in range(1, 200) if _stalls(n, 16, 3)]
    assert 50 in stalled  # vLLM run: prompt 50, block 16, K = 3 never finishes
    # the warning's numbers: P = 3, the first stalling length U + 1 = 17, P - 1 = 2 of every U = 16 lengths
    assert "P=3" in msg and "n = 17" in msg and "2 of every 16" in msg
    assert stalled[0] == 17 and all(sum(1 for n in stalled if lo < n <= lo + 16) == 2 for lo in range(16, 176, 16))
    # with the drop, or with lookahead hashes, there is no warning
    assert "speculative_mtp_prefill_stall" not in codes(kvgeom.resolve({**cfg, "speculative": spec("mtp", 3,
                                                                                                  mtp_modules=3)}))


# ----------------------------------------------------------------------------------- CLI


def test_explain_shows_the_drafter_lane_and_margins_and_check_reports_the_hazard(capsys, tmp_path):
    import json

    from kvgeom.cli import main

    path = tmp_path / "c.json"
    path.write_text(json.dumps({"groups": [FA16, M16, DRAFT16], "parallel": {"tp": 2, "dcp": 2}, "offload": {},
                                "speculative": spec()}))
    assert main(["explain", str(path)]) == 0
    out = capsys.readouterr().out
    assert "group 2 (full_attention): drafter lane; eagle group; GPU lookup matches 16 tokens" in out
    assert "queries one extra chunk of 32 and pops it" in out
    assert main(["check", str(path)]) == 0
    assert "[speculative_pop_vs_mamba_shift]" in capsys.readouterr().out
    assert main(["check", "--strict", str(path)]) == 1
