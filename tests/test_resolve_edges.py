"""Edge rows of :func:`kvgeom.resolve` (``kvgeom/_resolve/``): every refusal's class, code, field and
numbers, and the derived units at the edges of each rule (issue 19, mutation testing).

``tests/test_errors.py`` checks a refusal's class, code, field and the words of its message; the rows
here pin the whole problem list (every problem, in order) with the numbers each problem carries
(``Problem.values``), so a rule that blames the wrong group, drops a number or reports the wrong one
fails here. The other tables pin the resolved numbers (spans, L, H, A, partial hash hits, row widths,
window needs, the offload chunk geometry) and the warnings at the edge of each rule.
"""

from __future__ import annotations

from typing import Any

import pytest

import kvgeom
from kvgeom import ConfigError, GeometryError, KVGeomError, OffloadConfigError, ParallelismError

FA16 = {"kind": "full_attention", "block_size": 16}
M16 = {"kind": "mamba", "block_size": 16}
DCP2 = {"tp": 2, "dcp": 2}
EAGLE2 = {"method": "eagle", "num_speculative_tokens": 2}
MTP3 = {"method": "mtp", "num_speculative_tokens": 3, "mtp_modules": 3}


def problems(cfg: dict[str, Any]) -> tuple[type[KVGeomError], list[tuple[str, str, dict[str, Any]]]]:
    with pytest.raises(KVGeomError) as info:
        kvgeom.resolve(cfg)
    return type(info.value), [(p.code, p.field, p.values) for p in info.value.problems]


