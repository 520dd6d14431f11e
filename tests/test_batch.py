"""Example rows for kvgeom.batch: historical cases through the batch paths, the input checks, and a few
edge rows that the generated tests reach only rarely (each compared with the scalar reference).

Case sources are vLLM issue numbers and kvgeom's docs/ pages.
"""

from __future__ import annotations

import numpy as np
import pytest

import kvgeom
from kvgeom import batch, hits, ranks
from kvgeom._math import INT64_MAX

EX1 = kvgeom.DEFAULT_CONFIG  # #49964: FA B=16 + Mamba align B_m=16, TP=2, D=2, k=1


def geom(**over):
    return kvgeom.resolve({**EX1, **over})


# ---------------------------------------------------------------------------------------------
# DCP dealing: docs/keys-and-boundaries.md (B = 16, D = 2, row [7, 9, 11])
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize(
    "interleave, positions, ranks_, slots, lengths_37",
    [
        # example 7, I = 1: p=37 -> rank 1 slot 146, p=53 -> rank 1 slot 154; lengths for 37: 19, 18
        (1, [37, 53], [1, 1], [146, 154], [19, 18]),
        # example 7, I = 16 (block-level): p=37 -> rank 0 slot 149, p=53 -> rank 1 slot 149; lengths 21, 16
        (16, [37, 53], [0, 1], [149, 149], [21, 16]),
    ],
)
def test_example_7_dealing(interleave, positions, ranks_, slots, lengths_37):
    g = geom(parallel={"tp": 2, "dcp": 2, "cp_interleave": interleave})
    table = np.array([[7, 9, 11]])
    assert batch.placements(g, 0, positions).rank.tolist() == ranks_
    assert batch.slot_mapping(g, 0, positions, table, [0, 0]).tolist() == slots
    assert batch.rank_lengths(g, 0, [37])[0].tolist() == lengths_37


def test_slot_mapping_for_one_rank_pads_other_ranks_positions():
    # example 7, I = 1, rank 0's view: positions 36 (its own) and 37 (rank 1's) -> [slot, pad -1]
    g = geom()
    table = np.array([[7, 9, 11]])
    assert batch.slot_mapping(g, 0, [36, 37], table, [0, 0], rank=0).tolist() == [146, -1]
    assert [ranks.dcp_slot(g, 0, p, [7, 9, 11]) for p in (36, 37)] == [(0, 146), (1, 146)]


def test_replicated_group_has_rank_minus_one_and_mamba_no_slots():
    # example 7's last bullet: the Mamba group is not dealt (rank -1 = every rank) and has no slot mapping
    g = geom()
    assert batch.placements(g, 1, [37]).rank.tolist() == [-1]
    with pytest.raises(kvgeom.QueryError) as e:
        batch.slot_mapping(g, 1, [0], np.zeros((1, 1), dtype=np.int64), [0])
    assert e.value.code == "no_slot_mapping"


def test_slot_mapping_non_power_of_two_blocks_match_scalar():
    # B = 24 (not a power of two), D = 2, I = 8: the division path, not the shift path
    g = kvgeom.resolve({"groups": [{"kind": "mla", "block_size": 24}],
                        "parallel": {"tp": 2, "dcp": 2, "cp_interleave": 8}})
    table = np.array([[3, 5], [11, 2]])
    pos = np.arange(0, 96)
    req = pos % 2
    got = batch.slot_mapping(g, 0, pos, table, req)
    assert got.tolist() == [ranks.dcp_slot(g, 0, int(p), table[r].tolist())[1] for p, r in zip(pos, req, strict=True)]


