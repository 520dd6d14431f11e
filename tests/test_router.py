"""Router scoring (kvgeom.router): example tables.

The expected hits of TABLE are vLLM 0.33's answers: each row's held sets were fed to
``HybridKVCacheCoordinator.find_longest_cache_hit`` (``v1/core/kv_cache_coordinator.py``, the real
managers' ``find_longest_cache_hit`` over a block pool holding exactly those hashes) in the vLLM
0.33 CPU install, and the number it returned is written here. Held sets are hash indices of the
request's chain at H (index i = the entry ending at token ``(i+1)*H``).
"""

from __future__ import annotations

import numpy as np
import pytest

import kvgeom
from kvgeom.events import KVEventReader
from kvgeom.router import chain_matrix, lookup_groups, replica_hits, score_replicas

FA16 = {"kind": "full_attention", "block_size": 16}

TABLE = [
    # vLLM #46453's shape: Mamba m0 -- -- m3, attention f0 f1 -- --: the common hit is the Mamba state at 16.
    ({"groups": [FA16, {"kind": "mamba", "block_size": 16}]}, 65, {0: [0, 1], 1: [0, 3]}, 16),
    # The default geometry (DCP 2, attention span 32, partial hits on): attention to 64, Mamba state at 48.
    ({"groups": [FA16, {"kind": "mamba", "block_size": 16}], "parallel": {"tp": 2, "dcp": 2}}, 65,
     {0: [1, 3], 1: [0, 1, 2]}, 48),
    # Partial hash hits (Mamba block 64 > H = 16): the last held Mamba state on the H grid, 128.
    ({"groups": [FA16, {"kind": "mamba", "block_size": 64}]}, 200, {0: list(range(12)), 1: [4, 7]}, 128),
    # Attention span 64 with a hole after block 1: phase 2 finds the partial entry at 160 inside block 2.
    ({"groups": [{"kind": "full_attention", "block_size": 64}, {"kind": "mamba", "block_size": 128}],
      "cache": {"prefix_match_unit": 16}}, 300, {0: [3, 7, 9], 1: [2, 9, 12]}, 160),
    # Sliding window 33 over blocks of 16 needs 2 held blocks before the hit: blocks 5, 6 give 112.
    ({"groups": [FA16, {"kind": "sliding_window", "block_size": 16, "sliding_window": 33}]}, 161,
     {0: list(range(10)), 1: [0, 1, 2, 5, 6, 8]}, 112),
    # Sliding window alone (window 48 needs 3 blocks): the run 0..3 ends at 64.
    ({"groups": [{"kind": "sliding_window", "block_size": 16, "sliding_window": 48}]}, 100, {0: [0, 1, 2, 3]}, 64),
    # Window 100 needs 7 blocks; no run is that long, so the run reaching token 0 counts: 48.
    ({"groups": [FA16, {"kind": "sliding_window", "block_size": 16, "sliding_window": 100}]}, 161,
     {0: list(range(10)), 1: [0, 1, 2, 4, 5, 6, 8, 9]}, 48),
    # Chunked local (chunk 64): blocks before the current chunk count as computed, block 8 is held: 144.
    ({"groups": [FA16, {"kind": "chunked_local", "block_size": 16, "attention_chunk_size": 64}]}, 161,
     {0: list(range(10)), 1: [8]}, 144),
    # A Mamba hole below the attention hit: the only Mamba state is at 32.
    ({"groups": [FA16, {"kind": "mamba", "block_size": 16}]}, 65, {0: [0, 1, 2, 3], 1: [1]}, 32),
    # Everything held, 64 tokens: never the last token, so the Mamba state at 48.
    ({"groups": [FA16, {"kind": "mamba", "block_size": 16}]}, 64, {0: [0, 1, 2, 3], 1: [0, 1, 2, 3]}, 48),
    # Two equal attention specs are looked up together: the joint run stops at block 3, Mamba state at 32.
    ({"groups": [FA16, FA16, {"kind": "mamba", "block_size": 32}]}, 200,
     {0: list(range(6)), 1: [0, 1, 2, 5], 2: [1, 3, 5]}, 32),
    # Three groups (attention, window 20, Mamba 32): the convergence loop settles at 160.
    ({"groups": [FA16, {"kind": "sliding_window", "block_size": 16, "sliding_window": 20},
                 {"kind": "mamba", "block_size": 32}]}, 200,
     {0: list(range(12)), 1: [2, 3, 5, 6, 8, 9, 10], 2: [3, 5, 7, 9]}, 160),
]


