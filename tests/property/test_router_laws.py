"""Laws of the KV-events reader and router scoring (kvgeom.events, kvgeom.router).

* ``test_router_score_equals_scalar_prefix_hit``: per replica and tier, the batch score equals the
  scalar ``kvgeom.prefix.prefix_hit`` on that replica's residency (``Residency.probe`` with its
  holder bit), on both kernel paths (bit-parallel and matrix), empty chains and zero replicas included,
  and with the speculative drop on some groups (one draw in four);
* ``test_replayed_events_score_as_the_rebuilt_residency``: a random stream of store / remove / clear
  events read by ``KVEventReader`` gives the same scores as a residency built from scratch from the
  stream's final state (a multiset model of what each replica holds);
* ``test_cumulative_tier_scores_never_fall``: with ``cumulative=True`` each tier scores at least the
  tier before it;
* ``test_block_size_off_the_geometry_is_refused``: a store event whose block size is neither the
  group's span, nor H with one hash, nor an off-GPU placeholder 0 always raises, and changes nothing;
* ``test_reader_scores_equal_scalar_prefix_hit``: scores read from a ``KVEventReader`` whose packed rows
  were kept current event by event (the packed path for one attention group, the bit path for hybrids)
  equal the scalar ``prefix_hit`` on the reader's residency, per replica and tier, cumulative or not;
* ``test_packed_holders_match_the_residency``: ``PackedHolders`` under any sequence of bulk adds,
  discards and clears holds exactly the holder bits a ``Residency`` holds under the same updates, and its
  ``leading_rows`` (read by runs of rows) are the leading part of ``rows``, ending where no run can pass;
* ``test_fast_event_check_agrees_with_the_full_check``: an event read through the reader's fast check
  (a plain dict) and through the full one (the same event behind a read-only mapping) leaves the same
  residency, or raises the same error code;
* ``test_bit_path_work_is_linear_in_distinct_hits``: the partition operations of one score grow linearly
  with the number of distinct hits (counted, not timed: 4x the hits, at most 5x the operations).
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from types import MappingProxyType
from typing import Any

import pytest
from _prefix_laws import with_drop
from hypothesis import example, given
from hypothesis import strategies as st

import kvgeom
from kvgeom import router
from kvgeom.events import MEDIA, KVEventError, KVEventReader
from kvgeom.geometry import SpeculativeGeometry
from kvgeom.holders import PackedHolders
from kvgeom.prefix import prefix_hit
from kvgeom.router import score_replicas
from kvgeom.strategies import configs

# cross attention has no vLLM prefix lookup at all (both paths refuse it the same way)
KINDS = ["full_attention", "mla", "mamba", "sliding_window", "chunked_local", "uniform", "circular_buffer"]
MAX_HASHES = 24


def with_lookahead(geom: kvgeom.Geometry, P: int) -> kvgeom.Geometry:
    """``geom`` under lookahead hashes with ``P`` tokens (MTP of P modules without a connector): vLLM hashes a block
    once P tokens past it exist, so a request of n tokens has ``(n - P) // H`` hashes; no GPU drop."""
    return dataclasses.replace(geom, speculative=SpeculativeGeometry("mtp", P, True, True, False, P))


