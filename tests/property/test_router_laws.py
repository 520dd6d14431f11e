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
  group's span, nor H with one hash, nor an off-GPU placeholder 0 always raises, and changes nothing.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
from _prefix_laws import with_drop
from hypothesis import example, given
from hypothesis import strategies as st

import kvgeom
from kvgeom.events import MEDIA, KVEventError, KVEventReader
from kvgeom.prefix import prefix_hit
from kvgeom.router import score_replicas
from kvgeom.strategies import configs

# cross attention has no vLLM prefix lookup at all (both paths refuse it the same way)
KINDS = ["full_attention", "mla", "mamba", "sliding_window", "chunked_local", "uniform", "circular_buffer"]
MAX_HASHES = 24


@st.composite
def router_cases(draw: st.DrawFn) -> tuple[kvgeom.Geometry, int, list[str], int, dict[str, kvgeom.Residency]]:
    """(geometry, num_tokens, chain, replicas, {tier: residency}): per tier, per replica and group, a random
    set of the chain's hashes (dense, sparse or a prefix with holes), plus hashes of another request."""
    cfg = draw(configs(kinds=KINDS, max_block_size=8, max_groups=3, max_dcp=4, prefix_caching=True))
    geom = kvgeom.resolve(cfg)
    if draw(st.integers(0, 3)) == 3:  # a drafter: some attention groups take the speculative drop
        drafters = {g.index for g in geom.groups if g.family in ("full", "sliding") and draw(st.booleans())}
        geom = with_drop(geom, drafters)
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
def event_streams(draw: st.DrawFn) -> tuple[kvgeom.Geometry, int, list[str], int, list[tuple[int, dict[str, Any]]]]:
    cfg = draw(configs(kinds=["full_attention", "mamba", "sliding_window", "mla"], max_block_size=8, max_groups=3,
                       max_dcp=4, prefix_caching=True))
    geom = kvgeom.resolve(cfg)
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
