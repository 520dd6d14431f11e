"""Block-size resolution from layer shapes (docs/resolution.md, LMCache #4809)."""

from __future__ import annotations

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

import kvgeom
from kvgeom.errors import ConfigError, GeometryError
from kvgeom.resolution import resolve_block_sizes

BF16 = 2


def full(heads=2, head=128, count=1, **kw):
    return {
        "kind": "full_attention",
        "num_kv_heads": heads,
        "head_size": head,
        "dtype": "bfloat16",
        "count": count,
        **kw,
    }


def mamba(shapes, dtypes, count=1, **kw):
    return {"kind": "mamba", "shapes": shapes, "dtypes": dtypes, "count": count, **kw}


MLA = {"kind": "mla", "head_size": 576, "dtype": "bfloat16"}


def layered(layers, block_size=16, **sections):
    return {"model": {"block_size": block_size, "layers": layers}, **sections}


def test_example_11_glm5next_like_256_to_2304_at_dcp4():
    # LMCache #4809: CLI --block-size 256, vLLM resolves 2304-token pages, DCP 4.
    # The real GLM5Next shapes are not in the issue; these GLM5Next-like shapes give the same numbers:
    #   MLA latent 576 bf16 -> a = 576*2 = 1152 bytes per token per rank (MLA is not split by TP)
    #   linear-attention state at TP 4: ssm 144/4 = 36 heads x 128 x 128 float32 = 2,359,296 bytes
    #                                   conv 3 x 36864/4 = 9216 bfloat16       =    55,296 bytes
    #   m = 2,414,592 bytes
    #   K = max(kmin 16, CLI 256, MLA minimum 128) = 256; page(K) = 256 * 1152 = 294,912
    #   attention block = 256 * cdiv(2,414,592, 294,912) = 256 * 9 = 2304 (8.19 pages rounded up)
    #   Mamba page padded to 2304 * 1152 = 2,654,208: 9.92 %
    cfg = layered(
        [
            {**MLA, "count": 20, "name": "mla"},
            {
                "kind": "mamba",
                "name": "linear",
                "count": 60,
                "total_shapes": [[144, 128, 128], [3, 36864]],
                "tp_axes": [0, 1],
                "dtypes": ["float32", "bfloat16"],
            },
        ],
        block_size=256,
        parallel={"tp": 4, "dcp": 4},
        offload={},
    )
    r = resolve_block_sizes(cfg)
    assert (r.cli_block_size, r.attention_block_size, r.mamba_block_size) == (256, 2304, 2304)
    assert r.page_bytes == 2304 * 576 * BF16
    [pad] = r.padding
    assert (pad.layer, pad.real_bytes, pad.page_bytes, pad.count) == ("linear", 2414592, 2654208, 60)
    assert round(pad.percent, 2) == 9.92
    g = kvgeom.resolve(r.config)
    # correct per #4834: attention span 2304*4 = 9216, Mamba span 2304, L = lcm = 9216 (buggy: 256*4 = 1024)
    assert [x.span for x in g.groups] == [9216, 2304, 2304, 2304]
    assert g.scheduler_block_size == 9216
    assert g.hash_block_size == 2304
    # 20 MLA + 60 linear layers: groups of 20 layers (vLLM's equal-layer-count grouping)
    assert [len(x) for x in r.group_layers] == [20, 20, 20, 20]
    assert r.engine_block_size == 2304


