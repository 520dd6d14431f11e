"""Example tables for the Mamba hand-off (``kvgeom.handoff``): which align-mode Mamba states reach the offload
tier, and the partial-tail store job (vLLM 0.33 ``MambaManager.cache_blocks``,
``_build_aligned_boundary_store_jobs``, ``_build_partial_tail_store_jobs``; the module docstring states the
three conditions). Each row's numbers follow from the docstrings' formulas; the comment shows the arithmetic.

The rows marked "(vLLM run)" restate results of running vLLM 0.33 itself on the same deployment.
"""

from __future__ import annotations

import pytest
from _drafter_rows import DRAFT16, FA16, M16, spec

import kvgeom
from kvgeom import hits
from kvgeom.handoff import (
    cached_state_ends,
    checked_prefill_split,
    default_chunk_ends,
    mamba_cacheable_tokens,
    mamba_handoffs,
    partial_tail_boundary,
    replay_boundaries,
    state_ends,
)

SEED = kvgeom.resolve(kvgeom.DEFAULT_CONFIG)  # FA 16 + Mamba 16, DCP 2: L = 32, H = 16, partial hits, retention 0
SEED_DENSE = kvgeom.resolve({**kvgeom.DEFAULT_CONFIG, "cache": {"retention_interval": None}})
DCP1 = kvgeom.resolve({"groups": [FA16, M16], "offload": {}})  # L = H = 16: no partial hash hits
# a flagged drafter under the GPU drop (an offload section): the drop set is {2}, Mamba keeps its own manager
DROP = kvgeom.resolve({"groups": [FA16, M16, DRAFT16], "offload": {}, "speculative": spec()})
# no group flagged: the coordinator drops for every group, Mamba's manager included (the eagle bit)
DROP_ALL = kvgeom.resolve({"groups": [FA16, M16], "offload": {}, "speculative": spec()})
# the same with multi-module MTP, K = 3: P = 3, so P - 1 = 2 tokens may be re-prefilled
MTP_ALL = kvgeom.resolve({"groups": [FA16, M16], "offload": {}, "speculative": spec("mtp", 3, mtp_modules=3)})
NO_PREFIX = kvgeom.resolve({"groups": [FA16, {**M16, "mamba_cache_mode": "align"}],
                            "cache": {"prefix_caching": False}, "offload": {}})
FINE64_CFG = {"groups": [{"kind": "full_attention", "block_size": 64}, {"kind": "mamba", "block_size": 64}],
              "cache": {"prefix_match_unit": 16}, "offload": {}}  # DCP 1, span 64, H 16: partial tails on
FINE64 = kvgeom.resolve(FINE64_CFG)


@pytest.mark.parametrize(
    ("geom", "prompt", "points"),
    [
        (SEED, 100, (99,)),  # no GPU drop: the resend cap num_prompt - 1
        (SEED, 0, ()),  # an empty prompt: nowhere to resume
        (DROP, 100, (80,)),  # the drop, L 16: {rdown(99, 16) - 16, rdown(100, 16) - 16} = {80}
        (DROP, 96, (64, 80)),  # {rdown(95, 16) - 16, rdown(96, 16) - 16} = {64, 80}
        (DROP, 10, (0,)),  # both below one block: max(.., 0) = 0
    ],
)
def test_replay_boundaries(geom, prompt, points):
    assert replay_boundaries(geom, prompt) == points


@pytest.mark.parametrize(
    ("geom", "group", "computed", "cacheable"),
    [
        (SEED, 1, 100, 100),  # several groups, partial hash hits on: c itself
        (DCP1, 1, 100, 96),  # no partial hits: rdown(100, L = 16) = 96
        (NO_PREFIX, 1, 100, 0),  # prefix caching off: nothing is hashed
        (DROP, 1, 100, 96),  # Mamba is not in the drop set {2}: rdown(100, 16) = 96
        (DROP_ALL, 1, 100, 100),  # the eagle bit: min(finalized 100, rdown(100, 16) + span 16) = 100
        (DROP_ALL, 1, 96, 96),  # on the grid: min(96, 96 + 16) = 96
        (MTP_ALL, 1, 100, 98),  # finalized 100 - (P - 1) = 98, min(98, 96 + 16) = 98
        (MTP_ALL, 0, 100, 98),  # the attention group has the eagle bit too
    ],
)
def test_mamba_cacheable_tokens(geom, group, computed, cacheable):
    assert mamba_cacheable_tokens(geom, group, computed) == cacheable