# (config, error class, [(code, field, values)] in the order resolve() collects them)
REFUSALS = [
    # -- groups: per-group rules -----------------------------------------------------------------
    # a uniform group whose layers disagree on dcp_sharded: the flags of the layers, field .layers
    (
        {
            "groups": [
                {
                    "kind": "uniform",
                    "block_size": 16,
                    "layers": [{"kind": "mla"}, {"kind": "mla", "dcp_sharded": False}],
                }
            ]
        },
        GeometryError,
        [("uniform_mixed_sharding", "groups[0].layers", {"flags": [True, False]})],
    ),
    # MLA and Mamba in one uniform group: two manager families (and two sharding defaults)
    (
        {"groups": [{"kind": "uniform", "block_size": 16, "layers": [{"kind": "mla"}, {"kind": "mamba"}]}]},
        GeometryError,
        [
            ("uniform_mixed_sharding", "groups[0].layers", {"flags": [True, False]}),
            ("uniform_mixed_kinds", "groups[0].layers", {"families": ["full", "mamba"]}),
        ],
    ),
    # MLA and a sliding window (both sharded by default): the family problem alone, in its own class
    (
        {
            "groups": [
                {
                    "kind": "uniform",
                    "block_size": 16,
                    "layers": [{"kind": "mla"}, {"kind": "sliding_window", "sliding_window": 64}],
                }
            ]
        },
        GeometryError,
        [("uniform_mixed_kinds", "groups[0].layers", {"families": ["full", "sliding"]})],
    ),
    # Mamba layers of one uniform group in two modes
    (
        {
            "groups": [
                {
                    "kind": "uniform",
                    "block_size": 16,
                    "layers": [
                        {"kind": "mamba", "mamba_cache_mode": "align"},
                        {"kind": "mamba", "mamba_cache_mode": "all"},
                    ],
                }
            ]
        },
        GeometryError,
        [("uniform_mixed_mamba_modes", "groups[0].layers", {})],
    ),
    # a non-cacheable layer inside a uniform group: the field names the layer (index 1)
    (
        {
            "groups": [
                FA16,
                {
                    "kind": "uniform",
                    "block_size": 16,
                    "layers": [{"kind": "mla"}, {"kind": "mla", "prefix_cacheable": False}],
                },
            ]
        },
        GeometryError,
        [("uniform_layer_not_cacheable", "groups[1].layers[1].prefix_cacheable", {})],
    ),
    # ring buffer, HiSparse (hot and resident) and encoder-only groups cannot be made cacheable
    (
        {"groups": [FA16, {"kind": "circular_buffer", "block_size": 16, "prefix_cacheable": True}]},
        GeometryError,
        [("circular_buffer_cacheable", "groups[1].prefix_cacheable", {})],
    ),
    (
        {
            "groups": [
                FA16,
                {"kind": "hisparse_hot", "block_size": 16, "blocks_per_request": 4, "prefix_cacheable": True},
            ]
        },
        GeometryError,
        [("hisparse_cacheable", "groups[1].prefix_cacheable", {})],
    ),
    (
        {"groups": [FA16, {"kind": "hisparse_resident", "block_size": 16, "prefix_cacheable": True}]},
        GeometryError,
        [("hisparse_cacheable", "groups[1].prefix_cacheable", {})],
    ),
    (
        {"groups": [FA16, {"kind": "encoder_only", "block_size": 16, "prefix_cacheable": True}]},
        GeometryError,
        [("encoder_only_cacheable", "groups[1].prefix_cacheable", {})],
    ),
    # Mamba is never sharded, with or without DCP
    (
        {"groups": [FA16, {**M16, "dcp_sharded": True}]},
        GeometryError,
        [("mamba_cannot_shard", "groups[1].dcp_sharded", {})],
    ),
    # Mamba mode none with prefix caching on
    (
        {"groups": [FA16, {**M16, "mamba_cache_mode": "none"}]},
        GeometryError,
        [("mamba_none_with_prefix_caching", "groups[1].mamba_cache_mode", {})],
    ),
    # -- groups: dealing over KV shards ----------------------------------------------------------
    # a sharded sliding window at dcp=2: the number is dcp
    (
        {"groups": [FA16, {"kind": "sliding_window", "block_size": 16, "sliding_window": 64}], "parallel": DCP2},
        ParallelismError,
        [("sharded_kind_under_dcp", "groups[1].dcp_sharded", {"dcp": 2})],
    ),
    # interleave larger than the block; interleave not dividing the block; the group index is named
    (
        {"groups": [FA16], "parallel": {**DCP2, "cp_interleave": 32}},
        ParallelismError,
        [("interleave_mismatch", "parallel.cp_interleave", {"cp_interleave": 32, "block_size": 16, "group": 0})],
    ),
    (
        {"groups": [FA16, {"kind": "full_attention", "block_size": 24}], "parallel": {**DCP2, "cp_interleave": 16}},
        ParallelismError,
        [("interleave_mismatch", "parallel.cp_interleave", {"cp_interleave": 16, "block_size": 24, "group": 1})],
    ),
    # a sink of half a block; at dcp=2 a sink of one block is half the span 32
    (
        {"groups": [{"kind": "sink_full_attention", "block_size": 16, "sink_len": 24}]},
        GeometryError,
        [("sink_len_not_multiple_of_span", "groups[0].sink_len", {"sink_len": 24, "span": 16})],
    ),
    (
        {"groups": [FA16, {"kind": "sink_full_attention", "block_size": 16, "sink_len": 16}], "parallel": DCP2},
        GeometryError,
        [("sink_len_not_multiple_of_span", "groups[1].sink_len", {"sink_len": 16, "span": 32})],
    ),
    # -- groups: the encoder-only group ----------------------------------------------------------
    # two encoder-only groups: the second one is blamed, both are listed
    (
        {"groups": [FA16, {"kind": "encoder_only", "block_size": 16}, {"kind": "encoder_only", "block_size": 16}]},
        GeometryError,
        [("encoder_only_twice", "groups[2].kind", {"groups": [1, 2]})],
    ),
    # an encoder-only group that is not last
    (
        {"groups": [FA16, {"kind": "encoder_only", "block_size": 16}, M16]},
        GeometryError,
        [("encoder_only_not_last", "groups[1].kind", {"group": 1})],
    ),
    # -- groups/units: int64 bounds --------------------------------------------------------------
    (
        {"groups": [{"kind": "full_attention", "block_size": 2**40}], "parallel": {"tp": 2**24, "dcp": 2**24}},
        GeometryError,
        [("span_too_large", "groups[0].block_size", {"span": 2**64})],
    ),
    (
        {"groups": [FA16, {"kind": "full_attention", "block_size": 2**40}], "parallel": {"tp": 2**24, "dcp": 2**24}},
        GeometryError,
        [("span_too_large", "groups[1].block_size", {"span": 2**64})],
    ),
    (
        {
            "groups": [
                {"kind": "full_attention", "block_size": 2**40 - 1},
                {"kind": "full_attention", "block_size": 2**40 - 3},
            ]
        },
        GeometryError,
        [
            (
                "scheduler_block_too_large",
                "groups",
                {"spans": [2**40 - 1, 2**40 - 3], "scheduler_block_size": (2**40 - 1) * (2**40 - 3)},
            )
        ],
    ),
    # -- units -------------------------------------------------------------------------------------
    # prefix_match_unit with one group: refused when a hash consumer exists (prefix caching or offload)
    (
        {"groups": [FA16], "cache": {"prefix_match_unit": 8}},
        GeometryError,
        [
            (
                "prefix_match_unit_single_group",
                "cache.prefix_match_unit",
                {"prefix_match_unit": 8, "scheduler_block_size": 16},
            )
        ],
    ),
    (
        {"groups": [FA16], "cache": {"prefix_match_unit": 8, "prefix_caching": False}, "offload": {}},
        GeometryError,
        [
            (
                "prefix_match_unit_single_group",
                "cache.prefix_match_unit",
                {"prefix_match_unit": 8, "scheduler_block_size": 16},
            )
        ],
    ),
    # a configured unit that does not divide a span: the field is the unit
    (
        {"groups": [{"kind": "full_attention", "block_size": 24}, FA16], "cache": {"prefix_match_unit": 16}},
        GeometryError,
        [("span_not_divisible_by_hash_unit", "cache.prefix_match_unit", {"span": 24, "hash_block_size": 16})],
    ),
    # compression: a layer of a uniform group (field .layers[j]) and a plain group (48 fits a 64-token block,
    # so the block holds a state: tokens_per_state above the block is block_smaller_than_state, tests/test_errors.py)
    (
        {
            "groups": [
                {
                    "kind": "uniform",
                    "block_size": 64,
                    "layers": [{"kind": "mla"}, {"kind": "mla", "tokens_per_state": 48}],
                }
            ]
        },
        GeometryError,
        [
            (
                "hit_alignment_not_multiple_of_compression",
                "groups[0].layers[1].tokens_per_state",
                {"tokens_per_state": 48, "hit_alignment_tokens": 64},
            )
        ],
    ),
    (
        {"groups": [FA16, {"kind": "full_attention", "block_size": 64, "tokens_per_state": 48}]},
        GeometryError,
        [
            (
                "hit_alignment_not_multiple_of_compression",
                "groups[1].tokens_per_state",
                {"tokens_per_state": 48, "hit_alignment_tokens": 64},
            )
        ],
    ),
    # compression 2 does not divide A = 3 (the rule applies from tokens_per_state 2 up)
    (
        {"groups": [{"kind": "full_attention", "block_size": 3, "tokens_per_state": 2}]},
        GeometryError,
        [
            (
                "hit_alignment_not_multiple_of_compression",
                "groups[0].tokens_per_state",
                {"tokens_per_state": 2, "hit_alignment_tokens": 3},
            )
        ],
    ),
    # retention: nothing windowed to thin (chunked local does not count), or not a multiple of L
    (
        {"groups": [FA16], "cache": {"retention_interval": 32}},
        GeometryError,
        [("retention_without_windowed_group", "cache.retention_interval", {"retention_interval": 32})],
    ),
    (
        {
            "groups": [FA16, {"kind": "chunked_local", "block_size": 16, "attention_chunk_size": 32}],
            "cache": {"retention_interval": 48},
        },
        GeometryError,
        [("retention_without_windowed_group", "cache.retention_interval", {"retention_interval": 48})],
    ),
    (
        {"groups": [FA16, M16], "cache": {"retention_interval": 24}},
        GeometryError,
        [
            (
                "retention_not_multiple_of_scheduler_block",
                "cache.retention_interval",
                {"retention_interval": 24, "scheduler_block_size": 16},
            )
        ],
    ),
    (
        {"groups": [FA16, M16], "cache": {"retention_interval": 8}},
        GeometryError,
        [
            (
                "retention_not_multiple_of_scheduler_block",
                "cache.retention_interval",
                {"retention_interval": 8, "scheduler_block_size": 16},
            )
        ],
    ),
    # -- offload -------------------------------------------------------------------------------------
    (
        {"groups": [{**FA16, "prefix_cacheable": False}], "offload": {}},
        OffloadConfigError,
        [("no_offloadable_groups", "offload", {})],
    ),
    (
        {"groups": [FA16, {"kind": "cross_attention", "block_size": 16}], "offload": {}},
        OffloadConfigError,
        [("cross_attention_offload", "groups[1]", {})],
    ),
    # H = L (prefix caching off, or a Mamba group in mode all): a smaller span is not a multiple of H
    (
        {
            "groups": [{"kind": "full_attention", "block_size": 32}, M16],
            "cache": {"prefix_caching": False},
            "offload": {},
        },
        OffloadConfigError,
        [("tokens_per_block_not_divisible", "groups[1].block_size", {"tokens_per_block": 16, "tokens_per_hash": 32})],
    ),
    (
        {"groups": [{"kind": "full_attention", "block_size": 32}, {**M16, "mamba_cache_mode": "all"}], "offload": {}},
        OffloadConfigError,
        [("tokens_per_block_not_divisible", "groups[1].block_size", {"tokens_per_block": 16, "tokens_per_hash": 32})],
    ),
    # the chunk factor: both keys, mixed spans, a block size that is not a multiple of the span
    (
        {"groups": [FA16], "offload": {"block_size": 64, "blocks_per_chunk": 2}},
        OffloadConfigError,
        [("offload_chunk_both", "offload", {})],
    ),
    (
        {"groups": [FA16, {"kind": "full_attention", "block_size": 32}], "offload": {"block_size": 64}},
        OffloadConfigError,
        [("offload_block_size_mixed_spans", "offload.block_size", {"block_size": 64, "spans": [16, 32]})],
    ),
    (
        {"groups": [FA16], "offload": {"block_size": 40}},
        OffloadConfigError,
        [("offload_block_size_not_multiple", "offload.block_size", {"block_size": 40, "span": 16})],
    ),
    # two align Mamba groups with different chunks: each group's chunk, by index
    (
        {"groups": [FA16, M16, {"kind": "mamba", "block_size": 32}], "offload": {}},
        OffloadConfigError,
        [("mamba_chunk_mismatch", "groups", {"chunks": {1: 16, 2: 32}})],
    ),
    # retention a multiple of L but not of a windowed group's chunk (Mamba, sliding window)
    (
        {"groups": [FA16, M16], "cache": {"retention_interval": 32}, "offload": {"blocks_per_chunk": 4}},
        OffloadConfigError,
        [
            (
                "retention_not_multiple_of_chunk",
                "cache.retention_interval",
                {"retention_interval": 32, "tokens_per_chunk": 64},
            )
        ],
    ),
    (
        {
            "groups": [FA16, {"kind": "sliding_window", "block_size": 16, "sliding_window": 32}],
            "cache": {"retention_interval": 16},
            "offload": {"blocks_per_chunk": 2},
        },
        OffloadConfigError,
        [
            (
                "retention_not_multiple_of_chunk",
                "cache.retention_interval",
                {"retention_interval": 16, "tokens_per_chunk": 32},
            )
        ],
    ),
    # a chunked-local group's chunk (32 * 2 = 64) must divide the retention interval too
    (
        {
            "groups": [FA16, M16, {"kind": "chunked_local", "block_size": 32, "attention_chunk_size": 64}],
            "cache": {"retention_interval": 32},
            "offload": {"blocks_per_chunk": 2},
        },
        OffloadConfigError,
        [
            (
                "retention_not_multiple_of_chunk",
                "cache.retention_interval",
                {"retention_interval": 32, "tokens_per_chunk": 64},
            )
        ],
    ),
    # -- speculative ---------------------------------------------------------------------------------
    (
        {"groups": [{"kind": "mla", "block_size": 64, "drafter": True}]},
        GeometryError,
        [("drafter_without_speculative", "groups[0].drafter", {})],
    ),
    (
        {"groups": [{"kind": "mla", "block_size": 64}, {"kind": "mamba", "block_size": 64, "drafter": True}]},
        GeometryError,
        [("drafter_without_speculative", "groups[1].drafter", {}), ("drafter_mamba_group", "groups[1].drafter", {})],
    ),
    (
        {
            "groups": [{"kind": "mla", "block_size": 64}, {"kind": "mamba", "block_size": 64, "drafter": True}],
            "speculative": EAGLE2,
        },
        GeometryError,
        [("drafter_mamba_group", "groups[1].drafter", {})],
    ),
    (
        {
            "groups": [FA16, {"kind": "chunked_local", "block_size": 16, "attention_chunk_size": 64}],
            "speculative": EAGLE2,
            "offload": {},
        },
        GeometryError,
        [("eagle_chunked_local", "groups[1]", {"group": 1})],
    ),
    (
        {"groups": [{"kind": "full_attention", "block_size": 2}], "speculative": {**MTP3, "lookahead_hashes": False}},
        GeometryError,
        [
            (
                "multi_module_mtp_scheduler_block",
                "speculative.num_speculative_tokens",
                {"scheduler_block_size": 2, "num_speculative_tokens": 3},
            )
        ],
    ),
    (
        {
            "groups": [
                {"kind": "full_attention", "block_size": 2},
                {"kind": "full_attention", "block_size": 2, "drafter": True},
            ],
            "speculative": MTP3,
        },
        GeometryError,
        [
            (
                "multi_module_mtp_scheduler_block",
                "speculative.num_speculative_tokens",
                {"scheduler_block_size": 2, "num_speculative_tokens": 3},
            )
        ],
    ),
    # a Mamba group flagged sharded is not dealt: the interleave is not checked against it
    (
        {
            "groups": [{"kind": "full_attention", "block_size": 32}, {**M16, "dcp_sharded": True}],
            "parallel": {**DCP2, "cp_interleave": 32},
        },
        GeometryError,
        [("mamba_cannot_shard", "groups[1].dcp_sharded", {})],
    ),
    # H = L = lcm(16, 32, 48) = 96 with a Mamba group in mode all: no span is a multiple of it, each is named
    (
        {
            "groups": [
                FA16,
                {"kind": "full_attention", "block_size": 32},
                {"kind": "mamba", "block_size": 48, "mamba_cache_mode": "all"},
            ],
            "offload": {},
        },
        OffloadConfigError,
        [
            ("tokens_per_block_not_divisible", "groups[0].block_size", {"tokens_per_block": 16, "tokens_per_hash": 96}),
            ("tokens_per_block_not_divisible", "groups[1].block_size", {"tokens_per_block": 32, "tokens_per_hash": 96}),
            ("tokens_per_block_not_divisible", "groups[2].block_size", {"tokens_per_block": 48, "tokens_per_hash": 96}),
        ],
    ),
    # -- several problems at once: the common class, or GeometryError when they differ ---------------
    (
        {
            "groups": [
                FA16,
                {"kind": "sliding_window", "block_size": 16, "sliding_window": 64},
                {"kind": "sliding_window", "block_size": 16, "sliding_window": 32},
            ],
            "parallel": DCP2,
        },
        ParallelismError,
        [
            ("sharded_kind_under_dcp", "groups[1].dcp_sharded", {"dcp": 2}),
            ("sharded_kind_under_dcp", "groups[2].dcp_sharded", {"dcp": 2}),
        ],
    ),
    (
        {
            "groups": [
                FA16,
                {**M16, "dcp_sharded": True},
                {"kind": "sliding_window", "block_size": 16, "sliding_window": 64},
            ],
            "parallel": DCP2,
        },
        GeometryError,
        [
            ("mamba_cannot_shard", "groups[1].dcp_sharded", {}),
            ("sharded_kind_under_dcp", "groups[2].dcp_sharded", {"dcp": 2}),
        ],
    ),
]


