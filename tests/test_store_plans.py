"""Example rows for store plans (``kvgeom.hits.plan_store``): which chunks a request hands the offload tier.

This is the home of ``plan_store``'s example rows; its laws are in ``tests/property/test_store_plan_laws.py``
(and the batch twin's agreement in ``tests/property/test_batch_agrees_with_scalar.py``). Sections:

* attention and Mamba groups: the seed geometry, retention, limits (docs/hits.md, #49962);
* sliding windows: rows whose answers come from running vLLM 0.33's own
  ``OffloadingConnectorScheduler._build_store_jobs`` (DCP 1) on the same geometry and request. Each row is
  (groups, retention, request, SWA end tokens vLLM stores). The full-attention group is always dense, so
  only the sliding-window group (index 1) is listed. The rules are in ``docs/hits.md`` (store plan) and
  :mod:`kvgeom.masks`;
* drafters: the eagle store hold-back and the shifted Mamba checkpoint (``docs/speculative.md``).

Where prefill chunks end decides which Mamba states exist; those rows (``prefill_chunk_ends`` with
``plan_store``) are in ``test_prefill.py``.
"""

from __future__ import annotations

import pytest
from _drafter_rows import DRAFT16, FA16, M16, spec
from _step_rows import STEP_ROWS

import kvgeom
from kvgeom import hits
from kvgeom.batch import plan_stores
from kvgeom.errors import QueryError
from kvgeom.hits import lookup_hit, plan_store

SEED = kvgeom.resolve(kvgeom.DEFAULT_CONFIG)  # attention span 32, Mamba span 16, k = 1, retention 0
SEED_DENSE = kvgeom.resolve({**kvgeom.DEFAULT_CONFIG, "cache": {"retention_interval": None}})


# ----------------------------------------------------------------------------------- attention and Mamba


#: vLLM 0.33's split of 64 tokens with a 16-token budget (vLLM run): a Mamba state at every block boundary
B16 = (16, 32, 48, 64)


def test_store_plan_example_3_49962():
    # #49962: a confirmed 64-token prefix, dense retention, prefilled 16 tokens a step (vLLM run: stores
    # attention 32, 64 and Mamba 16, 32, 48, 64): 2 attention + 4 Mamba blocks
    plan = plan_store(SEED_DENSE, num_tokens=64, num_computed_tokens=64, chunk_ends=B16)
    att, mam = plan.groups
    assert att.chunks == (0, 1) and att.block_entries == ((0,), (1,))
    assert mam.end_tokens == (16, 32, 48, 64) and mam.block_entries == ((0,), (1,), (2,), (3,))
    # the buggy rule (#49962, every group B*D = 32): 64 // 32 = 2 Mamba states, the states after 16 and 32
    assert 64 // 32 == 2 != len(mam.chunks)


def test_store_plan_retention():
    # 0.33 default retention 0: only the replay boundary num_prompt - 1 = 63 -> rdown(63, A=16) = 48
    assert plan_store(SEED, num_tokens=64, num_computed_tokens=64).groups[1].end_tokens == (48,)
    # R = 32, vLLM's unbounded split (chunks end at 48 and 64, vLLM run): the replay boundary 48 and 64;
    # no chunk ended at 32, so no state exists there
    geom = kvgeom.resolve({**kvgeom.DEFAULT_CONFIG, "cache": {"retention_interval": 32}})
    assert plan_store(geom, num_tokens=64, num_computed_tokens=64).groups[1].end_tokens == (48, 64)
    # prefilled 16 tokens a step: one state per 32 tokens (32, 64) plus the replay boundary 48
    assert plan_store(geom, num_tokens=64, num_computed_tokens=64, chunk_ends=B16).groups[1].end_tokens == (32, 48, 64)
    # attention stays dense
    assert plan_store(geom, num_tokens=64, num_computed_tokens=64).groups[0].chunks == (0, 1)


def test_store_plan_limits():
    # only what is computed, only complete chunks, from what is not yet stored
    # prefilled with budgets [16, 16, 16, 16, 6] (vLLM run: chunks end at 16, 32, 48, 64, 70, ...), stored at 70
    plan = plan_store(SEED_DENSE, num_tokens=100, num_computed_tokens=70, stored_chunks={0: 1, 1: 2},
                      chunk_ends=(16, 32, 48, 64, 70))
    assert plan.offloadable_tokens == 70
    assert plan.groups[0].chunks == (1,)
    assert plan.groups[1].chunks == (2, 3)
    # allocated blocks cap the store
    plan = plan_store(SEED_DENSE, num_tokens=64, num_computed_tokens=64, allocated_blocks={0: 1})
    assert plan.groups[0].chunks == (0,)
    # decode tokens are not offloaded by default (offload_prompt_only)
    plan = plan_store(SEED_DENSE, num_tokens=100, num_computed_tokens=100, num_prompt_tokens=40)
    assert plan.offloadable_tokens == 40


def test_mamba_store_with_k_uses_mamba_chunk_not_attention_chunk():
    # k = 2: Mamba chunk 32, attention chunk 64; prefilled 16 tokens a step (vLLM run: Mamba 32, 64 stored),
    # Mamba keys end at 32 and 64, from blocks 1 and 3
    geom = kvgeom.resolve({**kvgeom.DEFAULT_CONFIG, "offload": {"blocks_per_chunk": 2},
                           "cache": {"retention_interval": None}})
    mam = plan_store(geom, num_tokens=64, num_computed_tokens=64, chunk_ends=B16).groups[1]
    assert mam.end_tokens == (32, 64) and mam.block_entries == ((1,), (3,))