def test_mamba_cacheable_tokens_of_a_single_group_keeps_p_minus_1_out():
    # the unitary coordinator: c - (P - 1) = 100 - 2 (multi-module MTP, K = 3, P = 3)
    g = kvgeom.resolve({"groups": [M16], "speculative": spec("mtp", 3, mtp_modules=3)})
    assert mamba_cacheable_tokens(g, 0, 100) == 98


#: vLLM 0.33's split of 100 tokens with a 16-token budget (vLLM run)
B16 = (16, 32, 48, 64, 80, 96, 100)

@pytest.mark.parametrize(
    ("geom", "prompt", "computed", "chunk_ends", "window", "ends"),
    [
        # the deployment's split given: the chunk ends themselves
        (SEED, 100, 100, (96, 100), {}, (96, 100)),
        # no split given: vLLM's unbounded split (vLLM run: chunks end at 96 and 100)
        (SEED, 100, 100, None, {}, (96, 100)),
        # a prefill stopped at 40: the ends up to 40, and 40 itself (the step that stores ended there)
        (SEED, 100, 40, B16, {}, (16, 32, 40)),
        (SEED, 100, 40, None, {}, (40,)),
        # only the window (32, 64]
        (SEED, 100, 100, B16, {"above": 32, "upto": 64}, (48, 64)),
        # under the GPU drop: vLLM's split with an unbounded budget, chunks (80, 20)
        (DROP, 100, 100, None, {}, (80, 100)),
    ],
)
def test_state_ends(geom, prompt, computed, chunk_ends, window, ends):
    assert state_ends(geom, prompt, computed, chunk_ends, **window) == ends


@pytest.mark.parametrize(
    ("geom", "prompt", "computed", "chunk_ends", "keys"),
    [
        # retention 0: the replay boundary 99 keeps the block of the chunk end 96 only
        (SEED, 100, 100, (96, 100), (96,)),
        # the same with the default split: still 96 (the mask keeps one block)
        (SEED, 100, 100, None, (96,)),
        # dense retention, chunks ending at 32, 64, 96, 100: the three on the Mamba grid (100 is not)
        (SEED_DENSE, 100, 100, (32, 64, 96, 100), (32, 64, 96)),
        # dense, default split (vLLM run: chunks end at 96, 100; Mamba 96 stored)
        (SEED_DENSE, 100, 100, None, (96,)),
        # dense, prefilled 16 tokens a step (vLLM run: Mamba 16, 32, ..., 96 stored)
        (SEED_DENSE, 100, 100, B16, (16, 32, 48, 64, 80, 96)),
        # dense, prefilled 16 a step to 40: the states at 16 and 32 (40 is off the Mamba grid)
        (SEED_DENSE, 100, 40, B16, (16, 32)),
        # the GPU drop: chunks end at 80 and 100; the replay boundary 80 keeps 80
        (DROP, 100, 100, None, (80,)),
    ],
)
def test_mamba_handoffs(geom, prompt, computed, chunk_ends, keys):
    assert mamba_handoffs(geom, 1, prompt, computed, chunk_ends) == keys


@pytest.mark.parametrize(
    ("geom", "prompt", "computed", "kw", "boundary"),
    [
        (FINE64, 228, 228, {}, 224),  # vLLM 0.33 run: FA and Mamba both store a key at 224 = rdown(227, 16)
        (FINE64, 228, 224, {}, None),  # the prefill has not gone past the checkpoint 224 yet
        (FINE64, 193, 193, {}, None),  # the checkpoint 192 is on the span grid (3 * 64): a complete chunk
        (FINE64, 228, 228, {"max_offload_tokens": 200}, None),  # 224 past max_offload_tokens
        (FINE64, 228, 228, {"chunk_ends": (64, 128, 192, 228)}, None),  # no chunk ended at 224
        (FINE64, 0, 0, {}, None),  # an empty prompt
        (SEED, 100, 100, {}, None),  # DCP 2: no partial tails
    ],
)
def test_partial_tail_boundary(geom, prompt, computed, kw, boundary):
    assert partial_tail_boundary(geom, prompt, computed, **kw) == boundary