def _held(geom, n, held, replicas=1):
    n_h = n // geom.hash_block_size
    out = {}
    for g in geom.groups:
        m = np.zeros((n_h, replicas), dtype=bool)
        m[held.get(g.index, []), :] = True
        out[g.index] = m
    return out


@pytest.mark.parametrize(("cfg", "n", "held", "expected"), TABLE)
def test_prefix_hits_match_vllm_coordinator(cfg, n, held, expected):
    geom = kvgeom.resolve(cfg)
    assert replica_hits(geom, _held(geom, n, held, replicas=3), n).tolist() == [expected] * 3


@pytest.mark.parametrize("matrix_path", [None, True])
@pytest.mark.parametrize(("cfg", "n", "held", "expected"), TABLE)
def test_score_replicas_reads_the_same_hits_from_a_residency(cfg, n, held, expected, matrix_path):
    # matrix_path None: the bit-parallel kernels wherever the geometry allows them (FA + Mamba rows)
    geom = kvgeom.resolve(cfg)
    chain = [f"h{i}" for i in range(n // geom.hash_block_size)]
    res = kvgeom.Residency()
    for g, idx in held.items():
        for i in idx:
            res.add(g, chain[i], holder=1)  # replica 1 holds the row's sets, replica 0 nothing
    scores = score_replicas(geom, res, [chain], n, num_replicas=2, matrix_path=matrix_path)
    assert scores.tier("GPU").tolist() == [[0, expected]]
    assert scores.best("GPU").tolist() == [1]


def test_lookup_groups_merge_equal_specs_and_put_full_attention_first():
    geom = kvgeom.resolve({"groups": [{"kind": "mamba", "block_size": 32}, FA16, FA16]})
    # vLLM sorts the full-attention spec group first and looks groups 1 and 2 up together
    assert [(lg.family, lg.group_ids) for lg in lookup_groups(geom)] == [("full", (1, 2)), ("mamba", (0,))]


def test_chain_matrix_unpacks_holder_bits_per_hash():
    res = kvgeom.Residency()
    res.add(0, b"a", holder=9)
    res.add(0, b"b", holder=0)
    m = chain_matrix(res, 0, [b"a", b"b", b"zz"], 10)
    assert m.shape == (3, 10) and m.dtype == bool
    assert np.argwhere(m).tolist() == [[0, 9], [1, 0]]  # replica 9 holds a; replica 0 holds b; nobody holds zz


def test_chain_matrix_refuses_a_replica_past_num_replicas():
    res = kvgeom.Residency()
    res.add(0, "a", holder=12)
    with pytest.raises(kvgeom.QueryError) as e:
        chain_matrix(res, 0, ["a"], 4)
    assert e.value.code == "replica_out_of_range" and e.value.values["replica"] == 12


def test_score_replicas_refuses_a_chain_at_the_wrong_unit():
    # A chain hashed every 32 tokens read at H = 16 would key every entry at half its end token.
    geom = kvgeom.resolve(kvgeom.DEFAULT_CONFIG)
    with pytest.raises(kvgeom.QueryError) as e:
        score_replicas(geom, kvgeom.Residency(), [["a", "b"]], 64, num_replicas=1)
    assert e.value.code == "chain_length_mismatch" and e.value.field == "chains[0]"
    assert "H=16" in str(e.value)


def test_score_replicas_tiers_alone_and_cumulative():
    geom = kvgeom.resolve({"groups": [FA16]})
    gpu, cpu = kvgeom.Residency(), kvgeom.Residency()
    chain = ["a", "b", "c"]
    gpu.add(0, "a", holder=0)
    cpu.add(0, "b", holder=0)  # alone, CPU's "b" is unusable (no "a" before it)
    cpu.add(0, "a", holder=1)
    alone = score_replicas(geom, {"GPU": gpu, "CPU": cpu}, [chain], 49, num_replicas=2)
    both = score_replicas(geom, {"GPU": gpu, "CPU": cpu}, [chain], 49, num_replicas=2, cumulative=True)
    assert alone.tier("GPU").tolist() == [[16, 0]] and alone.tier("CPU").tolist() == [[0, 16]]
    assert both.tier("GPU").tolist() == [[16, 0]] and both.tier("CPU").tolist() == [[32, 16]]


def test_score_replicas_several_requests_and_counts():
    geom = kvgeom.resolve({"groups": [FA16]})
    res = kvgeom.Residency()
    for h in ["a", "b"]:
        res.add(0, h, holder=0)
    s = score_replicas(geom, res, [["a", "b"], ["x"], []], [40, 20, 5], num_replicas=1)
    assert s.hit_tokens.shape == (3, 1, 1)
    # request 0: both blocks held (32 <= 39); request 1: nothing held; request 2: shorter than one block
    assert s.hit_tokens[:, 0, 0].tolist() == [32, 0, 0]


def test_prefix_caching_off_scores_zero():
    geom = kvgeom.resolve({"groups": [FA16], "cache": {"prefix_caching": False}})
    res = kvgeom.Residency()
    res.add(0, "a")
    assert score_replicas(geom, res, [["a", "b"]], 40, num_replicas=1).hit_tokens.tolist() == [[[0]]]


def test_prefix_hits_refuses_missing_group_matrices():
    geom = kvgeom.resolve(kvgeom.DEFAULT_CONFIG)
    with pytest.raises(kvgeom.QueryError) as e:
        replica_hits(geom, {0: np.zeros((4, 2), dtype=bool)}, 65)
    assert e.value.code == "bad_held_matrices" and e.value.values["missing"] == [1]


def test_prefix_hits_with_no_replicas_is_empty():
    geom = kvgeom.resolve(kvgeom.DEFAULT_CONFIG)
    held = {0: np.zeros((4, 0), dtype=bool), 1: np.zeros((4, 0), dtype=bool)}
    assert replica_hits(geom, held, 65).shape == (0,)


def test_unknown_tier_is_an_error():
    geom = kvgeom.resolve({"groups": [FA16]})
    with pytest.raises(kvgeom.QueryError) as e:
        score_replicas(geom, {"GPU": kvgeom.Residency()}, [["a"]], 20, num_replicas=1, tiers=["CPU"])
    assert e.value.code == "unknown_tier"


def test_speculative_drop_scores_come_from_the_scalar_reference():
    # Attention 16 (drafter, drops one block) + Mamba 16: the kernels do not model the drop, so every
    # replica's score is the scalar prefix_hit's (which vLLM's coordinator agrees with, tests/test_prefix.py).
    import dataclasses

    from kvgeom.geometry import SpeculativeGeometry
    from kvgeom.prefix import prefix_hit

    base = kvgeom.resolve({"groups": [FA16, {"kind": "mamba", "block_size": 16}]})
    groups = (dataclasses.replace(base.groups[0], eagle_group=True, proof_margin=16), base.groups[1])
    geom = dataclasses.replace(base, groups=groups, speculative=SpeculativeGeometry("eagle", 1, True, False, True, 1))
    chain = [f"h{i}" for i in range(5)]
    res = kvgeom.Residency()
    for i in range(5):
        res.add(0, chain[i], holder=0)
        res.add(1, chain[i], holder=0)
    for i in (0, 1, 2):
        res.add(0, chain[i], holder=1)
    res.add(1, chain[1], holder=1)
    got = score_replicas(geom, res, [chain], 81, num_replicas=2).tier("GPU")[0].tolist()
    want = [prefix_hit(geom, 81, res.probe(geom, chain, holder=r)).hit_tokens for r in range(2)]
    assert got == want
    plain = score_replicas(base, res, [chain], 81, num_replicas=2).tier("GPU")[0].tolist()
    assert got[0] < plain[0]  # the drop costs replica 0 its last proven block


def test_forcing_the_bit_path_on_a_sliding_window_geometry_is_refused():
    geom = kvgeom.resolve({"groups": [FA16, {"kind": "sliding_window", "block_size": 16, "sliding_window": 32}]})
    with pytest.raises(kvgeom.QueryError) as e:
        score_replicas(geom, kvgeom.Residency(), [["a"]], 20, num_replicas=1, matrix_path=False)
    assert e.value.code == "bit_path_unsupported"


def test_a_chain_in_another_encoding_than_the_events_is_refused():
    from kvgeom.events import KVEventReader

    geom = kvgeom.resolve({"groups": [FA16]})
    reader = KVEventReader(geom)
    reader.apply({"type": "BlockStored", "block_hashes": ["YWI="], "parent_block_hash": None, "token_ids": [],
                  "block_size": 16, "lora_id": None, "medium": "GPU"})  # JSON: base64 strings
    with pytest.raises(kvgeom.QueryError) as e:  # the router hashed to raw bytes: nothing would ever match
        score_replicas(geom, reader, [[b"ab"]], 20, num_replicas=1)
    assert e.value.code == "chain_encoding_mismatch" and e.value.field == "chains[0]"
    assert score_replicas(geom, reader, [["YWI="]], 20, num_replicas=1).tier("GPU").tolist() == [[16]]


# -- the packed path (a KVEventReader, one attention lookup group) ------------------------------------------
def _reader_with_runs(runs: list[int], cfg=None):
    """A reader where replica r holds the first runs[r] blocks of a chain of max(runs) + 4 blocks."""
    geom = kvgeom.resolve(cfg or {"groups": [FA16]})
    S = geom.groups[0].span
    H = geom.hash_block_size
    n_h = (max(runs) + 4) * (S // H)
    chain = list(range(1, n_h + 1))
    reader = kvgeom.events.KVEventReader(geom)
    reader.packed()  # kept current event by event from here on
    for r, k in enumerate(runs):
        if k:
            reader.apply({"type": "BlockStored", "block_hashes": chain[S // H - 1 : k * (S // H) : S // H],
                          "block_size": S}, r)
    return geom, reader, chain


def test_packed_path_counts_past_255_distinct_runs():
    # 300 distinct runs: the byte counters of the column count are summed in slices of 255 rows
    runs = [*range(300), 299, 5, 0]
    geom, reader, chain = _reader_with_runs(runs)
    n = len(chain) * 16 + 1
    packed = score_replicas(geom, reader, [chain], n, num_replicas=len(runs), tiers=["GPU"]).hit_tokens[0, 0]
    bits = score_replicas(geom, reader.residency(), [chain], n, num_replicas=len(runs)).hit_tokens[0, 0]
    assert packed.tolist() == bits.tolist() == [16 * k for k in runs]


def test_packed_path_under_dcp_reads_blocks_of_the_span():
    # attention under DCP 2 without partial hits: span 32, the chain hashed every 32 tokens (H = 32)
    geom, reader, chain = _reader_with_runs([3, 0, 1], {"groups": [FA16], "parallel": {"tp": 2, "dcp": 2}})
    assert geom.groups[0].span == 32
    n = len(chain) * geom.hash_block_size + 1
    assert score_replicas(geom, reader, [chain], n, num_replicas=3, tiers=["GPU"]).hit_tokens[0, 0].tolist() == \
        [96, 0, 32]


def test_packed_path_refuses_a_replica_past_num_replicas():
    geom, reader, chain = _reader_with_runs([1, 0, 2])
    with pytest.raises(kvgeom.QueryError) as e:
        score_replicas(geom, reader, [chain], len(chain) * 16 + 1, num_replicas=2)
    assert e.value.code == "replica_out_of_range" and "replica 2" in str(e.value)


def test_packed_rows_follow_removals_and_clears():
    geom, reader, chain = _reader_with_runs([4, 4])
    reader.apply({"type": "BlockRemoved", "block_hashes": [chain[1]]}, 0)  # replica 0 loses block 1: run 1
    reader.apply({"type": "AllBlocksCleared"}, 1)  # replica 1 loses everything
    n = len(chain) * 16 + 1
    assert score_replicas(geom, reader, [chain], n, num_replicas=2, tiers=["GPU"]).hit_tokens[0, 0].tolist() == \
        [16, 0]
    assert len(reader.packed()) == len(reader.residency())  # rows no replica holds were given back


def test_per_geometry_setup_is_cached_by_identity_and_refusals_are_not():
    # score_replicas works out the lookup groups once per geometry object (kvgeom.router._SETUPS, keyed by id with
    # an `is` check): a stale entry left under a reused id must not answer for another geometry, and a geometry
    # vLLM cannot look up is refused on every call, never cached as scoreable.
    from kvgeom import router

    fa = kvgeom.resolve({"groups": [FA16]})
    hybrid = kvgeom.resolve(kvgeom.DEFAULT_CONFIG)
    res = kvgeom.Residency()
    for h in ["a", "b", "c", "d"]:
        res.add(0, h, holder=0)
    res.add(1, "b", holder=0)
    first = score_replicas(hybrid, res, [["a", "b", "c", "d"]], 65, num_replicas=1).hit_tokens.tolist()
    router._SETUPS[id(hybrid)] = (fa, router._setup(fa))  # as if fa had died and hybrid reused its id
    assert score_replicas(hybrid, res, [["a", "b", "c", "d"]], 65, num_replicas=1).hit_tokens.tolist() == first
    assert first == [[[32]]]  # Mamba state at 32 (hash "b"); attention alone would give 64
    assert score_replicas(fa, res, [["a", "b", "c", "d"]], 65, num_replicas=1).hit_tokens.tolist() == [[[64]]]
    cross = kvgeom.resolve({"groups": [{"kind": "cross_attention", "block_size": 16}]})
    for _ in range(2):
        with pytest.raises(kvgeom.QueryError):
            score_replicas(cross, kvgeom.Residency(), [[]], 0, num_replicas=1)
    assert id(cross) not in router._SETUPS or router._SETUPS[id(cross)][0] is not cross


@pytest.mark.parametrize(
    ("where", "bad", "code", "field"),
    [
        # the first block: its type is not the events' (int), refused before any read
        (0, [1], "chain_encoding_mismatch", "chains[0]"),
        # inside the held run: compared with the next held hash, not equal, then looked up: unhashable
        (2, [3], "bad_block_hash", "chain"),
        # past the run (blocks 0-3 held): never read by the run, still checked
        (7, [8], "bad_block_hash", "chain"),
        # an == that is not a bool (a numpy array of two elements)
        (2, np.array([3, 3]), "bad_block_hash", "chain"),
    ],
)
def test_packed_path_refuses_an_unhashable_block_anywhere_in_the_chain(where, bad, code, field):
    # the packed path reads the chain by runs of rows (PackedHolders.leading_rows) and stops at the first block no
    # replica holds; a malformed block past that point is still refused, as a dict read per block refused it
    geom, reader, chain = _reader_with_runs([4, 2])
    chain = [*chain]
    chain[where] = bad
    with pytest.raises(kvgeom.QueryError) as e:
        score_replicas(geom, reader, [chain], len(chain) * 16 + 1, num_replicas=2, tiers=["GPU"])
    assert e.value.code == code and e.value.field == field


def test_packed_path_reads_a_chain_whose_blocks_sit_in_many_runs_of_rows():
    # the blocks of one chain stored by events in a shuffled order and with rows given back and reused, so the
    # chain's rows are many short runs; the scores are the residency's (the bit path's) all the same
    geom = kvgeom.resolve({"groups": [FA16]})
    reader = kvgeom.events.KVEventReader(geom)
    reader.packed()
    chain = list(range(100, 160))
    rng = np.random.default_rng(7)
    for r in range(5):
        for lo in rng.permutation(np.arange(0, 60, 6)).tolist():
            reader.apply({"type": "BlockStored", "block_hashes": chain[lo : lo + 6], "block_size": 16}, r)
        gone = rng.choice(60, size=3 * r, replace=False).tolist()
        if gone:
            reader.apply({"type": "BlockRemoved", "block_hashes": [chain[i] for i in gone]}, r)
        reader.apply({"type": "BlockStored", "block_hashes": [10**6 + r, 10**6 + r + 1], "block_size": 16}, r)
    for r in range(5):  # block 30 leaves every replica: its row is given back, then reused by another hash
        reader.apply({"type": "BlockRemoved", "block_hashes": [chain[30]]}, r)
    assert len(reader.packed()) == 6 + 59  # 10**6 .. 10**6 + 5 and the chain less block 30 (a sweep)
    reader.apply({"type": "BlockStored", "block_hashes": [-1], "block_size": 16}, 0)
    reader.apply({"type": "BlockStored", "block_hashes": [chain[30]], "block_size": 16}, 1)  # a new row
    n = len(chain) * 16 + 1
    packed = score_replicas(geom, reader, [chain], n, num_replicas=5, tiers=["GPU"]).hit_tokens[0, 0]
    bits = score_replicas(geom, reader.residency(), [chain], n, num_replicas=5).hit_tokens[0, 0]
    assert packed.tolist() == bits.tolist()
    assert packed[0] == 30 * 16 and packed.min() < packed.max()  # replica 0 holds blocks 0-29, not 30


@pytest.mark.parametrize(
    "cfg",
    [
        {"groups": [FA16], "speculative": {"method": "eagle", "num_speculative_tokens": 2}},
        {"groups": [FA16, {"kind": "mamba", "block_size": 16}], "speculative": {"method": "mtp",
                                                                              "num_speculative_tokens": 1}},
    ],
)
@pytest.mark.parametrize("via_reader", [False, True])
def test_a_chain_hashed_with_lookahead_is_read_like_the_full_one(cfg, via_reader):
    # under lookahead hashes (EAGLE/MTP without a connector: P = 1) vLLM hashes a block once P tokens past it
    # exist, so a 96-token request has (96 - 1) // 16 = 5 hashes, not 96 // 16 = 6: both lengths are accepted and
    # score the same (the sixth block ends at token 96, past the last token a hit may cover); the scalar
    # prefix_hit agrees
    geom = kvgeom.resolve(cfg)
    assert geom.hash_lookahead_tokens == 1
    n, scores = 96, []
    for m in (5, 6):
        chain = list(range(m))
        res, reader = kvgeom.Residency(), KVEventReader(geom)
        for g in geom.groups:
            res.add_hashes(g.index, chain, 0)
            reader.apply({"type": "BlockStored", "block_hashes": chain, "block_size": g.span, "group_idx": g.index}, 0)
        source = reader if via_reader else res
        scores.append(score_replicas(geom, source, [chain], n, num_replicas=1, tiers=["GPU"]).hit_tokens.tolist())
        assert kvgeom.prefix.prefix_hit(geom, n, res.probe(geom, chain, holder=0)).hit_tokens == 80
    assert scores == [[[[80]]], [[[80]]]]
    with pytest.raises(kvgeom.QueryError) as e:  # any other length is still refused, naming both counts
        score_replicas(geom, source, [list(range(4))], n, num_replicas=1, tiers=["GPU"])
    assert e.value.code == "chain_length_mismatch" and "6 (or 5, hashed P=1 tokens ahead)" in str(e.value)


@pytest.mark.parametrize("groups", [[FA16], [FA16, {"kind": "mamba", "block_size": 16}]])
@pytest.mark.parametrize("via_reader", [False, True])
def test_multi_module_mtp_scores_no_block_vllm_has_not_hashed(groups, via_reader):
    # MTP with 3 modules: P = 3, so vLLM hashes a block once 3 tokens past it exist. A 98-token request has
    # (98 - 3) // 16 = 5 hashes; with all 6 blocks resident vLLM 0.33's coordinator hits 80 (run through
    # kvgeom.conformance.vllm_prefix: {'0': [16, ..., 80]}, Mamba '1': [80]). A router's 98 // 16 = 6-hash chain
    # made kvgeom score 96, a block vLLM cannot look up yet; the chain is now read only as far as vLLM hashes it
    geom = kvgeom.resolve({"groups": groups, "speculative": {"method": "mtp", "num_speculative_tokens": 3,
                                                             "mtp_modules": 3}})
    assert geom.hash_lookahead_tokens == 3
    for m in (5, 6):
        chain = list(range(m))
        res, reader = kvgeom.Residency(), KVEventReader(geom)
        for g in geom.groups:
            res.add_hashes(g.index, list(range(6)), 0)
            reader.apply({"type": "BlockStored", "block_hashes": list(range(6)), "block_size": g.span,
                          "group_idx": g.index}, 0)
        source = reader if via_reader else res
        assert score_replicas(geom, source, [chain], 98, num_replicas=1, tiers=["GPU"]).hit_tokens.tolist() == \
            [[[80]]]
        assert score_replicas(geom, source, [chain, chain], 98, num_replicas=1, tiers=["GPU"]).hit_tokens.tolist() == \
            [[[80]], [[80]]]


@pytest.mark.parametrize(("n", "held", "vllm_hit"), [(6, [], 2), (29, [3, 6], 26), (23, [1, 3, 7, 8], 20)])
def test_chunked_local_with_a_chunk_off_the_block_grid_scores_as_vllm(n, held, vllm_hit):
    # chunked local, block 2, attention_chunk_size 3: vLLM 0.33's coordinator (kvgeom.conformance.vllm_prefix,
    # run) and the scalar prefix_hit answer vllm_hit. score_replicas answered one block less until its kernel
    # stopped re-applying the chunk rule at the lowered candidate (one group: one lookup, as vLLM's
    # UnitaryKVCacheCoordinator); found by the router law under the dev profile
    geom = kvgeom.resolve({"groups": [{"kind": "chunked_local", "block_size": 2, "attention_chunk_size": 3}],
                           "cache": {"retention_interval": 0}})
    chain = [f"h{i}" for i in range(n // 2)]
    res = kvgeom.Residency()
    for i in held:
        res.add(0, chain[i], holder=0)
    assert kvgeom.prefix_hit(geom, n, res.probe(geom, chain, holder=0)).hit_tokens == vllm_hit
    assert score_replicas(geom, res, [chain], n, num_replicas=1).hit_tokens[0, 0, 0] == vllm_hit
