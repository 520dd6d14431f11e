"""Example table for kvgeom.probes and the lazy lookup: one comment per row."""

from __future__ import annotations

import numpy as np
import pytest

import kvgeom
from kvgeom.errors import QueryError
from kvgeom.hits import lookup_hit
from kvgeom.probes import as_probe

SEED = kvgeom.resolve(kvgeom.DEFAULT_CONFIG)  # FA 16 + Mamba 16, TP 2 / DCP 2: C = 32 and 16, H = 16
SWA = kvgeom.resolve({
    "groups": [{"kind": "full_attention", "block_size": 16},
               {"kind": "sliding_window", "block_size": 16, "sliding_window": 40}],
    "cache": {"retention_interval": None},
    "offload": {},
})


class Untouchable(frozenset):
    """A set that may be asked about members but never walked as a whole."""

    def __iter__(self):
        raise AssertionError("the lookup walked the whole stored set")


def test_a_set_store_is_read_only_at_the_probed_keys():
    # 32k-token request, 75% stored: the lookup asks ~770 keys and never iterates either set
    n = 32768
    stored = {0: Untouchable(range(32, 24577, 32)), 1: Untouchable(range(16, 24577, 16))}
    assert lookup_hit(SEED, n, stored=stored).end_token == 24576


def test_probes_stop_at_the_first_full_attention_miss():
    # attention chunk 2 (end 96) missing: chunks 1, 2, 3 asked, then Mamba at the candidate 64 only
    asked = []

    def contains(g, e):
        asked.append((g, e))
        return e != 96

    assert lookup_hit(SEED, 1000, stored=contains).end_token == 64
    assert asked == [(0, 32), (0, 64), (0, 96), (1, 64)]


def test_a_long_request_with_few_keys_still_jumps_over_misses():
    # a set store is sorted only after a run of misses: an int64-sized request stays cheap
    assert lookup_hit(SWA, 2**62, stored={0: {16, 32, 48, 64}, 1: {16, 32, 48, 64}}).end_token == 64
    # a Residency is bounded by the request's chain: the scan starts at the chain's end
    chain = [b"h%d" % i for i in range(2**20)]
    r = kvgeom.Residency()
    for i in range(4):
        r.add(0, chain[i])
        r.add(1, chain[i])
    assert lookup_hit(SWA, 2**20 * 16, stored=r, block_hashes=chain).end_token == 64


def test_bool_chunk_masks():
    # entry j: the key ending at (j + 1) * C of the group; the Mamba key at 64 missing -> the one at 48
    masks = {0: np.array([True, True, True]), 1: np.array([True, True, True, False])}
    assert lookup_hit(SEED, 65, stored=masks).end_token == 48
    # and the same held keys as end tokens
    assert lookup_hit(SEED, 65, stored={0: [32, 64, 96], 1: [16, 32, 48]}).end_token == 48


STORE_ERRORS = [
    # a Residency without the request's hash chain
    (lambda: lookup_hit(SEED, 64, stored=kvgeom.Residency()), "missing_block_hashes"),
    # a hash chain given for a store that already names end tokens
    (lambda: lookup_hit(SEED, 64, stored={0: [32]}, block_hashes=[b"x"]), "unexpected_block_hashes"),
    # something that is no store at all
    (lambda: lookup_hit(SEED, 64, stored=42), "bad_stored"),
    # a two-dimensional bool array (that is the batch form)
    (lambda: lookup_hit(SEED, 64, stored={0: np.ones((1, 2), dtype=bool)}), "bad_stored"),
    # a list value is still checked in full: an end token off the hash grid
    (lambda: lookup_hit(SEED, 64, stored={1: [20]}), "not_on_hash_grid"),
    # a group that is not offloaded
    (lambda: lookup_hit(SEED, 64, stored={5: {16}}), "group_not_offloaded"),
]


@pytest.mark.parametrize(("call", "code"), STORE_ERRORS)
def test_bad_stores(call, code):
    with pytest.raises(QueryError) as info:
        call()
    assert info.value.code == code


def test_a_pending_lookup_answer_is_refused_not_guessed():
    class Pending:
        name = "HIT_PENDING"

    class Manager:
        def lookup(self, key, req_context):
            return Pending()

    with pytest.raises(QueryError) as info:
        lookup_hit(SEED, 64, stored=Manager(), block_hashes=[b"a", b"b", b"c", b"d"])
    assert info.value.code == "lookup_not_ready"


def test_as_probe_returns_a_probe_unchanged():
    p = as_probe(SEED, {1: {16}})
    assert as_probe(SEED, p) is p


# The eagle pair probe (kvgeom.probes.eagle_pair_held): chunk end e is held iff the chunks ending at e and
# e + C are both held and e + C <= stop. FA 16 alone, offloaded: C = 16.
FA_ONLY = kvgeom.resolve({"groups": [{"kind": "full_attention", "block_size": 16}], "offload": {}})


@pytest.mark.parametrize(
    ("held", "stop", "pairs"),
    [
        ([16, 32, 64], 64, [16]),  # 16 pairs with 32; 32 has no 48; 64 has no 80
        ([16, 32, 48, 64], 64, [16, 32, 48]),  # every chunk pairs with the next, up to stop
        ([16, 32, 48, 64], 48, [16, 32]),  # 48's partner 64 is past stop 48
        ([16, 32], 32, [16]),  # the partner may end exactly at stop
        ([16, 32], 31, []),  # ... but not past it
        ([32, 64], 64, []),  # no two consecutive chunks held: no pair
    ],
)
def test_eagle_pair_held(held, stop, pairs):
    from kvgeom.probes import eagle_pair_held

    probe = eagle_pair_held(as_probe(FA_ONLY, {0: held}), 16, stop)
    assert [e for e in range(16, 81, 16) if probe.contains(0, e)] == pairs
    assert not probe.contains(0, 24)  # off the chunk grid: never held