def test_partial_tail_boundary_needs_an_offload_section():
    assert partial_tail_boundary(kvgeom.resolve({**FINE64_CFG, "offload": None}), 228, 228) is None


# ----------------------------------------------------------------------------------- partial tails of an eagle group


def test_eagle_partial_tail_keyed_at_boundary_plus_margin():
    g = kvgeom.resolve({"groups": [{"kind": "full_attention", "block_size": 32, "drafter": True},
                                   {"kind": "mamba", "block_size": 32}],
                        "cache": {"prefix_match_unit": 8}, "offload": {}, "speculative": spec()})
    stored = {0: [32, 64, 88], 1: [32, 80]}
    # complete: 96 -> pop -> 32; tails from min(99, 32 + 2*32 - 1, 100 - 8) = 88 down; the bridge chunk 64 is
    # stored; b = 80 needs the attention key at 80 + 8 = 88 and the Mamba key at 80
    hit = hits.lookup_hit(g, 100, stored=stored)
    assert (hit.end_token, hit.partial_tail) == (80, True)
    loads = hits.plan_load(g, hit)
    assert loads[0].load_keys == (32, 64, 88) and loads[1].load_keys == (80,)
    # without chunk 64 the pop removes the only stored chunk (complete hit 0), and no tail in 8..56 has both
    # its attention key at b + 8 and its Mamba key at b
    assert hits.lookup_hit(g, 100, stored={0: [32, 88], 1: [32, 80]}).end_token == 0


# Rows for the mutation run of kvgeom.handoff (issue 19, docs/mutation.md): the argument checks, each
# naming the argument, and the windows they bound.
HANDOFF_PROBLEMS = [
    # a window bound that is not an int
    (lambda: state_ends(SEED, 100, 100, None, above="32"), "not_an_integer", "above"),
    (lambda: state_ends(SEED, 100, 100, None, upto=64.0), "not_an_integer", "upto"),
    (lambda: mamba_handoffs(SEED, 1, 100, 100, None, above=None), "not_an_integer", "above"),
    (lambda: mamba_handoffs(SEED, 1, 100, 100, None, upto="64"), "not_an_integer", "upto"),
    # chunk ends that are no collection, or a string, or too many
    (lambda: state_ends(SEED, 100, 100, 96), "bad_chunk_ends", "chunk_ends"),
    (lambda: state_ends(SEED, 100, 100, "96"), "bad_chunk_ends", "chunk_ends"),
    (lambda: state_ends(SEED, 100, 100, range(10**12)), "result_too_large", "chunk_ends"),
    (lambda: state_ends(SEED, 100, 100, [96, -1]), "negative", "chunk_ends[]"),
    # a group index that is not one: no_such_group, not a TypeError
    (lambda: mamba_handoffs(SEED, "1", 100, 100), "no_such_group", "group"),
    (lambda: mamba_cacheable_tokens(SEED, [1], 100), "no_such_group", "group"),
    # reachable boundaries that are no collection
    (lambda: mamba_handoffs(SEED, 1, 100, 100, (96, 100), reachable=99), "bad_reachable", "reachable"),
    # the prefill-split helpers name their own arguments
    (lambda: default_chunk_ends(SEED, -1), "negative", "num_prompt_tokens"),
    (lambda: checked_prefill_split([64, 100], -1), "negative", "num_tokens"),
    (lambda: checked_prefill_split([64, 90], 100), "bad_chunk_ends", "chunk_ends"),
    (lambda: cached_state_ends(SEED, 1, 100, 100, (96, 100), upto="64"), "not_an_integer", "upto"),
    (lambda: cached_state_ends(SEED, 7, 100, 100), "no_such_group", "group"),
]