CASES = [
    # plain hybrid: a = 2*256*2 = 1024 B/token, m = 16*64*64*4 = 262144 -> 16*cdiv(262144, 16384) = 256, no padding
    ("exact_fit", [full(), mamba([[16, 64, 64]], ["float32"])], {}, 256, 256, []),
    # + conv 3x256 bf16: m = 263680 -> 16*17 = 272, padding (278528-263680)/263680 = 5.63 %
    ("padded", [full(), mamba([[16, 64, 64], [3, 256]], ["float32", "bfloat16"])], {}, 272, 272, [5.63]),
    # kernel lcm 64 on the attention backend: 272 rounded up to 320 (_align_hybrid_block_size)
    (
        "kernel_lcm",
        [full(kernel_block_size=64), mamba([[16, 64, 64], [3, 256]], ["float32", "bfloat16"])],
        {},
        320,
        320,
        [round(100 * (320 * 1024 - 263680) / 263680, 2)],
    ),
    # MLA hybrid: K = max(16, 128) = 128; page(128) = 147456 >= m = 100000 -> 128 (would be 96 without the minimum)
    (
        "mla_minimum_128",
        [MLA, mamba([[25000]], ["float32"])],
        {},
        128,
        128,
        [round(100 * (147456 - 100000) / 100000, 2)],
    ),
    # prefill-checkpoint alignment 48 on every Mamba layer: K = lcm(16, 48) = 48, 48*cdiv(262144, 49152) = 48*6 = 288
    (
        "prefill_checkpoint_lcm",
        [full(), mamba([[16, 64, 64]], ["float32"], prefill_checkpoint_alignment=48)],
        {},
        288,
        288,
        [round(100 * (288 * 1024 - 262144) / 262144, 2)],
    ),
    # CLI block above the needed one: kept (only raised, never lowered); Mamba padded 100 %
    ("cli_above_needed", [full(), mamba([[16, 64, 64]], ["float32"])], {"block_size": 512}, 512, 512, [100.0]),
    # prefix caching off: mode none, Mamba block = max_model_len, attention block still raised
    (
        "mode_none",
        [full(), mamba([[16, 64, 64]], ["float32"])],
        {"cache": {"prefix_caching": False, "max_model_len": 8192}},
        256,
        8192,
        [],
    ),
]


@pytest.mark.parametrize(("name", "layers", "extra", "attn", "mamba_block", "pads"), CASES, ids=[c[0] for c in CASES])
def test_hybrid_block_raise_table(name, layers, extra, attn, mamba_block, pads):
    extra = dict(extra)
    block = extra.pop("block_size", 16)
    r = resolve_block_sizes(layered(layers, block_size=block, **extra))
    assert r.attention_block_size == attn
    assert r.mamba_block_size == mamba_block
    assert [round(p.percent, 2) for p in r.padding] == pads
    kvgeom.resolve(r.config)  # the result is a legal kvgeom config


def test_prefill_checkpoint_alignment_needs_every_mamba_layer():
    # one Mamba layer without an alignment: K stays 16 -> 256 ("when every Mamba layer declares one")
    layers = [
        full(),
        mamba([[16, 64, 64]], ["float32"], prefill_checkpoint_alignment=48),
        mamba([[16, 64, 64]], ["float32"]),
    ]
    assert resolve_block_sizes(layered(layers)).attention_block_size == 256


def test_mamba_cache_mode_promotion_is_noted():
    # vLLM 0.33 promotes none -> align with prefix caching on (MambaModelConfig)
    cfg = layered([full(), mamba([[16, 64, 64]], ["float32"])])
    cfg["model"]["mamba_cache_mode"] = "none"
    r = resolve_block_sizes(cfg)
    assert r.mamba_cache_mode == "align"
    assert any("becomes 'align'" in n for n in r.notes)


def test_tp_moves_the_hybrid_block_41037():
    # #41037: alignment uses per-rank heads, so TP changes the block. Attention 8 KV heads total; the Mamba ssm
    # is split by TP but the conv state is replicated (tp_axes null):
    #   tp=2: a = 4*256*2 = 2048; m = 16*64*64*4 + 3*4096*2 = 286720; 16*cdiv(286720, 32768) = 16*9 = 144
    #   tp=4: a = 1024;           m =  8*64*64*4 + 24576    = 155648; 16*cdiv(155648, 16384) = 16*10 = 160
    def at(tp):
        return resolve_block_sizes(
            layered(
                [
                    {"kind": "full_attention", "total_num_kv_heads": 8, "head_size": 128, "dtype": "bfloat16"},
                    {
                        "kind": "mamba",
                        "total_shapes": [[32, 64, 64], [3, 4096]],
                        "tp_axes": [0, None],
                        "dtypes": ["float32", "bfloat16"],
                    },
                ],
                parallel={"tp": tp},
            )
        )

    assert at(2).attention_block_size == 144
    assert at(4).attention_block_size == 160


