"""Example tables for kvgeom.resolve: spans, L, H, A, row widths, offload geometry.

One row per case; the comment names the case and its source (a vLLM issue,
a docs/ page or the vLLM 0.33 function).
"""

from __future__ import annotations

import pytest

import kvgeom

FA = {"kind": "full_attention"}
MAMBA = {"kind": "mamba"}
MLA = {"kind": "mla"}


def fa(b, **kw):
    return {**FA, "block_size": b, **kw}


def mamba(b, **kw):
    return {**MAMBA, "block_size": b, **kw}


def mla(b, **kw):
    return {**MLA, "block_size": b, **kw}


def dsa(b):
    return {"kind": "uniform", "block_size": b, "layers": [{"kind": "mla"}, {"kind": "mla", "cache_role": "indexer"}]}


def cfg(groups, parallel=None, cache=None, offload=None):
    out = {"groups": groups}
    if parallel:
        out["parallel"] = parallel
    if cache:
        out["cache"] = cache
    if offload is not None:
        out["offload"] = offload
    return out


# (config, spans, L, H, A)
SPAN_TABLE = [
    # #49964: attention 16 + Mamba 16, TP2 DCP2 -> (32, 16), L 32, H 16;
    # partial hash hits on (D > 1 and B_m >= H, partial_hash_hits_enabled) so A = H.
    (kvgeom.DEFAULT_CONFIG, [32, 16], 32, 16, 16),
    # the same hybrid without DCP: spans equal, H = gcd = 16, B_m > H false -> A = L
    (cfg([fa(16), mamba(16)]), [16, 16], 16, 16, 16),
    # #50883: DSA uniform group, block 64, DCP 2 -> L = H = 128
    (cfg([dsa(64)], {"tp": 2, "dcp": 2}), [128], 128, 128, 128),
    # example 5, DCP 8 -> 512 / 512
    (cfg([dsa(64)], {"tp": 8, "dcp": 8}), [512], 512, 512, 512),
    # example 5 unit-test form: two MLA leaves, block 16, D = 1 -> 16; D = 2 -> 32
    (cfg([{"kind": "uniform", "block_size": 16, "layers": [MLA, MLA]}]), [16], 16, 16, 16),
    (cfg([{"kind": "uniform", "block_size": 16, "layers": [MLA, MLA]}], {"tp": 2, "dcp": 2}), [32], 32, 32, 32),
    # example 5: a uniform group of Mamba leaves next to a Mamba group under D = 2 stays (16, 16)
    (
        cfg([{"kind": "uniform", "block_size": 16, "layers": [MAMBA, MAMBA]}, mamba(16)], {"tp": 2, "dcp": 2}),
        [16, 16],
        16,
        16,
        16,
    ),
    # vLLM's own case: PCP = 2 leaves a 16-token group at 16 (#46570)
    (cfg([fa(16)], {"tp": 2, "pcp": 2}), [16], 16, 16, 16),
    # the pre-#46570 design: PCP also shards KV -> 16*2*2 = 64
    (cfg([fa(16)], {"tp": 2, "pcp": 2, "dcp": 2, "pcp_shards_kv": True}), [64], 64, 64, 64),
    # a full 12-token group beside a 16-token MLA group: L = 48, H = gcd = 4 (vLLM's tokens_per_hash 4 case)
    (cfg([fa(12), mla(16)]), [12, 16], 48, 4, 48),
    # LMCache #4809: resolved 2304-token pages at DCP 4 -> 9216 / 2304
    (cfg([fa(2304), mamba(2304)], {"tp": 4, "dcp": 4}), [9216, 2304], 9216, 2304, 2304),
    # Kimi-K3 style (#55168): KDA 1536 + MLA 1536 at DCP 8 -> 12288 / 1536
    (cfg([mla(1536), mamba(1536)], {"tp": 8, "dcp": 8}), [12288, 1536], 12288, 1536, 1536),
    # a replicated draft group (dcp_sharded=false) beside a sharded one under DCP 2
    (cfg([fa(16), fa(16, dcp_sharded=False)], {"tp": 2, "dcp": 2}), [32, 16], 32, 16, 32),
    # sliding window replicated under DCP 2 next to full attention; SWA cannot do fine-grained hits -> A = L
    (
        cfg([fa(16), {"kind": "sliding_window", "block_size": 16, "sliding_window": 128, "dcp_sharded": False}],
            {"tp": 2, "dcp": 2}),
        [32, 16],
        32,
        16,
        32,
    ),
    # prefix caching off and no connector: H = L (resolve_kv_cache_block_sizes)
    (cfg([fa(16), mamba(16, mamba_cache_mode="none")], {"tp": 2, "dcp": 2}, {"prefix_caching": False}),
     [32, 16], 32, 32, 32),
    # explicit prefix_match_unit 8 dividing both spans; B_m=16 >= 8 -> partial hits, A = 8
    (cfg([fa(16), mamba(16)], {"tp": 2, "dcp": 2}, {"prefix_match_unit": 8}), [32, 16], 32, 8, 8),
    # circular buffer is not cacheable: counted in L, not in H
    (cfg([fa(32), {"kind": "circular_buffer", "block_size": 8}]), [32, 8], 32, 32, 32),
]