@pytest.mark.parametrize(("config", "cls", "want"), REFUSALS)
def test_refusal_code_field_and_numbers(config, cls, want):
    got_cls, got = problems(config)
    assert got_cls is cls
    assert got == want


# Configs on the edge of a refusal that resolve (the rule's other side).
ACCEPTED = [
    # a sliding window flagged sharded at dcp=1 is not dealt
    {"groups": [FA16, {"kind": "sliding_window", "block_size": 16, "sliding_window": 64, "dcp_sharded": True}]},
    # an interleave equal to the block; a replicated group ignores the interleave
    {"groups": [FA16], "parallel": {**DCP2, "cp_interleave": 16}},
    {"groups": [{**FA16, "dcp_sharded": False}], "parallel": {**DCP2, "cp_interleave": 32}},
    # a sink of whole spans; a replicated sink's span is its block size
    {"groups": [{"kind": "sink_full_attention", "block_size": 16, "sink_len": 32}], "parallel": DCP2},
    {
        "groups": [{"kind": "sink_full_attention", "block_size": 16, "sink_len": 16, "dcp_sharded": False}],
        "parallel": DCP2,
    },
    # Mamba mode none without prefix caching
    {"groups": [FA16, {**M16, "mamba_cache_mode": "none"}], "cache": {"prefix_caching": False}},
    # prefix_match_unit equal to L with one group; any unit with one group and no hash consumer
    {"groups": [FA16], "cache": {"prefix_match_unit": 16}},
    {"groups": [FA16], "cache": {"prefix_match_unit": 8, "prefix_caching": False}},
    # retention a multiple of L and of every windowed chunk
    {"groups": [FA16, M16], "cache": {"retention_interval": 32}},
    {
        "groups": [FA16, {"kind": "sliding_window", "block_size": 16, "sliding_window": 32}],
        "cache": {"retention_interval": 64},
        "offload": {"blocks_per_chunk": 4},
    },
    # an offload block size that is a multiple of the one span
    {"groups": [FA16], "offload": {"block_size": 64}},
    # compression dividing A
    {
        "groups": [
            {"kind": "full_attention", "block_size": 64, "tokens_per_state": 4},
            {"kind": "full_attention", "block_size": 6},
        ]
    },
    # multi-module MTP with L >= P, without the drop, or with lookahead hashes (no coordinator eagle)
    {"groups": [{"kind": "full_attention", "block_size": 3}], "speculative": {**MTP3, "lookahead_hashes": False}},
    {"groups": [{"kind": "full_attention", "block_size": 2}], "speculative": {**MTP3, "eagle_block_drop": False}},
    {"groups": [{"kind": "full_attention", "block_size": 2}], "speculative": MTP3},
    {
        "groups": [{"kind": "full_attention", "block_size": 2}],
        "speculative": {**MTP3, "lookahead_hashes": False},
        "cache": {"prefix_caching": False},
    },
    # eagle with a chunked-local group that does not drop (lookahead hashes; prefix caching off)
    {"groups": [FA16, {"kind": "chunked_local", "block_size": 16, "attention_chunk_size": 64}], "speculative": EAGLE2},
    {
        "groups": [FA16, {"kind": "chunked_local", "block_size": 16, "attention_chunk_size": 64}],
        "speculative": EAGLE2,
        "cache": {"prefix_caching": False},
    },
    # an explicit prefix_cacheable=true on an attention group and on a uniform group's layer
    {
        "groups": [
            {**FA16, "prefix_cacheable": True},
            {"kind": "uniform", "block_size": 16, "layers": [{"kind": "mla", "prefix_cacheable": True}]},
        ]
    },
    # an interleave larger than the block at dcp=1: no group is dealt
    {"groups": [FA16], "parallel": {"cp_interleave": 32}},
    # one encoder-only group, last; or alone
    {"groups": [FA16, {"kind": "encoder_only", "block_size": 16}]},
    {"groups": [{"kind": "encoder_only", "block_size": 16}]},
]