def test_pp_stage_without_attention_gets_the_same_block_51752():
    # #51752: stage 1 owns only Mamba layers; unfixed vLLM kept 16 there while stage 0 got 256, and the offloading
    # config failed "tokens_per_block=16 not divisible by tokens_per_hash=256". Aligned once (#51764): all 256.
    cfg = layered(
        [
            full(count=2, pp_stage=0),
            mamba([[16, 64, 64]], ["float32"], count=2, pp_stage=0),
            mamba([[16, 64, 64]], ["float32"], count=4, pp_stage=1),
        ],
        parallel={"pp": 2},
        offload={},
    )
    r = resolve_block_sizes(cfg)
    assert {g["block_size"] for g in r.config["groups"]} == {256}
    # 2 attention + 6 Mamba layers: groups of 2, the Mamba layers dealt round-robin over 3 groups (vLLM 0.33
    # layers[i::3], run on vLLM: (m0, m3), (m1, m4), (m2, m5)), so a group mixes stages
    assert r.group_stages == ((0,), (0, 1), (0, 1), (1,))
    assert r.group_layers[1:] == (("layers[1]#0", "layers[2]#1"), ("layers[1]#1", "layers[2]#2"),
                                  ("layers[2]#0", "layers[2]#3"))
    g = kvgeom.resolve(r.config)
    assert {o.tokens_per_block for o in g.offload.groups} == {256}


def test_page_unification_scales_attention_that_divides():
    # pages: full attention 2 heads (16384 B at 16) next to sliding window 4 heads (32768 B at 16): the smaller page
    # divides the larger, so the full-attention block doubles to 32
    r = resolve_block_sizes(
        layered(
            [
                full(heads=2),
                {
                    "kind": "sliding_window",
                    "sliding_window": 1024,
                    **{k: v for k, v in full(heads=4).items() if k != "kind"},
                },
            ]
        )
    )
    blocks = {g["kind"]: g["block_size"] for g in r.config["groups"]}
    assert blocks == {"full_attention": 32, "sliding_window": 16}
    assert r.page_bytes == 32768


def test_page_unification_pads_non_mla_attention_that_does_not_divide():
    # pages: full attention 2 heads (16384 B) vs sliding window 3 heads (24576 B): 24576 % 16384 != 0 -> full padded
    swa = {**full(heads=3), "kind": "sliding_window", "sliding_window": 1024}
    r = resolve_block_sizes(layered([full(heads=2), swa]))
    [pad] = r.padding
    assert (pad.kind, pad.real_bytes, pad.page_bytes) == ("full_attention", 16384, 24576)
    assert r.config["groups"][0]["page_size_padded"] == 24576


def test_sliding_window_takes_largest_kernel_multiple_that_fits():
    # pages (0.33): full 4 heads (32768 B at 16) + sliding window 1 head (8192 B per 16 tokens): 4 kernels fit -> 64
    swa = {**full(heads=1), "kind": "sliding_window", "sliding_window": 512}
    r = resolve_block_sizes(layered([full(heads=4), swa]))
    assert [g["block_size"] for g in r.config["groups"]] == [16, 64]


def test_mla_page_not_dividing_is_an_error():
    # pages: MLA 576 bf16 at 16 = 18432 B vs sliding window 8 heads = 65536 B; 65536 % 18432 != 0 and MLA cannot be
    # padded (vLLM: NotImplementedError "Padding is only supported for non-MLA attention layers")
    swa = {**full(heads=8), "kind": "sliding_window", "sliding_window": 1024}
    with pytest.raises(GeometryError) as info:
        resolve_block_sizes(layered([MLA, swa]))
    assert info.value.code == "mla_page_not_divisible"
    assert info.value.values == {"page_bytes": 18432, "shared_page_bytes": 65536}


def test_dsa_mla_and_indexer_become_one_uniform_group():
    # DSA: MLA + indexer layers share the block, one family -> one uniform container (UniformTypeKVCacheSpecs)
    idx = {"kind": "mla", "cache_role": "indexer", "head_size": 132, "dtype": "uint8", "count": 2}
    r = resolve_block_sizes(layered([{**MLA, "count": 2}, idx], block_size=64, parallel={"tp": 2, "dcp": 2}))
    [group] = r.config["groups"]
    assert group["kind"] == "uniform" and len(group["layers"]) == 4
    g = kvgeom.resolve(r.config)
    assert g.groups[0].span == 128  # the container is sharded like its layers (#50883)


