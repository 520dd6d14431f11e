"""Key, boundary, dealing and hit laws (docs/keys-and-boundaries.md, docs/hits.md), checked with the
token-accurate simulator ``kvgeom.sim`` where bytes move.

``case`` rows are ``(config, scenario)``; the scenario's ``evict`` booleans drop stored keys in
``(group, end_token)`` order (see ``kvgeom.sim.run_scenario``).
"""

from __future__ import annotations

from _hit_laws import MAX_BLOCK, check_hit_restores_exact_state, hit_cases
from _laws import H49964
from hypothesis import example, given
from hypothesis import strategies as st

import kvgeom
from kvgeom import hits, keys, ranks
from kvgeom.sim import Simulator
from kvgeom.strategies import geometries

_DENSE_49964 = {**H49964, "cache": {"retention_interval": None}}
#: #55168 scaled down: Kimi-K3 had attention span 12288 = KDA 1536 x DCP 8; here 32 = 4 x 8.
#: With the Mamba key at 96 evicted the hit ends at 92, inside attention chunk [64, 96).
_SCALED_55168 = {
    "groups": [{"kind": "full_attention", "block_size": 4}, {"kind": "mamba", "block_size": 4}],
    "parallel": {"tp": 8, "dcp": 8},
    "cache": {"retention_interval": None},
    "offload": {},
}
_EVICT_MAMBA_96 = [False] * 3 + [False] * 23 + [True]  # keys: attention 32, 64, 96; Mamba 4..96


def _scenario(n, local=0, evict=()):
    return {"num_tokens": n, "local_computed_tokens": local, "evict": list(evict)}


@example(case=(H49964, _scenario(64)))  # #49964: a 64-token prompt hits 48 (not 64, not 63)
@example(case=(_DENSE_49964, _scenario(65)))  # hit 64: attention chunks 0-1, Mamba state after 64 tokens
@example(case=(_DENSE_49964, _scenario(64, evict=[False] * 2 + [False, False, True])))  # #44599 shape: hit 32
@example(case=(_DENSE_49964, _scenario(80, local=40)))  # local prefix 40 -> looked up from rdown(40, L) = 32
@example(case=(_SCALED_55168, _scenario(97, evict=_EVICT_MAMBA_96)))  # #55168: hit 92, inside an attention chunk
@given(case=hit_cases())
def test_every_hit_restores_mamba_at_exactly_the_hit_boundary_and_matches_a_cold_run(case):
    check_hit_restores_exact_state(case)


@example(case=(_DENSE_49964, _scenario(64)))
@given(case=hit_cases())
def test_keys_fingerprint_exactly_their_prefix(case):
    cfg, sc = case
    geom = kvgeom.resolve(cfg)
    n = sc["num_tokens"]
    sim = Simulator(geom)
    sim.prefill(n)
    sim.store(hits.plan_store(geom, num_tokens=n, num_computed_tokens=n))
    assert sim.check_tier() == []
    H = geom.hash_block_size
    for og in geom.offload.groups:
        for j in range(keys.num_keys(geom, og.index, n)):
            end = keys.chunk_end_token(geom, og.index, j)
            assert end == (j + 1) * og.tokens_per_chunk <= n
            assert (keys.chunk_hash_index(geom, og.index, j) + 1) * H == end
            assert keys.boundary_hash_index(geom, end) == keys.chunk_hash_index(geom, og.index, j)


@example(g=kvgeom.resolve({**H49964, "offload": {"blocks_per_chunk": 4}}), j=1)
@given(g=geometries(offload=True, max_block_size=MAX_BLOCK), j=st.integers(0, 64))
def test_attention_chunk_j_is_block_entries_j_k_to_j_plus_1_k(g, j):
    for og in g.offload.groups:
        if g.groups[og.index].is_align_mamba:
            continue
        k = og.tokens_per_chunk // og.tokens_per_block
        assert k == g.offload.blocks_per_chunk
        entries = keys.chunk_block_entries(g, og.index, j)
        assert entries == range(j * k, (j + 1) * k)
        assert all(keys.chunk_of_entry(g, og.index, e) == j for e in entries)
        # the chunk's tokens are exactly the positions those entries stand for
        assert entries.start * og.tokens_per_block == j * og.tokens_per_chunk
        assert entries.stop * og.tokens_per_block == keys.chunk_end_token(g, og.index, j)