@pytest.mark.parametrize("config", ACCEPTED)
def test_edge_configs_resolve(config):
    assert isinstance(kvgeom.resolve(config), kvgeom.Geometry)


def test_config_errors_are_not_resolve_problems():
    # a malformed value is refused by the config model before any resolve step runs
    with pytest.raises(ConfigError):
        kvgeom.resolve({"groups": [{**FA16, "block_size": 0}]})


def _groups(geom: kvgeom.Geometry) -> list[tuple[Any, ...]]:
    return [(g.kind, g.span, g.dealt, g.row_width, g.mamba_mode, g.window_need, g.gpu_window_need) for g in geom.groups]


SW128 = {"kind": "sliding_window", "block_size": 16, "sliding_window": 128, "extra_retained_tokens": 2}
CL64 = {"kind": "chunked_local", "block_size": 16, "attention_chunk_size": 64}

# (config, [(kind, span, dealt, row_width, mamba_mode, window_need, gpu_window_need)], (L, H, A, partial))
UNITS = [
    # one group of every row-width family at max_model_len 100 (cdiv(100, 16) = 7): Mamba align 7 + 2 speculative
    # blocks, ring buffer 1; window needs: sliding (sw - 1 + extra, sw - 1) = (129, 127), chunked (63, 63)
    (
        {
            "groups": [
                FA16,
                SW128,
                CL64,
                {**M16, "num_speculative_blocks": 2},
                {"kind": "circular_buffer", "block_size": 16},
            ],
            "cache": {"max_model_len": 100},
        },
        [
            ("full_attention", 16, False, 7, None, None, None),
            ("sliding_window", 16, False, 7, None, 129, 127),
            ("chunked_local", 16, False, 7, None, 63, 63),
            ("mamba", 16, False, 9, "align", None, None),
            ("circular_buffer", 16, False, 1, None, None, None),
        ],
        (16, 16, 16, False),
    ),
    # Mamba mode none: one column plus its speculative blocks; a sharded group at dcp=2 is dealt and
    # its row is cdiv(100, 32) = 4; without prefix caching H = L
    (
        {
            "groups": [FA16, {**M16, "mamba_cache_mode": "none", "num_speculative_blocks": 2}],
            "cache": {"max_model_len": 100, "prefix_caching": False},
            "parallel": DCP2,
        },
        [("full_attention", 32, True, 4, None, None, None), ("mamba", 16, False, 3, "none", None, None)],
        (32, 32, 32, False),
    ),
    # a uniform group's row is its widest leaf (7 + 3)
    (
        {
            "groups": [
                FA16,
                {
                    "kind": "uniform",
                    "block_size": 16,
                    "layers": [
                        {"kind": "mamba", "num_speculative_blocks": 1},
                        {"kind": "mamba", "num_speculative_blocks": 3},
                    ],
                },
            ],
            "cache": {"max_model_len": 100},
        },
        [("full_attention", 16, False, 7, None, None, None), ("uniform", 16, False, 10, "align", None, None)],
        (16, 16, 16, False),
    ),
    # a HiSparse hot group's row is its fixed hot region (blocks_per_request), not cdiv(max_model_len, span)
    (
        {
            "groups": [FA16, {"kind": "hisparse_hot", "block_size": 16, "blocks_per_request": 4}],
            "cache": {"max_model_len": 32},
        },
        [("full_attention", 16, False, 2, None, None, None), ("hisparse_hot", 16, False, 4, None, None, None)],
        (16, 16, 16, False),
    ),
    # an encoder-only group is not one the scheduler manages: L = H = 16, not lcm(16, 24)
    (
        {"groups": [FA16, {"kind": "encoder_only", "block_size": 24}]},
        [("full_attention", 16, False, None, None, None, None), ("encoder_only", 24, False, None, None, None, None)],
        (16, 16, 16, False),
    ),
    # ... unless it is the only group
    (
        {"groups": [{"kind": "encoder_only", "block_size": 24}]},
        [("encoder_only", 24, False, None, None, None, None)],
        (24, 24, 24, False),
    ),
    # dcp_sharded set explicitly on an attention group: sharded like the default (span 32, dealt)
    (
        {"groups": [{**FA16, "dcp_sharded": True}], "parallel": DCP2},
        [("full_attention", 32, True, None, None, None, None)],
        (32, 32, 32, False),
    ),
    # a Mamba group in mode all forces H = L (32), not the gcd 16
    (
        {"groups": [FA16, {"kind": "mamba", "block_size": 32, "mamba_cache_mode": "all"}]},
        [("full_attention", 16, False, None, None, None, None), ("mamba", 32, False, None, "all", None, None)],
        (32, 32, 32, False),
    ),
    # prefix caching off without a connector: no hash consumer, H = L
    (
        {"groups": [FA16, {"kind": "full_attention", "block_size": 32}], "cache": {"prefix_caching": False}},
        [("full_attention", 16, False, None, None, None, None), ("full_attention", 32, False, None, None, None, None)],
        (32, 32, 32, False),
    ),
    # prefix caching off with a connector: H is the gcd 16, but partial hash hits need prefix caching (A = L)
    (
        {
            "groups": [FA16, {"kind": "mamba", "block_size": 32, "mamba_cache_mode": "align"}],
            "cache": {"prefix_caching": False},
            "offload": {},
        },
        [("full_attention", 16, False, None, None, None, None), ("mamba", 32, False, None, "align", None, None)],
        (32, 16, 32, False),
    ),
    # multi-module MTP (P = 3): a sliding window without extra_retained_tokens gets P - 1 = 2 (window need
    # 32 - 1 + 2 = 33) ...
    (
        {"groups": [FA16, {"kind": "sliding_window", "block_size": 16, "sliding_window": 32}], "speculative": MTP3},
        [("full_attention", 16, False, None, None, None, None), ("sliding_window", 16, False, None, None, 33, 31)],
        (16, 16, 16, False),
    ),
    # ... an explicit 0 wins
    (
        {
            "groups": [
                FA16,
                {"kind": "sliding_window", "block_size": 16, "sliding_window": 32, "extra_retained_tokens": 0},
            ],
            "speculative": MTP3,
        },
        [("full_attention", 16, False, None, None, None, None), ("sliding_window", 16, False, None, None, 31, 31)],
        (16, 16, 16, False),
    ),
    # the Mamba layers of a uniform group get K = 2 speculative blocks too (7 + 2 = 9 > 7 + 1 of the explicit layer)
    (
        {
            "groups": [
                FA16,
                {
                    "kind": "uniform",
                    "block_size": 16,
                    "layers": [{"kind": "mamba"}, {"kind": "mamba", "num_speculative_blocks": 1}],
                },
            ],
            "speculative": EAGLE2,
            "cache": {"max_model_len": 100},
        },
        [("full_attention", 16, False, 7, None, None, None), ("uniform", 16, False, 9, "align", None, None)],
        (16, 16, 16, False),
    ),
    # a uniform group's sliding-window layer gets the drafter default P - 1 = 2 as well
    (
        {
            "groups": [
                FA16,
                {"kind": "uniform", "block_size": 16, "layers": [{"kind": "sliding_window", "sliding_window": 32}]},
            ],
            "speculative": MTP3,
        },
        [("full_attention", 16, False, None, None, None, None), ("uniform", 16, False, None, None, 33, 31)],
        (16, 16, 16, False),
    ),
    # a span of exactly int64 max is accepted (the bound is inclusive)
    (
        {"groups": [{"kind": "full_attention", "block_size": 2**63 - 1}]},
        [("full_attention", 2**63 - 1, False, None, None, None, None)],
        (2**63 - 1, 2**63 - 1, 2**63 - 1, False),
    ),
]