def test_pure_attention_is_one_group_at_the_cli_block():
    r = resolve_block_sizes(layered([full(count=32)], block_size=32))
    assert r.config["groups"] == [
        {"kind": "full_attention", "block_size": 32, "num_kv_heads": 2, "head_size": 128, "dtype": "bfloat16"}
    ]
    assert r.padding == () and r.mamba_block_size is None


ERRORS = [
    # heads that TP cannot split evenly
    (
        layered(
            [{"kind": "full_attention", "total_num_kv_heads": 6, "head_size": 128, "dtype": "bfloat16"}],
            parallel={"tp": 4},
        ),
        "heads_not_divisible_by_tp",
        "model.layers[0].total_num_kv_heads",
    ),
    # a stage past parallel.pp
    (layered([full(pp_stage=2)], parallel={"pp": 2}), "pp_stage_out_of_range", "model.layers[0].pp_stage"),
    # a Mamba field on an attention layer
    (layered([full(dtypes=["float32"])]), "invalid_value", "model.layers[0]"),
    # attention layer without a dtype
    (layered([{"kind": "full_attention", "num_kv_heads": 2, "head_size": 64}]), "invalid_value", "model.layers[0]"),
    # prefix caching off needs max_model_len for the Mamba block
    (
        layered([full(), mamba([[4]], ["float32"])], cache={"prefix_caching": False}),
        "max_model_len_required",
        "cache.max_model_len",
    ),
    # a compressed main layer whose state spans more tokens than the starting block: no state fits in a block
    (
        layered(
            [{**MLA, "tokens_per_state": 256}, mamba([[4]], ["float32"])],
        ),
        "block_smaller_than_state",
        "model.layers[0].tokens_per_state",
    ),
    # absurd layer counts are refused rather than expanded
    (layered([full(count=10**6)]), "out_of_range", "model.layers[0].count"),
    # groups and model together
    ({"groups": [{"kind": "mla", "block_size": 64}], "model": {"layers": [MLA]}}, "groups_and_model", "groups"),
]


@pytest.mark.parametrize(("cfg", "code", "field"), ERRORS)
def test_bad_layered_configs(cfg, code, field):
    with pytest.raises(ConfigError) as info:
        resolve_block_sizes(cfg)
    assert info.value.code == code
    assert info.value.field == field


def test_report_is_json_serialisable():
    import json

    r = resolve_block_sizes(layered([full(), mamba([[16, 64, 64], [3, 256]], ["float32", "bfloat16"], count=3)]))
    d = json.loads(json.dumps(r.to_dict()))
    assert d["padding"][0]["padding_percent"] == round(r.padding[0].percent, 4)
    assert d["config"] == r.config


def test_layered_config_from_a_json_file(tmp_path):
    import json

    path = tmp_path / "model.json"
    path.write_text(json.dumps(layered([full(), mamba([[16, 64, 64]], ["float32"])])))
    assert resolve_block_sizes(path).attention_block_size == 256
    assert resolve_block_sizes(str(path)).config == resolve_block_sizes(json.loads(path.read_text())).config


@pytest.mark.parametrize(
    ("swa_layers", "full_layers", "group_sizes"),
    [
        # vLLM 0.33's example (gpt-oss-20b + eagle): 12 sliding + 13 full < 1.5 x 12 -> one group per bucket
        (12, 13, [12, 13]),
        # 12 + 17: 17 < 18, still one group per bucket (the old 1.25 threshold split the full layers)
        (12, 17, [12, 17]),
        # 12 + 18: not < 18 -> group size 12: one sliding group, two full groups; vLLM 0.33 deals the 18 full
        # layers round-robin (layers[0::2], layers[1::2]), so 9 + 9, not 12 + 6 (run on vLLM 0.33)
        (12, 18, [12, 9, 9]),
    ],
)
def test_grouping_keeps_one_group_per_bucket_below_one_and_a_half(swa_layers, full_layers, group_sizes):
    swa = {**full(heads=2, count=swa_layers), "kind": "sliding_window", "sliding_window": 512}
    r = resolve_block_sizes(layered([swa, full(heads=2, count=full_layers)]))
    assert [len(m) for m in r.group_layers] == group_sizes


