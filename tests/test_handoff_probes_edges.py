"""Edge rows for the Mamba hand-off (``kvgeom.handoff``), the membership probes (``kvgeom.probes``) and their
batch twin (``kvgeom.batch.handoff``), written for the mutation run of issue 19 (``docs/mutation.md``).

Each row pins a rule the example tables (``test_handoff.py``, ``test_probes.py``) left implicit: the argument a
problem names, the edge of a bound (0 and 1 tokens, a prompt one past a block), a branch only one form of input
reaches. The expected values follow from the docstrings' formulas; the comment shows the arithmetic.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest
from _drafter_rows import DRAFT16, FA16, M16, spec

import kvgeom
import kvgeom.probes
from kvgeom.handoff import (
    mamba_cacheable_tokens,
    mamba_handoffs,
    partial_tail_boundary,
    replay_boundaries,
    state_ends,
)

SEED = kvgeom.resolve(kvgeom.DEFAULT_CONFIG)  # FA 16 + Mamba 16, DCP 2: L = 32, H = 16, partial hash hits
FA_ONLY = kvgeom.resolve({"groups": [FA16]})  # no Mamba group at all
# FA 16 + Mamba 16 under the GPU drop with no group flagged: every group has the eagle bit; L = H = 16
DROP_ALL = kvgeom.resolve({"groups": [FA16, M16], "offload": {}, "speculative": spec()})
DROP = kvgeom.resolve({"groups": [FA16, M16, DRAFT16], "offload": {}, "speculative": spec()})  # L = 16
# the seed (partial hash hits) with multi-module MTP, K = 3 (P = 3) under the drop: every group has the eagle bit
MTP_PARTIAL = kvgeom.resolve({**kvgeom.DEFAULT_CONFIG, "speculative": spec("mtp", 3, mtp_modules=3)})
# one Mamba group (the unitary coordinator) with multi-module MTP, K = 3: P - 1 = 2 tokens held back
MTP_SINGLE = kvgeom.resolve({"groups": [M16], "speculative": spec("mtp", 3, mtp_modules=3)})
FINE64 = kvgeom.resolve({"groups": [{"kind": "full_attention", "block_size": 64}, {"kind": "mamba", "block_size": 64}],
                         "cache": {"prefix_match_unit": 16}, "offload": {}})  # DCP 1, span 64, H 16: partial tails

#: vLLM 0.33's split of 100 tokens with a 16-token budget
B16 = (16, 32, 48, 64, 80, 96, 100)


# ------------------------------------------------------------------------------ handoff: the argument a problem names

HANDOFF_FIELDS = [
    # every count argument is checked by name: the problem names it, with the value
    (lambda: replay_boundaries(SEED, -1), "num_prompt_tokens"),
    (lambda: state_ends(SEED, -1, 0), "num_prompt_tokens"),
    (lambda: state_ends(SEED, 100, -1), "num_computed_tokens"),
    (lambda: mamba_cacheable_tokens(SEED, 1, -1), "num_computed_tokens"),
    (lambda: mamba_handoffs(SEED, 1, -1, 0), "num_prompt_tokens"),
    (lambda: mamba_handoffs(SEED, 1, 100, -1), "num_computed_tokens"),
    (lambda: partial_tail_boundary(FINE64, -1, 0), "num_prompt_tokens"),
    (lambda: partial_tail_boundary(FINE64, 228, -1), "num_computed_tokens"),
    # the checkpoint 224 is read before the limit is: a negative limit is refused, not compared
    (lambda: partial_tail_boundary(FINE64, 228, 228, max_offload_tokens=-1), "max_offload_tokens"),
]


@pytest.mark.parametrize(("call", "field"), HANDOFF_FIELDS)
def test_a_negative_count_names_its_argument(call, field):
    with pytest.raises(kvgeom.QueryError) as info:
        call()
    (problem,) = info.value.problems
    assert (problem.code, problem.field, info.value.values) == ("negative", field, {field: -1})


# ------------------------------------------------------------------------ handoff: the edges of the cacheable prefix


@pytest.mark.parametrize(
    ("geom", "group", "computed", "cacheable"),
    [
        # one group: c - (P - 1), never below 0 (c = 0, and c = 2 <= P - 1)
        (MTP_SINGLE, 0, 0, 0),
        (MTP_SINGLE, 0, 2, 0),
        (MTP_SINGLE, 0, 3, 1),
        # the eagle bit with nothing cached (rdown(10, L = 16) = 0): 0, not min(finalized, ...)
        (DROP_ALL, 1, 10, 0),
        # partial hash hits, MTP K = 3 under the drop: cached = c = 1 > 0, but finalized = max(0, 1 - 2) = 0
        (MTP_PARTIAL, 1, 1, 0),
        (MTP_PARTIAL, 1, 2, 0),
        (MTP_PARTIAL, 1, 3, 1),  # finalized 1: min(1, 1 + span 16) = 1
    ],
)
def test_mamba_cacheable_tokens_at_its_edges(geom, group, computed, cacheable):
    assert mamba_cacheable_tokens(geom, group, computed) == cacheable


# -------------------------------------------------------------------------------- handoff: replay and state ends


def test_a_prompt_one_past_a_block_replays_from_one_block_below():
    # the drop, L = 16, n = 97: {rdown(96, 16) - 16, rdown(97, 16) - 16} = {80}; n - 1 = 96 is on the grid,
    # so rounding n - 2 = 95 instead would add 64
    assert replay_boundaries(DROP, 97) == (80,)


@pytest.mark.parametrize(
    ("geom", "prompt", "computed", "chunk_ends", "window", "ends"),
    [
        # a chunk that ended after 1 token is a state end (only 0 is not)
        (SEED, 100, 100, (1, 100), {}, (1, 100)),
        # a prefill stopped after 1 token: 1 is itself a chunk end
        (SEED, 100, 1, None, {}, (1,)),
        # an upper bound does not lift the computed bound: min(computed 40, prompt, upto 64) = 40
        (SEED, 100, 40, B16, {"upto": 64}, (16, 32, 40)),
        # ... nor the prompt bound: min(computed 100, prompt 50, upto 100) = 50
        (SEED, 50, 100, B16, {"upto": 100}, (16, 32, 48)),
        # computed == prompt is not added as an end (only a prefill stopped below the prompt is)
        (SEED, 100, 100, (96,), {}, (96,)),
        # an empty prompt has no ends, even in a geometry without a Mamba group (no split is asked for)
        (FA_ONLY, 0, 0, None, {}, ()),
    ],
)
def test_state_ends_at_its_edges(geom, prompt, computed, chunk_ends, window, ends):
    assert state_ends(geom, prompt, computed, chunk_ends, **window) == ends


# ------------------------------------------------------------------ handoff: which step makes the checkpoint keyed

MTP_PARTIAL20 = kvgeom.resolve({**kvgeom.DEFAULT_CONFIG, "speculative": spec("mtp", 20, mtp_modules=20)})  # P = 20


@pytest.mark.parametrize(
    ("geom", "prompt", "computed", "chunk_ends", "keys"),
    [
        # P = 20, L = 32: the checkpoint 16 is cached exactly only by the step ending at 35 = 16 + (P - 1)
        # (cacheable(35) = 35 - 19 = 16), which lies past 16 + L - P = 28: the read window must reach L + P past it
        (MTP_PARTIAL20, 35, 35, None, (16,)),
        # P = 3: a prefill stopped at 18 = 16 + (P - 1) caches exactly the checkpoint 16, which is keyed though the
        # store mask (retention 0) does not keep its block
        (MTP_PARTIAL, 36, 18, None, (16,)),
        # ... but no step of the default split of 32 (chunks end at 16 and 32) caches exactly 16
        # (cacheable(16) = 14, cacheable(32) = 30): the checkpoint is in the candidates, yet not keyed
        (MTP_PARTIAL, 32, 32, None, ()),
        # the explicit split decides whether the checkpoint was cached exactly: the step ending at 18 did it here
        (MTP_PARTIAL, 43, 48, (16, 18, 35, 42), (16,)),
        # ... and the step ending at 34 = 32 + 2 here (vLLM's own split of 53 has no such step)
        (MTP_PARTIAL, 53, 52, (11, 21, 32, 34), (32,)),
    ],
)
def test_the_checkpoint_is_keyed_only_when_a_step_cached_it_exactly(geom, prompt, computed, chunk_ends, keys):
    assert mamba_handoffs(geom, 1, prompt, computed, chunk_ends) == keys


def test_no_partial_tail_under_dcp_2_even_off_the_span_grid():
    # DCP 2 (the seed): partial tails unsupported, so None although the checkpoint 16 is off the span grid (32)
    assert partial_tail_boundary(SEED, 17, 17) is None


# ---------------------------------------------------------- handoff: the highest partial-tail boundary a lookup tries

EAGLE32 = kvgeom.resolve({"groups": [{"kind": "full_attention", "block_size": 32, "drafter": True},
                                     {"kind": "mamba", "block_size": 32}],
                          "cache": {"prefix_match_unit": 8}, "offload": {}, "speculative": spec()})  # H 8, margin 8


@pytest.mark.parametrize(
    ("geom", "args", "top"),
    [
        (FINE64, (0, 0, 0, 0), 0),  # an empty prompt
        # no margin, span 64, H 16: rdown(min(prompt - 1, done + 64 - 1, limit), 16)
        (FINE64, (228, 228, 0, 228), 48),  # done + 63 = 63 -> 48
        (FINE64, (228, 228, 1, 228), 64),  # done + 63 = 64 -> 64
        (FINE64, (48, 48, 0, 100), 32),  # prompt - 1 = 47 -> 32
        (FINE64, (49, 49, 0, 100), 48),  # prompt - 1 = 48 -> 48
        (FINE64, (228, 228, 0, 20), 16),  # limit 20 -> 16
        # margin 8, H 8: min(prompt - 1, done + 2 * 32 - 1, limit, rdown(num_tokens, H) - 8)
        (EAGLE32, (100, 100, 32, 100), 88),  # min(99, 95, 100, 96 - 8) = 88
        (EAGLE32, (60, 100, 32, 100), 48),  # min(99, 95, 100, 56 - 8) = 48
        (EAGLE32, (61, 100, 32, 100), 48),  # rdown(61, 8) = 56: 56 - 8 = 48
    ],
)
def test_partial_tail_max_boundary_rows(geom, args, top):
    from kvgeom.handoff import partial_tail_max_boundary

    got = partial_tail_max_boundary(geom, *args)
    assert (got, type(got)) == (top, int)


@pytest.mark.parametrize(
    ("geom", "prompt", "computed", "kw", "boundary"),
    [
        # the limit is inclusive: t = 16 <= max_offload_tokens = 16
        (FINE64, 17, 17, {"max_offload_tokens": 16}, 16),
        # an eagle proof margin m = 8 (checkpoint t = 48 of a 60-token prompt): only a request that loaded from the
        # tier stores the tail (the default is that it did not) ...
        (EAGLE32, 60, 60, {}, None),
        (EAGLE32, 60, 60, {"loaded_from_offload": True}, 48),
        # ... and only once t + m = 56 prompt tokens are computed (56 is enough, 55 is not)
        (EAGLE32, 60, 56, {"loaded_from_offload": True}, 48),
        (EAGLE32, 60, 55, {"loaded_from_offload": True}, None),
    ],
)
def test_partial_tail_boundary_limits_and_the_proof_margin(geom, prompt, computed, kw, boundary):
    assert partial_tail_boundary(geom, prompt, computed, **kw) == boundary


# FINE64 with multi-module MTP, K = 3 (P = 3): a step ending at e caches e - 2 tokens
FINE64_MTP = kvgeom.resolve({"groups": [{"kind": "full_attention", "block_size": 64},
                                        {"kind": "mamba", "block_size": 64}],
                             "cache": {"prefix_match_unit": 16}, "offload": {},
                             "speculative": spec("mtp", 3, mtp_modules=3)})


@pytest.mark.parametrize(
    ("chunk_ends", "boundary"),
    [
        (None, None),  # vLLM's split of 100 (chunks end at 80, 100): no step caches exactly the checkpoint 80
        ((80, 82, 100), 80),  # the given split: a chunk ended at 80 and the step ending at 82 cached exactly 80
        ((82, 100), None),  # no chunk ended at 80: no state was written there, whatever step 82 cached
    ],
)
def test_the_given_split_decides_the_partial_tail(chunk_ends, boundary):
    assert partial_tail_boundary(FINE64_MTP, 100, 100, chunk_ends) == boundary


# H = 1 (a prefix match unit of one token) with partial tails: the checkpoint of a 2-token prompt is 1
UNIT1 = kvgeom.resolve({"groups": [FA16, M16], "cache": {"prefix_match_unit": 1}, "offload": {}})


def test_a_one_token_hash_unit_keys_a_tail_at_token_1():
    from kvgeom.handoff import partial_tail_max_boundary

    assert partial_tail_boundary(UNIT1, 2, 2) == 1  # t = 1 > 0, off the span grid (16), prefill past it
    # the highest boundary a lookup tries with limit 0 is rdown(0, 1) = 0, not 1
    assert partial_tail_max_boundary(UNIT1, 2, 2, 0, 0) == 0
    assert partial_tail_max_boundary(UNIT1, 2, 2, 0, 2) == 1  # min(prompt - 1 = 1, 0 + 16 - 1, 2) = 1


def test_a_huge_prompt_keeps_its_exact_block_index():
    # 2^60 tokens: the state block (2^60 - 16) / 16 - 1 = 2^56 - 2 is read as an int (a float would round it)
    assert mamba_handoffs(SEED, 1, 2**60, 2**60) == (2**60 - 16,)


# ------------------------------------------------------------------------ batch twin: partial tails per request


@pytest.mark.parametrize(
    ("geom", "prompt", "computed", "chunk_ends", "loaded", "limit", "want"),
    [
        # FINE64 (span 64, H 16): 228 -> 224; stopped at 224 (not past it) -> none; 193 -> 192 on the span grid;
        # an empty prompt -> none (the same rows as test_handoff.py's scalar table)
        (FINE64, [228, 228, 193, 0], [228, 224, 193, 0], None, [False] * 4, None, [224, -1, -1, -1]),
        # per-request limits: 224 > 200 -> none, 224 <= 224 -> 224
        (FINE64, [228, 228], [228, 228], None, [False, False], [200, 224], [-1, 224]),
        # per-request splits (-1 padded): no chunk ended at 224 in the first
        (FINE64, [228, 228], [228, 228], [[64, 128, 192, 228], [224, 228, -1, -1]], [False, False], None, [-1, 224]),
        # the eagle proof margin: only a request that loaded from the tier, from t + m = 56 computed tokens on
        (EAGLE32, [60, 60, 60], [60, 60, 55], None, [False, True, True], None, [-1, 48, -1]),
        # DCP 2: no partial tails at all
        (SEED, [17, 100], [17, 100], None, [False, False], None, [-1, -1]),
    ],
)
def test_batch_partial_tail_boundaries(geom, prompt, computed, chunk_ends, loaded, limit, want):
    import numpy as np

    from kvgeom.batch.handoff import partial_tail_boundaries

    def arr(x, dtype=np.int64):
        return None if x is None else np.array(x, dtype=dtype)

    got = partial_tail_boundaries(geom, arr(prompt), arr(computed), arr(chunk_ends), arr(loaded, bool), arr(limit))
    assert got.tolist() == want
    # each entry is the scalar rule's answer (None as -1)
    for i, p in enumerate(prompt):
        ends = None if chunk_ends is None else tuple(e for e in chunk_ends[i] if e >= 0)
        scalar = partial_tail_boundary(geom, p, computed[i], ends, loaded_from_offload=loaded[i],
                                       max_offload_tokens=None if limit is None else limit[i])
        assert want[i] == (-1 if scalar is None else scalar)


# ------------------------------------------------------------------------------ probes: the stored-list fast path


def test_stored_lists_at_the_edges_of_the_fast_check():
    from kvgeom.probes import as_probe, validated_stored

    # an empty list is a group with nothing stored (not an error)
    assert validated_stored(SEED, {1: []})[1] == frozenset()
    # 2^60 + 1 is off the H = 16 grid; as a float it would round to 2^60, which is on it
    with pytest.raises(kvgeom.QueryError) as info:
        validated_stored(SEED, {1: [2**60 + 1]})
    assert (info.value.code, info.value.values) == ("not_on_hash_grid", {"end_token": 2**60 + 1,
                                                                          "hash_block_size": 16})
    # a set of plain ints is sorted once, so below() jumps to the highest held chunk under j: chunks 0 (16) and
    # 3 (64) held, below chunk 10 -> 3
    assert as_probe(SEED, {1: {16, 64}}).below(1, 16, 10) == 3


# ------------------------------------------------------------- second pass (issue 19): the hand-off's remaining edges

# one Mamba group of 1-token blocks, offloaded: L = H = 1, the unitary coordinator (cacheable = computed)
MAMBA1 = kvgeom.resolve({"groups": [{"kind": "mamba", "block_size": 1}], "offload": {}})


@pytest.mark.parametrize(
    ("prompt", "chunk_ends", "keys"),
    [
        # vLLM 0.33 runs (conformance.vllm_stores.run_store_then_lookup, unbounded budget): a 2-token prompt
        # prefills in chunks ending at [1, 2] and the Mamba group stores exactly the key ending at token 1 (the
        # replay boundary n - 1 = 1 keeps block 0); a 3-token prompt: chunks [2, 3], key 2. The state after 1
        # token is a hand-off: the window (above, upto] starts above 0, not above 1
        (2, (1, 2), (1,)),
        (3, (2, 3), (2,)),
    ],
)
def test_a_one_token_mamba_block_hands_off_the_state_at_token_1(prompt, chunk_ends, keys):
    assert state_ends(MAMBA1, prompt, prompt) == chunk_ends  # kvgeom's default split is vLLM's split
    assert mamba_handoffs(MAMBA1, 0, prompt, prompt) == keys


SEED_OFF = kvgeom.resolve({**kvgeom.DEFAULT_CONFIG, "offload": {}})  # FA 16 + Mamba 16, DCP 2, retention 0
SPLIT100 = (32, 64, 96, 100)


@pytest.mark.parametrize(
    ("reachable", "keys"),
    [
        # the default boundaries, passed explicitly: the same keys as reachable=None (replay boundary 99)
        (replay_boundaries(SEED_OFF, 100), (96,)),
        # a hit resuming at 64 needs the state after 64 tokens (block 3): kept; 96 is the prompt's H-grid
        # checkpoint, cached exactly by the step ending at 96 (partial hash hits), keyed whatever the mask says
        ((64,), (64, 96)),
        ((32, 64), (32, 64, 96)),
        # resuming at 63 needs no state on the 16-token grid: only the checkpoint
        ((63,), (96,)),
        ((), (96,)),
    ],
)
def test_explicit_reachable_boundaries_replace_the_replay_boundaries(reachable, keys):
    assert mamba_handoffs(SEED_OFF, 1, 100, 100, SPLIT100, reachable=reachable) == keys
    assert mamba_handoffs(SEED_OFF, 1, 100, 100, SPLIT100, reachable=iter(reachable)) == keys  # any iterable


# ------------------------------------------------------------- second pass (issue 19): set probes and their order


@pytest.mark.parametrize(
    ("held", "below"),
    [
        # numpy integers are plain ints: sorted once, below() jumps from chunk 10 to chunk 3 (end token 64)
        ({np.int64(16), np.int64(64)}, 3),
        ({np.int32(16), 64}, 3),
        # foreign elements have no safe order (16.0 == 16, a string compares with nothing): below() keeps stepping
        # (j - 1 = 9) and never raises; membership still reads the set in place
        ({16.0, 64.0}, 9),
        ({16, 64, "x"}, 9),
        ({16, 64, np.True_}, 9),  # a numpy bool is not an end token either
    ],
)
def test_a_set_probe_jumps_only_over_plain_int_chunks(held, below):
    from kvgeom.probes import as_probe

    probe = as_probe(SEED, {1: held})
    assert probe.below(1, 16, 10) == below
    assert (probe.contains(1, 64), probe.contains(1, 48)) == (True, False)


def test_a_huge_kept_state_is_found_in_the_mask_by_its_exact_block_index():
    # 2^60 + 4 tokens, chunks ending at E = 2^60 - 32 and at the prompt, a hit resuming at E: the state after E
    # tokens sits in block E / 16 - 1 = 2^56 - 3, which the mask keeps; E is not the checkpoint (rdown(n - 1, 16)
    # = 2^60, no chunk ended there), so only the mask keeps it. A float block index rounds to 2^56 and misses it
    E, n = 2**60 - 32, 2**60 + 4
    assert mamba_handoffs(SEED_OFF, 1, n, n, (E, n), reachable=(E,)) == (E,)
    assert mamba_handoffs(SEED_OFF, 1, n, n, (E - 16, E, n), reachable=(E - 16, E)) == (E - 16, E)


# ------------------------------------------- second pass (issue 19): partial tails with ONE offloaded group (vLLM 0.33)

# a circular buffer (never prefix-cacheable, vLLM's CircularBufferSpec) beside Mamba 64, H = 16: the Mamba group is
# the only offloaded group, and partial tails are on (DCP 1, one span 64 > H). The span is read from that group.
CIRC_MAMBA = kvgeom.resolve({"groups": [{"kind": "circular_buffer", "block_size": 64},
                                        {"kind": "mamba", "block_size": 64}],
                             "cache": {"prefix_match_unit": 16}, "offload": {}})


@pytest.mark.parametrize(
    ("prompt", "chunk_ends", "stored", "boundary"),
    [
        # vLLM 0.33 runs (conformance.vllm_stores.run_store_then_lookup, unbounded budget): chunks end at
        # [192, 224, 228]; the connector's aligned-boundary job stores 192 and its partial-tail job 224
        (228, (192, 224, 228), (192, 224), 224),
        # chunks [64, 96, 100]: aligned boundary 64, partial tail 96
        (100, (64, 96, 100), (64, 96), 96),
    ],
)
def test_one_offloaded_group_stores_its_partial_tail(prompt, chunk_ends, stored, boundary):
    assert state_ends(CIRC_MAMBA, prompt, prompt) == chunk_ends
    assert partial_tail_boundary(CIRC_MAMBA, prompt, prompt) == boundary
    assert (*mamba_handoffs(CIRC_MAMBA, 1, prompt, prompt), boundary) == stored


@pytest.mark.parametrize(
    ("stored", "hit", "probes"),
    [
        # vLLM 0.33 runs (conformance.vllm_stores.run_lookup_trace, a 240-token request from 0): the keys vLLM's
        # offload manager is asked, in order, and the hit. The partial-tail key 224 is tried only past a held 192
        ([224], 0, [(192, False), (128, False), (64, False), (48, False), (32, False), (16, False)]),
        ([64, 224], 64, [(192, False), (128, False), (64, True), (112, False), (96, False), (80, False)]),
        ([192], 192, [(192, True), (224, False), (208, False)]),
        ([208], 0, [(192, False), (128, False), (64, False), (48, False), (32, False), (16, False)]),
        ([64, 128, 192, 208, 224], 224, [(192, True), (224, True)]),
    ],
)
def test_one_offloaded_group_looks_up_its_partial_tail_as_vllm(stored, hit, probes):
    from kvgeom.hits import lookup_trace

    trace = lookup_trace(CIRC_MAMBA, 240, stored={1: stored})
    assert trace.hit.end_token == hit
    assert [(p.group, p.end_token, p.held) for p in trace.probes] == [(1, e, held) for e, held in probes]


# ------------------------------------------------------ second pass (issue 19): the Probe base methods, by contract


def _held_upto(limit):
    """A contains(group, end_token) callable: every key ending at or before ``limit`` is held."""
    return lambda group, end: end <= limit


@pytest.mark.parametrize(
    ("make", "group", "held", "missed"),
    [
        # state() of a form that cannot answer pending/retry is HIT exactly where contains() holds, MISS elsewhere
        (lambda: kvgeom.probes.as_probe(SEED, _held_upto(48)), 1, 48, 64),
        (lambda: kvgeom.probes.as_probe(SEED, {1: {16, 48}}), 1, 48, 32),
        (lambda: kvgeom.probes.as_probe(SEED, {0: {32}, 1: np.array([True, False, True])}), 1, 48, 32),
        # pair-held: 32 and 48 are held and 48 <= stop 48; the pair of 48 would end at 64, past the stop
        (lambda: kvgeom.probes.eagle_pair_held(kvgeom.probes.as_probe(SEED, {1: {16, 32, 48}}), 16, 48), 1, 32, 48),
    ],
)
def test_state_of_a_settled_probe_reads_contains(make, group, held, missed):
    from kvgeom.probes import HIT, MISS

    probe = make()
    assert (probe.state(group, held), probe.state(group, missed)) == (HIT, MISS)
    assert probe.unsettled is False


@pytest.mark.parametrize(
    ("stored", "j", "top", "forward"),
    [
        # forward(group, C, j, top): the first chunk j' >= j not held or starting at or past top.
        # every key held: stops at the first chunk starting at top = 64 (chunk 4), not one later
        (_held_upto(10**6), 0, 64, 4),
        (_held_upto(10**6), 2, 65, 5),  # chunk 4 starts at 64 < 65: asked and held; chunk 5 starts at 80
        (_held_upto(48), 0, 10**6, 3),  # chunk 3 (end 64) is the first miss
        ({1: set(range(16, 10**4, 16))}, 0, 64, 4),
        ({1: {16, 48}}, 0, 10**6, 1),  # chunk 1 (end 32) missing: stop there, never past it to 48
        ({1: {16, 48}}, 2, 10**6, 3),
    ],
)
def test_forward_stops_at_top_or_at_the_first_miss(stored, j, top, forward):
    probe = kvgeom.probes.as_probe(SEED, stored)
    assert probe.forward(1, 16, j, top) == forward
    # stepping with contains gives the same chunk (the Probe contract)
    step = j
    while step * 16 < top and probe.contains(1, (step + 1) * 16):
        step += 1
    assert step == forward


@pytest.mark.parametrize(
    ("probe", "j", "below"),
    [
        # no knowledge of the store (a callable): the chunk right under j
        (lambda: kvgeom.probes.as_probe(SEED, _held_upto(48)), 10, 9),
        (lambda: kvgeom.probes.as_probe(SEED, _held_upto(48)), 0, -1),
        # a bound of 64 tokens: nothing past chunk 64 / 16 - 1 = 3 is held, so below(10) jumps to 3 ...
        (lambda: kvgeom.probes.Probe(64), 10, 3),
        (lambda: kvgeom.probes.Probe(72), 10, 3),  # ... 72 // 16 - 1 = 3 (floor, an int)
        # ... and under the bound it is j - 1
        (lambda: kvgeom.probes.Probe(64), 3, 2),
        (lambda: kvgeom.probes.Probe(64), 4, 3),
    ],
)
def test_below_of_the_base_probe(probe, j, below):
    got = probe().below(1, 16, j)
    assert (got, type(got)) == (below, int)


def test_a_probe_keeps_its_bound():
    assert kvgeom.probes.Probe(64).bound == 64
    assert kvgeom.probes.Probe().bound is None
    # a mask probe's bound: the longest mask (3 chunks of C = 16 -> 48) or the highest set end (32)
    assert kvgeom.probes.as_probe(SEED, {0: {32}, 1: np.array([True, False, True])}).bound == 48
    # a pair probe has its inner probe's bound
    assert kvgeom.probes.eagle_pair_held(kvgeom.probes.Probe(80), 16, 80).bound == 80


def test_a_set_probe_sorts_each_group_and_chunk_size_apart():
    # below() sorts group 0's chunks and group 1's separately (and per chunk size): a shared order would give
    # group 1 the answer of group 0
    probe = kvgeom.probes.as_probe(SEED, {0: {32}, 1: {16, 64}})
    assert probe.below(0, 32, 10) == 0  # end 32 = chunk 0 of C = 32
    assert probe.below(1, 16, 10) == 3  # end 64 = chunk 3 of C = 16
    assert probe.below(1, 32, 10) == 1  # end 64 = chunk 1 of C = 32 (16 is off that grid)


class _Answer:
    """An answer object read by name, as vLLM 0.33's LookupResult members are."""

    def __init__(self, name):
        self.name = name