@pytest.mark.parametrize(("config", "groups", "units"), UNITS)
def test_derived_units(config, groups, units):
    geom = kvgeom.resolve(config)
    assert _groups(geom) == groups
    assert (geom.scheduler_block_size, geom.hash_block_size, geom.hit_alignment_tokens, geom.partial_hash_hits) == units


# (config, blocks_per_chunk, [(index, tokens_per_block, tokens_per_chunk, hashes_per_chunk, window_chunks)],
#  alignment_tokens, mamba_align_size, supports_partial_tail)
OFFLOAD = [
    # window 33 and chunk 33 over 16-token chunks: a window of sw tokens ending at the hit needs
    # cdiv(33, 16) = 3 chunks (not cdiv(32, 16) = 2); a local chunk of 33 tokens needs cdiv(33, 16) = 3 too
    (
        {
            "groups": [
                FA16,
                {"kind": "sliding_window", "block_size": 16, "sliding_window": 33},
                {"kind": "chunked_local", "block_size": 16, "attention_chunk_size": 33},
            ],
            "offload": {},
        },
        1,
        [(0, 16, 16, 1, None), (1, 16, 16, 1, 3), (2, 16, 16, 1, 3)],
        16,
        None,
        False,
    ),
    # offload.block_size 64 over one span 16: k = 64 // 16 = 4 blocks per chunk
    ({"groups": [FA16], "offload": {"block_size": 64}}, 4, [(0, 16, 64, 4, None)], 64, None, False),
    # full-attention chunks that differ: no alignment (the warning is pinned in WARNINGS)
    (
        {"groups": [FA16, {"kind": "full_attention", "block_size": 32}], "offload": {}},
        1,
        [(0, 16, 16, 1, None), (1, 32, 32, 2, None)],
        None,
        None,
        False,
    ),
    # the alignment is the full-attention chunk 16, not the larger Mamba chunk 32
    (
        {"groups": [FA16, {"kind": "mamba", "block_size": 32}], "offload": {}},
        1,
        [(0, 16, 16, 1, None), (1, 32, 32, 2, 1)],
        16,
        32,
        False,
    ),
    # a Mamba group in mode all also sets the Mamba chunk grid
    (
        {
            "groups": [
                {"kind": "full_attention", "block_size": 32},
                {"kind": "mamba", "block_size": 32, "mamba_cache_mode": "all"},
            ],
            "offload": {},
        },
        1,
        [(0, 32, 32, 1, None), (1, 32, 32, 1, 1)],
        32,
        32,
        False,
    ),
    # partial tails: an align Mamba group whose span is > H (16 > 8) ...
    (
        {"groups": [FA16, M16], "cache": {"prefix_match_unit": 8}, "offload": {}},
        1,
        [(0, 16, 16, 2, None), (1, 16, 16, 2, 1)],
        16,
        16,
        True,
    ),
    # ... not = H (16 = 16)
    ({"groups": [FA16, M16], "offload": {}}, 1, [(0, 16, 16, 1, None), (1, 16, 16, 1, 1)], 16, 16, False),
    # ... a span > H without a Mamba group is not enough
    (
        {"groups": [FA16, {**FA16, "num_kv_heads": 4}], "cache": {"prefix_match_unit": 8}, "offload": {}},
        1,
        [(0, 16, 16, 2, None), (1, 16, 16, 2, None)],
        16,
        None,
        False,
    ),
    # ... and a sliding-window or chunked-local group turns them off
    (
        {
            "groups": [FA16, M16, {"kind": "sliding_window", "block_size": 16, "sliding_window": 32}],
            "cache": {"prefix_match_unit": 8},
            "offload": {},
        },
        1,
        [(0, 16, 16, 2, None), (1, 16, 16, 2, 1), (2, 16, 16, 2, 2)],
        16,
        16,
        False,
    ),
    (
        {
            "groups": [FA16, M16, {"kind": "chunked_local", "block_size": 16, "attention_chunk_size": 32}],
            "cache": {"prefix_match_unit": 8},
            "offload": {},
        },
        1,
        [(0, 16, 16, 2, None), (1, 16, 16, 2, 1), (2, 16, 16, 2, 2)],
        16,
        16,
        False,
    ),
]


@pytest.mark.parametrize(("config", "k", "rows", "alignment", "mamba_align", "partial_tail"), OFFLOAD)
def test_offload_chunk_geometry(config, k, rows, alignment, mamba_align, partial_tail):
    off = kvgeom.resolve(config).offload
    assert off is not None
    got = [(o.index, o.tokens_per_block, o.tokens_per_chunk, o.hashes_per_chunk, o.window_chunks) for o in off.groups]
    assert (off.blocks_per_chunk, got) == (k, rows)
    assert (off.alignment_tokens, off.mamba_align_size, off.supports_partial_tail) == (
        alignment,
        mamba_align,
        partial_tail,
    )
    assert off.tokens_per_hash == kvgeom.resolve(config).hash_block_size
    # token and hash counts are ints (a float 2.0 would print as "2.0" in reports)
    assert type(off.blocks_per_chunk) is int
    assert all(type(x) is int for o in off.groups for x in (o.tokens_per_block, o.tokens_per_chunk, o.hashes_per_chunk))