@pytest.mark.parametrize(
    ("layers", "group_sizes"),
    [
        # one width: one group (vLLM's uniform type)
        ([{"sliding_window": 64, "count": 2}, {"sliding_window": 64, "count": 1}], [3]),
        # 64 and 512 at one block, heads and dtype: vLLM 0.33 makes two groups (run on vLLM 0.33 by
        # tests/test_grouping_conformance.py; kvgeom 0.2 made one uniform group of both)
        ([{"sliding_window": 64, "count": 1}, {"sliding_window": 512, "count": 1}], [1, 1]),
        # 3 + 1: buckets of 3 and 1, 3 >= 1.5 x 1, so groups of one layer each
        ([{"sliding_window": 64, "count": 3}, {"sliding_window": 512, "count": 1}], [1, 1, 1, 1]),
        ([{"kind": "chunked_local", "attention_chunk_size": 256, "count": 2},
          {"kind": "chunked_local", "attention_chunk_size": 512, "count": 1}], [1, 1, 1]),
    ],
)
def test_local_layers_of_different_widths_are_different_groups(layers, group_sizes):
    specs = [{**full(heads=2), "kind": "sliding_window", **x} for x in layers]
    r = resolve_block_sizes(layered(specs))
    assert [len(m) for m in r.group_layers] == group_sizes
    assert all(g["kind"] != "uniform" for g in r.config["groups"])  # no group mixes two widths
    kvgeom.resolve(r.config)  # and the geometry takes it


def test_a_compressed_sliding_layer_whose_kernel_block_holds_no_state_is_refused_not_a_crash():
    # tokens_per_state 64 on a 16-token kernel block: a page of 0 bytes; kvgeom 0.3.0.dev0 raised
    # ZeroDivisionError while unifying page sizes (found by 8,000 random layered configs)
    cfg = {"model": {"block_size": 1, "layers": [
        {"kind": "full_attention", "num_kv_heads": 2, "head_size": 128, "dtype": "bfloat16", "count": 2},
        {"kind": "sliding_window", "sliding_window": 128, "num_kv_heads": 2, "head_size": 128,
         "dtype": "bfloat16", "tokens_per_state": 64, "count": 1},
        {"kind": "mamba", "shapes": [[16, 64, 64]], "dtypes": ["float32"], "count": 2}]}}
    with pytest.raises(kvgeom.ConfigError) as e:
        kvgeom.resolve_block_sizes(cfg)
    p = e.value.problems[0]
    assert (p.code, p.field) == ("block_smaller_than_state", "model.layers[1].tokens_per_state")
    assert "tokens_per_state=64" in p.message and "16-token block" in p.message and "multiple of 64" in p.message


# -- block-outermost layouts: vLLM 0.33's packed grouping (step 5b) ---------------------------------------------
# The same numbers as the vLLM rows in tests/test_grouping_conformance.py (run on vLLM 0.33's
# get_kv_cache_groups), pinned here so the main suite catches a regression without vLLM.


def swa(window, **kw):
    return {**full(**kw), "kind": "sliding_window", "sliding_window": window}


def packed(layers, layout="BLHNC", **sections):
    return resolve_block_sizes({"model": {"block_size": 16, "kv_cache_layout": layout, "layers": layers}, **sections})


IDX = {"kind": "mla", "head_size": 132, "dtype": "bfloat16", "cache_role": "indexer"}


