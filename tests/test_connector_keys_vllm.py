"""A connector's own per-group offload keys on vLLM 0.33's real objects: ``lookup_hit(geom, n,
stored=manager, offload_keys=[s.offload_keys for s in req_status.group_states], req_context=...)`` over
the request state vLLM's scheduler-side OffloadingConnector keeps, against the same tier asked through
the hash chain and against vLLM's own lookup (``get_num_new_matched_tokens``).

Runs where vLLM is installed (``pytest -m vllm`` in the vLLM venv)."""

from __future__ import annotations

import pytest
from _vllm import NEEDS_VLLM
from hypothesis import given, settings
from hypothesis import strategies as st

import kvgeom
from kvgeom.hits import lookup_hit

pytestmark = NEEDS_VLLM

CONFIGS = {
    "seed FA16+M16 DCP2": {"groups": [{"kind": "full_attention", "block_size": 16},
                                      {"kind": "mamba", "block_size": 16}],
                           "parallel": {"tp": 2, "dcp": 2}, "offload": {}},
    "3xFA64+M2048 DCP8": {"groups": [{"kind": "full_attention", "block_size": 64}] * 3
                          + [{"kind": "mamba", "block_size": 2048}],
                          "parallel": {"tp": 8, "dcp": 8}, "offload": {}},
    "FA16+SWA16 k2": {"groups": [{"kind": "full_attention", "block_size": 16},
                                 {"kind": "sliding_window", "block_size": 16, "sliding_window": 40}],
                      "cache": {"retention_interval": None}, "offload": {"blocks_per_chunk": 2}},
    "FA16+M16 partial tails": {"groups": [{"kind": "full_attention", "block_size": 16},
                                          {"kind": "mamba", "block_size": 16}],
                               "cache": {"prefix_match_unit": 8, "retention_interval": None}, "offload": {}},
}


def _objects(geom):
    from kvgeom.conformance import vllm_objects as vo

    class Recording(vo.ChosenTier):
        def __init__(self):
            super().__init__()
            self.asked = []

        def lookup(self, key, req_context):
            self.asked.append(bytes(key))
            return super().lookup(key, req_context)

    tier = Recording()
    return vo, tier, vo.build_scheduler(geom, tier)


@settings(max_examples=25, deadline=None)
@given(name=st.sampled_from(sorted(CONFIGS)), data=st.data())
def test_per_group_keys_from_vllms_request_state_answer_as_the_chain_and_as_vllm(name, data):
    geom = kvgeom.resolve(CONFIGS[name])
    vo, tier, sched = _objects(geom)
    H = geom.hash_block_size
    n = data.draw(st.integers(0, 6 * max(og.tokens_per_chunk for og in geom.offload.groups)), label="n")
    request = vo.build_request(n, H)
    held = {og.index: [e for e in range(og.tokens_per_chunk, n + 1, og.tokens_per_chunk) if data.draw(
        st.integers(0, 3), label=f"g{og.index}@{e}")] for og in geom.offload.groups}
    tier.keys = {vo.offload_key(request, g, e, H) for g, ends in held.items() for e in ends}
    sched.on_new_request(request)
    state = sched._req_status[request.request_id]
    state.update_offload_keys()
    per_group = [s.offload_keys for s in state.group_states]  # vLLM's own lists, indexed by group
    tail = {"block_hashes": request.block_hashes} if geom.offload.supports_partial_tail else {}

    tier.asked = []
    by_keys = lookup_hit(geom, n, stored=tier, offload_keys=per_group, req_context=state.req_context, **tail)
    asked_by_keys, tier.asked = tier.asked, []
    by_chain = lookup_hit(geom, n, stored=tier, block_hashes=request.block_hashes, req_context=state.req_context)
    assert by_keys == by_chain == lookup_hit(geom, n, stored=held)
    assert asked_by_keys == tier.asked  # the same keys, in the same order

    vllm_hit, _ = sched.get_num_new_matched_tokens(request, 0)
    vllm_hit = vllm_hit or 0
    Cm = geom.offload.mamba_align_size
    if Cm and vllm_hit % Cm and not by_keys.partial_tail:
        # vLLM's hit off the Mamba chunk: kvgeom's registered deviation realign-after-clamp answers lower
        assert by_keys.hit_tokens < vllm_hit and by_keys.hit_tokens % Cm == 0
    else:
        assert by_keys.hit_tokens == vllm_hit


def test_on_vllms_cpu_tier_the_answers_are_read_by_name_once():
    # vLLM's real CPUOffloadingManager answers LookupResult members; filled as a connector fills it
    from vllm.v1.kv_offload.base import ReqContext
    from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager

    geom = kvgeom.resolve(CONFIGS["seed FA16+M16 DCP2"])
    vo, _, sched = _objects(geom)
    request = vo.build_request(256, geom.hash_block_size)
    sched.on_new_request(request)
    state = sched._req_status[request.request_id]
    state.update_offload_keys()
    per_group = [s.offload_keys for s in state.group_states]
    manager = CPUOffloadingManager(num_chunks=64)
    keys = [*per_group[0][:6], per_group[1][11]]  # attention to 192, the Mamba state at 192
    out = manager.prepare_store(keys, ReqContext("filler"))
    manager.complete_store(out.keys_to_store, ReqContext("filler"))
    hit = lookup_hit(geom, 256, stored=manager, offload_keys=per_group, req_context=state.req_context)
    assert hit.end_token == 192
    assert hit == lookup_hit(geom, 256, stored=manager, block_hashes=request.block_hashes,
                             req_context=state.req_context)


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_vllms_lists_are_indexed_by_group(name):
    # entry g of [s.offload_keys for s in group_states] is group g's: the 4-byte suffix names it
    geom = kvgeom.resolve(CONFIGS[name])
    vo, _, sched = _objects(geom)
    request = vo.build_request(4096, geom.hash_block_size)
    sched.on_new_request(request)
    state = sched._req_status[request.request_id]
    state.update_offload_keys()
    for g, s in enumerate(state.group_states):
        assert s.offload_keys and {kvgeom.split_offload_key(bytes(k))[1] for k in s.offload_keys} == {g}