# (config, index of the problem, its code, words its message must hold): the reason and the numbers a
# message gives are its contract
MESSAGES = [
    # why H equals L when an offloaded span is not a multiple of it: with an offload section (a hash
    # consumer) only a Mamba group in mode none (the default without prefix caching) or all makes H = L
    # while spans differ, so the message always gives that reason
    (
        {
            "groups": [{"kind": "full_attention", "block_size": 32}, M16],
            "cache": {"prefix_caching": False},
            "offload": {},
        },
        0,
        "tokens_per_block_not_divisible",
        ["L=32 here because a Mamba group is not in align mode:"],
    ),
    (
        {
            "groups": [
                {**M16, "mamba_cache_mode": "all"},
                {"kind": "mamba", "block_size": 32, "mamba_cache_mode": "all"},
            ],
            "offload": {},
        },
        0,
        "tokens_per_block_not_divisible",
        ["L=32 here because a Mamba group is not in align mode:"],
    ),
    # why a group has its span: dealt over 2 shards, replicated, or sharded at dcp=1 (its own block size)
    (
        {"groups": [FA16, M16], "parallel": DCP2, "cache": {"prefix_match_unit": 64}},
        0,
        "span_not_divisible_by_hash_unit",
        ["the group is DCP-sharded, so its span is block_size*kv_shards = 16*2 = 32"],
    ),
    (
        {"groups": [FA16, M16], "parallel": DCP2, "cache": {"prefix_match_unit": 64}},
        1,
        "span_not_divisible_by_hash_unit",
        ["the group is replicated across DCP ranks, so its span is its block_size 16"],
    ),
    (
        {"groups": [{"kind": "full_attention", "block_size": 24}, FA16], "cache": {"prefix_match_unit": 16}},
        0,
        "span_not_divisible_by_hash_unit",
        ["(prefix_match_unit=16); its span is its block_size 24."],
    ),
    # how the KV shards come about: dcp alone, or dcp x pcp in the pre-#46570 design
    (
        {"groups": [FA16, {"kind": "sliding_window", "block_size": 16, "sliding_window": 64}], "parallel": DCP2},
        0,
        "sharded_kind_under_dcp",
        ["dealt across 2 KV shards (dcp=2), but"],
    ),
    (
        {
            "groups": [FA16, {"kind": "sliding_window", "block_size": 16, "sliding_window": 64}],
            "parallel": {"tp": 2, "pcp": 2, "dcp": 2, "pcp_shards_kv": True},
        },
        0,
        "sharded_kind_under_dcp",
        ["dealt across 4 KV shards (dcp=2 x pcp=2, pcp_shards_kv), but"],
    ),
]


@pytest.mark.parametrize(("config", "i", "code", "words"), MESSAGES)
def test_message_reason_and_numbers(config, i, code, words):
    with pytest.raises(KVGeomError) as info:
        kvgeom.resolve(config)
    problem = info.value.problems[i]
    assert problem.code == code
    for w in words:
        assert w in problem.message, (w, problem.message)


def fa(b: int, **kw: Any) -> dict[str, Any]:
    return {"kind": "full_attention", "block_size": b, **kw}


MALL32 = {"kind": "mamba", "block_size": 32, "mamba_cache_mode": "all"}
CL16 = {"kind": "chunked_local", "block_size": 16, "attention_chunk_size": 64}

# (config, [(warning code, words its message must hold)]): the exact warnings, in resolve()'s order, on
# both sides of each warning's rule
WARNINGS = [
    # lcm blow-up: L = lcm(16, 24) = 48 is above every span, hits land on L ...
    (
        {"groups": [FA16, fa(24)]},
        [
            (
                "scheduler_block_lcm_blowup",
                "L=lcm(16, 24)=48 is larger than every group's span; prefix-cache hits land on "
                "multiples of L, so prompts sharing fewer than 48 tokens never hit",
            )
        ],
    ),
    # ... or on A with partial hash hits (A = 8 < L = 96)
    (
        {"groups": [fa(24), {"kind": "mamba", "block_size": 32}], "cache": {"prefix_match_unit": 8}},
        [
            (
                "scheduler_block_lcm_blowup",
                "hits still land on multiples of A=8 (partial hash hits), but the local prefix an "
                "offload connector starts from is rounded down to L=96",
            )
        ],
    ),
    # L equal to the largest span, or one group: no blow-up
    ({"groups": [FA16, fa(32)]}, []),
    ({"groups": [FA16]}, []),
    # hit floor: A = 128 is exactly 8x the smallest span 16 (the bound is inclusive) ...
    (
        {"groups": [FA16, fa(128)]},
        [("hit_floor", "multiples of A=128 tokens, 8x the smallest span 16: prompts sharing fewer than 128 tokens")],
    ),
    # ... not without prefix caching, and not without a cacheable group
    ({"groups": [FA16, fa(128)], "cache": {"prefix_caching": False}}, []),
    ({"groups": [fa(16, prefix_cacheable=False)]}, []),
    # offload chunk longer than max_model_len (16 > 15), not equal to it
    (
        {"groups": [FA16], "offload": {}, "cache": {"max_model_len": 15}},
        [("offload_chunk_exceeds_max_model_len", "offload chunks [16] of groups [0] exceed max_model_len=15")],
    ),
    ({"groups": [FA16], "offload": {}, "cache": {"max_model_len": 16}}, []),
    # partial tails at dcp=1 are on: nothing disables them
    ({"groups": [FA16, M16], "offload": {}, "cache": {"prefix_match_unit": 8}}, []),
    # retention past max_model_len, with and without offloading; not equal to it, not without max_model_len,
    # not without an interval
    (
        {"groups": [FA16, M16], "offload": {}, "cache": {"retention_interval": 1024, "max_model_len": 512}},
        [("retention_unreachable", "retention_interval=1024 exceeds max_model_len=512")],
    ),
    (
        {"groups": [FA16, M16], "cache": {"retention_interval": 1024, "max_model_len": 512}},
        [("retention_unreachable", "retention_interval=1024 exceeds max_model_len=512")],
    ),
    ({"groups": [FA16, M16], "offload": {}, "cache": {"retention_interval": 512, "max_model_len": 512}}, []),
    ({"groups": [FA16, M16], "cache": {"retention_interval": 512, "max_model_len": 512}}, []),
    ({"groups": [FA16, M16], "offload": {}, "cache": {"retention_interval": 1024}}, []),
    ({"groups": [FA16, M16], "offload": {}, "cache": {"max_model_len": 512}}, []),
    # a chunked-local group whose block (16) is not A (32), with prefix caching on; not with it off
    (
        {"groups": [fa(32), CL16]},
        [
            (
                "chunked_local_block_mismatch",
                "group 1 (chunked_local) has block_size=16 but prefix-cache hits land on multiples of A=32",
            )
        ],
    ),
    ({"groups": [fa(32), CL16], "cache": {"prefix_caching": False}}, []),
    # an ignored prefix_match_unit: each of the three reasons, and H = L = 32
    (
        {"groups": [FA16, fa(32)], "cache": {"prefix_match_unit": 8, "prefix_caching": False}},
        [
            (
                "prefix_match_unit_ignored",
                "prefix_match_unit=8 is ignored because nothing consumes hashes (prefix caching "
                "and offloading are off); H = L = 32.",
            )
        ],
    ),
    (
        {"groups": [FA16, MALL32], "cache": {"prefix_match_unit": 8}},
        [
            (
                "prefix_match_unit_ignored",
                "prefix_match_unit=8 is ignored because group 1 (mamba) is not in align mode, "
                "which forces H = L; H = L = 32.",
            ),
            ("mamba_mode_all_legacy", "group 1 (mamba) uses mamba_cache_mode='all'"),
        ],
    ),
    (
        {"groups": [fa(16, prefix_cacheable=False), fa(32, prefix_cacheable=False)], "cache": {"prefix_match_unit": 8}},
        [
            (
                "prefix_match_unit_ignored",
                "prefix_match_unit=8 is ignored because no group is prefix-cacheable; H = L = 32.",
            )
        ],
    ),
    # ... not when it equals L, nor when it is not set
    ({"groups": [FA16, MALL32], "cache": {"prefix_match_unit": 32}}, [("mamba_mode_all_legacy", "group 1 (mamba)")]),
    ({"groups": [FA16, MALL32]}, [("mamba_mode_all_legacy", "group 1 (mamba)")]),
    # a chunked-local group whose block is A (16): no warning
    ({"groups": [FA16, CL16]}, []),
    # the connector's warning first, then the geometry's: hit floor before the offload ones
    (
        {"groups": [FA16, fa(128)], "offload": {}},
        [
            ("alignment_tokens_none", "different chunks [16, 128]"),
            ("hit_floor", "multiples of A=128 tokens, 8x the smallest span 16"),
            ("offload_hit_floor", "complete full-attention chunks of 128 tokens, 8x the smallest span"),
        ],
    ),
    # the order: the hash unit's warning, the connector's, then the geometry's
    (
        {"groups": [fa(32), {**MALL32}], "cache": {"prefix_match_unit": 8, "max_model_len": 16}, "offload": {}},
        [
            ("prefix_match_unit_ignored", "prefix_match_unit=8"),
            ("offload_chunk_exceeds_max_model_len", "offload chunks [32, 32] of groups [0, 1] exceed max_model_len=16"),
            ("mamba_mode_all_legacy", "group 1 (mamba)"),
        ],
    ),
]