@pytest.mark.parametrize(
    ("layers", "group_layers", "kinds"),
    [
        # 1:1 full 2 heads (8 KiB) / sliding 4 heads (16 KiB): no repeating pattern; a block holds the 4 full
        # pages = 2 sliding pages, so the sliding state bucket splits in two, its layers dealt round-robin
        (
            [full(), swa(512, heads=4)] * 4,
            (
                ("layers[0]", "layers[2]", "layers[4]", "layers[6]"),
                ("layers[1]", "layers[5]"),
                ("layers[3]", "layers[7]"),
            ),
            ["full_attention", "sliding_window", "sliding_window"],
        ),
        # full 2 / 4 heads 1:1 (one bucket of two pages, 4 repeats) + 4 sliding: both buckets whole, the full one
        # in model order (a uniform container of both pages)
        (
            [full(), full(heads=4), swa(64)] * 4,
            (
                ("layers[0]", "layers[1]", "layers[3]", "layers[4]",
                 "layers[6]", "layers[7]", "layers[9]", "layers[10]"),
                ("layers[2]", "layers[5]", "layers[8]", "layers[11]"),
            ),
            ["uniform", "sliding_window"],
        ),
        # hybrid: full 2 / 4 heads 1:1 x2 + 8 Mamba (block 256): 2 repeats per group, so 4 Mamba groups dealt
        # round-robin (m0, m4), (m1, m5), ...
        (
            [full(), full(heads=4)] * 2 + [mamba([[16, 64, 64]], ["float32"], count=8)],
            (
                ("layers[0]", "layers[1]", "layers[2]", "layers[3]"),
                ("layers[4]#0", "layers[4]#4"), ("layers[4]#1", "layers[4]#5"),
                ("layers[4]#2", "layers[4]#6"), ("layers[4]#3", "layers[4]#7"),
            ),
            ["uniform", "mamba", "mamba", "mamba", "mamba"],
        ),
        # hybrid without a pattern: 2 full + 2 sliding 4 heads + 6 Mamba: the widest group (2 full pages)
        # holds 1 sliding page or 2 Mamba states -> 2 sliding groups of one, 3 Mamba pairs
        (
            [full(count=2), swa(64, heads=4, count=2), mamba([[16, 64, 64]], ["float32"], count=6)],
            (
                ("layers[0]#0", "layers[0]#1"), ("layers[1]#0",), ("layers[1]#1",),
                ("layers[2]#0", "layers[2]#3"), ("layers[2]#1", "layers[2]#4"), ("layers[2]#2", "layers[2]#5"),
            ),
            ["full_attention", "sliding_window", "sliding_window", "mamba", "mamba", "mamba"],
        ),
        # MLA + indexer 1:1 x3 + 6 Mamba (MLA hybrid block 256, Mamba padded 12.5 % to the MLA page):
        # 3 repeats per group, the Mamba bucket in two groups of 3
        (
            [MLA, IDX] * 3 + [mamba([[16, 64, 64]], ["float32"], count=6)],
            (
                tuple(f"layers[{i}]" for i in range(6)),
                ("layers[6]#0", "layers[6]#2", "layers[6]#4"), ("layers[6]#1", "layers[6]#3", "layers[6]#5"),
            ),
            ["uniform", "mamba", "mamba"],
        ),
    ],
)
def test_block_outermost_layout_packs_groups_as_vllm(layers, group_layers, kinds):
    r = packed(layers)
    assert r.packed and r.kv_cache_layout == "BLHNC"
    assert r.group_layers == group_layers
    assert [g["kind"] for g in r.config["groups"]] == kinds
    # pages are not unified: every layer keeps the block of steps 2-3, and the pages stay mixed
    assert {b for _, b in r.layer_block_sizes()} == {r.attention_block_size}
    assert r.page_bytes is None
    assert not any(p.kind != "mamba" for p in r.padding)
    assert "vLLM 0.33 packs them" in r.notes[-1]
    kvgeom.resolve(r.config)  # an ordinary kvgeom config
    for layout in ("BLNHC", "BHLNC"):  # every block-outermost layout packs alike
        assert packed(layers, layout).group_layers == group_layers


def test_layer_outermost_or_no_layout_keeps_todays_grouping():
    # the first row above without a layout, or with a layer-outermost one: unified pages (full block 32), 2 groups
    layers = [full(), swa(512, heads=4)] * 4
    default = resolve_block_sizes(layered(layers))
    assert not default.packed and default.kv_cache_layout is None
    assert [len(m) for m in default.group_layers] == [4, 4]
    assert {b for _, b in default.layer_block_sizes()} == {16, 32}
    for layout in ("LBNHC", "LBHNC", "LHBNC", "NHD", "HND"):
        r = packed(layers, layout)
        assert (r.group_layers, r.config, r.notes) == (default.group_layers, default.config, default.notes)