@pytest.mark.parametrize(("config", "spans", "L", "H", "A"), SPAN_TABLE)
def test_spans_and_units(config, spans, L, H, A):
    g = kvgeom.resolve(config)
    assert [x.span for x in g.groups] == spans
    assert (g.scheduler_block_size, g.hash_block_size, g.hit_alignment_tokens) == (L, H, A)


# (config, [(index, tokens_per_block, tokens_per_chunk, hashes_per_chunk, window_chunks)], alignment, mamba_align,
#  partial_tail)
OFFLOAD_TABLE = [
    # #49964: tokens_per_block (32, 16), hashes (2, 1), alignment 32, Mamba align 16
    (kvgeom.DEFAULT_CONFIG, [(0, 32, 32, 2, None), (1, 16, 16, 1, 1)], 32, 16, False),
    # the same with k = 4: chunks 128 / 64
    (cfg([fa(16), mamba(16)], {"tp": 2, "dcp": 2}, offload={"blocks_per_chunk": 4}),
     [(0, 32, 128, 8, None), (1, 16, 64, 4, 1)], 128, 64, False),
    # #50883: DSA wrapper at DCP 2 offloads 128-token blocks, not 64
    (cfg([dsa(64)], {"tp": 2, "dcp": 2}, offload={}), [(0, 128, 128, 1, None)], 128, None, False),
    # LMCache #4809 shape: 9216 / 2304, chunk alignment is the attention chunk
    (cfg([fa(2304), mamba(2304)], {"tp": 4, "dcp": 4}, offload={}),
     [(0, 9216, 9216, 4, None), (1, 2304, 2304, 1, 1)], 9216, 2304, False),
    # offload block_size in tokens with one common span: k = 64/16 = 4
    (cfg([fa(16)], offload={"block_size": 64}), [(0, 16, 64, 4, None)], 64, None, False),
    # sliding window 100 with k = 2 (chunk 32): window max(cdiv(100,32), cdiv(99,32)) = 4
    (cfg([fa(16), {"kind": "sliding_window", "block_size": 16, "sliding_window": 100}],
         offload={"blocks_per_chunk": 2}),
     [(0, 16, 32, 2, None), (1, 16, 32, 2, 4)], 32, None, False),
    # no full-attention group: alignment is the largest chunk (SchedulerOffloadConfig.from_spec)
    (cfg([mamba(16), {"kind": "sliding_window", "block_size": 32, "sliding_window": 64}],
         cache={"retention_interval": None}, offload={}),
     [(0, 16, 16, 1, 1), (1, 32, 32, 2, 2)], 32, 16, False),
    # circular buffer is excluded from offloading (build_offloading_config)
    (cfg([fa(32), {"kind": "circular_buffer", "block_size": 8}], offload={}), [(0, 32, 32, 1, None)], 32, None,
     False),
    # partial tails: D = 1, k = 1, one span 16, Mamba span 16 > H = 8 (prefix_match_unit), no SWA
    (cfg([fa(16), mamba(16)], cache={"prefix_match_unit": 8}, offload={}),
     [(0, 16, 16, 2, None), (1, 16, 16, 2, 1)], 16, 16, True),
    # chunked local, window cdiv(64, 16) = 4 chunks
    (cfg([fa(16), {"kind": "chunked_local", "block_size": 16, "attention_chunk_size": 64}], offload={}),
     [(0, 16, 16, 1, None), (1, 16, 16, 1, 4)], 16, None, False),
]