@st.composite
def router_cases(draw: st.DrawFn) -> tuple[kvgeom.Geometry, int, list[str], int, dict[str, kvgeom.Residency]]:
    """(geometry, num_tokens, chain, replicas, {tier: residency}): per tier, per replica and group, a random
    set of the chain's hashes (dense, sparse or a prefix with holes), plus hashes of another request."""
    cfg = draw(configs(kinds=KINDS, max_block_size=8, max_groups=3, max_dcp=4, prefix_caching=True))
    geom = kvgeom.resolve(cfg)
    if draw(st.integers(0, 3)) == 3:  # a drafter: some attention groups take the speculative drop
        drafters = {g.index for g in geom.groups if g.family in ("full", "sliding") and draw(st.booleans())}
        geom = with_drop(geom, drafters)
    elif draw(st.integers(0, 4)) == 4:  # lookahead hashes: the chain's last blocks may not be hashed yet
        geom = with_lookahead(geom, draw(st.integers(1, 3)))
    H = geom.hash_block_size
    n_h = draw(st.integers(0, MAX_HASHES))
    n = n_h * H + draw(st.integers(0, H - 1))
    chain = [f"h{i}" for i in range(n_h)]
    R = draw(st.integers(0, 5))
    tiers = {}
    for tier in draw(st.sampled_from([("GPU",), ("GPU", "CPU")])):
        res = kvgeom.Residency()
        for r in range(R):
            for g in geom.groups:
                if not g.prefix_cacheable:
                    continue
                style = draw(st.sampled_from(["dense", "sparse", "prefix"]))
                for i in range(n_h):
                    on_grid = (i + 1) * H % g.span == 0
                    p = {"dense": 0.9, "sparse": 0.3, "prefix": 1.0 if i < n_h // 2 else 0.1}[style]
                    if draw(st.floats(0, 1)) < (p if on_grid else p / 3):
                        res.add(g.index, chain[i], holder=r)
                res.add(g.index, "other-request", holder=r)
        tiers[tier] = res
    return geom, n, chain, R, tiers


def _residency(held: dict[tuple[int, int], list[int]]) -> kvgeom.Residency:
    res = kvgeom.Residency()
    for (replica, group), idx in held.items():
        for i in idx:
            res.add(group, f"h{i}", holder=replica)
    return res


#: vLLM #46453's shape on two replicas: replica 0 holds attention f0 f1 -- -- and Mamba m0 -- -- m3,
#: replica 1 holds everything.
CASE_46453 = (
    kvgeom.resolve({"groups": [{"kind": "full_attention", "block_size": 16}, {"kind": "mamba", "block_size": 16}]}),
    65, ["h0", "h1", "h2", "h3"], 2,
    {"GPU": _residency({(0, 0): [0, 1], (0, 1): [0, 3], (1, 0): [0, 1, 2, 3], (1, 1): [0, 1, 2, 3]})},
)


def _scalar(geom, n, chain, res, r):
    return prefix_hit(geom, n, res.probe(geom, chain, holder=r)).hit_tokens


@given(router_cases())
@example(CASE_46453)
def test_router_score_equals_scalar_prefix_hit(case):
    geom, n, chain, R, tiers = case
    try:
        expected = [[_scalar(geom, n, chain, res, r) for r in range(R)] for res in tiers.values()]
    except kvgeom.QueryError as e:  # a lookup vLLM 0.33 has no answer for: the batch refuses it the same way
        with pytest.raises(kvgeom.QueryError) as batch_error:
            score_replicas(geom, tiers, [chain], n, num_replicas=max(R, 1))
        assert batch_error.value.code == e.code
        return
    for matrix_path in (None, True):
        try:
            scores = score_replicas(geom, tiers, [chain], n, num_replicas=R, matrix_path=matrix_path)
        except kvgeom.QueryError as e:  # refused up front; the scalar refuses the same on its first lookup
            with pytest.raises(kvgeom.QueryError) as scalar_error:
                prefix_hit(geom, 8 * geom.hash_block_size + 1, {})
            assert scalar_error.value.code == e.code
            return
        assert scores.hit_tokens.shape == (1, len(tiers), R)
        assert scores.hit_tokens[0].tolist() == expected, matrix_path


@st.composite
def event_streams(draw: st.DrawFn, max_groups: int = 3,
                  ) -> tuple[kvgeom.Geometry, int, list[str], int, list[tuple[int, dict[str, Any]]]]:
    cfg = draw(configs(kinds=["full_attention", "mamba", "sliding_window", "mla"], max_block_size=8,
                       max_groups=max_groups, max_dcp=4, prefix_caching=True))
    geom = kvgeom.resolve(cfg)
    if geom.speculative is None and draw(st.integers(0, 4)) == 4:
        geom = with_lookahead(geom, draw(st.integers(1, 3)))
    H = geom.hash_block_size
    n_h = draw(st.integers(1, MAX_HASHES))
    chain = [f"h{i}" for i in range(n_h)]
    R = draw(st.integers(1, 4))
    groups = [g for g in geom.groups if g.prefix_cacheable]
    stream = []
    for _ in range(draw(st.integers(0, 40))):
        replica = draw(st.integers(0, R - 1))
        kind = draw(st.sampled_from(["store", "store", "store", "partial", "remove", "remove", "clear"]))
        if kind == "clear":
            stream.append((replica, {"type": "AllBlocksCleared"}))
            continue
        g = draw(st.sampled_from(groups))
        medium = draw(st.sampled_from([*MEDIA, None, "cpu"]))
        hashes = draw(st.lists(st.sampled_from(chain), max_size=4))
        if kind == "remove":
            stream.append((replica, {"type": "BlockRemoved", "block_hashes": hashes, "medium": medium,
                                     "group_idx": g.index}))
            continue
        size = H if kind == "partial" else g.span
        if kind == "partial":
            hashes = hashes[:1]
        stream.append((replica, {"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": None,
                                 "token_ids": list(range(size * len(hashes))), "block_size": size,
                                 "lora_id": None, "medium": medium, "group_idx": g.index}))
    return geom, n_h * H + H - 1, chain, R, stream


@given(event_streams(), st.booleans())
def test_replayed_events_score_as_the_rebuilt_residency(case, count_duplicates):
    geom, n, chain, R, stream = case
    H = geom.hash_block_size
    reader = KVEventReader(geom, count_duplicates=count_duplicates)
    model: Counter[tuple[str, int, int, str]] = Counter()  # (medium, replica, group, hash) -> copies held
    for replica, event in stream:
        if event["type"] == "BlockStored" and event["block_size"] == H and len(event["block_hashes"]) != 1 \
                and geom.groups[event["group_idx"]].span > H:
            with pytest.raises(KVEventError):  # a partial entry carries one hash: refused, nothing applied
                reader.apply(event, replica)
            continue
        reader.apply_batch([0.0, [event], 0], replica)
        medium = (event.get("medium") or "GPU").upper()
        if event["type"] == "AllBlocksCleared":
            for key in [k for k in model if k[0] == "GPU" and k[1] == replica]:
                del model[key]
        elif event["type"] == "BlockStored":
            for h in event["block_hashes"]:
                key = (medium, replica, event["group_idx"], h)
                model[key] = model[key] + 1 if count_duplicates else 1
        else:
            for h in event["block_hashes"]:
                key = (medium, replica, event["group_idx"], h)
                if model[key] > 1:
                    model[key] -= 1
                else:
                    model.pop(key, None)
    rebuilt = {m: kvgeom.Residency() for m in MEDIA}
    for (medium, replica, group, h), copies in model.items():
        if copies > 0:
            rebuilt[medium].add(group, h, holder=replica)
    live = score_replicas(geom, reader, [chain], n, num_replicas=R)
    fresh = score_replicas(geom, rebuilt, [chain], n, num_replicas=R)
    assert live.tiers == fresh.tiers == MEDIA
    assert live.hit_tokens.tolist() == fresh.hit_tokens.tolist()
    for m in MEDIA:
        live_entries = {(g, h, reader.residency(m).holders(g, h)) for g in range(len(geom.groups))
                        for h in reader.residency(m).entries(g)}
        fresh_entries = {(g, h, rebuilt[m].holders(g, h)) for g in range(len(geom.groups))
                         for h in rebuilt[m].entries(g)}
        assert live_entries == fresh_entries


@given(router_cases())
def test_cumulative_tier_scores_never_fall(case):
    geom, n, chain, R, tiers = case
    try:
        scores = score_replicas(geom, tiers, [chain], n, num_replicas=R, cumulative=True).hit_tokens[0]
    except kvgeom.QueryError:
        return
    A = geom.hit_alignment_tokens
    assert (scores % A == 0).all() and (scores <= max(n - 1, 0)).all()
    for t in range(1, scores.shape[0]):
        assert (scores[t] >= scores[t - 1]).all()


@given(st.integers(0, 4096), st.integers(1, 3), st.sampled_from(["GPU", "CPU"]))
@example(16, 2, "GPU")  # the per-rank block under DCP 2 (Dynamo #9376's wrong fallback)
@example(0, 1, "GPU")  # a placeholder size on the GPU tier
def test_block_size_off_the_geometry_is_refused(size, n_hashes, medium):
    geom = kvgeom.resolve(kvgeom.DEFAULT_CONFIG)  # spans (32, 16), H = 16
    reader = KVEventReader(geom)
    event = {"type": "BlockStored", "block_hashes": [f"h{i}" for i in range(n_hashes)], "parent_block_hash": None,
             "token_ids": [], "block_size": size, "lora_id": None, "medium": medium, "group_idx": 0}
    readable = size == 32 or (size == 16 and n_hashes == 1) or (size == 0 and medium != "GPU")
    if readable:
        reader.apply(event)
        assert len(reader.residency(medium)) == n_hashes
    else:
        with pytest.raises(KVEventError) as e:
            reader.apply(event)
        assert e.value.code == "block_size_mismatch" and e.value.field == "block_size"
        assert all(len(reader.residency(m)) == 0 for m in MEDIA)


@given(st.one_of(event_streams(max_groups=1), event_streams()), st.booleans(), st.booleans())
@example(  # one attention group; replica 1 holds the first two blocks, replica 0 only the second
    (kvgeom.resolve({"groups": [{"kind": "full_attention", "block_size": 16}]}), 48, ["h0", "h1", "h2"], 2,
     [(1, {"type": "BlockStored", "block_hashes": ["h0", "h1"], "block_size": 16}),
      (0, {"type": "BlockStored", "block_hashes": ["h1"], "block_size": 16})]), True, False)
def test_reader_scores_equal_scalar_prefix_hit(case, packed_first, cumulative):
    geom, n, chain, R, stream = case
    reader = KVEventReader(geom)
    if packed_first:  # the packed rows exist before the first event: kept current event by event
        for m in MEDIA:
            reader.packed(m)
    for replica, event in stream:
        try:
            reader.apply(event, replica)
        except KVEventError:
            continue
    res = reader.residencies()
    scores = score_replicas(geom, reader, [chain], n, num_replicas=R, cumulative=cumulative).hit_tokens[0]
    union: dict[str, kvgeom.Residency] = {}
    for t, m in enumerate(MEDIA):
        tier = res[m]
        if cumulative:  # the scalar reference on the union of this tier and the ones before it
            merged = kvgeom.Residency()
            for source in (*union.values(), tier):
                for g in source.groups():
                    for h in source.entries(g):
                        for r in range(R):
                            if source.contains(g, h, r):
                                merged.add(g, h, r)
            union[m] = tier
            tier = merged
        assert scores[t].tolist() == [_scalar(geom, n, chain, tier, r) for r in range(R)], m
        if not cumulative:  # one chain on one tier (the router's hot call, a shorter path): the same row
            one = score_replicas(geom, reader, [chain], n, num_replicas=R, tiers=[m.lower()])
            assert one.tiers == (m,) and one.hit_tokens[0, 0].tolist() == scores[t].tolist(), m


@given(event_streams(), st.lists(st.booleans(), max_size=40))
def test_packed_rows_read_between_events_match_the_residency(case, reads):
    """The reader's packed rows, read after any event (stores batched, removals rewritten, clears applied at
    once), hold exactly the residency's holders for every hash of every group and medium."""
    geom, _n, chain, _R, stream = case
    reader = KVEventReader(geom)
    for m in MEDIA:
        reader.packed(m)
    for i, (replica, event) in enumerate(stream):
        try:
            reader.apply(event, replica)
        except KVEventError:
            continue
        if i < len(reads) and reads[i]:
            for m in MEDIA:
                p, res = reader.packed(m), reader.residency(m)
                for g in range(len(geom.groups)):
                    assert [p.holders(g, h) for h in chain] == res.chain_masks(g, chain), (m, g, i)
    for m in MEDIA:
        p, res = reader.packed(m), reader.residency(m)
        for g in range(len(geom.groups)):
            assert [p.holders(g, h) for h in chain] == res.chain_masks(g, chain), (m, g)
        assert len(p) == len(res)


@given(st.lists(st.tuples(st.sampled_from(["add", "add", "hashes", "hashes", "batch", "discard", "clear", "clear_all",
                                            "sweep"]),
                          st.integers(0, 2), st.lists(st.integers(0, 12), max_size=6),
                          st.sampled_from([0, 1, 63, 64, 130]))),
       st.lists(st.integers(0, 13), max_size=16))
def test_packed_holders_match_the_residency(ops, query):
    packed, res = PackedHolders(), kvgeom.Residency()
    for op, group, hashes, holder in ops:
        if op == "add":
            packed.add_many(group, hashes, holder)
            res.add_hashes(group, hashes, holder)
        elif op == "hashes":  # the reader's one-index path: the same duplicates reported, in order
            assert packed.add_hashes(group, hashes, holder) == res.add_hashes(group, hashes, holder)
        elif op == "batch":  # the same hashes as two events in one batch: this holder's and holder 2's
            packed.add_events([(group, hashes, holder), (group, hashes[::2], 2)])
            res.add_hashes(group, hashes, holder)
            res.add_hashes(group, hashes[::2], 2)
        elif op == "discard":
            packed.discard_many(group, hashes, holder)
            res.discard_hashes(group, hashes, holder)
        elif op == "clear":
            packed.clear(holder)
            res.clear(holder)
        elif op == "sweep":  # rows no holder holds are given back, to be reused by the next new hashes
            assert len(packed) == len(res)
        else:
            packed.clear()
            res.clear()
        for g in range(3):
            chain = list(range(13))
            want = res.chain_masks(g, chain)
            got = [int.from_bytes(row.tobytes(), "little") for row in packed.rows(g, chain)]
            assert got == want == [packed.holders(g, h) for h in chain]
            for c in (chain, chain[::-1], query):  # leading_rows: rows' leading part, read by runs of rows
                rows, lead = packed.rows(g, c), packed.leading_rows(g, c, sentinel=True)
                k = lead.shape[0] - 1
                assert not lead[k].any() and (lead[:k] == rows[:k]).all()
                assert k == len(c) or not rows[k].any()  # it stops only where no leading run can pass
                assert (packed.leading_rows(g, c) == lead[:k]).all()
    assert len(packed) == len(res)
    rebuilt = kvgeom.Residency()  # the rows handed over (how a reader builds its residency on first ask)
    for g in packed.groups():
        rebuilt.add_masks(g, *packed.held_masks(g))
    assert {(g, h, rebuilt.holders(g, h)) for g in range(3) for h in rebuilt.entries(g)} == \
        {(g, h, res.holders(g, h)) for g in range(3) for h in res.entries(g)}


@given(event_streams(), st.booleans(), st.booleans(), st.lists(st.booleans(), max_size=40))
def test_one_index_reader_equals_a_live_residency_reader(case, count_duplicates, cumulative, asks):
    """A reader whose packed rows are its only index (nobody asked for a residency) scores, holds and hands
    over exactly what a reader that keeps a live residency from the start does, event by event; asking for
    the residency part-way (``asks``) switches it to keeping both, with the same answers."""
    geom, n, chain, R, stream = case
    one = KVEventReader(geom, count_duplicates=count_duplicates)
    live = KVEventReader(geom, count_duplicates=count_duplicates)
    live.residencies()
    for i, (replica, event) in enumerate(stream):
        outcomes = []
        for reader in (one, live):
            try:
                reader.apply(event, replica)
                outcomes.append(None)
            except KVEventError as e:
                outcomes.append(e.code)
        assert outcomes[0] == outcomes[1]
        for m in MEDIA:
            for g in range(len(geom.groups)):
                assert [one.packed(m).holders(g, h) for h in chain] == [live.packed(m).holders(g, h) for h in chain]
        if i < len(asks) and asks[i]:
            one.residencies()
    got = score_replicas(geom, one, [chain], n, num_replicas=R, cumulative=cumulative).hit_tokens.tolist()
    assert got == score_replicas(geom, live, [chain], n, num_replicas=R, cumulative=cumulative).hit_tokens.tolist()
    for m in MEDIA:
        a, b = one.residency(m), live.residency(m)
        assert {(g, h, a.holders(g, h)) for g in range(len(geom.groups)) for h in a.entries(g)} == \
            {(g, h, b.holders(g, h)) for g in range(len(geom.groups)) for h in b.entries(g)}


@given(event_streams(), st.data())
def test_fast_event_check_agrees_with_the_full_check(case, data):
    geom, _n, _chain, _R, stream = case
    fast, full = KVEventReader(geom), KVEventReader(geom)
    for replica, event in stream:
        event = dict(event)
        if data.draw(st.integers(0, 3)) == 0:  # a field made odd: the fast check must hand it to the full one
            key = data.draw(st.sampled_from(["group_idx", "block_size", "medium", "kv_cache_spec_kind", "token_ids",
                                             "block_hashes", "kv_cache_spec_sliding_window"]))
            event[key] = data.draw(st.sampled_from([None, True, -1, 0, 7, "gpu", "mamba", [1], [b"x"], [[1]], 2.0]))
        outcomes = []
        for reader, shown in ((fast, event), (full, MappingProxyType(event))):
            try:
                reader.apply(shown, replica)
                outcomes.append("ok")
            except KVEventError as e:
                outcomes.append(e.code)
        assert outcomes[0] == outcomes[1]
    for m in MEDIA:
        a, b = fast.residency(m), full.residency(m)
        assert {(g, h, a.holders(g, h)) for g in a.groups() for h in a.entries(g)} == \
            {(g, h, b.holders(g, h)) for g in b.groups() for h in b.entries(g)}


def _partition_ops(cfg: dict[str, Any], replicas: int, distinct: int) -> int:
    """Partition operations (``_put``) of one bit-path score on ``replicas`` replicas with ``distinct`` hits."""
    geom = kvgeom.resolve(cfg)
    H = geom.hash_block_size
    chain = list(range(1, 2 * replicas + 9))
    res = kvgeom.Residency()
    for r in range(replicas):
        for g in geom.groups:
            s = g.span // H
            res.add_hashes(g.index, chain[s - 1 : 2 * (r % distinct) + 2 : s], r)
    calls = 0
    put = router._put

    def counting(*args: Any) -> None:
        nonlocal calls
        calls += 1
        put(*args)

    router._put = counting
    try:
        score_replicas(geom, res, [chain], len(chain) * H + 1, num_replicas=replicas, matrix_path=False)
    finally:
        router._put = put
    return calls


@pytest.mark.parametrize("cfg", [
    {"groups": [{"kind": "full_attention", "block_size": 16}]},
    {"groups": [{"kind": "mamba", "block_size": 16}]},
    {"groups": [{"kind": "full_attention", "block_size": 16}, {"kind": "mamba", "block_size": 16}]},
    {"groups": [{"kind": "full_attention", "block_size": 16}, {"kind": "mamba", "block_size": 64}]},
    {"groups": [{"kind": "full_attention", "block_size": 16},
                {"kind": "full_attention", "block_size": 32, "num_kv_heads": 4},
                {"kind": "mamba", "block_size": 16}]},
], ids=["attention", "mamba", "attention+mamba", "attention+mamba64 (partial hits)", "three lookup groups"])
def test_bit_path_work_is_linear_in_distinct_hits(cfg):
    # issue 23: _pmin paired every value with every value, quadratic in the distinct hits of a one-group model
    few, many = _partition_ops(cfg, 256, 32), _partition_ops(cfg, 256, 128)
    assert many <= 5 * few + 16, (few, many)


@given(router_cases(), st.integers(0, 400))
def test_request_hashes_is_the_chain_vllm_holds(case, n):
    """``Geometry.request_hashes``, the one home of vLLM's ``request.block_hashes`` length: ``(n - P) // H``,
    at most ``n // H`` and equal to it without lookahead hashes; the router accepts exactly that chain."""
    geom = case[0]
    H, P = geom.hash_block_size, geom.hash_lookahead_tokens
    got = geom.request_hashes(n)
    assert got == max(n - P, 0) // H <= n // H
    assert P or got == n // H
    chain = [f"x{i}" for i in range(got)]
    try:
        assert score_replicas(geom, kvgeom.Residency(), [chain], n, num_replicas=1).hit_tokens.shape == (1, 1, 1)
    except kvgeom.QueryError as e:  # a geometry vLLM cannot look up is refused, never the chain
        assert e.code != "chain_length_mismatch", e