def test_block_outermost_layout_with_one_page_or_one_group_changes_nothing():
    # one page size: vLLM's packed grouping returns None and the usual grouping runs (12 sliding + 18 full)
    same_page = [swa(512, count=12), full(count=18)]
    assert packed(same_page).group_layers == resolve_block_sizes(layered(same_page)).group_layers
    assert not packed(same_page).packed
    # one uniform type (full 2 and 4 heads): one group before any packing, as under every layout
    one_type = [full(), full(heads=4)]
    assert packed(one_type).config == resolve_block_sizes(layered(one_type)).config


def test_packing_rescues_a_model_page_unification_refuses():
    # MLA + indexer 1:1 + 6 sliding 1 head: layer-outermost, the indexer page does not divide the sliding one
    # (mla_page_not_divisible); block-outermost, vLLM packs it: (MLA, indexer) x3 and two sliding groups of 3
    layers = [MLA, IDX] * 3 + [swa(128, heads=1, count=6)]
    with pytest.raises(GeometryError):
        resolve_block_sizes(layered(layers))
    assert [len(m) for m in packed(layers).group_layers] == [6, 3, 3]


@pytest.mark.parametrize(("small", "big"), [(4, 2), (3, 1)])
def test_an_unbalanced_state_bucket_split_by_packing_is_refused(small, big):
    # sliding layers of one window with 2 and 4 heads next to one 1-head full layer: the sliding state bucket
    # must split, but its pages have unequal counts; vLLM 0.33 drops s2, s3 (4 + 2) or raises StopIteration
    # (3 + 1) -- run in tests/test_grouping_conformance.py
    layers = [full(heads=1), swa(64, count=small), swa(64, heads=4, count=big)]
    with pytest.raises(GeometryError) as info:
        packed(layers)
    p = info.value.problems[0]
    assert (p.code, p.field) == ("packed_bucket_unbalanced", "model.kv_cache_layout")
    assert p.values == {"num_groups": 2, "layers": small + big}
    assert "layer-outermost" in p.message and "2 layers end in no group" in p.message


def test_an_unknown_layout_is_refused():
    with pytest.raises(ConfigError) as info:
        packed([full()], layout="BNLHC")
    assert info.value.field == "model.kv_cache_layout"


@st.composite
def _layouts_models(draw):
    """Small layered models (attention of 1-4 heads, sliding windows, MLA, Mamba) under a drawn layout."""
    layers = []
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["full_attention", "sliding_window", "mla", "mamba"]))
        count = draw(st.integers(1, 8))
        if kind == "mamba":
            layers.append(mamba([[16, 64, 64]], ["float32"], count=count))
        elif kind == "mla":
            layers.append({**draw(st.sampled_from([MLA, IDX])), "count": count})
        else:
            layer = full(heads=draw(st.sampled_from([1, 2, 4])), count=count)
            if kind == "sliding_window":
                layer = {**layer, "kind": kind, "sliding_window": draw(st.sampled_from([64, 512]))}
            layers.append(layer)
    layout = draw(st.sampled_from([None, "LBNHC", "BLHNC", "BLNHC", "BHLNC"]))
    return layers, layout


@given(_layouts_models())
def test_packed_groups_keep_step_2_3_blocks_and_every_layer_once(model):
    # BlockSizeResolution.packed's invariant (vLLM's rows are in tests/test_grouping_conformance.py)
    layers, layout = model
    cfg = {"model": {"block_size": 16, "layers": layers, **({"kv_cache_layout": layout} if layout else {})}}
    try:
        r = resolve_block_sizes(cfg)
    except kvgeom.KVGeomError:
        assume(False)
    labels = [label for group in r.group_layers for label in group]
    assert sorted(labels) == sorted(r.layer_labels)  # every layer in exactly one group
    if r.packed:
        assert layout in ("BLHNC", "BLNHC", "BHLNC") and r.page_bytes is None
        assert {b for _, b in r.layer_block_sizes()} <= {r.attention_block_size, r.mamba_block_size}
        assert not any(p.kind != "mamba" for p in r.padding)  # no attention page padded
        kvgeom.resolve(r.config)
    else:
        without = resolve_block_sizes({"model": {"block_size": 16, "layers": layers}})
        assert (r.config, r.group_layers, r.notes) == (without.config, without.group_layers, without.notes)
