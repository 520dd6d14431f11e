"""Every deliberate difference from vLLM 0.33 is on docs/deviations.md and has a test here asserting
kvgeom's answer on the page's reproducer (vLLM's answer is stated on the page; it was obtained by running
vLLM 0.33's own code on the same geometry)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import kvgeom
from kvgeom.deviations import DEVIATIONS, deviation
from kvgeom.errors import GeometryError, ParallelismError
from kvgeom.hits import lookup_hit, plan_store
from kvgeom.resolution import resolve_block_sizes

PAGE = Path(__file__).resolve().parent.parent / "docs" / "deviations.md"


def test_page_and_registry_name_the_same_ids():
    headings = re.findall(r"^## (\S+)\s*$", PAGE.read_text(encoding="utf-8"), flags=re.M)
    assert headings == list(DEVIATIONS)


def test_every_deviation_has_a_test_here():
    names = {name for name in globals() if name.startswith("test_")}
    for id in DEVIATIONS:
        assert f"test_{id.replace('-', '_')}" in names, id


def test_unknown_id_names_the_known_ones():
    with pytest.raises(KeyError, match="realign-after-clamp"):
        deviation("no-such-id")


def test_realign_after_clamp():
    # FA 16 + Mamba 24: a 73-token prompt stores attention 16..64 and the Mamba key at 72; a lookup of 80
    # clamps to 64 on the attention chunks, re-aligns to the Mamba chunk (48): no Mamba key there -> 0
    # (vLLM hits 64 and loads the state after token 72)
    g = kvgeom.resolve({"groups": [{"kind": "full_attention", "block_size": 16},
                                   {"kind": "mamba", "block_size": 24}], "offload": {}})
    tier = {s.index: list(s.end_tokens) for s in plan_store(g, num_tokens=73, num_computed_tokens=73).groups}
    assert tier == {0: [16, 32, 48, 64], 1: [72]}
    assert lookup_hit(g, 80, stored=tier).hit_tokens == 0


def test_interleave_per_sharded_group():
    # only the 32-token attention group is dealt: I = 32 fits (vLLM rejects it against the Mamba block 16)
    ok = kvgeom.resolve({"groups": [{"kind": "full_attention", "block_size": 32}, {"kind": "mamba", "block_size": 16}],
                         "parallel": {"tp": 2, "dcp": 2, "cp_interleave": 32}})
    assert ok.groups[0].span == 64
    # a 48-token dealt group does not hold whole 32-token runs (vLLM accepts it)
    with pytest.raises(ParallelismError) as info:
        kvgeom.resolve({"groups": [{"kind": "full_attention", "block_size": 32},
                                   {"kind": "full_attention", "block_size": 48}],
                        "parallel": {"tp": 2, "dcp": 2, "cp_interleave": 32}})
    assert [(p.code, p.field) for p in info.value.problems] == [("interleave_mismatch", "parallel.cp_interleave")]
    assert "48" in info.value.problems[0].message


def test_swa_mask_own_span():
    # replicated SWA 16 next to FA 16 at DCP 2: alignment 32 = two SWA blocks, the window needs one
    # (vLLM's 32-token grid makes the mask dense and stores every chunk)
    g = kvgeom.resolve({"groups": [{"kind": "full_attention", "block_size": 16},
                                   {"kind": "sliding_window", "block_size": 16, "sliding_window": 16,
                                    "dcp_sharded": False}],
                        "parallel": {"tp": 2, "dcp": 2}, "cache": {"retention_interval": None}, "offload": {}})
    plan = plan_store(g, num_tokens=100, num_computed_tokens=100)
    assert plan.groups[1].end_tokens == (32, 64, 96)


def test_dcp_sharded_windowed_rejected():
    # one DCP-sharded circular buffer: vLLM accepts it (no hybrid coordinator); kvgeom rejects with the fix
    with pytest.raises(ParallelismError) as info:
        kvgeom.resolve({"groups": [{"kind": "circular_buffer", "block_size": 16, "dcp_sharded": True}],
                        "parallel": {"tp": 2, "dcp": 2}})
    (p,) = info.value.problems
    assert (p.code, p.field) == ("sharded_kind_under_dcp", "groups[0].dcp_sharded")
    assert "dcp_sharded=false" in p.message


def test_mamba_all_mode():
    # vLLM 0.33 rejects 'all'; kvgeom resolves it with H = L and a warning
    g = kvgeom.resolve({"groups": [{"kind": "full_attention", "block_size": 16},
                                   {"kind": "mamba", "block_size": 16, "mamba_cache_mode": "all"}]})
    assert g.hash_block_size == g.scheduler_block_size == 16
    assert "mamba_mode_all_legacy" in [w.code for w in g.warnings]


def test_sink_attention():
    # vLLM 0.33 raises TypeError building the sink manager; kvgeom resolves it as full attention
    g = kvgeom.resolve({"groups": [{"kind": "sink_full_attention", "block_size": 16, "sink_len": 32}]})
    assert (g.scheduler_block_size, g.hash_block_size, g.groups[0].family) == (16, 16, "full")
    # sink_len 16 under DCP 2: the span is 32, so the sink does not cover whole blocks
    with pytest.raises(GeometryError) as info:
        kvgeom.resolve({"groups": [{"kind": "sink_full_attention", "block_size": 16, "sink_len": 16}],
                        "parallel": {"tp": 2, "dcp": 2}})
    (p,) = info.value.problems
    assert p.code == "sink_len_not_multiple_of_span" and "32" in p.message


def test_chunked_local_mixed_blocks():
    # vLLM 0.33 asserts at the first prefix-cache lookup (block 16 != hit alignment 32); kvgeom resolves it
    g = kvgeom.resolve({"groups": [{"kind": "full_attention", "block_size": 32},
                                   {"kind": "chunked_local", "block_size": 16, "attention_chunk_size": 64}],
                        "offload": {}})
    assert (g.scheduler_block_size, g.hash_block_size, g.hit_alignment_tokens) == (32, 16, 32)
    assert "chunked_local_block_mismatch" in [w.code for w in g.warnings]
    assert g.offload is not None and g.offload.group(1).window_chunks == 64 // 16


def test_packed_bucket_unbalanced():
    # vLLM 0.33 (run, tests/test_grouping_conformance.py): under BLHNC the sliding bucket of 4 + 2 layers of two
    # pages is zipped into (s0, t0), (s1, t1) and s2, s3 get no group; kvgeom refuses the config
    def attn(count, heads, **kw):
        return {"kind": kw.pop("kind", "sliding_window"), "num_kv_heads": heads, "head_size": 128,
                "dtype": "bfloat16", "count": count, **kw}

    layers = [attn(1, 1, kind="full_attention"), attn(4, 2, sliding_window=64), attn(2, 4, sliding_window=64)]
    with pytest.raises(GeometryError) as e:
        resolve_block_sizes({"model": {"block_size": 16, "kv_cache_layout": "BLHNC", "layers": layers}})
    assert (e.value.problems[0].code, e.value.problems[0].field) == ("packed_bucket_unbalanced",
                                                                     "model.kv_cache_layout")
    # the same model under the default layout is grouped (pages unified), not refused
    assert resolve_block_sizes({"model": {"block_size": 16, "layers": layers}}).group_layers


def test_lookahead_past_unitary_window():
    # vLLM 0.33 (run): IndexError on the first schedule (the unitary coordinator's Mamba scan reads past the
    # (n - P) // H hashes); kvgeom resolves and reads the hit from the hashes the request has
    g = kvgeom.resolve({"groups": [{"kind": "mamba", "block_size": 2}],
                        "speculative": {"method": "mtp", "num_speculative_tokens": 3, "mtp_modules": 3}})
    assert (g.hash_lookahead_tokens, g.hash_block_size) == (3, 2)
    assert kvgeom.prefix_hit(g, 40, {"0": [36, 38]}).hit_tokens == 36  # 38 needs a hash the request lacks


# (config, n, vLLM 0.33's hit or None where its coordinator raises IndexError; kvgeom.conformance.vllm_prefix,
# run): not only a block below P. Mamba 16 with P = 3 crashes where floor((n-1)/16)*16 passes the hashed
# tokens; a hybrid without full attention crashes too; full attention first never does
_MTP3 = {"method": "mtp", "num_speculative_tokens": 3, "mtp_modules": 3}
_M16 = {"kind": "mamba", "block_size": 16}
_SW_M = {"groups": [{"kind": "sliding_window", "block_size": 2, "sliding_window": 3, "drafter": True},
                    {"kind": "mamba", "block_size": 2}],
         "cache": {"prefix_match_unit": 1}, "speculative": {"method": "mtp", "num_speculative_tokens": 2,
                                                            "mtp_modules": 2}}
LOOKAHEAD_ROWS = [
    ({"groups": [_M16], "speculative": _MTP3}, 17, {"0": [16, 32]}, None, 0),
    ({"groups": [_M16], "speculative": _MTP3}, 18, {"0": [16, 32]}, None, 0),
    ({"groups": [_M16], "speculative": _MTP3}, 19, {"0": [16, 32]}, 16, 16),
    ({"groups": [_M16], "speculative": _MTP3}, 33, {"0": [16, 32]}, None, 16),
    ({"groups": [{"kind": "full_attention", "block_size": 16}, _M16], "speculative": _MTP3}, 33,
     {"0": [16, 32], "1": [16, 32]}, 16, 16),
    (_SW_M, 5, {"0": list(range(1, 9)), "1": list(range(1, 9))}, None, 2),
    (_SW_M, 7, {"0": list(range(1, 9)), "1": list(range(1, 9))}, None, 4),
    (_SW_M, 30, {"0": list(range(1, 9)), "1": list(range(1, 9))}, 8, 8),
]


@pytest.mark.parametrize(("cfg", "n", "resident", "vllm_hit", "kvgeom_hit"), LOOKAHEAD_ROWS)
def test_lookahead_past_a_windowed_first_lookup(cfg, n, resident, vllm_hit, kvgeom_hit):
    g = kvgeom.resolve(cfg)
    S = g.groups[0].span
    crashes = (n - 1) // S * S > g.request_hashes(n) * g.hash_block_size and g.groups[0].family != "full"
    assert crashes == (vllm_hit is None)  # the deviation's condition, as the rows from vLLM runs show it
    assert kvgeom.prefix_hit(g, n, resident).hit_tokens == kvgeom_hit
    assert vllm_hit is None or vllm_hit == kvgeom_hit


def test_mamba_state_keyed_past_chunk_end():
    # vLLM 0.33 (run): chunks end at 144 and 167, the Mamba block 4 (tokens 128..160, holding the state after
    # 144) is stored as key 160 and a 254-token lookup hits 160; kvgeom stores no Mamba key and hits 0
    from kvgeom.handoff import mamba_handoffs

    g = kvgeom.resolve({"groups": [{"kind": "full_attention", "block_size": 16}, {"kind": "mamba", "block_size": 32}],
                        "parallel": {"tp": 2, "dcp": 2}, "cache": {"retention_interval": None}, "offload": {},
                        "speculative": {"method": "eagle", "num_speculative_tokens": 1}})
    ends = kvgeom.prefill_chunk_ends(g, 167, max_num_batched_tokens=490)
    assert ends == (144, 167)
    assert mamba_handoffs(g, 1, 167, 167, ends) == ()
    plan = plan_store(g, num_tokens=167, num_computed_tokens=167, chunk_ends=ends)
    stored = {s.index: list(s.stored_end_tokens) for s in plan.groups}
    assert stored[1] == [] and stored[0] == [32, 64, 96, 128, 160]
    assert lookup_hit(g, 254, stored=stored).hit_tokens == 0


_FM64 = {"groups": [{"kind": "full_attention", "block_size": 64}, {"kind": "mamba", "block_size": 64}],
          "cache": {"prefix_match_unit": 16}, "offload": {}}


def _stores(g, n, limit):
    plan = plan_store(g, num_tokens=n, num_computed_tokens=n, max_offload_tokens=limit)
    return {s.index: list(s.stored_end_tokens) for s in plan.groups}


def test_partial_tail_past_offload_limit():
    # vLLM 0.33 (run, tests/test_store_conformance.py rows fm-24-limit8, fm-100-limit64): AssertionError in
    # _build_partial_tail_store_jobs. kvgeom stores no tail past the limit: vLLM's own stores at the checkpoint
    # limit (16: {16}; 96: {64, 96}, run) cut at the limit
    from kvgeom.handoff import partial_tail_boundary

    g = kvgeom.resolve(_FM64)
    assert partial_tail_boundary(g, 24, 24, max_offload_tokens=8) is None
    assert _stores(g, 24, 8) == {0: [], 1: []}
    assert partial_tail_boundary(g, 100, 100, max_offload_tokens=64) is None
    assert _stores(g, 100, 64) == {0: [64], 1: [64]}


def test_partial_tail_zero_offload_limit():
    # vLLM 0.33 (run, rows fm-24-limit0, fm-100-limit0): the partial tail is stored at 16 (at 96) although the
    # chunk path stores nothing under 0; kvgeom stores nothing
    from kvgeom.handoff import partial_tail_boundary

    g = kvgeom.resolve(_FM64)
    assert partial_tail_boundary(g, 24, 24, max_offload_tokens=0) is None
    assert _stores(g, 24, 0) == {0: [], 1: []}
    assert _stores(g, 100, 0) == {0: [], 1: []}


def test_swa_lookup_window_agrees_with_vllm():
    # Not a deviation: kvgeom's lookup asks, as vLLM 0.33's _sliding_window_lookup does, for at least the window
    # in chunks, max(cdiv(17, 16), cdiv(16, 16)) = 2, although the store keeps only the one chunk the window
    # reaches. Window 17 over 16-token chunks: the planned tier holds [80, 96) only, and vLLM hits 0 (run).
    g = kvgeom.resolve({"groups": [{"kind": "full_attention", "block_size": 16},
                                   {"kind": "sliding_window", "block_size": 16, "sliding_window": 17}],
                        "offload": {}})
    tier = {s.index: list(s.end_tokens) for s in plan_store(g, num_tokens=100, num_computed_tokens=100).groups}
    assert tier == {0: [16, 32, 48, 64, 80, 96], 1: [96]}
    assert lookup_hit(g, 120, stored=tier).hit_tokens == 0
    # with the chunk before it stored too, the run of 2 is there: hit 96
    assert lookup_hit(g, 120, stored={0: tier[0], 1: [80, 96]}).hit_tokens == 96
