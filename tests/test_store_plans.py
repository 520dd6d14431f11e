"""Sliding-window store plans: example rows whose answers come from running vLLM 0.33's own
``OffloadingConnectorScheduler._build_store_jobs`` (DCP 1) on the same geometry and request.

Each row is (groups, retention, request, SWA end tokens vLLM stores). The full-attention group is
always dense, so only the sliding-window group (index 1) is listed. The rules are in
``docs/hits.md`` (store plan) and :mod:`kvgeom.masks`.
"""

from __future__ import annotations

import pytest

import kvgeom
from kvgeom.batch import plan_stores
from kvgeom.hits import lookup_hit, plan_store


def _geom(fa: int, swa: int, window: int, extra: int, retention: int | None, k: int = 1) -> kvgeom.Geometry:
    return kvgeom.resolve(
        {
            "groups": [
                {"kind": "full_attention", "block_size": fa},
                {"kind": "sliding_window", "block_size": swa, "sliding_window": window, "extra_retained_tokens": extra},
            ],
            "cache": {"retention_interval": retention},
            "offload": {"blocks_per_chunk": k},
        }
    )


# (fa block, swa block, window, extra, retention, k, request kwargs, SWA end tokens vLLM 0.33 stores)
ROWS = [
    # issue 13 rule 1: retention null keeps the window's blocks before each 64-token boundary, not every block
    (64, 32, 16, 0, None, 1, {"num_tokens": 200}, (64, 128, 192)),
    # issue 13 rule 2: extra_retained_tokens widens the stored window: cdiv(32 - 1 + 16, 16) = 3 blocks before 96
    (16, 16, 32, 16, 0, 1, {"num_tokens": 100}, (64, 80, 96)),
    # issue 13 rule 3: window 48 needs 6 blocks >= 4 per 32-token segment: every block is stored, 120 included
    (8, 8, 48, 0, 32, 1, {"num_tokens": 120}, tuple(range(8, 121, 8))),
    # retention null, prompt 230: the last, partial segment keeps its own tail (block 6, ending at 224)
    (64, 32, 16, 0, None, 1, {"num_tokens": 230}, (64, 128, 192, 224)),
    # retention 64 with 2 of 4 blocks per segment: blocks 2,3 and 6,7, plus the replay tail before 144
    (16, 16, 20, 0, 64, 1, {"num_tokens": 150}, (48, 64, 112, 128, 144)),
    # k = 2: a 16-token chunk survives when one of its two blocks is a segment's last block
    (16, 8, 9, 0, None, 2, {"num_tokens": 100}, (32, 64, 96)),
    # extra widens a 16-token window to 2 blocks >= 1 block per 16-token segment: dense
    (16, 16, 16, 16, None, 1, {"num_tokens": 100}, (16, 32, 48, 64, 80, 96)),
    # a prefill step that has computed 100 of 230 tokens: only the tail before 64 so far
    (64, 32, 16, 0, None, 1, {"num_tokens": 230, "num_computed_tokens": 100}, (64,)),
    # retention 0, k = 2, window 24 + extra 40 -> 4 blocks before 128 = chunks ending 96 and 128
    (16, 16, 24, 40, 0, 2, {"num_tokens": 150}, (96, 128)),
    # finished after decoding to 288 (prompt 230, offload_prompt_only off, 9 chunks already considered):
    # chunk 8 was skipped under the prompt's horizon and is the final segment's tail now
    (
        64, 32, 16, 0, None, 1,
        {"num_tokens": 289, "num_prompt_tokens": 230, "finished": True, "offload_prompt_only": False,
         "stored_chunks": {0: 4, 1: 9}},
        (288,),
    ),
    # the same request one step before it finished: past the prompt there is no final tail
    (
        64, 32, 16, 0, None, 1,
        {"num_tokens": 289, "num_prompt_tokens": 230, "offload_prompt_only": False, "stored_chunks": {0: 4, 1: 8}},
        (),
    ),
]


@pytest.mark.parametrize(("fa", "swa", "window", "extra", "retention", "k", "query", "want"), ROWS)
def test_sliding_window_store_plan_matches_vllm(fa, swa, window, extra, retention, k, query, want):
    g = _geom(fa, swa, window, extra, retention, k)
    kw = {"num_computed_tokens": query["num_tokens"], **query}
    plan = plan_store(g, **kw)
    assert plan.groups[1].end_tokens == want
    # the batch twin gives the same plan
    batch_kw = {
        key: ({gi: [v] for gi, v in val.items()} if key == "stored_chunks" else
              val if key in ("offload_prompt_only", "max_offload_tokens") else [val])
        for key, val in kw.items()
    }
    assert plan_stores(g, **batch_kw).plan(0) == plan


# (geometry, prompt stored, later request, hit vLLM 0.33 finds on that tier)
LOOKUPS = [
    # issue 13 rule 2: after storing a 100-token prompt, a 120-token request hits 96 (kvgeom used to find 0)
    ((16, 16, 32, 16, 0), 100, 120, 96),
    # issue 13 rule 3: after storing a 120-token prompt, a 130-token request hits 120 (kvgeom used to stop at 112)
    ((8, 8, 48, 0, 32), 120, 130, 120),
    # issue 13 rule 1: retention null, 200-token prompt, a 250-token request hits the last boundary 192
    ((64, 32, 16, 0, None), 200, 250, 192),
]


@pytest.mark.parametrize(("shape", "prompt", "request_tokens", "want"), LOOKUPS)
def test_lookup_on_the_planned_tier_finds_vllms_hit(shape, prompt, request_tokens, want):
    g = _geom(*shape)
    plan = plan_store(g, num_tokens=prompt, num_computed_tokens=prompt)
    tier = {s.index: list(s.end_tokens) for s in plan.groups}
    assert lookup_hit(g, request_tokens, stored=tier).hit_tokens == want