class _PendingTier:
    """An offload manager's lookup(key, req_context) answering HIT_PENDING for every key."""

    def lookup(self, key, req_context):
        return _Answer("HIT_PENDING")


def test_a_recording_probe_reports_its_tiers_unsettled_answers():
    from kvgeom.probes import PENDING, RecordingProbe, as_probe

    recorder = RecordingProbe(as_probe(SEED, _PendingTier(), block_hashes=[b"h0", b"h1"]))
    assert recorder.unsettled is False  # nothing asked yet
    assert recorder.state(1, 16) == PENDING
    assert recorder.unsettled is True
    assert recorder.calls == [(1, 16, False)]  # recorded; held only for HIT


@pytest.mark.parametrize(
    ("stored", "C", "j", "below"),
    [
        # {16, 64} at C = 16: chunks 0 and 3 held; below(j) is the highest held chunk under j, -1 when none
        ({16, 64}, 16, 10, 3),
        ({16, 64}, 16, 4, 3),
        ({16, 64}, 16, 3, 0),
        ({16, 64}, 16, 1, 0),
        ({16, 64}, 16, 0, -1),
        # at C = 32 only end tokens on the 32-grid are chunks: 48 and 16 are not (64 is chunk 1)
        ({16, 48, 64}, 32, 1, -1),
        ({16, 48, 64}, 32, 2, 1),
        # huge end tokens keep their exact chunk index (an int, never a float)
        ({2**60, 2**61}, 16, 2**57 - 1, 2**60 // 16 - 1),  # chunks 2^56 - 1 and 2^57 - 1
    ],
)
def test_below_of_a_set_probe(stored, C, j, below):
    got = kvgeom.probes.as_probe(SEED, {1: stored}).below(1, C, j)
    assert (got, type(got)) == (below, int)


def test_below_of_a_one_token_chunk():
    # C = 1 (a Mamba group of 1-token blocks): the key ending at token 1 is chunk 0
    probe = kvgeom.probes.as_probe(MAMBA1, {0: {1, 5}})
    assert [probe.below(0, 1, j) for j in (0, 1, 3, 5, 9)] == [-1, 0, 0, 4, 4]


def test_a_mask_probe_reads_its_set_groups_and_has_no_bound_over_foreign_ends():
    probe = kvgeom.probes.as_probe(SEED, {0: {32}, 1: np.array([True, False, True])})
    assert (probe.contains(0, 32), probe.contains(0, 64), probe.contains(1, 48)) == (True, False, True)
    # a set with a foreign element (32.0) gives no safe bound: None, and below() keeps stepping
    foreign = kvgeom.probes.as_probe(SEED, {0: {32.0}, 1: np.array([True, False, True])})
    assert foreign.bound is None
    assert foreign.below(1, 16, 10) == 9
    assert foreign.contains(0, 32) is True


def test_a_mask_probe_at_its_edges():
    mask = np.array([True, False, True])  # chunks 0 and 2 of group 1 (C = 16): end tokens 16 and 48
    probe = kvgeom.probes.as_probe(SEED, {0: {320}, 1: mask})
    # the mask's end (3 chunks: 48) is not the last held key: group 0 holds 320, so the bound is 320 and below()
    # on group 0 (C = 32) from chunk 20 stops at chunk 320 / 32 - 1 = 9, never jumping over it
    assert probe.bound == 320
    assert probe.below(0, 32, 20) == 9
    # one past the mask's end is not held (no IndexError); an end off the chunk grid is not held
    assert (probe.contains(1, 64), probe.contains(1, 40), probe.contains(1, 48)) == (False, False, True)
    # an empty set beside a mask: the bound is the mask's end
    assert kvgeom.probes.as_probe(SEED, {0: set(), 1: mask}).bound == 48
    # nothing held at all (C = 1, one-token Mamba blocks): bound 0, and below() answers -1 (no chunk may be held)
    empty = kvgeom.probes.as_probe(MAMBA1, {0: np.array([], dtype=bool)})
    assert (empty.bound, empty.below(0, 1, 5)) == (0, -1)


def _residency(chain, group, held):
    res = kvgeom.Residency()
    for i in held:
        res.add(group, chain[i])
    return res


def test_a_residency_probe_at_its_edges():
    chain = [b"h0", b"h1", b"h2", b"h3"]
    probe = kvgeom.probes.as_probe(SEED, _residency(chain, 1, (0, 3)), block_hashes=chain)
    # bounded by the chain: 4 hashes of H = 16 tokens
    assert (probe.bound, type(probe.bound)) == (64, int)
    # held at 16 and 64; an end token off the H grid (24), 0 or negative is never held (even though the hash at
    # index -1, h3, is held), nor one past the chain (80)
    assert [probe.contains(1, e) for e in (16, 24, 0, -16, 64, 80)] == [True, False, False, False, True, False]
    # H = 1 (one-token Mamba blocks): the key ending at token 1 is hash 0
    one = kvgeom.probes.as_probe(MAMBA1, _residency(chain, 0, (0,)), block_hashes=chain)
    assert (one.contains(0, 1), one.contains(0, 2)) == (True, False)


@pytest.mark.parametrize(
    "ends",
    [
        "16",  # a string is not a list of end tokens (not read as "1", "6")
        b"16",
        16,  # nor a bare int
        {16: True},  # nor a mapping
        np.array([[16, 32]]),  # nor a 2-d array
    ],
)
def test_a_stored_entry_that_is_no_list_of_end_tokens(ends):
    with pytest.raises(kvgeom.QueryError) as info:
        kvgeom.probes.validated_stored(SEED, {1: ends})
    (problem,) = info.value.problems
    assert (problem.code, problem.field) == ("bad_stored", "stored.1")


def test_a_stored_group_that_is_not_offloaded_is_named():
    with pytest.raises(kvgeom.QueryError) as info:
        kvgeom.probes.validated_stored(SEED, {5: [16]})
    (problem,) = info.value.problems
    assert (problem.code, problem.field, info.value.values) == ("group_not_offloaded", "stored.5", {"group": 5})


def test_a_residency_probe_walks_whole_chunks_of_its_chain_only():
    # group 0 of the seed: C = 32 = 2 hashes per chunk. A 5-hash chain holds 2 whole chunks (hashes 1 and 3 end
    # them); hash 4 starts a third chunk whose end hash is past the chain, so forward() stops at chunk 2
    chain = [b"h0", b"h1", b"h2", b"h3", b"h4"]
    probe = kvgeom.probes.as_probe(SEED, _residency(chain, 0, range(5)), block_hashes=chain)
    assert probe.forward(0, 32, 0, 10**6) == 2
    assert probe.forward(0, 32, 0, 33) == 2  # top 33: chunk 1 starts at 32 < 33, asked and held
    assert probe.forward(0, 32, 0, 32) == 1  # top 32: chunk 1 starts at the top


def test_validated_stored_gives_every_offloaded_group_a_set():
    # a group the mapping does not name holds nothing: an empty set, not a missing entry
    assert kvgeom.probes.validated_stored(SEED, {"1": [16, 32]}) == {0: frozenset(), 1: frozenset({16, 32})}


def test_a_residency_probe_forward_stops_at_the_first_missing_chunk():
    # group 1 (C = H = 16): hashes 0 and 2 held, 1 missing: forward from chunk 0 stops at chunk 1, never past it
    chain = [b"h%d" % i for i in range(8)]
    probe = kvgeom.probes.as_probe(SEED, _residency(chain, 1, (0, 2)), block_hashes=chain)
    assert [probe.forward(1, 16, j, 10**6) for j in (0, 1, 2)] == [1, 1, 3]


def test_a_mapping_probe_holds_nothing_for_a_group_it_does_not_name():
    probe = kvgeom.probes.as_probe(SEED, {1: {16}})
    assert (probe.contains(0, 32), probe.forward(0, 32, 0, 10**6)) == (False, 0)


# --------------------------------------------------------------------- second pass (issue 19): the Residency holder


@pytest.mark.parametrize("holder", [-1, "0", 0.0, None, True])
def test_a_bad_residency_holder_is_refused_by_name(holder):
    chain = [b"h0"]
    with pytest.raises(kvgeom.QueryError) as info:
        kvgeom.probes.as_probe(SEED, _residency(chain, 1, (0,)), block_hashes=chain, holder=holder)
    (problem,) = info.value.problems
    assert (problem.code, problem.field) == ("bad_holder", "holder")


@pytest.mark.parametrize(("holder", "held"), [(0, False), (1, True), (2, False), (70, True)])
def test_a_residency_probe_reads_its_holders_bit(holder, held):
    # hash 0 held by holders 1 and 70 only: bit `holder` of the mask decides (1 << holder, a big int for 70)
    chain = [b"h0"]
    res = kvgeom.Residency()
    res.add(1, chain[0], 1)
    res.add(1, chain[0], 70)
    probe = kvgeom.probes.as_probe(SEED, res, block_hashes=chain, holder=holder)
    assert probe.contains(1, 16) is held
    assert probe.forward(1, 16, 0, 16) == int(held)


# ---------------------------------------------------------------- second pass (issue 19): the length of a hash chain

# a Mamba group under multi-module MTP K = 3 with look-ahead hashes (no offload section): P = 3 hash look-ahead tokens
LOOKAHEAD = kvgeom.resolve({"groups": [M16], "speculative": spec("mtp", 3, mtp_modules=3, lookahead_hashes=True)})


@pytest.mark.parametrize(
    ("geom", "num_tokens", "hashes"),
    [
        # max(0, n - P) // H hashes. With P = 3, H = 16, vLLM 0.33 requests (conformance.vllm_objects.build_request
        # with the scheduler's num_hash_lookahead_tokens) hold 0 hashes at 18 tokens, 1 at 19 and at 34, 2 at 35
        (LOOKAHEAD, 18, 0),
        (LOOKAHEAD, 19, 1),
        (LOOKAHEAD, 34, 1),
        (LOOKAHEAD, 35, 2),
        (SEED, 40, 2),  # P = 0: 40 // 16 = 2 (a floor: 2.5 hashes are 2)
        (SEED, 64, 4),
        (MAMBA1, 0, 0),  # H = 1 and no tokens: no hash is needed
        (MAMBA1, 3, 3),
    ],
)
def test_a_chain_of_exactly_the_requests_hashes_is_long_enough(geom, num_tokens, hashes):
    from kvgeom.probes import check_chain_length

    chain = [b"h%d" % i for i in range(hashes)]
    assert check_chain_length(geom, num_tokens, chain) is None
    if hashes:
        with pytest.raises(kvgeom.QueryError) as info:
            check_chain_length(geom, num_tokens, chain[:-1])
        (problem,) = info.value.problems
        assert (problem.code, problem.field) == ("block_hashes_too_short", "block_hashes")
        assert info.value.values == {"num_hashes": hashes - 1, "needed": hashes}
        assert type(info.value.values["needed"]) is int


# -------------------------------------------------------- second pass (issue 19): a lookup() tier read through a chain


class _CtxTier:
    """An offload manager that holds every key, but only for the request context it was built for; every answer
    is a fresh object named HIT or MISS (read by name, as vLLM's LookupResult members are)."""

    def __init__(self, ctx):
        self.ctx = ctx

    def lookup(self, key, req_context):
        return _Answer("HIT" if req_context == self.ctx else "MISS")


def test_a_lookup_probe_passes_the_request_context_and_is_bounded_by_its_chain():
    from kvgeom.probes import HIT, MISS

    chain = [b"h0", b"h1", b"h2", b"h3"]
    probe = kvgeom.probes.as_probe(SEED, _CtxTier("req-7"), block_hashes=chain, req_context="req-7")
    assert (probe.bound, type(probe.bound)) == (64, int)
    assert probe.unsettled is False
    assert (probe.contains(1, 16), probe.state(1, 32), probe.forward(1, 16, 0, 64)) == (True, HIT, 4)
    assert probe.unsettled is False  # HIT read by name is a settled answer
    other = kvgeom.probes.as_probe(SEED, _CtxTier("req-7"), block_hashes=chain, req_context="req-8")
    assert (other.contains(1, 16), other.state(1, 32), other.forward(1, 16, 0, 64)) == (False, MISS, 0)


class _SameAnswerTier:
    """An offload manager answering one fixed answer object for every key."""

    def __init__(self, answer):
        self.answer = answer

    def lookup(self, key, req_context):
        return self.answer


@pytest.mark.parametrize(("name", "state"), [("MISS", "miss"), ("HIT", "hit"), ("HIT_PENDING", "pending"),
                                             ("RETRY", "retry")])
def test_the_same_answer_object_means_the_same_thing_every_time(name, state):
    # answers are remembered by identity once read by name: a MISS object stays a miss (never read as HIT), a
    # pending or retry object stays unsettled (never remembered as HIT or MISS)
    chain = [b"h0", b"h1"]
    probe = kvgeom.probes.as_probe(SEED, _SameAnswerTier(_Answer(name)), block_hashes=chain)
    assert [probe.state(1, 16), probe.state(1, 16), probe.state(1, 32)] == [state] * 3
    assert probe.unsettled is (state in ("pending", "retry"))
    # contains() counts an unsettled answer as held (the lookup then re-asks through state())
    assert probe.contains(1, 16) is (state != "miss")
    # keys off the H grid, at or below 0, or past the 2-hash chain are never asked: a miss
    assert [probe.state(1, e) for e in (24, 0, -16, 48)] == ["miss"] * 4
    assert [probe.contains(1, e) for e in (24, 0, -16, 48)] == [False] * 4


def test_an_unknown_answer_is_refused_after_hit_and_miss_objects_were_remembered():
    chain = [b"h0", b"h1"]
    for name in ("HIT", "MISS"):
        kvgeom.probes.as_probe(SEED, _SameAnswerTier(_Answer(name)), block_hashes=chain).state(1, 16)
    # not a LookupResult member, not True / False; a name that is no string (unhashable here) is no answer either
    for answer in (None, "HIT", 1, _Answer(["HIT"])):
        probe = kvgeom.probes.as_probe(SEED, _SameAnswerTier(answer), block_hashes=chain)
        for ask in (probe.state, probe.contains):
            with pytest.raises(kvgeom.QueryError) as info:
                ask(1, 16)
            assert info.value.code == "lookup_not_ready"


class _VirtualChain(Sequence):
    """A request's hash chain of ``n`` hashes, made on demand (hash i is b"h<i>"): int64-sized requests."""

    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if not -self.n <= i < self.n:
            raise IndexError(i)
        return b"h%d" % (i % self.n)


def test_forward_over_an_int64_sized_chain_keeps_exact_chunk_arithmetic():
    # chunk j0 = 2^51 of group 1 (C = H = 16) is held, and top = 16 * j0 + 1 starts inside it: stepping with
    # contains asks chunk j0 (it starts at 16 * j0 < top), finds it held and stops at j0 + 1. (top / C as a float is
    # exactly 2^51 and would stop before asking.)
    j0 = 2**51
    chain = _VirtualChain(2**55)
    res = kvgeom.Residency()
    res.add(1, chain[j0])
    probe = kvgeom.probes.as_probe(SEED, res, block_hashes=chain)
    assert probe.contains(1, 16 * (j0 + 1)) is True
    assert probe.forward(1, 16, j0, 16 * j0 + 1) == j0 + 1
    assert probe.forward(1, 16, j0, 16 * j0) == j0  # chunk j0 starts at the top: not asked


def test_a_lookup_probe_at_the_edges_of_its_chain():
    # the seed's group 0 (C = 32, 2 hashes per chunk) over a 5-hash chain: 2 whole chunks, whatever top says
    every = kvgeom.probes.as_probe(SEED, _SameAnswerTier(True), block_hashes=[b"h%d" % i for i in range(5)])
    assert [every.forward(0, 32, 0, top) for top in (10**6, 33, 32)] == [2, 2, 1]
    # H = 1 (one-token Mamba blocks): the key ending at token 1 is hash 0, asked and held
    one = kvgeom.probes.as_probe(MAMBA1, _SameAnswerTier(True), block_hashes=[b"h0"])
    assert (one.contains(0, 1), one.state(0, 1), one.contains(0, 2)) == (True, "hit", False)
    # an int64-sized chain: chunk j0 = 2^51 starts below top = 16 * j0 + 1, so it is asked (exact ints)
    j0 = 2**51
    huge = kvgeom.probes.as_probe(SEED, _SameAnswerTier(True), block_hashes=_VirtualChain(2**55))
    assert (huge.forward(1, 16, j0, 16 * j0 + 1), huge.forward(1, 16, j0, 16 * j0)) == (j0 + 1, j0)


class _KeyTier:
    """An offload manager holding exactly ``keys`` (for the request context ``ctx`` only)."""

    def __init__(self, keys, ctx=None):
        self.keys, self.ctx = set(keys), ctx

    def lookup(self, key, req_context):
        return req_context == self.ctx and key in self.keys


def test_per_group_offload_keys_in_any_sequence():
    from collections import UserList

    tier = _KeyTier({b"k0/0", b"k0/1", b"k1/1"})
    for keys in ([[b"k0/0"], [b"k0/1", b"k1/1"]], UserList([[b"k0/0"], UserList([b"k0/1", b"k1/1"])])):
        probe = kvgeom.probes.as_probe(SEED, tier, offload_keys=keys)
        assert (probe.bound, probe.unsettled) == (None, False)  # no known bound; nothing unsettled asked yet
        assert probe.unsettled is False
        # group 1 (C = 16): chunks 0 and 1 held; group 0 (C = 32): chunk 0
        assert [probe.contains(1, e) for e in (16, 32, 48)] == [True, True, False]
        assert (probe.contains(0, 32), probe.forward(1, 16, 0, 10**6)) == (True, 2)


def test_an_off_grid_key_without_a_hash_chain_is_refused_by_name():
    # no partial tails (DCP 2), no block_hashes: a key off group 1's chunk grid (24, C = 16) cannot be built
    probe = kvgeom.probes.as_probe(SEED, _KeyTier(set()), offload_keys=[[], []])
    for ask in (probe.contains, probe.state):
        with pytest.raises(kvgeom.QueryError) as info:
            ask(1, 24)
        (problem,) = info.value.problems
        assert (problem.code, problem.field) == ("missing_block_hashes", "block_hashes")


def test_a_partial_tail_key_is_asked_with_the_request_context():
    # FINE64 (C = 64, H = 16, partial tails): the key ending at 80 is off the chunk grid, so it is built from the
    # hash chain (hash 4 and the group index) and asked with the request's context, as the chunk keys are
    chain = [b"%016d" % i for i in range(8)]  # 16-byte hashes (xxhash-sized)
    tail_key = kvgeom.make_offload_key(chain[4], 1)
    for ctx, held in (("req-1", True), ("req-2", False)):
        probe = kvgeom.probes.as_probe(FINE64, _KeyTier({b"c0", tail_key}, "req-1"), offload_keys=[[b"c0"], [b"c0"]],
                                       block_hashes=chain, req_context=ctx)
        assert (probe.contains(1, 80), probe.contains(1, 64)) == (held, held)


def test_the_per_geometry_chunk_memo_never_serves_another_geometry():
    # the memo is keyed by id(geometry), and CPython gives a freed geometry's id to a new object: an entry whose
    # geometry is another object (simulated here) is rebuilt, never read. FINE64's chunks are 64 tokens, the seed's 32
    # and 16: read with the seed's, group 1's chunk 0 would be the key ending at 16, not 64
    from kvgeom import probes

    probes._CHUNKS[id(FINE64)] = (SEED, {0: 32, 1: 16}, 2, False)
    try:
        probe = probes.as_probe(FINE64, _KeyTier({b"m0"}), offload_keys=[[b"a0"], [b"m0"]], block_hashes=[b"h"] * 8)
        assert (probe.contains(1, 64), probe.contains(1, 16)) == (True, False)
    finally:
        probes._CHUNKS.pop(id(FINE64), None)


def test_a_residency_subclass_is_read_as_a_residency():
    class Tier(kvgeom.Residency):
        __slots__ = ()

    chain = [b"h0", b"h1"]
    res = Tier()
    res.add(1, chain[1], 2)
    probe = kvgeom.probes.as_probe(SEED, res, block_hashes=tuple(chain), holder=2)
    assert (probe.contains(1, 32), probe.contains(1, 16), probe.bound) == (True, False, 32)
    with pytest.raises(kvgeom.QueryError) as info:
        kvgeom.probes.as_probe(SEED, res, block_hashes=chain, holder=None)
    assert info.value.code == "bad_holder"


H16 = [b"%016d" % i for i in range(8)]  # 16-byte block hashes (xxhash-sized)


def test_a_keys_probe_reads_per_group_keys_by_vllms_answers():
    from collections import UserList

    from kvgeom.probes import HIT, MISS, PENDING

    # state() over a UserList of keys (not a list: checked, then read like one)
    tier = _KeyTier({b"k0/1", b"k1/1"}, "ctx")
    probe = kvgeom.probes.as_probe(SEED, tier, offload_keys=[[], UserList([b"k0/1", b"k1/1"])], req_context="ctx",
                                   block_hashes=H16)
    assert [probe.state(1, e) for e in (16, 32, 48, 0)] == [HIT, HIT, MISS, MISS]  # 48: past the list; 0: no key
    # the request context reaches the tier through state() too
    other = kvgeom.probes.as_probe(SEED, tier, offload_keys=[[], [b"k0/1", b"k1/1"]], req_context="other")
    assert other.state(1, 16) == MISS
    # a pending answer: held for contains() (the lookup re-asks by state()), PENDING for state(); unsettled
    pending = kvgeom.probes.as_probe(SEED, _SameAnswerTier(_Answer("HIT_PENDING")), offload_keys=[[b"a"], [b"b"]])
    assert (pending.contains(1, 16), pending.state(1, 16), pending.unsettled) == (True, PENDING, True)
    # the same MISS object twice: a miss both times (remembered as MISS, never as HIT)
    miss = kvgeom.probes.as_probe(SEED, _SameAnswerTier(_Answer("MISS")), offload_keys=[[b"a"], [b"b"]])
    assert [miss.state(1, 16), miss.state(1, 16), miss.contains(1, 16)] == [MISS, MISS, False]


def test_a_keys_probe_refuses_a_group_entry_that_is_no_list_of_keys():
    probe = kvgeom.probes.as_probe(SEED, _KeyTier(set()), offload_keys=[[], "k0k1"])
    for ask in (probe.state, probe.contains):
        with pytest.raises(kvgeom.QueryError) as info:
            ask(1, 16)
        (problem,) = info.value.problems
        assert (problem.code, problem.field) == ("bad_offload_keys", "offload_keys.1")


def test_a_one_token_chunk_key_is_read_from_the_group_list():
    # MAMBA1: C = H = 1; the key ending at token 1 is offload_keys[0][0], not the one built from the chain
    probe = kvgeom.probes.as_probe(MAMBA1, _KeyTier({b"k0"}), offload_keys=[[b"k0"]], block_hashes=H16)
    assert (probe.state(0, 1), probe.contains(0, 1)) == ("hit", True)


def test_an_empty_mask_beside_an_empty_set_bounds_the_store_at_0():
    # FA 16 + Mamba 1 (H = 1, the Mamba group's chunk C = 1): nothing stored in either group, so the bound is 0 and
    # below() on the Mamba group answers -1 (no chunk may be held), not chunk 0
    geom = kvgeom.resolve({"groups": [FA16, {"kind": "mamba", "block_size": 1}], "offload": {}})
    probe = kvgeom.probes.as_probe(geom, {0: set(), 1: np.array([], dtype=bool)})
    assert (probe.bound, probe.below(1, 1, 5)) == (0, -1)


@pytest.mark.parametrize(("name", "state", "unsettled"), [("HIT", "hit", False), ("MISS", "miss", False),
                                                          ("HIT_PENDING", "pending", True), ("RETRY", "retry", True)])
def test_state_alone_marks_a_keys_probe_unsettled(name, state, unsettled):
    # a fresh probe asked only through state(): a chunk key (16, from offload_keys) and a partial-tail key (80, off
    # FINE64's 64-token chunk grid, built from the hash chain) each set the flag exactly for PENDING and RETRY
    for end in (64, 80):
        probe = kvgeom.probes.as_probe(FINE64, _SameAnswerTier(_Answer(name)), offload_keys=[[b"a"], [b"b"]],
                                       block_hashes=H16)
        assert probe.state(1, end) == state
        assert probe.unsettled is unsettled


def test_any_mapping_is_a_stored_mapping():
    from types import MappingProxyType

    probe = kvgeom.probes.as_probe(SEED, MappingProxyType({1: [16, 32], "0": {32}}))
    assert (probe.contains(1, 32), probe.contains(0, 32), probe.contains(1, 48)) == (True, True, False)


def test_a_pair_probe_jumps_as_its_inner_probe():
    # every pair-held chunk is held, so the inner probe's below() bounds the pairs: {16, 64} at C = 16 -> chunk 3
    inner = kvgeom.probes.as_probe(SEED, {1: {16, 64}, 0: {64}})
    pairs = kvgeom.probes.eagle_pair_held(inner, 16, 1000)
    assert [pairs.below(1, 16, j) for j in (10, 3, 0)] == [3, 0, -1]
    assert pairs.below(0, 32, 10) == 1  # group 0's own set, C = 32


def test_a_keys_probe_never_asks_a_key_at_token_0():
    # the key "ending at token 0" does not exist: not the last key of the list, not a chain key
    probe = kvgeom.probes.as_probe(SEED, _SameAnswerTier(True), offload_keys=[[b"a"], [b"b", b"c"]], block_hashes=H16)
    assert (probe.contains(1, 0), probe.state(1, 0), probe.contains(1, 32), probe.contains(1, 48)) == (
        False, "miss", True, False)


def test_forward_of_a_keys_probe():
    from collections import UserList

    keys = [[b"a0"], [b"k0", b"k1", b"k2"]]
    tier = _KeyTier({b"k0", b"k1"}, "ctx")
    probe = kvgeom.probes.as_probe(SEED, tier, offload_keys=keys, req_context="ctx")
    # group 1's own chunk (C = 16): keys k0, k1 held, k2 not -> chunk 2; the context reaches the tier
    assert (probe.forward(1, 16, 0, 10**6), probe.forward(1, 16, 0, 16)) == (2, 1)
    assert kvgeom.probes.as_probe(SEED, tier, offload_keys=keys, req_context="other").forward(1, 16, 0, 10**6) == 0
    # another chunk size (C = 32, as the scan of another group asks): stepped with contains(), i.e. the keys ending
    # at 32 (k1, held) and 64 (past the list)
    assert probe.forward(1, 32, 0, 10**6) == 1
    # a UserList of keys is read like a list; a string is no list of keys
    assert kvgeom.probes.as_probe(SEED, tier, offload_keys=[[], UserList(keys[1])], req_context="ctx").forward(
        1, 16, 0, 10**6) == 2
    with pytest.raises(kvgeom.QueryError) as info:
        kvgeom.probes.as_probe(SEED, tier, offload_keys=[[], "k0k1"]).forward(1, 16, 0, 10**6)
    assert (info.value.code, info.value.problems[0].field) == ("bad_offload_keys", "offload_keys.1")


def test_forward_of_a_keys_probe_stops_at_a_remembered_miss():
    miss = _Answer("MISS")
    probe = kvgeom.probes.as_probe(SEED, _SameAnswerTier(miss), offload_keys=[[b"a"], [b"b", b"c"]])
    assert probe.state(1, 16) == "miss"  # read by name once, then remembered by identity
    assert probe.forward(1, 16, 0, 10**6) == 0


def test_forward_of_a_keys_probe_over_an_int64_sized_key_list():
    # group 1's keys as an int64-sized list (key j = b"h<j>"), the key of chunk j0 = 2^51 held: top = 16 * j0 + 1
    # starts inside chunk j0, so it is asked and the scan stops after it (exact ints; top / C as a float is 2^51)
    j0 = 2**51
    keys = _VirtualChain(2**55)
    probe = kvgeom.probes.as_probe(SEED, _KeyTier({keys[j0]}), offload_keys=[[], keys])
    assert (probe.forward(1, 16, j0, 16 * j0 + 1), probe.forward(1, 16, j0, 16 * j0)) == (j0 + 1, j0)


def test_below_of_a_keys_probe():
    # group 1 (C = 16) holds 3 keys: no chunk past index 2 can be held, whatever the tier says
    probe = kvgeom.probes.as_probe(SEED, _SameAnswerTier(True), offload_keys=[[], [b"k0", b"k1", b"k2"]])
    assert [probe.below(1, 16, j) for j in (10, 3, 2, 0)] == [2, 2, 1, -1]
    # another chunk size: no knowledge, the chunk right under j
    assert [probe.below(1, 32, j) for j in (10, 0)] == [9, -1]


class _MixedTier:
    """Answers a fresh HIT-named object for k0 (read by name) and one remembered MISS object for every other key."""

    def __init__(self, miss):
        self.miss = miss

    def lookup(self, key, req_context):
        return _Answer("HIT") if key == b"k0" else self.miss


def test_forward_of_a_keys_probe_after_an_answer_read_by_name():
    miss = _Answer("MISS")
    probe = kvgeom.probes.as_probe(SEED, _MixedTier(miss), offload_keys=[[], [b"k0", b"k1", b"k2"]])
    assert probe.state(1, 32) == "miss"  # the MISS object is remembered
    assert probe.forward(1, 16, 0, 10**6) == 1  # k0 held (read by name), k1 the remembered miss: stop