@pytest.mark.parametrize(("config", "rows", "alignment", "mamba_align", "partial_tail"), OFFLOAD_TABLE)
def test_offload_geometry(config, rows, alignment, mamba_align, partial_tail):
    off = kvgeom.resolve(config).offload
    assert off is not None
    got = [(o.index, o.tokens_per_block, o.tokens_per_chunk, o.hashes_per_chunk, o.window_chunks) for o in off.groups]
    assert got == rows
    assert off.alignment_tokens == alignment
    assert off.mamba_align_size == mamba_align
    assert off.supports_partial_tail is partial_tail


def test_seed_case_done_when():
    # issue 2 "done when": spans (32, 16), L 32, H 16, offload tokens_per_block (32, 16)
    g = kvgeom.resolve(kvgeom.DEFAULT_CONFIG)
    assert [x.span for x in g.groups] == [32, 16]
    assert (g.scheduler_block_size, g.hash_block_size) == (32, 16)
    assert [o.tokens_per_block for o in g.offload.groups] == [32, 16]
    assert g.offload.retention_interval == 0  # vLLM 0.33 default


# (config, [row widths])
ROW_TABLE = [
    # #50287: max_model_len 512, B = 16, D = 2 -> attention 16, Mamba 32 (not 16)
    (cfg([fa(16), mamba(16)], {"tp": 2, "dcp": 2}, {"max_model_len": 512}), [16, 32]),
    # speculative blocks add to the Mamba row
    (cfg([fa(16), mamba(16, num_speculative_blocks=2)], {"tp": 2, "dcp": 2}, {"max_model_len": 512}), [16, 34]),
    # #50823: DSA wrapper row is per-layer (DCP-aware): cdiv(8192, 64*2) = 64, not 128
    (cfg([dsa(64)], {"tp": 2, "dcp": 2}, {"max_model_len": 8192}), [64]),
    # Mamba none mode (prefix caching off): 1 + speculative blocks
    (cfg([fa(16), mamba(16, mamba_cache_mode="none", num_speculative_blocks=1)], cache={
        "prefix_caching": False, "max_model_len": 100}), [7, 2]),
    # circular buffer: one block per request
    (cfg([fa(16), {"kind": "circular_buffer", "block_size": 8}], cache={"max_model_len": 100}), [7, 1]),
    # a replicated draft group under DCP 2 keeps cdiv(max_len, B)
    (cfg([fa(16), fa(16, dcp_sharded=False)], {"tp": 2, "dcp": 2}, {"max_model_len": 100}), [4, 7]),
]


@pytest.mark.parametrize(("config", "widths"), ROW_TABLE)
def test_row_widths(config, widths):
    assert [g.row_width for g in kvgeom.resolve(config).groups] == widths


def test_row_width_null_without_max_model_len():
    assert [g.row_width for g in kvgeom.resolve(kvgeom.DEFAULT_CONFIG).groups] == [None, None]


