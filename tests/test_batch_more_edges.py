"""More edge rows for :mod:`kvgeom.batch` and :mod:`kvgeom.sim` (issue 19, mutation testing, second pass).

Each row pins one rule the example tables and laws left implicit: the argument a batch problem names, an
inclusive int64 bound, an empty input, or a batch answer, which must equal the scalar rule's answer on the
same input (the scalar kvgeom function is the oracle; no answer here is written by hand). They were found by
the fast mutation pass (``scripts/mutation-fast.py``, docs/mutation.md): the tables passed with the rule
broken the way each row's comment says.
"""

from __future__ import annotations

import numpy as np
import pytest

import kvgeom
from kvgeom import batch, keys
from kvgeom._math import INT64_MAX
from kvgeom.batch.speculative import partial_tail_top
from kvgeom.errors import QueryError

SEED = kvgeom.resolve(kvgeom.DEFAULT_CONFIG)  # attention 16 (DCP 2: span 32, 2 hashes a chunk) + align Mamba 16, k = 1
TABLE = np.array([[1, 2]])


def _problem(call):
    with pytest.raises(QueryError) as info:
        call()
    (problem,) = info.value.problems
    return problem


# ---------------------------------------------------------------------------------------------
# kvgeom.batch._arrays: the input rules every twin shares
# ---------------------------------------------------------------------------------------------