def test_store_plan_too_large_for_the_scalar_path():
    from kvgeom.masks import MAX_SCALAR_RESULT

    geom = kvgeom.resolve({**kvgeom.DEFAULT_CONFIG, "cache": {"retention_interval": 32}})
    with pytest.raises(QueryError) as info:
        plan_store(geom, num_tokens=2**40, num_computed_tokens=2**40)
    assert info.value.code == "result_too_large"
    # narrowing the range with stored_chunks keeps it small
    n = 2**40
    plan = plan_store(geom, num_tokens=n, num_computed_tokens=n, stored_chunks={0: n // 32 - 2, 1: n // 16 - 4})
    assert plan.groups[0].chunks == (n // 32 - 2, n // 32 - 1)
    # the unbounded split ends chunks at n - 16 and n: the replay boundary n - 16 and n (as vLLM stores 240, 256
    # of a 256-token prompt under this retention, vLLM run)
    assert plan.groups[1].end_tokens == (n - 16, n)
    assert n // 16 > MAX_SCALAR_RESULT



# ------------------------------------------------------- an explicit `reachable` list (no vLLM counterpart)
# plan_store's `reachable` replaces the replay boundary num_prompt - 1 (its default) in the store masks. vLLM 0.33
# always uses the replay boundary, so only the default rows are vLLM's (runs noted below); the other rows are
# derived by hand from kvgeom.masks' module docstring (retention 0: only the reachable boundaries are kept; a
# boundary t keeps the Mamba block rdown(t, A) // B_m - 1, and the `need` sliding-window blocks before
# rdown(t, alignment_tokens)) and from plan_store's (a chunk is stored when a block of it is kept; an align Mamba
# key inside the prompt also needs a prefill chunk to end there, and the prompt's H-grid checkpoint is keyed
# whatever the mask says).

#: FA16 + SWA16 (window 16: need 1 block), retention 0, alignment 16: one block per chunk
SWA_R0 = kvgeom.resolve({"groups": [FA16, {"kind": "sliding_window", "block_size": 16, "sliding_window": 16}],
                         "offload": {}})
#: FA16 + Mamba16, retention 0, A = 16, DCP 1 (no partial tails)
MAMBA_R0 = kvgeom.resolve({"groups": [FA16, M16], "offload": {}})


@pytest.mark.parametrize(
    ("reachable", "swa"),
    [
        (None, (192,)),  # vLLM run (200-token prompt): SWA 192 alone, the block before rdown(199, 16) = 192
        ((199,), (192,)),  # the default spelled out
        ((99, 150), (96, 144)),  # rdown(99, 16) = 96 keeps block 5 (end 96); rdown(150, 16) = 144 keeps block 8
        ((), ()),  # no boundary: retention 0 keeps nothing
    ],
)
def test_explicit_reachable_boundaries_move_the_sliding_window_store_mask(reachable, swa):
    plan = plan_store(SWA_R0, num_tokens=200, num_computed_tokens=200, reachable=reachable)
    assert plan.groups[0].end_tokens == tuple(range(16, 193, 16))  # full attention: dense
    assert plan.groups[1].end_tokens == swa


@pytest.mark.parametrize(
    ("reachable", "mamba"),
    [
        # vLLM run (100-token prompt, budgets 32, 32, 36: chunks end at 32, 64, 96, 100): Mamba 96, the block of
        # rdown(99, 16) = 96, which is also the prompt's H-grid checkpoint
        (None, (96,)),
        ((64,), (64, 96)),  # block 3 (end 64; a chunk ended there) and the checkpoint 96
        ((32, 64), (32, 64, 96)),
        ((48,), (96,)),  # block 2 (end 48) is kept, but no chunk ended at 48: no state to hand over
        ((), (96,)),  # the checkpoint alone
    ],
)
def test_explicit_reachable_boundaries_choose_the_mamba_hand_offs_in_the_prompt(reachable, mamba):
    plan = plan_store(MAMBA_R0, num_tokens=100, num_computed_tokens=100, chunk_ends=(32, 64, 96, 100),
                      reachable=reachable)
    assert plan.groups[0].end_tokens == (16, 32, 48, 64, 80, 96)
    assert plan.groups[1].end_tokens == mamba


@pytest.mark.parametrize(
    ("reachable", "mamba"),
    [
        # vLLM run (40-token prompt decoded to 80, offload_prompt_only off: chunks end at 32, 40): Mamba 32 alone
        # (the block of rdown(39, 16) = 32 and the checkpoint); nothing past the prompt
        (None, (32,)),
        ((64, 80), (32, 64, 80)),  # past the prompt the store mask alone: blocks 3 and 4 (ends 64, 80)
        ((79,), (32, 64)),  # rdown(79, 16) = 64
        ((), (32,)),
    ],
)
def test_explicit_reachable_boundaries_choose_the_mamba_keys_past_the_prompt(reachable, mamba):
    plan = plan_store(MAMBA_R0, num_tokens=80, num_computed_tokens=80, num_prompt_tokens=40, offload_prompt_only=False,
                      chunk_ends=(32, 40), reachable=reachable)
    assert plan.groups[0].end_tokens == (16, 32, 48, 64, 80)
    assert plan.groups[1].end_tokens == mamba


# ----------------------------------------------------------------------------------- sliding windows


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
    # retention null, 4 blocks per 64-token segment, window 33 needs 2: prompt 90 ends 1 block into its second
    # segment, which keeps only that block (80), beside the first segment's tail 48, 64 (vLLM run, 2026-12-02)
    (64, 16, 33, 0, None, 1, {"num_tokens": 90}, (48, 64, 80)),
    # window 17 needs 1 block: prompt 120 ends 3 blocks into its last segment, which keeps its last block (112),
    # not all three (vLLM run, 2026-12-02)
    (64, 16, 17, 0, None, 1, {"num_tokens": 120}, (64, 112)),
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


# ----------------------------------------------------------------------------------- drafters


@pytest.mark.parametrize(
    ("n", "computed", "finished", "ends"),
    [
        (48, 40, False, [16, 32]),  # prefill (computed <= prompt 40): trailing chunk stored at once
        (49, 48, False, [16, 32]),  # decoding: chunk 48 held back (vLLM run: stored at 64 instead)
        (65, 64, False, [16, 32, 48]),  # decoding: chunk 48 now, chunk 64 held back
        (65, 64, True, [16, 32, 48, 64]),  # finished: the hold-back is lifted
    ],
)
def test_eagle_store_holds_back_the_volatile_chunk_while_decoding(n, computed, finished, ends):
    g = kvgeom.resolve({"groups": [{**FA16, "drafter": True}], "offload": {}, "speculative": spec()})
    plan = hits.plan_store(g, num_tokens=n, num_computed_tokens=computed, num_prompt_tokens=40,
                           offload_prompt_only=False, finished=finished)
    assert list(plan.groups[0].end_tokens) == ends
    plain = kvgeom.resolve({"groups": [FA16], "offload": {}})
    assert list(hits.plan_store(plain, num_tokens=n, num_computed_tokens=computed, num_prompt_tokens=40,
                                offload_prompt_only=False, finished=finished).groups[0].end_tokens) == \
        [16 * (j + 1) for j in range(min(computed, n - 1 if finished else n) // 16)]


def test_stores_keep_the_shifted_mamba_checkpoint():
    g = kvgeom.resolve({"groups": [{**FA16, "drafter": True}, M16], "offload": {}, "speculative": spec()})
    plan = hits.plan_store(g, num_tokens=100, num_computed_tokens=100)
    assert list(plan.groups[1].end_tokens) == [80] and plan.groups[1].block_entries == ((4,),)


@pytest.mark.parametrize(
    ("group", "storable", "offloadable", "finished", "kept"),
    [
        (2, 6, 100, False, 5),  # eagle group decoding (100 > prompt 90): 100 // 16 - 1 = 5 chunks
        (2, 4, 100, False, 4),  # fewer storable than that: min(4, 5) = 4
        (2, 0, 100, False, 0),  # nothing storable stays nothing
        (2, 6, 100, True, 6),  # finished: the hold-back is lifted
        (2, 6, 90, False, 6),  # still in the prompt (90 <= 90): no hold-back
        (0, 6, 100, False, 6),  # a target group never holds back
    ],
)
def test_store_holdback_chunks(group, storable, offloadable, finished, kept):
    from kvgeom.hits import store_holdback_chunks

    g = kvgeom.resolve({"groups": [FA16, M16, DRAFT16], "offload": {}, "speculative": spec()})  # chunks of 16
    assert store_holdback_chunks(g, group, storable, offloadable, 90, finished) == kept


# ------------------------------------------------------- sliding-window drafters (issue 19)
# Rows run through vLLM 0.33's real Scheduler and OffloadingConnector
# (kvgeom.conformance.vllm_stores.run_store_then_lookup): prompt n1 stored, then a request of n2 looked up.
# Under the EAGLE drop a sliding-window eagle group's store mask keeps one block more of the window and
# ends its runs one block later (SlidingWindowManager.reachable_block_mask with use_eagle).


def _sw_drafter(block, window, **extra):
    return {"kind": "sliding_window", "block_size": block, "sliding_window": window, "drafter": True, **extra}


EAGLE_SWA_ROWS = [
    # R = 64: ends 48-80, 112-144, 176-(208) -- the 3-block run (window 2 + pop) one block past each
    # 64-token boundary; without the drafter vLLM stores 48, 64, 112, 128, 176, 192. Hit 128.
    ("r64", [FA16, _sw_drafter(16, 32)], 64, {}, 200, 220, [48, 64, 80, 112, 128, 144, 176, 192], 128),
    # R = 64, window 1: the run is the pop block alone, the first block of each next segment. Hit 0.
    ("r64-window1", [FA16, _sw_drafter(16, 1)], 64, {}, 200, 220, [80, 144], 0),
    # R = 0: only the run at the aligned replay boundary rdown(199, 16) = 192; its pop block (ends 208)
    # is past the prompt, so nothing is loadable. Hit 0.
    ("r0", [FA16, _sw_drafter(16, 32)], 0, {}, 200, 220, [176, 192], 0),
    # R = 0, a prompt of 96: the run around rdown(95, 16) = 80 fits (ends 64, 80, 96). vLLM hits 80.
    ("r0-fits", [FA16, _sw_drafter(16, 32)], 0, {}, 96, 120, [64, 80, 96], 80),
    # R = 0, blocks_per_chunk 2 (chunks of 32): blocks 15-17 around rdown(299, 32) = 288 -> chunks 256, 288.
    ("r0-k2", [{"kind": "full_attention", "block_size": 32}, _sw_drafter(16, 32)], 0, {"blocks_per_chunk": 2},
     300, 330, [256, 288], 256),
    # R = None: the run covers every 16-token segment (dense). Hit 176 (the lookup's pop).
    ("dense", [FA16, _sw_drafter(16, 32)], None, {}, 200, 220, list(range(16, 193, 16)), 176),
]


@pytest.mark.parametrize(("name", "groups", "retention", "offload", "n1", "n2", "stored", "hit"), EAGLE_SWA_ROWS,
                         ids=[r[0] for r in EAGLE_SWA_ROWS])
def test_sliding_window_drafter_store_and_hit_match_vllm(name, groups, retention, offload, n1, n2, stored, hit):
    g = kvgeom.resolve({"groups": groups, "cache": {"retention_interval": retention}, "offload": offload,
                        "speculative": spec(k=1)})
    plan = hits.plan_store(g, num_tokens=n1, num_computed_tokens=n1)
    assert list(plan.groups[1].end_tokens) == stored
    tier = {str(gs.index): list(gs.end_tokens) for gs in plan.groups}
    assert g.plan_hit({"num_tokens": n2, "stored": tier})["hit_tokens"] == hit


def test_a_target_sliding_window_group_keeps_its_own_mask_beside_a_drafter():
    # FA16 + SWA16 (target) + SWA16 drafter with 4 KV heads, R = 64, prompt 200 (vLLM run): the target keeps
    # 48, 64, 112, 128, 176, 192, the drafter 48-80, 112-144, 176-192; both load 112, 128 for a hit of 128
    sw = {"kind": "sliding_window", "block_size": 16, "sliding_window": 32}
    g = kvgeom.resolve({"groups": [FA16, sw, {**sw, "num_kv_heads": 4, "drafter": True}],
                        "cache": {"retention_interval": 64}, "offload": {}, "speculative": spec(k=1)})
    plan = hits.plan_store(g, num_tokens=200, num_computed_tokens=200)
    assert [list(gs.end_tokens) for gs in plan.groups[1:]] == [[48, 64, 112, 128, 176, 192],
                                                              [48, 64, 80, 112, 128, 144, 176, 192]]
    tier = {str(gs.index): list(gs.end_tokens) for gs in plan.groups}
    out = g.plan_hit({"num_tokens": 220, "stored": tier})
    assert out["hit_tokens"] == 128
    assert [grp["load_keys"] for grp in out["groups"][1:]] == [[112, 128], [112, 128]]


def test_an_eagle_group_has_no_final_store_tail():
    # vLLM 0.33 gives an EAGLE group no store horizon: swa_store_horizon is None for it
    from kvgeom.masks import swa_store_horizon

    g = kvgeom.resolve({"groups": [{"kind": "full_attention", "block_size": 64}, _sw_drafter(32, 16)],
                        "cache": {"retention_interval": None}, "offload": {}, "speculative": spec(k=1)})
    assert swa_store_horizon(g, 1, storable_chunks=3, prompt_chunks=7, finished=False) is None


# ------------------------------------------------------- partial tails and Mamba keys past the prompt (issue 19)
# Rows run through vLLM 0.33's real Scheduler and OffloadingConnector over a recording tier, step by step (the
# keys prepare_store is asked for at each step, as kvgeom.conformance.vllm_stores records them; request A's
# decoded tokens continue the hash chain, max_offload_tokens passed as the request's kv_transfer_params,
# offload_prompt_only as the connector's extra config).

#: FA64 + Mamba64, H = 16, DCP 1: partial tails (the prompt's H-grid checkpoint off the 64-token span)
FINE64 = kvgeom.resolve({"groups": [{"kind": "full_attention", "block_size": 64}, {"kind": "mamba", "block_size": 64}],
                         "cache": {"prefix_match_unit": 16}, "offload": {}})


@pytest.mark.parametrize(
    ("n", "computed", "kw", "tail"),
    [
        # a 24-token prompt (vLLM: chunks end at 16, 24): nothing at the step ending at 16, both groups store the
        # checkpoint 16 at the step ending at 24 (no chunk key: 24 < 64)
        (24, 16, {}, None),
        (24, 24, {}, 16),
        # max_offload_tokens = 16 = the checkpoint: the tail is still stored (vLLM run, the same keys)
        (24, 24, {"max_offload_tokens": 16}, 16),
        # a 40-token prompt prefilled with budgets 8, 100 (vLLM: chunks end at 8, 32, 40): the tail 32 at 40
        (40, 40, {"chunk_ends": (8, 32, 40)}, 32),
    ],
)
def test_partial_tail_keys_in_the_store_plan_match_vllm(n, computed, kw, tail):
    plan = plan_store(FINE64, num_tokens=n, num_computed_tokens=computed, **kw)
    assert [(g.index, g.chunks, g.partial_tail) for g in plan.groups] == [(0, (), tail), (1, (), tail)]
    assert [g.stored_end_tokens for g in plan.groups] == [() if tail is None else (tail,)] * 2


#: an eagle FA32 drafter + Mamba32, H = 8, K = 2, DCP 1: partial tails with a proof margin of one hash unit (8)
EAGLE_TAIL = kvgeom.resolve({"groups": [{"kind": "full_attention", "block_size": 32, "drafter": True},
                                        {"kind": "mamba", "block_size": 32}],
                             "cache": {"prefix_match_unit": 8}, "offload": {}, "speculative": spec()})


@pytest.mark.parametrize(
    ("n", "computed", "ends", "stored", "loaded", "fa", "mamba"),
    [
        # request A, a 100-token prompt that loaded nothing (vLLM: chunks end at 64, 88, 96, 100; the Mamba manager
        # hands over the checkpoint 88 at the step ending at 96 = 88 + the margin, and no partial-tail key is
        # stored for a request that did not load from the tier); `loaded` None: the argument left out
        (100, 64, (64, 88, 96, 100), None, None, ((32, 64), None), ((64,), None)),
        (100, 96, (64, 88, 96, 100), {0: 2, 1: 2}, None, ((96,), None), ((), None)),
        (100, 96, (64, 88, 96, 100), {0: 2, 1: 2}, False, ((96,), None), ((), None)),
        # request B, a 150-token prompt over A's tier: it loads FA 32, 64 and Mamba 64 (hit 64), then computes 96,
        # 136, 150; the step ending at 150 (past the checkpoint 136 + 8) stores its partial tail: the drafter's key
        # at 136 + 8 = 144, Mamba's at 136
        (150, 96, (64, 96, 136, 150), {0: 2, 1: 2}, True, ((96,), None), ((96,), None)),
        (150, 136, (64, 96, 136, 150), {0: 3, 1: 3}, True, ((128,), None), ((), None)),
        (150, 150, (64, 96, 136, 150), {0: 4, 1: 4}, True, ((), 144), ((), 136)),
        # request B prefilled with budgets 100, 32, 32, 8, 4, 100 (chunks end at 96, 128, 136, 140, 150): the
        # manager hands the checkpoint 136 over once, at the step ending at 140 < 136 + 8, so vLLM stores no tail,
        # neither then nor at 150 (kvgeom listed it at 150 before the hand-off step was modelled)
        (150, 140, (64, 96, 128, 136, 140, 150), {0: 4, 1: 4}, True, ((), None), ((), None)),
        (150, 150, (64, 96, 128, 136, 140, 150), {0: 4, 1: 4}, True, ((), None), ((), None)),
        # budgets 100, 32, 40, 4, 100 (chunks end at 96, 128, 132, 136, 150): the hand-off step ends at 150
        (150, 150, (64, 96, 128, 132, 136, 150), {0: 4, 1: 4}, True, ((), 144), ((), 136)),
    ],
)
def test_partial_tail_of_a_request_that_loaded_from_the_tier_as_vllm_stores_it(n, computed, ends, stored, loaded,
                                                                               fa, mamba):
    """vLLM 0.33 runs (the Scheduler and OffloadingConnector over a recording tier as above, request B built
    over request A's stored keys, its loads reported done; the KV cache config's hit alignment set as vLLM's
    engine core sets it, which makes the proof margin one hash unit, 8, rather than a block): each step's stores.
    With an eagle proof margin, only a request that ``loaded_from_offload`` stores its partial tail."""
    kw = {} if loaded is None else {"loaded_from_offload": loaded}
    plan = plan_store(EAGLE_TAIL, num_tokens=n, num_computed_tokens=computed, chunk_ends=ends, stored_chunks=stored,
                      **kw)
    assert [(g.end_tokens, g.partial_tail) for g in plan.groups] == [fa, mamba]


#: FINE64 with multi-module MTP (K = 3, P = 3): a step ending at e caches e - 2 tokens
FINE64_MTP = kvgeom.resolve({"groups": [{"kind": "full_attention", "block_size": 64},
                                        {"kind": "mamba", "block_size": 64}],
                             "cache": {"prefix_match_unit": 16}, "offload": {},
                             "speculative": spec("mtp", 3, mtp_modules=3)})


@pytest.mark.parametrize(
    ("computed", "ends", "stored", "fa", "mamba"),
    [
        # a 100-token prompt prefilled with budgets 64, 16, 2, 100 (vLLM: chunks end at 64, 80, 82, 100): FA 64 at
        # the step ending at 64; the step ending at 82 caches exactly the checkpoint 80, and the partial tail 80 of
        # both groups is stored at the step ending at 100
        (64, (64, 80, 82, 100), None, ((64,), None), ((), None)),
        (100, (64, 80, 82, 100), {0: 1, 1: 1}, ((), 80), ((), 80)),
        # vLLM's own split (an unbounded budget: chunks end at 80, 100): no step caches exactly 80, no tail
        (100, None, None, ((64,), None), ((), None)),
    ],
)
def test_the_given_chunk_ends_decide_the_partial_tail_as_vllm_stores_it(computed, ends, stored, fa, mamba):
    """vLLM 0.33 runs (the Scheduler's split with the given budgets, the connector's stores per step)."""
    plan = plan_store(FINE64_MTP, num_tokens=100, num_computed_tokens=computed, chunk_ends=ends, stored_chunks=stored)
    assert [(g.end_tokens, g.partial_tail) for g in plan.groups] == [fa, mamba]


#: FA16 + Mamba16, retention 32, offload_prompt_only off: a 40-token prompt decoded to 80 tokens
DECODE32 = kvgeom.resolve({"groups": [FA16, M16], "cache": {"retention_interval": 32}, "offload": {}})


@pytest.mark.parametrize(
    ("n", "computed", "stored", "fa", "mamba"),
    [
        # vLLM's steps (prompt 40): the prefill step ending at 32 stores FA 16, 32 and Mamba 32; decoding, the step
        # computing 48 stores FA 48 alone, 64 stores FA 64 and Mamba 64 (a retention boundary past the prompt:
        # the store mask alone), 80 stores FA 80 alone
        (40, 32, None, (16, 32), (32,)),
        (48, 48, {0: 2, 1: 2}, (48,), ()),
        (64, 64, {0: 3, 1: 3}, (64,), (64,)),
        (80, 80, {0: 4, 1: 4}, (80,), ()),
    ],
)
def test_mamba_keys_past_the_prompt_follow_the_store_mask_as_vllm_stores_them(n, computed, stored, fa, mamba):
    plan = plan_store(DECODE32, num_tokens=n, num_computed_tokens=computed, num_prompt_tokens=40,
                      offload_prompt_only=False, stored_chunks=stored)
    att, mam = plan.groups
    assert (att.end_tokens, mam.end_tokens) == (fa, mamba)
    assert mam.block_entries == tuple((e // 16 - 1,) for e in mamba)


#: one eagle drafter group (FA16), offload_prompt_only off: a 10-token prompt decoded to 40 tokens
EAGLE_DECODE = kvgeom.resolve({"groups": [{**FA16, "drafter": True}], "offload": {}, "speculative": spec()})


@pytest.mark.parametrize(
    ("n", "computed", "finished", "stored", "ends"),
    [
        # vLLM's steps: nothing while fewer than 32 tokens are computed (the one offloadable chunk is the volatile
        # one, held back), chunk 16 at the step computing 32, chunk 32 once the request finished at 40
        (20, 20, False, None, ()),
        (32, 32, False, None, (16,)),
        (41, 40, True, {0: 1}, (32,)),
    ],
)
def test_eagle_hold_back_of_the_only_offloadable_chunk_matches_vllm(n, computed, finished, stored, ends):
    plan = hits.plan_store(EAGLE_DECODE, num_tokens=n, num_computed_tokens=computed, num_prompt_tokens=10,
                           offload_prompt_only=False, finished=finished, stored_chunks=stored)
    assert plan.groups[0].end_tokens == ends


#: FA128 + SWA32 (window 16), retention None (alignment 128 = 4 SWA blocks), offload_prompt_only off
SWA_REVISIT = _geom(128, 32, 16, 0, None)


def _fa_swa_step(n, computed, stored, finished, geom, prompt):
    """The full-attention and sliding-window end tokens one store step lists (decode stored too:
    offload_prompt_only off), for the step tables below, each from vLLM 0.33's own steps."""
    plan = plan_store(geom, num_tokens=n, num_computed_tokens=computed, num_prompt_tokens=prompt,
                      offload_prompt_only=False, finished=finished, stored_chunks=stored)
    return plan.groups[0].end_tokens, plan.groups[1].end_tokens


@pytest.mark.parametrize(
    ("n", "computed", "stored", "finished", "fa", "swa"),
    [
        # vLLM's steps for a 230-token prompt decoded to 353 tokens: the prefill stores FA 128 and SWA 128, 224 (the
        # partial last segment's tail); decoding, 256 stores FA 256 and SWA 256 and nothing else until 353; the
        # step after the finish stores SWA 352 alone: of the revisited segment [256, 384) only the final tail
        (230, 230, None, False, (128,), (128, 224)),
        (256, 256, {0: 1, 1: 7}, False, (256,), (256,)),
        (353, 353, {0: 2, 1: 8}, False, (), ()),
        (354, 353, {0: 2, 1: 11}, True, (), (352,)),
    ],
)
def test_finished_sliding_window_revisits_only_its_final_tail_as_vllm_stores_it(n, computed, stored, finished, fa,
                                                                                 swa):
    assert _fa_swa_step(n, computed, stored, finished, SWA_REVISIT, 230) == (fa, swa)


#: FA16 + SWA32 (window 16), retention None: the offload alignment (16) is no multiple of the SWA block (32)
SWA_OFF_GRID = _geom(16, 32, 16, 0, None)


@pytest.mark.parametrize(
    ("n", "computed", "stored", "finished", "fa", "swa"),
    [
        # vLLM's steps for a 301-token prompt decoded to 372 tokens: 320 stores FA 320 and SWA 320; the step after
        # the finish stores nothing (no final-tail revisit: the alignment is not a whole number of SWA blocks)
        (320, 320, {0: 19, 1: 9}, False, (320,), (320,)),
        (373, 372, {0: 23, 1: 11}, True, (), ()),
    ],
)
def test_no_final_tail_revisit_off_the_sliding_window_grid_as_vllm_stores_it(n, computed, stored, finished, fa, swa):
    assert _fa_swa_step(n, computed, stored, finished, SWA_OFF_GRID, 301) == (fa, swa)


#: FA64 + SWA16 (window 33: need 2 blocks), retention None: alignment 64 = 4 SWA blocks, one block per chunk
SWA_NEAR_TAILS = _geom(64, 16, 33, 0, None)


@pytest.mark.parametrize(
    ("n", "computed", "stored", "finished", "fa", "swa"),
    [
        # vLLM's steps for a 216-token prompt decoded to 230 tokens (offload_prompt_only off): the prefill stores
        # FA 64, 128, 192 and SWA 48, 64, 112, 128, 176, 192 (segment tails) and 208 (the partial last segment's
        # tail); decoding stores nothing; the step that sees the finish stores SWA 224 alone: the final tail of
        # [192, 256) is 208 and 224, and 208, kept under the prompt's horizon, was stored by the prefill
        (216, 216, None, False, (64, 128, 192), (48, 64, 112, 128, 176, 192, 208)),
        (224, 224, {0: 3, 1: 13}, False, (), ()),
        (229, 229, {0: 3, 1: 14}, False, (), ()),
        (230, 229, {0: 3, 1: 14}, True, (), (224,)),
    ],
)
def test_finished_sliding_window_does_not_store_the_prompt_tail_again_as_vllm_stores_it(n, computed, stored,
                                                                                         finished, fa, swa):
    assert _fa_swa_step(n, computed, stored, finished, SWA_NEAR_TAILS, 216) == (fa, swa)


#: FA16 + FA32 (different chunks: the connector has no alignment_tokens, warning alignment_tokens_none) + SWA16
#: (window 16), retention None: the sliding window's store mask is dense and no final tail is revisited
SWA_NO_ALIGNMENT = kvgeom.resolve({"groups": [{"kind": "full_attention", "block_size": 16},
                                              {"kind": "full_attention", "block_size": 32, "num_kv_heads": 4},
                                              {"kind": "sliding_window", "block_size": 16, "sliding_window": 16}],
                                   "cache": {"retention_interval": None}, "offload": {}})


@pytest.mark.parametrize(
    ("n", "computed", "stored", "finished", "ends"),
    [
        # vLLM's steps for a 64-token prompt decoded to 100 tokens (offload_prompt_only off): every chunk of each
        # group as it completes, the sliding window's too; the step that sees the finish stores nothing
        (64, 64, None, False, ((16, 32, 48, 64), (32, 64), (16, 32, 48, 64))),
        (80, 80, {0: 4, 1: 2, 2: 4}, False, ((80,), (), (80,))),
        (96, 96, {0: 5, 1: 2, 2: 5}, False, ((96,), (96,), (96,))),
        (100, 100, {0: 6, 1: 3, 2: 6}, False, ((), (), ())),
        (101, 100, {0: 6, 1: 3, 2: 6}, True, ((), (), ())),
    ],
)
def test_sliding_window_without_an_offload_alignment_stores_every_chunk_as_vllm_does(n, computed, stored, finished,
                                                                                    ends):
    plan = plan_store(SWA_NO_ALIGNMENT, num_tokens=n, num_computed_tokens=computed, num_prompt_tokens=64,
                      offload_prompt_only=False, finished=finished, stored_chunks=stored)
    assert tuple(g.end_tokens for g in plan.groups) == ends


# ------------------------------------------------------- the walked-blocks bound (kvgeom's own, masks.MAX_STORE_BLOCKS)
# Not a vLLM answer: kvgeom refuses a scalar store plan that would walk more than MAX_STORE_BLOCKS = 2**18 blocks
# (docs: kvgeom.masks.check_store_size). FA16 with 4 blocks per chunk: 2**16 chunks walk exactly 2**18 blocks.
_FA16_K4 = {"kind": "full_attention", "block_size": 16}


# A step with one chunk left is answered however wide the sliding window's segments (plan_store's docstring, "Size":
# the masks cover only the walked chunks; only a finished group revisiting its last segment builds a mask from that
# segment's first chunk). Not a vLLM answer (2**25-token requests): the stored chunk is derived by hand. FA 2**22
# (chunk and alignment 2**25 tokens) + SWA with block 1 and a window of 2**24 + 16 tokens (need 2**24 + 15 blocks; an
# EAGLE drafter needs one block more, one block later), 8 blocks per chunk; a segment is 2**25 blocks. The request
# has N = 2**25 + 2**24 + 8 tokens: the last SWA chunk (blocks [N - 8, N)) lies in the last need blocks of segment 1,
# [2**26 - need, 2**26), so it is stored; everything before it was stored already. Its segment starts 2**24 + 8
# blocks below N: a mask from there would be refused as more than MAX_SCALAR_RESULT = 2**24 blocks.
_WIDE_N = 2**25 + 2**24 + 8
_WIDE_SWA = {"kind": "sliding_window", "block_size": 1, "sliding_window": 2**24 + 16}


@pytest.mark.parametrize(
    ("swa", "retention", "n", "prompt", "finished"),
    [
        (_WIDE_SWA, None, _WIDE_N, 2**25 + 8, False),  # decoding past the prompt: no final tail, no revisit
        (_WIDE_SWA, None, _WIDE_N, _WIDE_N, True),  # finished at the prompt's horizon: nothing to revisit
        (_WIDE_SWA, 2**25, _WIDE_N + 1, 2**25 + 8, True),  # a retention interval: no final tail, no revisit
        ({**_WIDE_SWA, "drafter": True}, None, _WIDE_N + 1, 2**25 + 8, True),  # an EAGLE group: no final tail
    ],
    ids=["decoding", "finished-at-the-prompt", "retention", "eagle"],
)
def test_a_step_with_one_chunk_left_is_answered_over_a_wide_sliding_segment(swa, retention, n, prompt, finished):
    cfg = {"groups": [{"kind": "full_attention", "block_size": 2**22}, swa], "offload": {"blocks_per_chunk": 8},
           "cache": {"retention_interval": retention}}
    if swa.get("drafter"):
        cfg["speculative"] = spec(k=1)
    geom = kvgeom.resolve(cfg)
    plan = plan_store(geom, num_tokens=n, num_computed_tokens=_WIDE_N, num_prompt_tokens=prompt,
                      offload_prompt_only=False, finished=finished, stored_chunks={0: 1, 1: _WIDE_N // 8 - 1})
    assert [g.end_tokens for g in plan.groups] == [(), (_WIDE_N,)]


@pytest.mark.parametrize(
    ("groups", "n", "stored", "count"),
    [
        ([_FA16_K4], 2**22, None, None),  # exactly the bound: planned
        ([_FA16_K4], 2**22 + 64, None, (2**16 + 1) * 4),  # one chunk more: refused, counted in blocks
        # two groups: the second one's blocks are added to the first one's
        ([_FA16_K4, {**_FA16_K4, "num_kv_heads": 4}], 2**22, None, 2 * 2**18),
        # a group with nothing left to store walks no block
        ([_FA16_K4, {**_FA16_K4, "num_kv_heads": 4}], 2**22, {1: 2**16}, None),
    ],
    ids=["at-the-bound", "past-the-bound", "two-groups-add", "nothing-left-walks-nothing"],
)
def test_store_plan_walked_blocks_bound(groups, n, stored, count):
    from kvgeom.masks import MAX_STORE_BLOCKS

    g = kvgeom.resolve({"groups": groups, "offload": {"blocks_per_chunk": 4}})
    if count is None:
        plan = plan_store(g, num_tokens=n, num_computed_tokens=n, stored_chunks=stored)
        assert len(plan.groups[0].chunks) == 2**16
        assert sum(len(gs.chunks) for gs in plan.groups) * 4 == MAX_STORE_BLOCKS
        return
    with pytest.raises(QueryError) as info:
        plan_store(g, num_tokens=n, num_computed_tokens=n, stored_chunks=stored)
    assert (info.value.code, info.value.problems[0].values) == ("result_too_large",
                                                                 {"count": count, "limit": MAX_STORE_BLOCKS})


@pytest.mark.parametrize(("cfg", "n", "budgets", "ends", "steps", "gpu"), STEP_ROWS)
def test_each_steps_stores_and_the_gpu_states_as_vllm(cfg, n, budgets, ends, steps, gpu):
    """kvgeom.hits.plan_store_steps (a plan per step, each passing next_stored_chunk and partial_tail_stored on)
    and kvgeom.sim.GPUPrefixCache give vLLM 0.33's answers (``tests/_step_rows.py``: the split of the per-step
    budgets, the keys stored in each step, the GPU prefix cache's entries)."""
    from kvgeom.hits import plan_store_steps
    from kvgeom.prefill import prefill_chunk_ends
    from kvgeom.sim import GPUPrefixCache

    geom = kvgeom.resolve(cfg)
    if any(g.is_align_mamba for g in geom.groups):  # kvgeom models vLLM's split with an align Mamba group
        assert list(prefill_chunk_ends(geom, n, max_num_batched_tokens=budgets)) == ends
    plans = plan_store_steps(geom, num_prompt_tokens=n, chunk_ends=ends)
    assert [{str(g.index): list(g.stored_end_tokens) for g in p.groups if g.stored_end_tokens} for p in plans] == steps
    # one plan over the whole prefill (and the finish step) lists the same keys
    whole = [plan_store(geom, num_tokens=n, num_computed_tokens=n, chunk_ends=ends),
             plan_store(geom, num_tokens=n + 1, num_computed_tokens=n, num_prompt_tokens=n, chunk_ends=ends,
                        finished=True)]
    keys = {(g.index, e) for p in whole for g in p.groups for e in g.stored_end_tokens}
    assert keys == {(int(g), e) for step in steps for g, ends_ in step.items() for e in ends_}
    cache = GPUPrefixCache(geom)
    cache.cache_request(n, chunk_ends=ends)
    assert {g: e for g, e in cache.resident().items() if e} == gpu


@pytest.mark.parametrize(
    ("kwargs", "code", "field"),
    [
        ({"chunk_ends": [64, 32, 100]}, "bad_chunk_ends", "chunk_ends"),  # not increasing
        ({"chunk_ends": [64, 90]}, "bad_chunk_ends", "chunk_ends"),  # does not end at the prompt
        ({"chunk_ends": [0, 100]}, "bad_chunk_ends", "chunk_ends"),  # a chunk of nothing
        ({"chunk_ends": "100"}, "bad_chunk_ends", "chunk_ends"),  # a string is not a list of ends
        ({"finished": "yes"}, "not_a_bool", "finished"),
        ({"num_prompt_tokens": -1}, "negative", "num_prompt_tokens"),
    ],
)
def test_plan_store_steps_refuses_a_split_that_is_not_a_prefill(kwargs, code, field):
    geom = kvgeom.resolve({"groups": [FA16, M16], "offload": {}})
    with pytest.raises(QueryError) as e:
        hits.plan_store_steps(geom, **{"num_prompt_tokens": 100, **kwargs})
    assert (e.value.code, e.value.problems[0].field) == (code, field)


def test_plan_store_steps_refuses_more_steps_than_it_plans_before_planning():
    geom = kvgeom.resolve({"groups": [FA16, M16], "offload": {}})
    n = hits.MAX_STORE_STEPS + 1
    with pytest.raises(QueryError) as e:
        hits.plan_store_steps(geom, num_prompt_tokens=n, chunk_ends=range(1, n + 1))
    assert e.value.code == "result_too_large" and e.value.problems[0].field == "chunk_ends"
    assert e.value.values == {"total": n, "limit": hits.MAX_STORE_STEPS}
    assert len(hits.plan_store_steps(geom, num_prompt_tokens=n - 1, chunk_ends=range(1, n))) == n


def test_plan_store_steps_defaults_to_vllms_unbounded_split_and_a_finish_step():
    """FA 16 + Mamba 16, a 100-token prompt: vLLM's unbounded split ends chunks at 96 and 100 (the default), the
    step after the finish stores nothing more; without ``finished`` only the prefill steps are planned; without an
    align Mamba group the prefill is one chunk."""
    geom = kvgeom.resolve({"groups": [FA16, M16], "offload": {}})
    plans = hits.plan_store_steps(geom, num_prompt_tokens=100)
    assert [[g.end_tokens for g in p.groups] for p in plans] == [
        [(16, 32, 48, 64, 80, 96), (96,)], [(), ()], [(), ()]]
    assert len(hits.plan_store_steps(geom, num_prompt_tokens=100, finished=False)) == 2
    fa = kvgeom.resolve({"groups": [FA16], "offload": {}})
    assert [[g.end_tokens for g in p.groups] for p in hits.plan_store_steps(fa, num_prompt_tokens=40)] == [
        [(16, 32)], [()]]
    assert hits.plan_store_steps(fa, num_prompt_tokens=0) == (hits.plan_store(fa, num_tokens=1, num_computed_tokens=0,
                                                                              num_prompt_tokens=0, finished=True),)


def test_a_plan_that_passes_partial_tail_stored_lists_no_tail_and_refuses_a_non_bool():
    """FINE64 (FA 64 + Mamba 64, H 16), a 228-token prompt: the tail at 224 is listed until a plan says it was
    stored; the batch twin takes the flag per request."""
    plan = plan_store(FINE64, num_tokens=228, num_computed_tokens=228)
    assert [g.partial_tail for g in plan.groups] == [224, 224]
    again = plan_store(FINE64, num_tokens=228, num_computed_tokens=228, partial_tail_stored=True)
    assert [g.partial_tail for g in again.groups] == [None, None]
    assert [g.end_tokens for g in again.groups] == [g.end_tokens for g in plan.groups]
    sp = plan_stores(FINE64, num_tokens=[228, 228], num_computed_tokens=[228, 228], partial_tail_stored=[False, True])
    assert (sp.plan(0), sp.plan(1)) == (plan, again)
    with pytest.raises(QueryError) as e:
        plan_store(FINE64, num_tokens=228, num_computed_tokens=228, partial_tail_stored=1)
    assert (e.value.code, e.value.problems[0].field) == ("not_a_bool", "partial_tail_stored")


def test_plan_store_steps_passes_the_requests_offload_limit_and_whether_it_loaded():
    """The per-request inputs reach every step's plan: an eagle drafter's partial tail is stored only for a request
    that loaded from the tier (EAGLE_TAIL, a 48-token prompt: vLLM's unbounded split ends at 40 and 48, the tail at
    40 is handed over at 48 = 40 + the margin 8), and ``max_offload_tokens`` caps what any step stores."""
    plain = hits.plan_store_steps(EAGLE_TAIL, num_prompt_tokens=48)
    loaded = hits.plan_store_steps(EAGLE_TAIL, num_prompt_tokens=48, loaded_from_offload=True)
    assert [[g.partial_tail for g in p.groups] for p in plain] == [[None, None]] * 3
    assert [[g.partial_tail for g in p.groups] for p in loaded] == [[None, None], [48, 40], [None, None]]
    capped = hits.plan_store_steps(FINE64, num_prompt_tokens=228, max_offload_tokens=100)
    assert {e for p in capped for g in p.groups for e in g.stored_end_tokens} == {64}