def test_report_contract_keys():
    r = kvgeom.resolve(kvgeom.DEFAULT_CONFIG).to_report()
    assert {"groups", "scheduler_block_size", "hash_block_size", "hit_alignment_tokens", "partial_hash_hits",
            "offload", "warnings", "speculative"} <= set(r)
    assert set(r["groups"][0]) == {"index", "kind", "block_size", "dcp_sharded", "prefix_cacheable", "span",
                                   "row_width", "eagle_group", "proof_margin"}
    assert set(r["offload"]) == {"blocks_per_chunk", "tokens_per_hash", "alignment_tokens", "mamba_align_size",
                                 "retention_interval", "supports_partial_tail", "groups"}
    assert set(r["offload"]["groups"][0]) == {"index", "tokens_per_block", "tokens_per_chunk", "hashes_per_chunk",
                                             "window_chunks", "eagle_group", "proof_margin"}
    assert all(set(w) == {"code", "message"} for w in r["warnings"])
    import json

    assert json.loads(json.dumps(r)) == r


def test_report_offload_null_without_connector():
    assert kvgeom.resolve(cfg([fa(16)])).to_report()["offload"] is None


# (config, partial_hash_hits) -- partial_hash_hits_enabled
PARTIAL_TABLE = [
    # D = 1: needs B_m > H strictly; equal spans 16/16 -> off
    (cfg([fa(16), mamba(16)]), False),
    # D = 1 with H = 8 < B_m = 16 -> on
    (cfg([fa(16), mamba(16)], cache={"prefix_match_unit": 8}), True),
    # D = 2: B_m = 16 >= H = 16 -> on
    (kvgeom.DEFAULT_CONFIG, True),
    # single group: never (no hybrid coordinator)
    (cfg([mamba(16)]), False),
    # prefix caching off: never
    (cfg([fa(16), mamba(16, mamba_cache_mode="none")], {"tp": 2, "dcp": 2}, {"prefix_caching": False}), False),
    # a sliding-window group whose span != H turns it off
    (cfg([fa(32), mamba(32), {"kind": "sliding_window", "block_size": 32, "sliding_window": 64}],
         cache={"prefix_match_unit": 16, "retention_interval": None}), False),
    # ... but not when its span equals H
    (cfg([fa(32), mamba(32), {"kind": "sliding_window", "block_size": 16, "sliding_window": 64}],
         cache={"retention_interval": None}), True),
]


@pytest.mark.parametrize(("config", "expected"), PARTIAL_TABLE)
def test_partial_hash_hits(config, expected):
    assert kvgeom.resolve(config).partial_hash_hits is expected


def test_mamba_mode_defaults_follow_prefix_caching():
    on = kvgeom.resolve(cfg([fa(16), mamba(16)]))
    off = kvgeom.resolve(cfg([fa(16), mamba(16)], cache={"prefix_caching": False}))
    assert on.groups[1].mamba_mode == "align"
    assert off.groups[1].mamba_mode == "none"


def test_resolve_reads_json_and_toml(tmp_path):
    import json

    p = tmp_path / "g.json"
    p.write_text(json.dumps(kvgeom.DEFAULT_CONFIG))
    t = tmp_path / "g.toml"
    t.write_text(
        '[[groups]]\nkind = "full_attention"\nblock_size = 16\n\n[[groups]]\nkind = "mamba"\nblock_size = 16\n'
        '\n[parallel]\ntp = 2\ndcp = 2\n\n[offload]\n'
    )
    assert kvgeom.resolve(p).to_report() == kvgeom.resolve(t).to_report() == kvgeom.resolve(
        kvgeom.DEFAULT_CONFIG
    ).to_report()
    assert kvgeom.resolve(str(p)).to_report() == kvgeom.resolve(p).to_report()


def test_retention_dense_spellings():
    for dense in (None, "dense"):
        g = kvgeom.resolve(cfg([fa(16), mamba(16)], cache={"retention_interval": dense}, offload={}))
        assert g.offload.retention_interval is None


def test_dealt_is_sharded_with_more_than_one_kv_shard():
    # the one place consumers read "are this group's positions spread over ranks?"
    assert [g.dealt for g in kvgeom.resolve(kvgeom.DEFAULT_CONFIG).groups] == [True, False]
    # DCP 1: a sharded-by-kind attention group is still held whole by its one rank
    one = kvgeom.resolve(cfg([fa(16), mamba(16)]))
    assert [(g.dcp_sharded, g.dealt) for g in one.groups] == [(True, False), (False, False)]