# (call, code, field, values): the problem names the argument the caller passed, with its numbers
ARRAY_PROBLEMS = [
    # a per-request array argument (not only a broadcast scalar) is named by its own name
    (
        lambda: batch.lookup_hits(SEED, [64, 32], stored={}, local_computed_tokens=[0, -1]),
        "negative",
        "local_computed_tokens",
        {"local_computed_tokens": -1},
    ),
    (
        lambda: batch.lookup_hits(SEED, [64, 32], stored={}, max_num_new_tokens=np.array([-3, 0])),
        "negative",
        "max_num_new_tokens",
        {"max_num_new_tokens": -3},
    ),
    # slot_mapping reads int64 1-D positions without a copy; any other array goes through the full check
    # (an int32 array with a negative value, a 2-D int64 array)
    (
        lambda: batch.slot_mapping(SEED, 0, np.array([-1], dtype=np.int32), TABLE, [0]),
        "negative",
        "positions",
        {"positions": -1},
    ),
    (
        lambda: batch.slot_mapping(SEED, 0, np.array([[5]], dtype=np.int64), TABLE, [0]),
        "bad_shape",
        "positions",
        {"shape": (1, 1)},
    ),
    (
        lambda: batch.slot_mapping(SEED, 0, [5], TABLE, np.array([[0]], dtype=np.int64)),
        "bad_shape",
        "request_index",
        {"shape": (1, 1)},
    ),
    # int64 1-D arrays are read without a check; a negative entry is found (and named) by the index check, on
    # the fast path (every table entry fits) and on the checked one (a negative entry in an unused column)
    *(
        (lambda t=t, pos=pos, req=req: batch.slot_mapping(SEED, 0, np.array([5, pos], dtype=np.int64), t,
                                                          np.array([0, req], dtype=np.int64)),
         "negative", field, {field: -1})
        for t in (TABLE, np.array([[1, -2]]))
        for pos, req, field in ((-1, 0, "positions"), (5, -1, "request_index"))
    ),
    # the int64 maxima are no negatives: past the table's columns and rows
    (
        lambda: batch.slot_mapping(SEED, 0, np.array([INT64_MAX], dtype=np.int64), TABLE, np.array([0])),
        "row_too_short",
        "block_row",
        {"column": INT64_MAX // 32, "row_length": 2},
    ),
    (
        lambda: batch.slot_mapping(SEED, 0, np.array([5]), TABLE, np.array([INT64_MAX], dtype=np.int64)),
        "no_such_request",
        "request_index",
        {"request_index": INT64_MAX, "rows": 1},
    ),
]


@pytest.mark.parametrize(("call", "code", "field", "values"), ARRAY_PROBLEMS)
def test_array_problem_names_the_argument_and_numbers(call, code, field, values):
    problem = _problem(call)
    assert (problem.code, problem.field) == (code, field)
    assert {k: problem.values.get(k) for k in values} == values


@pytest.mark.parametrize(
    "twin", [batch.chunk_hash_index, batch.chunk_end_token, batch.chunk_first_entry, batch.chunk_of_entry]
)
def test_no_chunk_gives_an_empty_answer(twin):
    """The int64 pre-check of an empty input bounds nothing (the largest of no chunk is 0): no error, no entry."""
    got = twin(SEED, 0, [])
    assert got.shape == (0,) and got.dtype == np.int64


def test_int64_bound_of_a_key_is_inclusive():
    """A result of exactly INT64_MAX fits int64 (``fits`` refuses only past it); the scalar gives the same key."""
    j = (1 << 62) - 1  # (j + 1) * 2 hashes - 1 == INT64_MAX
    assert keys.chunk_hash_index(SEED, 0, j) == INT64_MAX
    assert batch.chunk_hash_index(SEED, 0, [j]).tolist() == [keys.chunk_hash_index(SEED, 0, j)]
    # k = 1: the chunk's first block entry is the chunk itself, INT64_MAX at most
    first = keys.chunk_block_entries(SEED, 0, INT64_MAX).start
    assert batch.chunk_first_entry(SEED, 0, [INT64_MAX]).tolist() == [first]


# ---------------------------------------------------------------------------------------------
# kvgeom.batch.handoff.partial_tail_top == kvgeom.handoff.partial_tail_max_boundary, request by request
# ---------------------------------------------------------------------------------------------

FA64 = {"kind": "full_attention", "block_size": 64}
M64 = {"kind": "mamba", "block_size": 64}
FA32D = {"kind": "full_attention", "block_size": 32, "drafter": True}
M32 = {"kind": "mamba", "block_size": 32}
TAIL_GEOMS = {
    # DCP 1, span 64, H 16, no proof margin: rdown(min(prompt - 1, done + 63, limit), 16)
    "fine64": kvgeom.resolve({"groups": [FA64, M64], "cache": {"prefix_match_unit": 16}, "offload": {}}),
    # the attention group is not prefix-cacheable: the Mamba group is the only offloaded group
    "mamba_only": kvgeom.resolve(
        {"groups": [{**FA64, "prefix_cacheable": False}, M64], "cache": {"prefix_match_unit": 16}, "offload": {}}
    ),
    # H = 1 (a one-token prefix match unit): a boundary of 1 token is on the hash grid, so the clip to 0 shows
    "unit1": kvgeom.resolve(
        {"groups": [{"kind": "full_attention", "block_size": 16}, {"kind": "mamba", "block_size": 16}],
         "cache": {"prefix_match_unit": 1}, "offload": {}}
    ),
    # EAGLE K = 2, H 8 under span 32: proof margin 8, two spans of reach, the last hash minus the margin
    "eagle32": kvgeom.resolve(
        {"groups": [FA32D, M32], "cache": {"prefix_match_unit": 8}, "offload": {},
         "speculative": {"method": "eagle", "num_speculative_tokens": 2}}
    ),
}
# (num_tokens, prompt, done, limit): done <= limit <= num_tokens and done <= prompt, as a lookup calls it
TAIL_ROWS = [
    (n, p, d, lim)
    for n, p in [(0, 0), (1, 1), (2, 1), (16, 16), (17, 17), (60, 60), (61, 61), (65, 65), (100, 100), (100, 60),
                 (129, 129), (200, 120), (300, 300)]
    for d in (0, 1, 8, 16, 32, 63, 64, 96)
    for lim in (d, d + 1, d + 20, n)
    if d <= p and d <= lim <= n
]


@pytest.mark.parametrize("name", list(TAIL_GEOMS))
def test_partial_tail_top_equals_the_scalar_max_boundary(name):
    """The batch closed form of the highest partial-tail boundary a lookup tries equals the scalar rule per request
    (reach of one span, two under a proof margin; the margin below the last hash; 0 for an empty prompt)."""
    from kvgeom.handoff import partial_tail_max_boundary

    geom = TAIL_GEOMS[name]
    assert geom.offload is not None and geom.offload.supports_partial_tail
    n, p, d, lim = (np.array(c, dtype=np.int64) for c in zip(*TAIL_ROWS, strict=True))
    got = partial_tail_top(geom, n, p, d, lim)
    want = [partial_tail_max_boundary(geom, *row) for row in TAIL_ROWS]
    assert got.tolist() == want


# ---------------------------------------------------------------------------------------------
# kvgeom.batch.plan_stores: the argument a refusal names, and what an argument left out means
# ---------------------------------------------------------------------------------------------

_STORES = {"num_tokens": [64, 64], "num_computed_tokens": [64, 64]}


@pytest.mark.parametrize(
    ("kwargs", "code", "field", "values"),
    [
        ({"max_offload_tokens": [64, -1]}, "negative", "max_offload_tokens", {"max_offload_tokens": -1}),
        ({"reachable": [[1]]}, "length_mismatch", "reachable", {"length": 1, "expected": 2}),
        # -1 pads a row of reachable boundaries; below it is a negative boundary
        ({"reachable": [[31, -1], [-2, 3]]}, "negative", "reachable", {"reachable": -2}),
        ({"chunk_ends": [[16, -3], [16, 32]]}, "negative", "chunk_ends", {"chunk_ends": -3}),
        ({"chunk_ends": [[16]]}, "length_mismatch", "chunk_ends", {"length": 1, "expected": 2}),
        ({"loaded_from_offload": [1, 0]}, "bad_shape", "loaded_from_offload", {}),
        ({"loaded_from_offload": [True]}, "length_mismatch", "loaded_from_offload", {"length": 1, "expected": 2}),
        ({"finished": [True, False, True]}, "length_mismatch", "finished", {"length": 3, "expected": 2}),
        # per-group arrays are named with their group index
        ({"allocated_blocks": {0: [4, -1]}}, "negative", "allocated_blocks[0]", {"allocated_blocks[0]": -1}),
        ({"allocated_blocks": {0: [4]}}, "length_mismatch", "allocated_blocks[0]", {"length": 1, "expected": 2}),
        ({"stored_chunks": {1: [0, -2]}}, "negative", "stored_chunks[1]", {"stored_chunks[1]": -2}),
        ({"stored_chunks": {1: [0]}}, "length_mismatch", "stored_chunks[1]", {"length": 1, "expected": 2}),
    ],
)
def test_plan_stores_problem_names_the_argument_and_numbers(kwargs, code, field, values):
    problem = _problem(lambda: batch.plan_stores(SEED, **_STORES, **kwargs))
    assert (problem.code, problem.field) == (code, field)
    assert {k: problem.values.get(k) for k in values} == values


FA16 = {"kind": "full_attention", "block_size": 16}
STORE_GEOMS = {
    # retention None: a sliding group keeps the tail of its last segment, ended by `finished` past the prompt
    "sliding_revisit": kvgeom.resolve(
        {"groups": [FA16, {"kind": "sliding_window", "block_size": 16, "sliding_window": 24}],
         "cache": {"retention_interval": None}, "offload": {"blocks_per_chunk": 2}}
    ),
    # an eagle proof margin: only a request loaded from the tier stores its partial tail
    "eagle_tail": kvgeom.resolve(
        {"groups": [FA32D, M32], "cache": {"prefix_match_unit": 8, "retention_interval": 0}, "offload": {},
         "speculative": {"method": "eagle", "num_speculative_tokens": 2}}
    ),
    # a drafter sliding window (the EAGLE drop shifts the kept run one block on): the replay point
    # prompt - 1 = 0 of a one-token prompt keeps block 0, an empty prompt's point (-1) keeps nothing
    "eagle_sliding": kvgeom.resolve(
        {"groups": [FA16, {"kind": "sliding_window", "block_size": 16, "sliding_window": 40, "drafter": True}],
         "offload": {}, "speculative": {"method": "eagle", "num_speculative_tokens": 2}}
    ),
}


@pytest.mark.parametrize("offload_prompt_only", [True, False])
@pytest.mark.parametrize("name", list(STORE_GEOMS))
def test_plan_stores_defaults_past_the_prompt_equal_the_scalar_defaults(name, offload_prompt_only):
    """Left out, ``finished`` is False, ``loaded_from_offload`` False and ``reachable`` the replay point
    ``prompt - 1`` (none for an empty prompt), as in :func:`kvgeom.hits.plan_store`; requests decoding past
    their prompt (prompts of 0 and 1 tokens included) are where these defaults change the plan."""
    from kvgeom import hits

    geom = STORE_GEOMS[name]
    n = [0, 33, 64, 65, 100, 100, 100, 130, 200]
    computed = [0, 33, 64, 60, 100, 100, 100, 130, 200]
    prompt = [0, 20, 64, 40, 0, 1, 61, 100, 150]
    sp = batch.plan_stores(geom, num_tokens=n, num_computed_tokens=computed, num_prompt_tokens=prompt,
                           offload_prompt_only=offload_prompt_only)
    for i in range(len(n)):
        want = hits.plan_store(geom, num_tokens=n[i], num_computed_tokens=computed[i], num_prompt_tokens=prompt[i],
                               offload_prompt_only=offload_prompt_only)
        assert sp.plan(i) == want, (i, n[i], computed[i], prompt[i])


def test_plan_stores_loaded_from_offload_default_is_false():
    """The eagle proof-margin tail: the default (not loaded) equals the scalar default, and differs from True."""
    from kvgeom import hits

    geom = STORE_GEOMS["eagle_tail"]
    n = [33, 64, 100, 130]
    sp = batch.plan_stores(geom, num_tokens=n, num_computed_tokens=n)
    loaded = batch.plan_stores(geom, num_tokens=n, num_computed_tokens=n, loaded_from_offload=True)
    for i, tokens in enumerate(n):
        assert sp.plan(i) == hits.plan_store(geom, num_tokens=tokens, num_computed_tokens=tokens)
        assert loaded.plan(i) == hits.plan_store(geom, num_tokens=tokens, num_computed_tokens=tokens,
                                                 loaded_from_offload=True)
    assert any(sp.plan(i) != loaded.plan(i) for i in range(len(n)))


# ---------------------------------------------------------------------------------------------
# kvgeom.batch._arrays: the bounds of the per-request checks (0 is a count, -1 pads, equality is no excess)
# ---------------------------------------------------------------------------------------------

HELD = np.ones((2, 4), dtype=bool)  # the tier holds every chunk of the first 64 tokens of both requests
SCALAR_STORED = {0: [32, 64], 1: [16, 32, 48, 64]}


@pytest.mark.parametrize("local", [0, [0, 0], [64, 0], [65, 32]])
def test_a_local_prefix_up_to_the_request_is_no_excess(local):
    """``local_computed_tokens`` of 0 (broadcast or per request) is a count, and equal to ``num_tokens`` it is not
    past the request: the batch lookup answers, and equals the scalar lookup request by request."""
    from kvgeom import hits

    n = [65, 32]
    got = batch.lookup_hits(SEED, n, stored={0: HELD, 1: HELD}, local_computed_tokens=local)
    per = [local, local] if isinstance(local, int) else local
    for i in range(2):
        assert got.hit(i) == hits.lookup_hit(SEED, n[i], stored=SCALAR_STORED, local_computed_tokens=per[i])


@pytest.mark.parametrize(
    ("kwargs", "code", "field", "values"),
    [
        # request 0 is exactly at its limit (not past it): the problem names request 1, the first one past it
        ({"local_computed_tokens": [64, 40]}, "local_past_request", "local_computed_tokens",
         {"local_computed_tokens": 40, "num_tokens": 32}),
        ({"num_prompt_tokens": [64, 40]}, "prompt_longer_than_request", "num_prompt_tokens",
         {"num_prompt_tokens": 40, "num_tokens": 32}),
        ({"num_prompt_tokens": [-1, 3]}, "negative", "num_prompt_tokens", {"num_prompt_tokens": -1}),
    ],
)
def test_lookup_problem_names_the_first_request_past_its_bound(kwargs, code, field, values):
    problem = _problem(lambda: batch.lookup_hits(SEED, [64, 32], stored={}, **kwargs))
    assert (problem.code, problem.field) == (code, field)
    assert {k: problem.values.get(k) for k in values} == values


def test_an_object_array_of_python_ints_reads_like_an_int_array():
    """An object array (Python ints) takes the same checks: 0 is a count, and -1 pads a row of reachable
    boundaries; the answers equal the int64 array's and the scalar's."""
    from kvgeom import hits

    assert batch.num_keys(SEED, 0, np.array([0, 64], dtype=object)).tolist() == [
        keys.num_keys(SEED, 0, 0), keys.num_keys(SEED, 0, 64)]
    padded = batch.plan_stores(SEED, num_tokens=[64], num_computed_tokens=[64],
                               reachable=np.array([[31, -1]], dtype=object))
    assert padded.plan(0) == hits.plan_store(SEED, num_tokens=64, num_computed_tokens=64, reachable=[31])


# a one-token align Mamba group (k = 1: a chunk is one token, so every positive token is a chunk end)
MAMBA1 = {"kind": "mamba", "block_size": 1, "mamba_cache_mode": "align"}


@pytest.mark.parametrize("retention", [0, None])
def test_one_token_mamba_chunks_store_only_the_handed_states(retention):
    """Requests with fewer hand-offs than the widest row (the batch pads the rest) store exactly the scalar's
    chunks: the padding is no state, even where a key of 1 token would be a chunk end."""
    from kvgeom import hits

    geom = kvgeom.resolve({"groups": [MAMBA1], "offload": {}, "cache": {"retention_interval": retention}})
    n = [5, 1, 3, 0, 2]
    sp = batch.plan_stores(geom, num_tokens=n, num_computed_tokens=n)
    for i, tokens in enumerate(n):
        assert sp.plan(i) == hits.plan_store(geom, num_tokens=tokens, num_computed_tokens=tokens), i


@pytest.mark.parametrize(
    ("call", "code", "field", "values"),
    [
        # a 0-d array has no length to pre-check: it is refused by its shape
        (lambda: batch.num_keys(SEED, 0, np.array(5)), "bad_shape", "num_tokens", {"shape": ()}),
        # an int64 array of the wrong rank is refused like any other array
        (lambda: batch.num_keys(SEED, 0, np.array([[5]], dtype=np.int64)), "bad_shape", "num_tokens",
         {"shape": (1, 1)}),
    ],
)
def test_array_shape_problems(call, code, field, values):
    problem = _problem(call)
    assert (problem.code, problem.field) == (code, field)
    assert {k: problem.values.get(k) for k in values} == values


def test_numpy_integers_in_an_object_array_and_the_uint64_bound():
    """numpy integers inside an object array are integers; a uint64 value of exactly INT64_MAX fits int64."""
    assert batch.num_keys(SEED, 0, np.array([np.int64(64), 0], dtype=object)).tolist() == [
        keys.num_keys(SEED, 0, 64), keys.num_keys(SEED, 0, 0)]
    assert batch.num_keys(SEED, 0, np.array([INT64_MAX], dtype=np.uint64)).tolist() == [
        keys.num_keys(SEED, 0, INT64_MAX)]


def test_an_object_block_table_with_a_negative_unused_entry():
    """A block table is checked only where positions read it (as the scalar does for a block row), also when it
    is an object array: a negative id in an unused column is fine, and the slots are dcp_slot's."""
    from kvgeom import ranks

    row = [1, 2, -5]
    positions = [5, 37]
    want = [ranks.dcp_slot(SEED, 0, p, row)[1] for p in positions]
    assert batch.slot_mapping(SEED, 0, positions, np.array([row], dtype=object), [0, 0]).tolist() == want


@pytest.mark.parametrize("name", ["sliding_revisit", "eagle_tail"])
def test_per_request_bool_arrays_equal_the_scalar_flags(name):
    """``finished`` and ``loaded_from_offload`` given as per-request bool arrays: request i's plan is the scalar
    plan with its own flags."""
    from kvgeom import hits

    geom = STORE_GEOMS[name]
    n = [33, 64, 100, 100, 130]
    prompt = [20, 64, 61, 100, 100]
    fin = np.array([True, False, True, False, True])
    loaded = np.array([False, True, True, False, True])
    sp = batch.plan_stores(geom, num_tokens=n, num_computed_tokens=n, num_prompt_tokens=prompt,
                           offload_prompt_only=False, finished=fin, loaded_from_offload=loaded)
    for i in range(len(n)):
        want = hits.plan_store(geom, num_tokens=n[i], num_computed_tokens=n[i], num_prompt_tokens=prompt[i],
                               offload_prompt_only=False, finished=bool(fin[i]), loaded_from_offload=bool(loaded[i]))
        assert sp.plan(i) == want, i


def test_key_maps_total_past_int64_is_refused_not_wrapped():
    """33 prefixes of INT64_MAX tokens hold 33 * (2^58 - 1) keys, past int64: the count is taken without wrapping
    around (a wrapped sum would be negative and pass the size check), so the map is ``result_too_large``."""
    problem = _problem(lambda: batch.key_maps(SEED, [INT64_MAX] * 33))
    assert (problem.code, problem.field) == ("result_too_large", "key_maps")
    assert problem.values["total"] > INT64_MAX


def test_one_token_mamba_loads_the_state_block_of_its_hit():
    """The state block a hit of N tokens loads is (N - 1) // B: with B = 1 every hit shows it (N = 1 loads block
    0); the batch load plans equal the scalar plan_load of the scalar lookup, request by request."""
    from kvgeom import hits

    geom = kvgeom.resolve({"groups": [MAMBA1], "offload": {}})
    n = [5, 3, 2, 40, 33]
    width = 48
    h = batch.lookup_hits(geom, n, stored={0: np.ones((len(n), width), dtype=bool)})
    loads = batch.plan_loads(geom, h)
    stored = {0: list(range(1, width + 1))}
    for i, tokens in enumerate(n):
        hit = hits.lookup_hit(geom, tokens, stored=stored)
        assert h.hit(i) == hit
        assert loads.plan(i) == hits.plan_load(geom, hit), i


def test_align_mamba_over_two_block_chunks_stores_one_state_block_per_chunk():
    """k = 2 with an align Mamba group (DCP 3: attention span 72, Mamba block 48): each stored chunk's entry is
    its one state block, not a run of k blocks; the batch plans equal the scalar plan_store."""
    from kvgeom import hits

    geom = kvgeom.resolve(
        {"groups": [{"kind": "full_attention", "block_size": 24},
                    {"kind": "mamba", "block_size": 48, "mamba_cache_mode": "align"}],
         "parallel": {"tp": 3, "dcp": 3, "cp_interleave": 2}, "offload": {"blocks_per_chunk": 2}}
    )
    n = [100, 300, 500]
    sp = batch.plan_stores(geom, num_tokens=n, num_computed_tokens=n)
    for i, tokens in enumerate(n):
        assert sp.plan(i) == hits.plan_store(geom, num_tokens=tokens, num_computed_tokens=tokens), i


@pytest.mark.parametrize("attention, window", [(32, 16), (64, 16), (64, 20), (64, 33)])
@pytest.mark.parametrize("finished", [False, True])
def test_sliding_final_tail_and_revisits_equal_the_scalar(attention, window, finished):
    """Retention None, a sliding group of block 16 under a wider attention block (the connector aligns to the
    attention chunk, so a segment is 2 or 4 sliding blocks and keeps only its last one or two): the tail of the
    last, partial segment (``swa_store_horizon``: at the storable chunks once finished, at the prompt's end while
    decoding) and the chunks a finished request revisits below what it stored; request by request the batch plan
    equals the scalar plan_store, from stored starts 0 to 3 chunks."""
    from kvgeom import hits

    geom = kvgeom.resolve(
        {"groups": [{"kind": "full_attention", "block_size": attention},
                    {"kind": "sliding_window", "block_size": 16, "sliding_window": window}],
         "cache": {"retention_interval": None, "prefix_match_unit": 16}, "offload": {}}
    )
    n = [64, 100, 130, 200, 260, 300, 333, 400]
    prompt = [64, 64, 100, 150, 260, 200, 333, 300]
    stored = [0, 1, 1, 2, 0, 3, 2, 1]
    sp = batch.plan_stores(geom, num_tokens=n, num_computed_tokens=n, num_prompt_tokens=prompt, finished=finished,
                           offload_prompt_only=False, stored_chunks={1: stored})
    for i in range(len(n)):
        want = hits.plan_store(geom, num_tokens=n[i], num_computed_tokens=n[i], num_prompt_tokens=prompt[i],
                               finished=finished, offload_prompt_only=False, stored_chunks={1: stored[i]})
        assert sp.plan(i) == want, i


@pytest.mark.parametrize(
    ("n", "total"),
    [
        ([2**40], 2**35),  # 2^35 attention chunks of 32 tokens: more candidates than a CSR result holds
        # 33 * (2^58 - 1) candidates, past int64: counted without wrapping around
        ([INT64_MAX] * 33, None),
    ],
)
def test_plan_stores_refuses_too_many_candidate_chunks(n, total):
    problem = _problem(lambda: batch.plan_stores(SEED, num_tokens=n, num_computed_tokens=n))
    assert (problem.code, problem.field) == ("result_too_large", "plan_stores candidate chunks")
    if total is None:
        assert problem.values["total"] > INT64_MAX
    else:
        assert problem.values["total"] == total


# the docstring's vLLM row of kvgeom.sim.run_request: the GPU keeps Mamba states up to 48 only, so the request
# restores nothing locally and 96 tokens from the tier (vLLM run); the tier evictions decide that external hit
_RUN = kvgeom.resolve({**kvgeom.DEFAULT_CONFIG, "cache": {"retention_interval": None}})


@pytest.mark.parametrize(
    ("evict_tier", "external"),
    [
        (None, 96),
        (lambda group, end: False, 96),  # a predicate that evicts nothing
        ([False] * 64, 96),  # bools in (group, end_token) order, none True
        (lambda group, end: True, 0),  # the tier emptied: nothing to load
        ([True] * 64, 0),
    ],
)
def test_run_request_tier_evictions_decide_the_external_hit(evict_tier, external):
    from kvgeom.sim import run_request

    r = run_request(_RUN, 100, evict_gpu=lambda g, e: g == 1 and e > 48, evict_tier=evict_tier)
    assert (r.plan.local_hit_tokens, r.plan.external_hit_tokens, r.ok) == (0, external, True)


def test_key_maps_request_column_repeats_each_prefix_once_per_key():
    """``GroupKeys.request`` is the CSR row of each key: prefix i repeated once per key of its scalar key map."""
    km = batch.key_maps(SEED, [64, 40, 0, 100])
    for g in km.groups:
        want = [i for i, n in enumerate([64, 40, 0, 100])
                for _ in next(x for x in keys.key_map(SEED, n)["groups"] if x["index"] == g.index)["keys"]]
        assert g.request.tolist() == want


def test_the_inclusive_edges_of_a_result_bound_and_of_a_prompt():
    # check_total refuses only a result past MAX_RESULT elements (exactly MAX_RESULT is built); a prompt as long
    # as its request is no excess (only a longer one is prompt_longer_than_request)
    from kvgeom.batch._arrays import MAX_RESULT, check_total, prompt_tokens

    check_total("hit_tokens", MAX_RESULT)
    with pytest.raises(QueryError) as e:
        check_total("hit_tokens", MAX_RESULT + 1)
    assert e.value.code == "result_too_large"
    n = np.array([32, 48], dtype=np.int64)
    assert prompt_tokens([32, 48], n).tolist() == [32, 48]
    with pytest.raises(QueryError) as e:
        prompt_tokens([32, 49], n)
    assert e.value.code == "prompt_longer_than_request"


@pytest.mark.parametrize("stored", [20, 10**6, 2**57])
def test_a_finished_revisit_below_a_stored_start_far_past_the_storable_chunks_stops_at_them(stored):
    """A finished sliding request (retention None, no replay boundary) whose stored start lies past its storable
    chunks: the revisited chunks are those in [revisit, storable), none past storable (no mask holds a block
    there). The scalar once walked [revisit, stored) chunk by chunk: 1.3e17 steps for the case the thorough profile
    drew (a hang); the batch twin caps at storable."""
    import signal

    from kvgeom import hits

    geom = kvgeom.resolve(
        {"groups": [{"kind": "full_attention", "block_size": 64},
                    {"kind": "sliding_window", "block_size": 16, "sliding_window": 33}],
         "cache": {"retention_interval": None, "prefix_match_unit": 16}, "offload": {}}
    )
    kw = dict(num_tokens=100, num_computed_tokens=100, num_prompt_tokens=64, finished=True,
              offload_prompt_only=False)
    # a hang guard with the fuzz tests' CPU bound (tests/property/test_fuzz.py: 15 s), not a speed check: the old
    # walk to the stored start never ended for 2^57, so the alarm turns a hang into a failure
    def hang(*_: object) -> None:
        raise AssertionError("plan_store walked towards the stored start (a hang)")

    old = signal.signal(signal.SIGPROF, hang)
    signal.setitimer(signal.ITIMER_PROF, 15.0)
    try:
        want = hits.plan_store(geom, stored_chunks={1: stored}, reachable=(), **kw)
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0)
        signal.signal(signal.SIGPROF, old)
    # a stored start past the 6 storable chunks revisits as a start at them: chunks 4 and 5 (the last partial
    # segment, kept under the final horizon and skipped under the prompt's), none at or past 6; the next step
    # still starts at the stored start (vLLM's next_stored_chunk_idx never moves back)
    at_six = hits.plan_store(geom, stored_chunks={1: 6}, reachable=(), **kw)
    assert [(g.chunks, g.block_entries) for g in want.groups] == [(g.chunks, g.block_entries) for g in at_six.groups]
    assert want.groups[1].chunks == (4, 5)
    assert (want.groups[1].next_stored_chunk, at_six.groups[1].next_stored_chunk) == (stored, 6)
    sp = batch.plan_stores(geom, num_tokens=[100], num_computed_tokens=[100], num_prompt_tokens=[64], finished=True,
                           offload_prompt_only=False, stored_chunks={1: [stored]}, reachable=[[-1]])
    assert sp.plan(0) == want