@pytest.mark.parametrize(("config", "want"), WARNINGS)
def test_warnings_at_the_edges(config, want):
    warnings = kvgeom.resolve(config).warnings
    assert [w.code for w in warnings] == [code for code, _ in want]
    for w, (_, words) in zip(warnings, want, strict=True):
        assert words in w.message, (words, w.message)


@pytest.mark.parametrize(
    ("span", "H", "fine", "margin"),
    [
        (32, 16, True, 16),  # fine-grained lookups and span > H: one hash unit
        (32, 16, False, 32),  # no fine-grained lookups: the whole span
        (16, 16, True, 16),  # span = H: the span (which is H)
        (16, 8, False, 16),
    ],
)
def test_eagle_proof_margin(span, H, fine, margin):
    from kvgeom.speculative import eagle_proof_margin

    assert eagle_proof_margin(span, H, fine) == margin


E3 = {"method": "eagle", "num_speculative_tokens": 3}

# (config past the groups, (method, K, block_drop, lookahead_hashes, gpu_drop, P), GPU drop groups) for one
# 16-token full-attention group: the module invariants of kvgeom/_resolve/speculative.py, one row per switch
SPECULATIVE = [
    ({"speculative": E3}, ("eagle", 3, True, True, False, 1), []),
    ({"speculative": {"method": "eagle3", "num_speculative_tokens": 2}}, ("eagle3", 2, True, True, False, 1), []),
    # P = K only for multi-module MTP: min(mtp_modules, K) > 1
    ({"speculative": MTP3}, ("mtp", 3, True, True, False, 3), []),
    ({"speculative": {**MTP3, "mtp_modules": 1}}, ("mtp", 3, True, True, False, 1), []),
    ({"speculative": {**MTP3, "num_speculative_tokens": 1}}, ("mtp", 1, True, True, False, 1), []),
    # dflash drafts from hidden states (P = 1) but drops nothing; ngram neither
    ({"speculative": {"method": "dflash", "num_speculative_tokens": 3}}, ("dflash", 3, False, False, False, 1), []),
    ({"speculative": {"method": "ngram", "num_speculative_tokens": 3}}, ("ngram", 3, False, False, False, 0), []),
    # the drop switched off; a connector or lookahead_hashes=false turn lookahead hashes off and the GPU drop on
    ({"speculative": {**E3, "eagle_block_drop": False}}, ("eagle", 3, False, False, False, 1), []),
    ({"speculative": E3, "offload": {}}, ("eagle", 3, True, False, True, 1), [0]),
    ({"speculative": {**E3, "lookahead_hashes": False}}, ("eagle", 3, True, False, True, 1), [0]),
    # without prefix caching nothing is looked up, so nothing drops
    ({"speculative": E3, "cache": {"prefix_caching": False}}, ("eagle", 3, True, False, False, 1), []),
]


@pytest.mark.parametrize(("extra", "want", "drop"), SPECULATIVE)
def test_speculative_switches(extra, want, drop):
    geom = kvgeom.resolve({"groups": [FA16], **extra})
    s = geom.speculative
    assert s is not None
    assert (
        s.method,
        s.num_speculative_tokens,
        s.block_drop,
        s.lookahead_hashes,
        s.gpu_drop,
        s.prefill_lookahead_tokens,
    ) == want
    assert sorted(geom.gpu_drop_groups) == drop


def _uniform(drafter: bool = False, **layer: Any) -> dict[str, Any]:
    """A uniform group of one MLA layer (``layer`` its keys); ``drafter`` flags the group."""
    out: dict[str, Any] = {"kind": "uniform", "block_size": 16, "layers": [{"kind": "mla", **layer}]}
    return {**out, "drafter": True} if drafter else out


def _uniform_drafter_layer(**layer: Any) -> dict[str, Any]:
    """A uniform group of one MLA layer that carries the drafter flag itself."""
    return {"kind": "uniform", "block_size": 16, "layers": [{"kind": "mla", "drafter": True, **layer}]}


