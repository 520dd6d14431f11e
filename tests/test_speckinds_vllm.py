"""The four vLLM 0.33 spec kinds kvgeom models since issue 19 (``rswa``, ``hisparse_hot``, ``hisparse_resident``,
``encoder_only``), each against vLLM 0.33's own classes, coordinator and offloading config (marked ``vllm``).

What vLLM does with each kind, found by running it (these rows pin it):

* ``RSWASpec``: a ``FullAttentionSpec`` (``get_kv_cache_spec_kind`` says full attention), cacheable, DCP-sharded,
  served by ``RSWAManager``: hits, skipped tokens and the store mask are full attention's; a decoding request's
  blocks between the prompt and the last ``rswa_window`` tokens are freed (``kvgeom.hits.rswa_gap_blocks``).
* ``HiSparseHotSpec`` / ``HiSparseResidentSpec``: not cacheable, replicated; the hybrid coordinator leaves them out
  of the hit lookup and the offloading connector out of its groups.
* ``EncoderOnlyAttentionSpec``: no manager is registered for it, so a coordinator given one raises; vLLM's model
  runner appends the group after the scheduler's config is built, so the scheduler never sees it.
"""

from __future__ import annotations

import os

import pytest
from _vllm import NEEDS_VLLM
from hypothesis import given, settings
from hypothesis import strategies as st

import kvgeom
from kvgeom.events import vllm_spec_kinds
from kvgeom.hits import rswa_gap_blocks

pytestmark = NEEDS_VLLM

os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
torch = pytest.importorskip("torch")
pytest.importorskip("vllm")

from vllm.v1.core.kv_cache_coordinator import get_kv_cache_coordinator  # noqa: E402
from vllm.v1.core.kv_cache_utils import resolve_kv_cache_block_sizes  # noqa: E402
from vllm.v1.kv_cache_interface import (  # noqa: E402
    EncoderOnlyAttentionSpec,
    FullAttentionSpec,
    HiSparseHotSpec,
    HiSparseResidentSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    RSWASpec,
    get_kv_cache_spec_kind,
)

from kvgeom.adapters.vllm import geometry_from_vllm  # noqa: E402
from kvgeom.conformance import vllm_objects as vo  # noqa: E402
from kvgeom.conformance.vllm_rswa import vllm_null_blocks  # noqa: E402

F16 = torch.float16
A = {"num_kv_heads": 1, "head_size": 8, "dtype": F16}


def _kv(*specs):
    return KVCacheConfig(num_blocks=256, kv_cache_tensors=[],
                         kv_cache_groups=[KVCacheGroupSpec([f"l{i}"], s) for i, s in enumerate(specs)])


def _coordinator(kv):
    return get_kv_cache_coordinator(kv, max_model_len=4096, max_in_flight_tokens=8192, use_eagle=False,
                                    enable_caching=True, enable_kv_cache_events=False, dcp_world_size=1,
                                    pcp_world_size=1, scheduler_block_size=16, hash_block_size=16)


VLLM_SPECS = {
    "rswa": lambda: RSWASpec(block_size=16, rswa_window=64, **A),
    "hisparse_hot": lambda: HiSparseHotSpec(block_size=16, page_size=1024, blocks_per_request=4),
    "hisparse_resident": lambda: HiSparseResidentSpec(block_size=16, page_size=1024),
    "encoder_only": lambda: EncoderOnlyAttentionSpec(block_size=16, **A),
}


@pytest.mark.parametrize(
    ("kind", "cacheable", "sharded", "vllm_kind"),
    [
        # RSWA is a FullAttentionSpec to vLLM: cacheable, sharded, kind full attention
        ("rswa", True, True, "full_attention"),
        # the HiSparse groups opt out of prefix caching and are replicated; vLLM has no kind name for them
        ("hisparse_hot", False, False, "unknown"),
        ("hisparse_resident", False, False, "unknown"),
        # encoder-only: vLLM's spec says cacheable, but nothing of it reaches the scheduler (kvgeom: not cacheable)
        ("encoder_only", False, True, "encoder_only_attention"),
    ],
)
def test_each_kind_reads_as_vllm_spec_says(kind, cacheable, sharded, vllm_kind):
    spec = VLLM_SPECS[kind]()
    assert get_kv_cache_spec_kind(spec).value == vllm_kind
    assert spec.dcp_sharded is sharded
    g = geometry_from_vllm(_kv(FullAttentionSpec(block_size=16, **A), spec), parallel={}, cache={})
    assert g.groups[1].kind == kind  # the adapter maps vLLM's class to the kind
    assert g.groups[1].prefix_cacheable is cacheable
    assert g.groups[1].dcp_sharded is sharded
    assert vllm_spec_kinds(g.groups[1]) == {vllm_kind, "unknown"}  # the kind vLLM's KV events carry
    # and back: the conformance builder makes the same vLLM class from kvgeom's group
    assert type(vo.build_kv_cache_spec(g, 1)) is type(spec)