@pytest.mark.parametrize(("call", "code", "field"), HANDOFF_PROBLEMS)
def test_handoff_argument_problems(call, code, field):
    with pytest.raises(kvgeom.QueryError) as info:
        call()
    (problem,) = info.value.problems
    assert (problem.code, problem.field) == (code, field)


def test_handoff_window_bounds_and_limits():
    from kvgeom.masks import MAX_STORE_BLOCKS

    # a negative lower bound is below everything; numpy ints are ints
    assert state_ends(SEED, 100, 100, (96, 100), above=-5) == (96, 100)
    import numpy as np

    every = (16, 32, 48, 64, 80, 96, 100)  # a prefill stopped at every Mamba block
    assert state_ends(SEED, 100, 100, every, above=np.int64(32), upto=np.int64(64)) == (48, 64)
    assert mamba_handoffs(SEED_DENSE, 1, 100, 100, every, above=np.int64(32), upto=64) == (48, 64)
    # the default (vLLM's unbounded split: one chunk to 96, then 100) has no end in (32, 64]
    assert mamba_handoffs(SEED_DENSE, 1, 100, 100, None, above=np.int64(32), upto=64) == ()
    # exactly MAX_STORE_BLOCKS chunk ends are read; one more is refused with the count
    n = 16 * MAX_STORE_BLOCKS
    assert len(state_ends(SEED, n, n, range(16, n + 1, 16))) == MAX_STORE_BLOCKS
    with pytest.raises(kvgeom.QueryError) as info:
        state_ends(SEED, n + 16, n + 16, range(16, n + 17, 16))
    assert info.value.values == {"count": MAX_STORE_BLOCKS + 1, "limit": MAX_STORE_BLOCKS}
    # ... and inside a window only the window's blocks count
    assert state_ends(SEED, 10**9, 10**9, above=10**9 - 32) == (10**9 - 16, 10**9)
    # chunk ends: a generator is read, up to the bound
    assert state_ends(SEED, 100, 100, (e for e in (96, 100))) == (96, 100)


def test_the_default_split_of_a_huge_prompt_is_two_chunk_ends_not_a_walk():
    # issue 19: the old default (a state at every Mamba block) walked 62.5M blocks for 10^9 tokens and had to
    # be refused; vLLM's unbounded split (the default since issue 19 item 3) is one chunk to the last
    # cacheable boundary and the prompt's end, answered without a walk
    assert state_ends(SEED, 10**9, 10**9) == (10**9 - 16, 10**9)


@pytest.mark.parametrize(("args", "field"), [
    ((-1, 100, None), "num_prompt_tokens"),
    ((100, -1, None), "num_computed_tokens"),
])
def test_checkpoint_step_refuses_bad_counts_naming_the_field(args, field):
    """handoff.checkpoint_step (public for the simulated GPU cache) refuses a negative count as every count is
    refused (nonneg): QueryError naming the field; an unknown group is refused too."""
    from kvgeom.handoff import checkpoint_step

    geom = kvgeom.resolve({**kvgeom.DEFAULT_CONFIG, "offload": {}})
    with pytest.raises(kvgeom.QueryError) as info:
        checkpoint_step(geom, 1, *args)
    assert info.value.problems[0].field == field
    with pytest.raises(kvgeom.KVGeomError):
        checkpoint_step(geom, 7, 100, 100, None)  # no group 7


#: FA 32 + Mamba 32, H 16, retention None, MTP K=3 with 3 modules (2 re-prefilled tokens)
MTP3_32 = kvgeom.resolve({"groups": [{"kind": "full_attention", "block_size": 32}, {"kind": "mamba", "block_size": 32}],
                          "cache": {"prefix_match_unit": 16, "retention_interval": None}, "offload": {},
                          "speculative": spec("mtp", 3, mtp_modules=3)})