# Rows for the mutation run of kvgeom.probes (issue 19, docs/mutation.md): what each check names.
STORE_PROBLEMS = [
    # an end token off the H grid: the problem names the group's key, its end token and H
    (lambda: lookup_hit(SEED, 64, stored={1: [20]}), "not_on_hash_grid", "stored.1",
     {"end_token": 20, "hash_block_size": 16}),
    # a key that is not a group index: the problem names the stored mapping
    (lambda: lookup_hit(SEED, 64, stored={"x": [16]}), "bad_group_key", "stored", {}),
    # a 2-D integer array is not a list of end tokens (the batch form is a bool matrix)
    (lambda: lookup_hit(SEED, 64, stored={1: np.array([[16, 32]])}), "bad_stored", "stored.1", {}),
    # a Residency with a string (not a sequence of hashes) for a chain
    (lambda: lookup_hit(SEED, 64, stored=kvgeom.Residency(), block_hashes="abcd"), "bad_block_hashes",
     "block_hashes", {}),
    # ... or an int
    (lambda: lookup_hit(SEED, 64, stored=kvgeom.Residency(), block_hashes=5), "bad_block_hashes", "block_hashes", {}),
    # a stored range past sys.maxsize: refused by its size, shown as "more than" int64
    (lambda: lookup_hit(SEED, 64, stored={1: range(16, 2**70, 16)}), "too_many_stored", "stored.1",
     {"count": 2**63, "limit": 1 << 20}),
    # one end token past the bound
    (lambda: lookup_hit(SEED, 64, stored={1: range(16, 16 * ((1 << 20) + 2), 16)}), "too_many_stored", "stored.1",
     {"count": (1 << 20) + 1, "limit": 1 << 20}),
    # an end token that is not an int: the problem names the group's end tokens
    (lambda: lookup_hit(SEED, 64, stored={1: [16, "32"]}), "not_an_integer", "stored.1 end token", {}),
    # 0 is no key's end token (keys end on positive multiples of H)
    (lambda: lookup_hit(SEED, 64, stored={1: [0, 16]}), "not_on_hash_grid", "stored.1", {"end_token": 0}),
    # a range of exactly int64-max end tokens is counted, not described
    (lambda: lookup_hit(SEED, 64, stored={1: range(2**63 - 1)}), "too_many_stored", "stored.1",
     {"count": 2**63 - 1}),
    # a geometry without offloading has no tier to ask, whatever the store form
    (lambda: as_probe(kvgeom.resolve({"groups": [{"kind": "mla", "block_size": 64}]}), {0: [64]}),
     "no_offload", "offload", {}),
    (lambda: as_probe(kvgeom.resolve({"groups": [{"kind": "mla", "block_size": 64}]}), lambda g, e: True),
     "no_offload", "offload", {}),
    # a hash chain shorter than the request: 1 hash for 64 tokens of H = 16
    (lambda: lookup_hit(SEED, 64, stored=kvgeom.Residency(), block_hashes=[b"a"]), "block_hashes_too_short",
     "block_hashes", {"num_hashes": 1, "needed": 4}),
]


@pytest.mark.parametrize(("call", "code", "field", "values"), STORE_PROBLEMS)
def test_store_problems_name_the_field_and_numbers(call, code, field, values):
    with pytest.raises(QueryError) as info:
        call()
    (problem,) = info.value.problems
    assert (problem.code, problem.field) == (code, field)
    assert {k: problem.values.get(k) for k in values} == values


def test_stored_bounds_and_array_forms():
    from kvgeom.probes import MAX_STORED_ENDS

    # exactly MAX_STORED_ENDS end tokens are checked and read
    ends = range(16, 16 * (MAX_STORED_ENDS + 1), 16)
    assert lookup_hit(SEED, 65, stored={0: [32, 64], 1: ends}).end_token == 64
    # a 1-D integer array is a list of end tokens
    assert lookup_hit(SEED, 65, stored={0: np.array([32, 64]), 1: np.array([16, 32, 48])}).end_token == 48
    # a range past sys.maxsize is described, not printed
    with pytest.raises(QueryError) as info:
        lookup_hit(SEED, 64, stored={1: range(16, 2**70, 16)})
    assert "more than 9223372036854775807 end tokens" in str(info.value)
    with pytest.raises(QueryError) as info:
        lookup_hit(SEED, 64, stored={1: range(2**63 - 1)})
    assert "lists 9223372036854775807 end tokens" in str(info.value)
    with pytest.raises(QueryError) as info:
        lookup_hit(SEED, 64, stored={1: range(16, 16 * ((MAX_STORED_ENDS) + 2), 16)})
    assert f"lists {MAX_STORED_ENDS + 1} end tokens" in str(info.value)
    # every checked end token is read, a plain or numpy int alike (the fast path and the loop agree)
    assert lookup_hit(SEED, 65, stored={0: [32, np.int64(64)], 1: [16, 32, 48]}).end_token == 48