@pytest.mark.parametrize(
    "kwargs, code",
    [
        # a block id whose slot passes int64: refused, never wrapped (issue 3 item 6)
        ({"block_table": [[INT64_MAX // 8]]}, "int64_overflow"),
        # a negative block id in a column the positions use
        ({"block_table": [[-3]]}, "negative"),
        # a position past the row: the scalar's row_too_short
        ({"positions": [64]}, "row_too_short"),
        # a request index past the table's rows
        ({"request_index": [1]}, "no_such_request"),
        # float positions are not token positions
        ({"positions": [1.0]}, "not_an_integer_array"),
        # a 2-D positions array
        ({"positions": [[1]]}, "bad_shape"),
        # a position past int64 (a Python int of 2**63)
        ({"positions": [INT64_MAX + 1]}, "int64_overflow"),
        # mismatched lengths
        ({"request_index": [0, 0]}, "length_mismatch"),
    ],
)
def test_slot_mapping_refuses(kwargs, code):
    g = geom()
    args = {"positions": [5], "block_table": [[1, 2]], "request_index": [0], **kwargs}
    with pytest.raises(kvgeom.QueryError) as e:
        batch.slot_mapping(g, 0, args["positions"], np.asarray(args["block_table"]), args["request_index"])
    assert e.value.code == code


@pytest.mark.parametrize(
    "where, kwargs, code",
    [
        # a position past the row in the third kernel block: the whole input's error, found in the kernel
        (2 * (1 << 15) + 3, {"positions": 64}, "row_too_short"),
        # a negative position in the second block (read as a huge unsigned value by the block check)
        ((1 << 15) + 1, {"positions": -1}, "negative"),
        # a request index past the rows in the last block
        (3 * (1 << 15) - 1, {"request_index": 5}, "no_such_request"),
    ],
)
def test_slot_mapping_bad_index_in_a_late_block_is_the_whole_input_error(where, kwargs, code):
    g = geom()
    n = 3 * (1 << 15)
    args = {"positions": np.full(n, 5, dtype=np.int64), "request_index": np.zeros(n, dtype=np.int64)}
    for name, value in kwargs.items():
        args[name][where] = value
    with pytest.raises(kvgeom.QueryError) as e:
        batch.slot_mapping(g, 0, args["positions"], np.array([[1, 2]]), args["request_index"])
    # the same problem, numbers included, that a check of the whole input before the kernel raises
    with pytest.raises(kvgeom.QueryError) as whole:
        batch.ranks._check_slot_indices(g.groups[0], args["positions"], args["request_index"], 1, 2)
    assert e.value.code == code and e.value.problems == whole.value.problems


def test_slot_mapping_into_a_buffer():
    g = geom()
    table = np.array([[7, 9, 11]])
    pos, req = np.arange(48, dtype=np.int64), np.zeros(48, dtype=np.int64)
    buf = np.full(48, -5, dtype=np.int64)
    got = batch.slot_mapping(g, 0, pos, table, req, out=buf)
    assert got is buf and buf.tolist() == batch.slot_mapping(g, 0, pos, table, req).tolist()
    # the exact path (a negative entry in an unused column) writes into the buffer too
    neg = np.array([[7, 9, -1]])
    assert batch.slot_mapping(g, 0, pos[:32], neg, req[:32], out=buf[:32]).tolist() == buf[:32].tolist()
    assert buf[:32].tolist() == batch.slot_mapping(g, 0, pos[:32], neg, req[:32]).tolist()


@pytest.mark.parametrize(
    "make",
    [
        lambda pos, req: np.empty(len(pos), dtype=np.int32),  # another dtype
        lambda pos, req: np.empty(len(pos) + 1, dtype=np.int64),  # another length
        lambda pos, req: np.empty(2 * len(pos), dtype=np.int64)[::2],  # not contiguous
        lambda pos, req: pos,  # the positions themselves: overlapping an input
        lambda pos, req: req,  # the request indices themselves: overlapping the other input
        lambda pos, req: [0] * len(pos),  # a list
    ],
)
def test_slot_mapping_refuses_a_bad_buffer(make):
    g = geom()
    pos, req = np.arange(8, dtype=np.int64), np.zeros(8, dtype=np.int64)
    with pytest.raises(kvgeom.QueryError) as e:
        batch.slot_mapping(g, 0, pos, np.array([[1]]), req, out=make(pos, req))
    assert e.value.code == "bad_out"


def test_slot_mapping_refuses_a_read_only_buffer():
    g = geom()
    buf = np.zeros(4, dtype=np.int64)
    buf.setflags(write=False)
    with pytest.raises(kvgeom.QueryError) as e:
        batch.slot_mapping(g, 0, [1, 2, 3, 4], np.array([[1]]), [0, 0, 0, 0], out=buf)
    assert e.value.code == "bad_out"


@pytest.mark.parametrize("rank", [None, 1])
def test_slot_mapping_of_no_position_is_an_empty_int64_array_or_the_buffer(rank):
    # no position: no slot; an empty int64 array, or the caller's (empty) buffer itself
    g = geom()
    empty = np.zeros(0, dtype=np.int64)
    got = batch.slot_mapping(g, 0, empty, np.array([[1]]), empty, rank=rank)
    assert isinstance(got, np.ndarray) and got.dtype == np.int64 and got.shape == (0,)
    buf = np.empty(0, dtype=np.int64)
    assert batch.slot_mapping(g, 0, [], np.array([[1]]), [], rank=rank, out=buf) is buf


@pytest.mark.parametrize(
    "block, entry, position, slot",
    [
        (16, (1 << 59) - 1, 15, INT64_MAX),  # the last slot fits
        (16, 1 << 59, 0, 1 << 63),  # one block id further: past int64
        # B = 27 divides 2**63 + 1: the largest block id whose offsets all fit is (2**63 + 1) // 27 - 2
        (27, (2**63 + 1) // 27 - 1, 25, INT64_MAX),  # its next id fits up to offset 25 ...
        (27, (2**63 + 1) // 27 - 1, 26, 1 << 63),  # ... and reaches 2**63 at offset 26
    ],
)
def test_slot_mapping_at_the_int64_edge_equals_dcp_slot(block, entry, position, slot):
    # the pre-multiplied fast path is taken only when every slot fits; the largest fitting table entry is
    # (INT64_MAX - (B - 1)) // B, exact in ints: one id more must be checked slot by slot, as dcp_slot does
    g = kvgeom.resolve({"groups": [{"kind": "mla", "block_size": block}]})
    table = np.array([[entry]], dtype=np.int64)
    assert entry * block + position == slot
    if slot <= INT64_MAX:
        assert ranks.dcp_slot(g, 0, position, [entry]) == (None, slot)
        assert batch.slot_mapping(g, 0, [position], table, [0]).tolist() == [slot]
        return
    for call in (lambda: ranks.dcp_slot(g, 0, position, [entry]),
                 lambda: batch.slot_mapping(g, 0, [position], table, [0])):
        with pytest.raises(kvgeom.QueryError) as e:
            call()
        assert e.value.code == "int64_overflow" and e.value.problems[0].values == {"slot": slot}


def test_slot_mapping_with_one_token_blocks_equals_dcp_slot():
    # B = 1 (a shift by 0 on the power-of-two path): slot = row[position]
    g = kvgeom.resolve({"groups": [{"kind": "full_attention", "block_size": 1}]})
    table = np.array([[5, 6, 7, 8], [9, 10, 11, 12]])
    pos, req = [0, 1, 2, 3, 3], [0, 0, 0, 1, 0]
    want = [ranks.dcp_slot(g, 0, p, table[r].tolist())[1] for p, r in zip(pos, req, strict=True)]
    assert want == [5, 6, 7, 12, 8]
    assert batch.slot_mapping(g, 0, pos, table, req).tolist() == want


def test_slot_overflow_names_the_first_position_past_int64():
    # B = 27: block id (2**63 + 1) // 27 - 1 fits up to offset 25; the problem holds the slot of the first
    # position past int64 (the second one here), as dcp_slot's for that position
    g = kvgeom.resolve({"groups": [{"kind": "mla", "block_size": 27}]})
    entry = (2**63 + 1) // 27 - 1
    with pytest.raises(kvgeom.QueryError) as e:
        batch.slot_mapping(g, 0, [25, 26], np.array([[entry]], dtype=np.int64), [0, 0])
    assert e.value.code == "int64_overflow" and e.value.problems[0].values == {"slot": 1 << 63}


def test_block_id_zero_on_the_checked_path_is_no_negative_entry():
    # a -1 elsewhere in the table sends slot_mapping down its checked path; block id 0 is a valid id there
    g = geom()
    table = np.array([[0, -1]])
    assert batch.slot_mapping(g, 0, [3, 31], table, [0, 0]).tolist() == [
        ranks.dcp_slot(g, 0, 3, [0, -1])[1], ranks.dcp_slot(g, 0, 31, [0, -1])[1]] == [1, 15]


def test_negative_entries_outside_the_used_columns_are_fine():
    # a -1 padded table row: the scalar checks only the entry it uses, and so does the batch
    g = geom()
    assert batch.slot_mapping(g, 0, [3], np.array([[4, -1]]), [0]).tolist() == [ranks.dcp_slot(g, 0, 3, [4, -1])[1]]


# ---------------------------------------------------------------------------------------------
# Keys and boundaries: #49964
# ---------------------------------------------------------------------------------------------

def test_example_1_keys_for_a_64_token_prefix():
    g = geom()
    # attention chunks 0, 1 -> h1, h3, entries 0 and 1; Mamba chunks 0..3 -> h0..h3 = state blocks 0..3
    assert batch.num_keys(g, 0, [64]).tolist() == [2]
    assert batch.chunk_hash_index(g, 0, [0, 1]).tolist() == [1, 3]
    assert batch.chunk_first_entry(g, 0, [0, 1]).tolist() == [0, 1]
    assert batch.chunk_hash_index(g, 1, [0, 1, 2, 3]).tolist() == [0, 1, 2, 3]
    assert batch.chunk_state_block(g, 1, [0, 1, 2, 3]).tolist() == [0, 1, 2, 3]
    # the buggy #49964 geometry would have given state block j for chunk j of C_m = 32: [0, 1] for 32, 64
    assert batch.state_block_for_boundary(g, 1, [32, 64]).tolist() == [1, 3]


@pytest.mark.parametrize(
    "fn, args, code",
    [
        # an int64-sized chunk whose end token passes int64 (C = 32)
        (batch.chunk_end_token, (0, [INT64_MAX // 32]), "int64_overflow"),
        # its hash index still fits: (j+1)*2 - 1 <= INT64_MAX
        (batch.chunk_hash_index, (0, [INT64_MAX // 2 - 1]), None),
        # a boundary off the Mamba grid
        (batch.state_block_for_boundary, (1, [40]), "not_a_state_boundary"),
        # a restore of 0 tokens reads no block
        (batch.restore_read_block, (1, [0]), "zero"),
        # an attention group has no state blocks
        (batch.restore_read_block, (0, [16]), "not_align_mamba"),
        # computed + scheduled past int64 (the scalar would return a block for it; see the module doc)
        (batch.running_state_block, (1, [INT64_MAX], [1]), "int64_overflow"),
        # a Mamba key holds a state, not block-table entries
        (batch.chunk_first_entry, (1, [0]), "not_positional"),
        # a uint64 array with a value past int64
        (batch.num_keys, (0, np.array([1 << 63], dtype=np.uint64)), "int64_overflow"),
        # bools are not token counts
        (batch.num_keys, (0, np.array([True])), "not_an_integer_array"),
    ],
)
def test_key_and_boundary_checks(fn, args, code):
    g = geom()
    if code is None:
        fn(g, *args)
        return
    with pytest.raises(kvgeom.QueryError) as e:
        fn(g, *args)
    assert e.value.code == code


def test_empty_input_gives_empty_output():
    g = geom()
    assert batch.num_keys(g, 0, []).shape == (0,)
    assert batch.rank_lengths(g, 0, np.zeros(0, dtype=np.int64)).shape == (0, 2)
    assert len(batch.lookup_hits(g, [], stored={})) == 0
    assert len(batch.plan_stores(g, num_tokens=[], num_computed_tokens=[])) == 0


# ---------------------------------------------------------------------------------------------
# Store plans
# ---------------------------------------------------------------------------------------------

def test_example_3_store_plan_batch():
    # #49962 (dense retention): 64 computed tokens -> attention 2 chunks, Mamba 4 states
    g = geom(cache={"retention_interval": None})
    # prefilled 16 tokens a step (vLLM run: a Mamba state stored at every block boundary)
    sp = batch.plan_stores(g, num_tokens=[64], num_computed_tokens=[64], chunk_ends=[[16, 32, 48, 64]])
    assert sp.groups[0].chunk.tolist() == [0, 1]
    assert sp.groups[1].block.tolist() == [0, 1, 2, 3]
    assert sp.plan(0) == hits.plan_store(g, num_tokens=64, num_computed_tokens=64, chunk_ends=(16, 32, 48, 64))


@pytest.mark.parametrize(
    "config, n, reachable",
    [
        # sliding window alone, R = 2*span: the segment ends at 32, 64 keep the one block before each
        # (tail = cdiv(sw-1, 16) = 1) and the replay boundary 63 keeps block 2: chunks 1, 2, 3, not 0
        ({"groups": [{"kind": "sliding_window", "block_size": 16, "sliding_window": 10}],
          "cache": {"retention_interval": 32}, "offload": {}}, 64, None),
        # Mamba align, R = 32, k = 1 (#49964's mask at alignment 32): states after 32 and 64 only
        ({**EX1, "cache": {"retention_interval": 32}}, 64, None),
        # non-align retention 0 with an explicit junction list, two requests of different length
        ({**EX1, "cache": {"retention_interval": 0}}, 96, [[40, -1], [-1, -1]]),
        # blocks_per_chunk = 3 with sliding window under R: a chunk survives if any of its blocks is kept
        ({"groups": [{"kind": "full_attention", "block_size": 16},
                     {"kind": "sliding_window", "block_size": 16, "sliding_window": 40}],
          "cache": {"retention_interval": 96}, "offload": {"blocks_per_chunk": 3}}, 300, None),
    ],
)
def test_store_masks_agree_with_scalar(config, n, reachable):
    g = kvgeom.resolve(config)
    counts = np.array([n, n // 2 + 7])
    sp = batch.plan_stores(g, num_tokens=counts, num_computed_tokens=counts,
                           reachable=None if reachable is None else np.array(reachable))
    for i, x in enumerate(counts.tolist()):
        pts = None if reachable is None else tuple(t for t in reachable[i] if t >= 0)
        assert sp.plan(i) == hits.plan_store(g, num_tokens=x, num_computed_tokens=x, reachable=pts)


def test_sliding_mask_row_keeps_the_tail_before_each_segment_end():
    g = kvgeom.resolve({"groups": [{"kind": "sliding_window", "block_size": 16, "sliding_window": 10}],
                        "cache": {"retention_interval": 32}, "offload": {}})
    sp = batch.plan_stores(g, num_tokens=[64], num_computed_tokens=[64])
    assert sp.groups[0].chunk.tolist() == [1, 2, 3]


def test_finished_request_stops_at_prompt_or_one_before_the_end():
    # _build_store_jobs: a finished request stops at max(num_prompt, num_tokens - 1); an empty one offloads nothing
    g = geom(cache={"retention_interval": None})
    sp = batch.plan_stores(g, num_tokens=[0, 65], num_computed_tokens=[0, 65], num_prompt_tokens=[0, 10],
                           offload_prompt_only=False, finished=True)
    assert sp.offloadable_tokens.tolist() == [0, 64]
    for i, (n, p) in enumerate([(0, 0), (65, 10)]):
        assert sp.plan(i) == hits.plan_store(g, num_tokens=n, num_computed_tokens=n, num_prompt_tokens=p,
                                             offload_prompt_only=False, finished=True)


# ---------------------------------------------------------------------------------------------
# Hits and loads
# ---------------------------------------------------------------------------------------------

def test_example_3_hit_and_load():
    # #49962, 0.33 shape: 65-token request, the tier holds the 64-token prefix -> hit 64;
    # attention loads entries 0, 1; Mamba loads the one key ending at 64 into block 3
    g = geom()
    held = np.ones((1, 4), dtype=bool)
    h = batch.lookup_hits(g, [65], stored={0: held, 1: held})
    lp = batch.plan_loads(g, h)
    assert h.end_token.tolist() == [64]
    assert (lp.groups[0].first_entry.tolist(), lp.groups[0].stop_entry.tolist()) == ([0], [2])
    assert lp.groups[1].state_block.tolist() == [3]
    assert lp.plan(0) == hits.plan_load(g, hits.lookup_hit(g, 65, stored={0: [32, 64], 1: [16, 32, 48, 64]}))


@pytest.mark.parametrize(
    "n, attention, mamba, end",
    [
        # #44599: a 64-token prompt never restores the state at 64: M = rdown(63, 16) = 48
        (64, [32, 64], [16, 32, 48, 64], 48),
        # a miss at the Mamba boundary 48 falls back to the key at 32 (right-to-left scan)
        (64, [32, 64], [16, 32, 64], 32),
        # attention holds only chunk 0: the prefix stops at 32
        (200, [32], [16, 32, 48, 64], 32),
        # nothing of the attention group: less than one chunk -> no hit
        (64, [], [16, 32, 48], 0),
    ],
)
def test_hit_rows(n, attention, mamba, end):
    g = geom()
    H = g.hash_block_size
    width = 16

    def matrix(ends):
        m = np.zeros((1, width), dtype=bool)
        m[0, [e // H - 1 for e in ends]] = True
        return m

    h = batch.lookup_hits(g, [n], stored={0: matrix(attention), 1: matrix(mamba)})
    assert h.end_token.tolist() == [end]
    assert h.hit(0) == hits.lookup_hit(g, n, stored={0: attention, 1: mamba})


def test_partial_tail_row():
    # partial tails (vLLM 0.33 _lookup): one span 64, H = 16, D = 1, k = 1; complete hit 64, every group holds
    # the boundary key 112 -> hit 112 with the boundary key loaded last
    g = kvgeom.resolve({"groups": [{"kind": "full_attention", "block_size": 64},
                                   {"kind": "mamba", "block_size": 64, "mamba_cache_mode": "align"}],
                        "cache": {"prefix_match_unit": 16}, "offload": {}})
    held = np.zeros((1, 12), dtype=bool)
    held[0, [3, 6]] = True  # keys ending at 64 and 112
    stored = {0: held, 1: held}
    h = batch.lookup_hits(g, [150], stored=stored)
    assert (h.end_token.tolist(), h.partial_tail.tolist()) == ([112], [True])
    scalar = hits.lookup_hit(g, 150, stored={0: [64, 112], 1: [64, 112]})
    assert h.hit(0) == scalar
    assert batch.plan_loads(g, h).plan(0) == hits.plan_load(g, scalar)


def test_int64_sized_counts_near_the_end():
    # int64-sized request with a local prefix near its end: no overflow in min(M, c + max_num_new_tokens)
    g = geom()
    n = INT64_MAX - 5
    h = batch.lookup_hits(g, [n], stored={}, local_computed_tokens=[n - 100], max_num_new_tokens=INT64_MAX)
    assert h.hit(0) == hits.lookup_hit(g, n, stored={}, local_computed_tokens=n - 100, max_num_new_tokens=INT64_MAX)


@pytest.mark.parametrize(
    "kwargs, code",
    [
        # prompt longer than the request
        ({"num_prompt_tokens": [70]}, "prompt_longer_than_request"),
        # local prefix past the request
        ({"local_computed_tokens": [70]}, "local_past_request"),
        # stored matrix of the wrong row count
        ({"stored": {0: np.ones((2, 4), dtype=bool)}}, "bad_stored"),
        # stored matrix of ints instead of bools
        ({"stored": {0: np.ones((1, 4), dtype=np.int64)}}, "bad_stored"),
        # a group that is not offloaded
        ({"stored": {5: np.ones((1, 4), dtype=bool)}}, "group_not_offloaded"),
        # negative max_load_tokens
        ({"max_load_tokens": -1}, "negative"),
    ],
)
def test_lookup_hits_refuses(kwargs, code):
    g = geom()
    args = {"stored": {}, **kwargs}
    with pytest.raises(kvgeom.QueryError) as e:
        batch.lookup_hits(g, [64], **args)
    assert e.value.code == code


@pytest.mark.parametrize(
    "block, dcp, interleave, rank",
    [
        # powers of two, token round robin, the owner's slots (the shift kernel)
        (16, 2, 1, None),
        # ... and rank 1's view with pads (the owner is p mod D)
        (16, 2, 1, 1),
        # powers of two with I = 2 (neither token nor block dealing), the owner's slots and rank 1's view
        (16, 2, 2, None),
        (16, 2, 2, 1),
        # block-level dealing (I = B), rank 1's view with pads
        (16, 8, 16, 1),
        # general interleave I = 4 under D = 4, rank 3's view
        (16, 4, 4, 3),
        # B = 24: the division kernel, rank 0's view
        (24, 2, 8, 0),
        # replicated group (D = 1): column p // B, every rank holds every slot
        (48, 1, 1, 0),
    ],
)
def test_slot_mapping_blocked_kernel_spans_several_blocks(block, dcp, interleave, rank):
    # more positions than one kernel block (2**15), shuffled, against the exact path and the scalar
    g = kvgeom.resolve({"groups": [{"kind": "mla", "block_size": block}],
                        "parallel": {"tp": dcp, "dcp": dcp, "cp_interleave": interleave}})
    rng = np.random.default_rng(block * 100 + dcp)
    rows, width = 7, 300
    table = rng.integers(0, 1 << 40, size=(rows, width))
    n = (1 << 16) + 5
    req = rng.integers(0, rows, size=n)
    pos = rng.integers(0, width * g.groups[0].span, size=n)
    got = batch.slot_mapping(g, 0, pos, table, req, rank=rank)
    assert got.tolist() == batch.ranks._slots_checked(g, g.groups[0], pos, req, table, rank).tolist()
    for i in range(0, n, 97):
        owner, slot = ranks.dcp_slot(g, 0, int(pos[i]), table[req[i]].tolist())
        assert got[i] == (slot if rank is None or owner is None or owner == rank else -1)


def test_sliding_scan_falls_back_to_the_run_below_a_miss():
    # windowed scan: sliding window 33 tokens -> a run needs the window in chunks,
    # max(cdiv(33, 16), cdiv(32, 16)) = 3 (vLLM 0.33 load_window_size_in_chunks; kvgeom conform found the
    # old answer 144, from 2 chunks, disagreeing with vLLM). M = 161 - 1 = 160; chunk 9 (tokens 144..160) is
    # missing; the run below it (chunks 8, 7) is too short because chunk 6 is missing; chunks 0..5 serve: 96
    g = kvgeom.resolve({"groups": [{"kind": "full_attention", "block_size": 16},
                                   {"kind": "sliding_window", "block_size": 16, "sliding_window": 33}],
                        "offload": {}})
    full = np.ones((1, 12), dtype=bool)
    sliding = np.zeros((1, 12), dtype=bool)
    sliding[0, [0, 1, 2, 3, 4, 5, 7, 8]] = True
    h = batch.lookup_hits(g, [161], stored={0: full, 1: sliding})
    assert h.end_token.tolist() == [96]
    scalar = hits.lookup_hit(g, 161, stored={0: [16 * (j + 1) for j in range(12)],
                                             1: [16 * (j + 1) for j in (0, 1, 2, 3, 4, 5, 7, 8)]})
    assert h.hit(0) == scalar
    assert batch.plan_loads(g, h).plan(0) == hits.plan_load(g, scalar)


def test_positional_mamba_retention_keeps_one_state_per_interval():
    # legacy "all" mode (positional Mamba blocks), R = 64: blocks 3 and 7 by retention, block 6 by the
    # replay boundary 127 (rdown(127, 16) = 112 -> block 6): chunks 3, 6, 7 of a 128-token prefix
    g = kvgeom.resolve({"groups": [{"kind": "full_attention", "block_size": 16},
                                   {"kind": "mamba", "block_size": 16, "mamba_cache_mode": "all"}],
                        "cache": {"retention_interval": 64}, "offload": {}})
    sp = batch.plan_stores(g, num_tokens=[128, 70], num_computed_tokens=[128, 70])
    assert sp.plan(0).groups[1].chunks == (3, 6, 7)
    for i, n in enumerate((128, 70)):
        assert sp.plan(i) == hits.plan_store(g, num_tokens=n, num_computed_tokens=n)


@pytest.mark.parametrize(
    "n",
    [
        # a request far past the stored matrix: the scan jumps over the unheld chunks, then finds chunk 4
        # (the key ending at 80) held below the last column; chunk 3 is missing and must not be skipped to
        1000,
        # int64-sized: the scalar would walk ~5.8e17 chunks one by one; the batch answers the same way
        INT64_MAX,
    ],
)
def test_scan_jumps_over_chunks_past_the_stored_matrix(n):
    g = kvgeom.resolve({"groups": [{"kind": "mamba", "block_size": 16, "mamba_cache_mode": "align"}], "offload": {}})
    held = np.array([[True, True, True, False, True]])  # keys ending at 16, 32, 48, 80
    h = batch.lookup_hits(g, [n], stored={0: held})
    assert h.end_token.tolist() == [80]
    if n < 10_000:
        assert h.hit(0) == hits.lookup_hit(g, n, stored={0: [16, 32, 48, 80]})


def test_results_too_large_to_build_are_refused():
    # an int64-sized prefix has ~2**59 keys: refused with a QueryError instead of a MemoryError
    g = geom()
    with pytest.raises(kvgeom.QueryError) as e:
        batch.key_maps(g, [INT64_MAX])
    assert e.value.code == "result_too_large"
    with pytest.raises(kvgeom.QueryError) as e:
        batch.plan_stores(g, num_tokens=[INT64_MAX], num_computed_tokens=[INT64_MAX],
                          offload_prompt_only=False, reachable=np.zeros((1, 0), dtype=np.int64))
    assert e.value.code == "result_too_large"