def test_hybrid_coordinator_leaves_the_hisparse_groups_out_of_the_lookup():
    c = _coordinator(_kv(FullAttentionSpec(block_size=16, **A), VLLM_SPECS["hisparse_hot"](),
                         VLLM_SPECS["hisparse_resident"]()))
    assert [g.group_ids for g in c.attention_groups] == [[0]]  # vLLM: only group 0 is looked up
    g = kvgeom.resolve({"groups": [{"kind": "full_attention", "block_size": 16},
                                   {"kind": "hisparse_hot", "block_size": 16, "blocks_per_request": 4},
                                   {"kind": "hisparse_resident", "block_size": 16}], "offload": {}})
    assert [og.index for og in g.offload.groups] == [0]  # never offloaded, as get_offloading_group_ids
    assert [x.row_width for x in g.groups[1:]] == [None, None]  # no max_model_len: no row width asked


def test_rswa_is_its_own_lookup_group_and_scans_like_full_attention():
    c = _coordinator(_kv(FullAttentionSpec(block_size=16, **A), VLLM_SPECS["rswa"]()))
    assert [g.group_ids for g in c.attention_groups] == [[0], [1]]  # distinct specs, two full-attention scans
    assert c.single_type_managers[1].get_num_skipped_tokens(1000) == 0  # nothing skipped, like full attention
    g = kvgeom.resolve({"groups": [{"kind": "full_attention", "block_size": 16},
                                   {"kind": "rswa", "block_size": 16, "rswa_window": 64}]})
    assert kvgeom.hits.skipped_tokens(g, 1, 1000) == 0


def test_a_coordinator_refuses_an_encoder_only_group_so_the_scheduler_never_holds_one():
    with pytest.raises(AssertionError, match="No manager registered"):
        _coordinator(_kv(FullAttentionSpec(block_size=16, **A), VLLM_SPECS["encoder_only"]()))
    # kvgeom models the deployment: the scheduler's L and H are decided without the (last) encoder group
    g = kvgeom.resolve({"groups": [{"kind": "full_attention", "block_size": 16},
                                   {"kind": "encoder_only", "block_size": 64}]})
    scheduler_only = _kv(FullAttentionSpec(block_size=16, **A))
    vc = vo.build_vllm_config(kvgeom.resolve({"groups": [{"kind": "full_attention", "block_size": 16}]}))
    assert (g.scheduler_block_size, g.hash_block_size) == resolve_kv_cache_block_sizes(scheduler_only, vc)


@pytest.mark.parametrize(
    ("prompt", "steps", "expected"),
    [
        # block 16, window 40, a 50-token prompt: block 3 holds the prompt's tail and stays; at 120 the window
        # starts at 80, so block 4 is freed; at 160 blocks 4-6 (run on vLLM 0.33)
        (50, [100, 120, 160], [[], [4], [4, 5, 6]]),
        # a prompt ending on a block boundary: the first gap block is the next one
        (64, [64, 200], [[], [4, 5, 6, 7, 8, 9]]),
    ],
)
def test_rswa_gap_rows(prompt, steps, expected):
    g = kvgeom.resolve({"groups": [{"kind": "full_attention", "block_size": 16},
                                   {"kind": "rswa", "block_size": 16, "rswa_window": 40}]})
    assert vllm_null_blocks(g, 1, prompt, steps) == expected
    assert [list(rswa_gap_blocks(g, 1, prompt, t)) for t in steps] == expected


@settings(max_examples=30, deadline=None)
@given(
    block=st.sampled_from([1, 4, 16, 32]),
    window=st.integers(0, 200),
    prompt=st.integers(1, 200),
    deltas=st.lists(st.integers(1, 90), min_size=1, max_size=6),
    others=st.sampled_from([[], [{"kind": "full_attention"}], [{"kind": "mamba", "mamba_cache_mode": "align"}]]),
)
def test_rswa_gap_blocks_are_the_blocks_vllm_frees(block, window, prompt, deltas, others):
    groups = [{**o, "block_size": block} for o in others] + [
        {"kind": "rswa", "block_size": block, "rswa_window": window}]
    g = kvgeom.resolve({"groups": groups})
    steps, t = [], prompt
    for d in deltas:
        t += d
        steps.append(t)
    ours = [list(rswa_gap_blocks(g, len(groups) - 1, prompt, s)) for s in steps]
    assert vllm_null_blocks(g, len(groups) - 1, prompt, steps) == ours


def test_a_sharded_hisparse_group_is_refused_under_dcp_as_vllms_hybrid_coordinator_does():
    kv = _kv(FullAttentionSpec(block_size=16, **A), HiSparseResidentSpec(block_size=16, page_size=1024,
                                                                         dcp_sharded=True))
    with pytest.raises(AssertionError, match="DCP with hybrid KV cache layouts"):
        get_kv_cache_coordinator(kv, max_model_len=4096, max_in_flight_tokens=8192, use_eagle=False,
                                 enable_caching=True, enable_kv_cache_events=False, dcp_world_size=2,
                                 pcp_world_size=1, scheduler_block_size=32, hash_block_size=16)
    with pytest.raises(kvgeom.KVGeomError) as info:
        kvgeom.resolve({"groups": [{"kind": "full_attention", "block_size": 16},
                                   {"kind": "hisparse_resident", "block_size": 16, "dcp_sharded": True}],
                        "parallel": {"dcp": 2, "tp": 2}})
    assert info.value.code == "sharded_kind_under_dcp"