def test_cached_state_ends_reads_the_next_steps_end():
    """The contract rows of kvgeom.handoff.cached_state_ends (the vLLM rows are tests/_step_rows.py): a state at a
    chunk end is cached if the next step made it cacheable; past the last end the prefill's own end
    (min(computed, prompt)) is that step; a chunk end at token 1 counts (the default window starts at 0)."""
    # MTP K=3: a step ending at e caches e - 2 tokens, so the one-token chunk after 64 leaves 64 uncached
    assert cached_state_ends(MTP3_32, 1, 150, 150, (64, 65, 96, 150)) == (65, 96)
    assert cached_state_ends(MTP3_32, 1, 150, 150, (64, 66, 96, 150)) == (64, 66, 96)
    # ends that stop short of the prompt: the last one's next step ends at the prompt (150 caches 148 >= 65)
    assert cached_state_ends(MTP3_32, 1, 150, 150, (64, 65)) == (65,)
    # the seed (partial hash hits): 1 token cacheable in the step ending at 100
    assert cached_state_ends(SEED, 1, 100, 100, (1, 100)) == (1, 100)
    assert cached_state_ends(SEED, 1, 100, 100, (1, 100), above=1) == (100,)


EAGLE_TAIL = kvgeom.resolve({"groups": [{"kind": "full_attention", "block_size": 32, "drafter": True},
                                        {"kind": "mamba", "block_size": 32}],
                             "cache": {"prefix_match_unit": 8}, "offload": {}, "speculative": spec()})


def test_an_eagle_partial_tail_on_the_default_split_is_the_given_splits():
    """EAGLE drafter FA 32 + Mamba 32, H 8 (proof margin 8), a 48-token prompt that loaded from the tier: the
    default split is vLLM's unbounded one (40, 48), and the tail at 40 is handed over at 48 = 40 + the margin,
    with or without the split given."""
    assert default_chunk_ends(EAGLE_TAIL, 48) == (40, 48)
    assert partial_tail_boundary(EAGLE_TAIL, 48, 48, None, loaded_from_offload=True) == 40
    assert partial_tail_boundary(EAGLE_TAIL, 48, 48, (40, 48), loaded_from_offload=True) == 40
    assert partial_tail_boundary(EAGLE_TAIL, 48, 48, None) is None  # a request that did not load: no tail


def test_the_checkpoint_step_may_lie_up_to_a_scheduler_block_plus_the_lookahead_past_it():
    """Contract row (kvgeom's rule; vLLM 0.33 stalls on this split, so no vLLM run): MTP K=10 with 2 modules
    re-prefills 9 tokens, so the step ending at 25 caches exactly the checkpoint 16 of a 40-token prompt split at
    16, 25, 40: the state at 16 is kept, handed over by the step after 25. A search window of one scheduler block
    minus the lookahead (16 - 10) would miss that step."""
    from kvgeom.handoff import checkpoint_step

    geom = kvgeom.resolve({"groups": [FA16, M16], "cache": {"retention_interval": None}, "offload": {},
                           "speculative": spec("mtp", 10, mtp_modules=2)})
    assert checkpoint_step(geom, 1, 40, 40, (16, 25, 40)) == 25
    assert checkpoint_step(geom, 1, 40, 40, (16, 24, 40)) is None  # 15 cacheable at 24, 31 at the next end


def test_handed_over_tokens_is_the_cacheable_prefix_while_the_prompt_is_prefilled():
    """kvgeom.handoff.handed_over_tokens: under MTP K=3 (2 re-prefilled tokens) a step ending at c has offered the
    states up to c - 2 while the prompt is prefilled, and nothing is counted once the prompt is computed. So a
    store plan's next Mamba step starts at chunk (c - 2) // C, where the attention group starts at its storable
    chunks c // C."""
    from kvgeom.handoff import handed_over_tokens

    assert handed_over_tokens(MTP3_32, 1, 150, 149) == 147
    assert handed_over_tokens(MTP3_32, 1, 150, 150) is None
    assert handed_over_tokens(MTP3_32, 1, 150, 151) is None
    plan = hits.plan_store(MTP3_32, num_tokens=150, num_computed_tokens=129, chunk_ends=(64, 129, 150))
    assert [g.next_stored_chunk for g in plan.groups] == [4, 3]