@example(g=kvgeom.resolve(_DENSE_49964), n=64)
@example(g=kvgeom.resolve({**_DENSE_49964, "parallel": {"tp": 8, "dcp": 8}}), n=200)
@given(
    g=geometries(offload=True, max_block_size=MAX_BLOCK, kinds=["mamba", "full_attention", "uniform"]),
    n=st.integers(0, 2048),
)
def test_mamba_key_ending_at_b_holds_the_state_after_b_tokens(g, n):
    plan = hits.plan_store(g, num_tokens=n, num_computed_tokens=n)
    sim = Simulator(g)
    sim.prefill(n)
    sim.store(plan)
    H = g.hash_block_size
    for gs in plan.groups:
        x = g.groups[gs.index]
        if not x.is_align_mamba:
            continue
        C = g.offload.group(gs.index).tokens_per_chunk
        for end, entries in zip(gs.end_tokens, gs.block_entries, strict=True):
            assert end % C == 0 and end <= n
            assert entries == (end // x.block_size - 1,)  # B_m, never B_m * dcp (#49962)
            assert sim.tier[(end // H - 1, gs.index)] == end


@example(g=kvgeom.resolve(_DENSE_49964), n=37)  # docs/keys-and-boundaries.md: rank lengths 19 and 18
@example(g=kvgeom.resolve({**_DENSE_49964, "parallel": {"tp": 2, "dcp": 2, "cp_interleave": 16}}), n=37)  # 21, 16
@given(g=geometries(max_block_size=MAX_BLOCK), n=st.integers(0, 1500))
def test_rank_lengths_sum_to_n_and_every_position_has_exactly_one_owner(g, n):
    shards = g.kv_shards
    for x in g.groups:
        lengths = ranks.rank_lengths(g, x.index, n)
        assert len(lengths) == shards
        if not (x.dcp_sharded and shards > 1):
            assert lengths == (n,) * shards
            continue
        assert sum(lengths) == n
        owned = [0] * shards
        slots = set()
        for p in range(n):
            col, rank, offset = ranks.dcp_placement(g, x.index, p)
            assert rank is not None and 0 <= rank < shards and 0 <= offset < x.block_size
            assert col == p // x.span
            owned[rank] += 1
            slots.add((col, rank, offset))
        assert tuple(owned) == lengths
        assert len(slots) == n  # no two positions share a slot


@example(case=(_DENSE_49964, _scenario(65)))
@example(case=(_SCALED_55168, _scenario(97, evict=_EVICT_MAMBA_96)))
@given(case=hit_cases())
def test_a_tier_read_through_a_residency_gives_the_hit_of_its_stored_lists(case):
    # The simulator's tier after kvgeom's store plan and the scenario's evictions, handed to the lookup
    # three ways: as stored end-token lists (the plan_hit contract), as a Residency fed with vLLM offload
    # key bytes + the request's hash chain, and as a contains() callable. Same Hit every time.
    cfg, sc = case
    geom = kvgeom.resolve(cfg)
    n, local = sc["num_tokens"], sc["local_computed_tokens"]
    sim = Simulator(geom)
    sim.prefill(n)
    sim.store(hits.plan_store(geom, num_tokens=n, num_computed_tokens=n))
    order = sorted(sim.tier)
    gone = {key for key, bit in zip(order, sc["evict"], strict=False) if bit}
    sim.evict(lambda g, e: (e // geom.hash_block_size - 1, g) not in gone)
    stored = sim.tier_end_tokens()
    H = geom.hash_block_size
    chain = [(b"hash-%d" % i).ljust(16, b".") for i in range(n // H)]
    tier = kvgeom.Residency()
    for g, ends in stored.items():
        tier.add_keys(kvgeom.make_offload_key(chain[e // H - 1], int(g)) for e in ends)
    want = hits.lookup_hit(geom, n, stored=stored, local_computed_tokens=local)
    assert hits.lookup_hit(geom, n, stored=tier, block_hashes=chain, local_computed_tokens=local) == want
    held = {(int(g), e) for g, ends in stored.items() for e in ends}
    assert hits.lookup_hit(geom, n, stored=lambda g, e: (g, e) in held, local_computed_tokens=local) == want
