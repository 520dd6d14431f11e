"""Rows of the four spec kinds of issue 19 without vLLM (the vLLM rows are in ``tests/test_speckinds_vllm.py``)."""

from __future__ import annotations

import pytest

import kvgeom
import kvgeom.batch
from kvgeom.errors import GeometryError, QueryError
from kvgeom.hits import rswa_gap_blocks
from kvgeom.pages import maybe_page_bytes
from kvgeom.report import hit_landing_lines

FA = {"kind": "full_attention", "block_size": 16}


def test_rswa_resolves_as_full_attention_and_frees_the_gap():
    g = kvgeom.resolve({"groups": [FA, {"kind": "rswa", "block_size": 16, "rswa_window": 40}], "offload": {},
                        "parallel": {"dcp": 2, "tp": 2}})
    # DCP-sharded like full attention: span 32; cacheable; offloaded
    assert (g.groups[1].family, g.groups[1].span, g.groups[1].prefix_cacheable) == ("full", 32, True)
    assert [o.index for o in g.offload.groups] == [0, 1]
    # a 100-token prompt decoded to 300: blocks of 32 from cdiv(100, 32) = 4 up to (300 - 40) // 32 = 8
    assert rswa_gap_blocks(g, 1, 100, 300) == range(4, 8)


@pytest.mark.parametrize(
    ("group", "row_width", "page"),
    [
        # the hot region: a fixed number of blocks per request, the page given in bytes
        ({"kind": "hisparse_hot", "block_size": 64, "blocks_per_request": 8, "page_size": 4096}, 8, 4096),
        # resident pages: one per block of the sequence
        ({"kind": "hisparse_resident", "block_size": 64, "page_size": 4096}, 64, 4096),
        # encoder-only: the scheduler fills no row, but vLLM's spec sizes one as attention does
        # (max_num_blocks_per_req = cdiv(4096, 16) = 256, run on vLLM 0.33)
        ({"kind": "encoder_only", "block_size": 16, "num_kv_heads": 1, "head_size": 8, "dtype": "float16"}, 256,
         512),
    ],
)
def test_not_cacheable_kinds(group, row_width, page):
    g = kvgeom.resolve({"groups": [FA, group], "offload": {}, "cache": {"max_model_len": 4096}})
    x = g.groups[1]
    assert not x.prefix_cacheable
    assert x.row_width == row_width
    assert maybe_page_bytes(x.spec) == page
    assert [o.index for o in g.offload.groups] == [0]  # never offloaded
    assert any("not prefix-cacheable" in line for line in hit_landing_lines(g))


@pytest.mark.parametrize(
    ("groups", "code", "field"),
    [
        # vLLM 0.33's HiSparse specs say prefix_cacheable=False; the host source group owns prefix caching
        ([FA, {"kind": "hisparse_hot", "block_size": 16, "blocks_per_request": 2, "prefix_cacheable": True}],
         "hisparse_cacheable", "groups[1].prefix_cacheable"),
        # vLLM's scheduler has no manager for encoder-only attention ("No manager registered")
        ([FA, {"kind": "encoder_only", "block_size": 16, "prefix_cacheable": True}],
         "encoder_only_cacheable", "groups[1].prefix_cacheable"),
        # the model runner appends the encoder-only group after the scheduler's groups
        ([{"kind": "encoder_only", "block_size": 16}, FA], "encoder_only_not_last", "groups[0].kind"),
        # and asserts a single encoder-only spec
        ([FA, {"kind": "encoder_only", "block_size": 16}, {"kind": "encoder_only", "block_size": 32}],
         "encoder_only_twice", "groups[2].kind"),
    ],
)
def test_refusals(groups, code, field):
    with pytest.raises(GeometryError) as info:
        kvgeom.resolve({"groups": groups})
    assert info.value.code == code
    assert info.value.field == field


def test_encoder_only_is_left_out_of_l_and_h():
    # full attention 16 + an encoder-only group of 48: vLLM's scheduler sees only the first, so L = H = 16
    g = kvgeom.resolve({"groups": [FA, {"kind": "encoder_only", "block_size": 48}]})
    assert (g.scheduler_block_size, g.hash_block_size) == (16, 16)
    # a model of encoder-only layers alone (BERT-like): vLLM's scheduler has no group, L = H = the cache block
    alone = kvgeom.resolve({"groups": [{"kind": "encoder_only", "block_size": 48}]})
    assert (alone.scheduler_block_size, alone.hash_block_size) == (48, 48)


def test_rswa_gap_refusals():
    g = kvgeom.resolve({"groups": [FA, {"kind": "rswa", "block_size": 16, "rswa_window": 4}]})
    with pytest.raises(QueryError) as info:
        rswa_gap_blocks(g, 0, 10, 20)  # group 0 is full attention
    assert info.value.code == "not_rswa"
    with pytest.raises(QueryError) as info:
        rswa_gap_blocks(g, 1, 30, 20)  # still in the prompt
    assert info.value.code == "computed_before_prompt"
    with pytest.raises(QueryError) as info:
        kvgeom.batch.rswa_gap_blocks(g, 1, [10, 30], [20, 20])  # the batch twin refuses the same element
    assert info.value.code == "computed_before_prompt"