# (config, GPU drop groups, [(eagle_group, proof_margin)], offloaded [(eagle_group, proof_margin)])
DRAFTERS = [
    # a uniform group equal to the flagged drafter group but for the flag joins its lookup group (vLLM's
    # is_draft is compare=False); one whose layers differ does not
    (
        {
            "groups": [_uniform(), _uniform(True, num_kv_heads=4), _uniform(num_kv_heads=4)],
            "speculative": EAGLE2,
            "offload": {},
        },
        [1, 2],
        [(False, None), (True, 16), (False, 16)],
        [(False, None), (True, None), (False, None)],
    ),
    # the same with the drafter flag on the uniform group's layer instead of the group
    (
        {
            "groups": [_uniform(), _uniform_drafter_layer(num_kv_heads=4), _uniform(num_kv_heads=4)],
            "speculative": EAGLE2,
            "offload": {},
        },
        [1, 2],
        [(False, None), (True, 16), (False, 16)],
        [(False, None), (True, None), (False, None)],
    ),
    # no flagged group: every group drops; without partial hash hits the margin is the whole span (32, not H = 16)
    (
        {"groups": [fa(32), FA16], "speculative": EAGLE2, "offload": {}},
        [0, 1],
        [(False, 32), (False, 16)],
        [(False, None), (False, None)],
    ),
    # one offloaded group, the drafter: the connector's eagle group has no margin without partial tails
    (
        {"groups": [{**FA16, "drafter": True}], "speculative": EAGLE2, "offload": {}},
        [0],
        [(True, 16)],
        [(True, None)],
    ),
    # no partial tails (Mamba span 16 = H): no offload margin for any group, flagged or not
    (
        {"groups": [FA16, M16, {**FA16, "num_kv_heads": 4, "drafter": True}], "speculative": EAGLE2, "offload": {}},
        [2],
        [(False, None), (False, None), (True, 16)],
        [(False, None), (False, None), (True, None)],
    ),
    # partial tails (H = 8 < Mamba span 16) with partial hash hits: the eagle group keys its tail at one hash
    # unit (8) ...
    (
        {
            "groups": [{**FA16, "drafter": True}, M16],
            "speculative": EAGLE2,
            "offload": {},
            "cache": {"prefix_match_unit": 8},
        },
        [0],
        [(True, 8), (False, None)],
        [(True, 8), (False, None)],
    ),
    # ... and without them (prefix caching off, an explicit align Mamba group) at the whole span 16
    (
        {
            "groups": [{**FA16, "drafter": True}, {**M16, "mamba_cache_mode": "align"}],
            "speculative": EAGLE2,
            "offload": {},
            "cache": {"prefix_caching": False, "prefix_match_unit": 8},
        },
        [],
        [(True, None), (False, None)],
        [(True, 16), (False, None)],
    ),
]


@pytest.mark.parametrize(("config", "drop", "groups", "offloaded"), DRAFTERS)
def test_drafter_groups(config, drop, groups, offloaded):
    geom = kvgeom.resolve(config)
    assert sorted(geom.gpu_drop_groups) == drop
    assert [(g.eagle_group, g.proof_margin) for g in geom.groups] == groups
    assert geom.offload is not None
    assert [(o.eagle_group, o.proof_margin) for o in geom.offload.groups] == offloaded


DRAFT16 = {**FA16, "num_kv_heads": 4, "drafter": True}

# (config, [(warning code, words its message must hold)]) for the drafter hazards: the pop-vs-Mamba-shift
# warning names each reason C != A (dcp scaling a dealt drafter, blocks_per_chunk > 1, a Mamba chunk not
# dividing A) and only those
SPECULATIVE_WARNINGS = [
    # dcp=2 deals the drafter (span 32 = C, A = 16): the only reason is dcp
    (
        {"groups": [FA16, M16, DRAFT16], "parallel": DCP2, "speculative": EAGLE2, "offload": {}},
        [("speculative_pop_vs_mamba_shift", "C=32 of eagle group 2 (dcp=2 scales the drafter's span to 32):")],
    ),
    # a replicated drafter at dcp=2 with k = 2: blocks_per_chunk and the Mamba chunk 32 not dividing A = 16
    (
        {
            "groups": [FA16, M16, {**DRAFT16, "dcp_sharded": False}],
            "parallel": DCP2,
            "speculative": EAGLE2,
            "offload": {"blocks_per_chunk": 2},
        },
        [
            ("alignment_tokens_none", "different chunks [64, 32]"),
            (
                "speculative_pop_vs_mamba_shift",
                "C=32 of eagle group 2 (blocks_per_chunk=2; the Mamba chunk 32 does not divide A):",
            ),
        ],
    ),
    # KV shards from pcp_shards_kv at dcp=1: dcp is not a reason, k = 2 is
    (
        {
            "groups": [FA16, M16, DRAFT16],
            "parallel": {"tp": 2, "pcp": 2, "pcp_shards_kv": True},
            "speculative": EAGLE2,
            "offload": {"blocks_per_chunk": 2},
        },
        [("speculative_pop_vs_mamba_shift", "C=64 of eagle group 2 (blocks_per_chunk=2):")],
    ),
    # no GPU drop (prefix caching off): no pop warning even though C = 32 != A = 16
    (
        {
            "groups": [{**FA16, "drafter": True}, {**M16, "mamba_cache_mode": "align"}],
            "speculative": EAGLE2,
            "offload": {"blocks_per_chunk": 2},
            "cache": {"prefix_caching": False},
        },
        [],
    ),
    # a sliding-window drafter, window 1, extra 0: sw - 1 + extra = 0 reaches nothing
    (
        {
            "groups": [
                FA16,
                M16,
                {
                    "kind": "sliding_window",
                    "block_size": 16,
                    "sliding_window": 1,
                    "drafter": True,
                    "extra_retained_tokens": 0,
                },
            ],
            "offload": {},
            "speculative": EAGLE2,
        },
        [],
    ),
    # a sliding-window drafter, window 2, extra 0: sw - 1 + extra = 1 > 0
    (
        {
            "groups": [
                FA16,
                M16,
                {
                    "kind": "sliding_window",
                    "block_size": 16,
                    "sliding_window": 2,
                    "drafter": True,
                    "extra_retained_tokens": 0,
                },
            ],
            "offload": {},
            "speculative": EAGLE2,
        },
        [("speculative_sliding_drafter_offload", "is a sliding-window eagle group (window 2, extra 0)")],
    ),
    # a sliding-window drafter, window 2, extra 2: sw - 1 + extra = 3
    (
        {
            "groups": [
                FA16,
                M16,
                {
                    "kind": "sliding_window",
                    "block_size": 16,
                    "sliding_window": 2,
                    "drafter": True,
                    "extra_retained_tokens": 2,
                },
            ],
            "offload": {},
            "speculative": EAGLE2,
        },
        [("speculative_sliding_drafter_offload", "is a sliding-window eagle group (window 2, extra 2)")],
    ),
    # a sliding-window drafter, window 1, extra 1: sw - 1 + extra = 1: the extra retained token reaches back
    (
        {
            "groups": [
                FA16,
                M16,
                {
                    "kind": "sliding_window",
                    "block_size": 16,
                    "sliding_window": 1,
                    "drafter": True,
                    "extra_retained_tokens": 1,
                },
            ],
            "offload": {},
            "speculative": EAGLE2,
        },
        [("speculative_sliding_drafter_offload", "is a sliding-window eagle group (window 1, extra 1)")],
    ),
    # multi-module MTP without the drop and an align Mamba group: P = 2 stalls ...
    (
        {
            "groups": [FA16, M16],
            "speculative": {**MTP3, "num_speculative_tokens": 2, "mtp_modules": 2, "eagle_block_drop": False},
        },
        [("speculative_mtp_prefill_stall", "multi-module MTP reserves P=2 prefill tokens")],
    ),
    # ... single-module MTP (P = 1) does not
    (
        {"groups": [FA16, M16], "speculative": {**MTP3, "mtp_modules": 1, "eagle_block_drop": False}},
        [],
    ),
]


@pytest.mark.parametrize(("config", "want"), SPECULATIVE_WARNINGS)
def test_speculative_warnings_name_their_reasons(config, want):
    warnings = kvgeom.resolve(config).warnings
    assert [w.code for w in warnings] == [code for code, _ in want]
    for w, (_, words) in zip(warnings, want, strict=True):
        assert words in w.message, (words, w.message)
