"""Example tables for ``kvgeom.prefix`` (GPU prefix-cache hits); admission (``kvgeom.request``) is in
``test_request.py``.

Every ``prefix_hit`` row's expected numbers are vLLM 0.33's: the same geometry and residency were
run through vLLM's own ``get_kv_cache_coordinator(...).find_longest_cache_hit`` (CPU build; block
pool lookups answered from the row's residency, ``max_cache_hit_length = num_tokens - 1``), and the
comment on each row says what vLLM returned. Retention rows take their residency from
``kvgeom.sim.GPUPrefixCache`` (a cold run of a 100-token prompt), then ask the same question.
"""

from __future__ import annotations

import numpy as np
import pytest
from _prefix_rows import ROWS, geometry

import kvgeom
from kvgeom.batch.prefix import prefix_hits
from kvgeom.prefix import prefix_hit, resident_sets, scheduler_keeps_load
from kvgeom.sim import GPUPrefixCache


@pytest.mark.parametrize(("name", "cfg", "drop", "n", "resident", "hit", "blocks"), ROWS, ids=[r[0] for r in ROWS])
def test_prefix_hit_matches_vllm_coordinator(name, cfg, drop, n, resident, hit, blocks):
    geom = geometry(cfg, drop)
    got = prefix_hit(geom, n, resident)
    assert got.hit_tokens == hit
    assert [list(g.end_tokens) for g in got.groups] == blocks
    assert geom.prefix_hit({"num_tokens": n, "resident": resident}) == {
        "hit_tokens": hit,
        "groups": [{"index": i, "blocks": b} for i, b in enumerate(blocks)],
    }


def test_block_indices_follow_the_span():
    g = kvgeom.resolve(kvgeom.DEFAULT_CONFIG)  # attention span 32, Mamba 16
    got = prefix_hit(g, 100, {0: [32, 64, 80], 1: [16, 48, 80]})
    assert [x.block_indices for x in got.groups] == [(0, 1, 2), (4,)]  # partial entry 80 is attention block 2


@pytest.mark.parametrize(
    ("resident", "code"),
    [
        ({"0": [8]}, "not_on_hash_grid"),  # H = 16
        ({"0": [0]}, "not_on_hash_grid"),  # an entry covers at least one hash unit
        ({"5": [16]}, "no_such_group"),  # two groups
        ({"x": [16]}, "bad_resident"),  # not a group index
        ({"0": 16}, "bad_resident"),  # not a list
        ([16], "bad_resident"),  # not a mapping
        ({"0": [-16]}, "negative"),
    ],
)
def test_bad_residency_raises_query_error(resident, code):
    g = kvgeom.resolve(kvgeom.DEFAULT_CONFIG)
    with pytest.raises(kvgeom.QueryError) as e:
        prefix_hit(g, 100, resident)
    assert e.value.problems[0].code == code


def test_non_cacheable_group_in_residency_is_an_error():
    g = kvgeom.resolve(
        {"groups": [{"kind": "full_attention", "block_size": 16}, {"kind": "circular_buffer", "block_size": 16}]}
    )
    with pytest.raises(kvgeom.QueryError) as e:
        resident_sets(g, {"1": [16]})
    assert e.value.problems[0].code == "group_not_prefix_cacheable"


def test_cross_attention_has_no_prefix_cache_lookup():
    g = kvgeom.resolve({"groups": [{"kind": "full_attention", "block_size": 16},
                                   {"kind": "cross_attention", "block_size": 16}]})
    with pytest.raises(kvgeom.QueryError) as e:
        prefix_hit(g, 100, {})
    assert e.value.problems[0].code == "cross_attention_prefix_cache"


def test_prefix_caching_off_gives_no_hit():
    g = kvgeom.resolve({"groups": [{"kind": "full_attention", "block_size": 16}], "cache": {"prefix_caching": False}})
    assert prefix_hit(g, 100, {"0": [16, 32]}).hit_tokens == 0


def test_scenario_contract_rejects_unknown_keys():
    g = kvgeom.resolve(kvgeom.DEFAULT_CONFIG)
    with pytest.raises(kvgeom.QueryError) as e:
        g.prefix_hit({"num_tokens": 10, "stored": {}})
    assert e.value.problems[0].code == "unknown_key"
    with pytest.raises(kvgeom.QueryError):
        g.prefix_hit({"resident": {}})


def test_max_hit_tokens_caps_the_hit():
    g = kvgeom.resolve(kvgeom.DEFAULT_CONFIG)
    # capped at 50: attention proves one span (32) and has no partial entry at 48, so 32 (not 48)
    assert prefix_hit(g, 100, {0: [32, 64], 1: [16, 32, 48, 64]}, max_hit_tokens=50).hit_tokens == 32
    assert prefix_hit(g, 100, {0: [32, 48, 64], 1: [16, 32, 48, 64]}, max_hit_tokens=50).hit_tokens == 48


@pytest.mark.parametrize(
    ("local", "L", "external", "runs"),
    [
        (64, 32, 16, True),  # local on L: the connector's answer stands
        (48, 32, 16, False),  # tail 16; the load ends at 48, not past the local hit: keep 48, load nothing
        (48, 32, 32, True),  # tail 16; the load ends at 64, past 48: local drops to 32, load 32
        (48, 32, 0, False),  # nothing to load
        (0, 32, 0, False),  # nothing at all
    ],
)
def test_scheduler_keeps_load(local, L, external, runs):
    assert scheduler_keeps_load(local, L, external) is runs


_DENSE = {**kvgeom.DEFAULT_CONFIG, "cache": {"retention_interval": None}}  # L = 32, H = A = 16


def test_plan_hit_runs_no_load_the_scheduler_would_not():
    """``plan_hit`` with a local prefix off the L grid: the connector's hit_tokens stay, but no group
    loads when the hit does not pass the local prefix."""
    g = kvgeom.resolve(_DENSE)
    plan = g.plan_hit({"num_tokens": 100, "local_computed_tokens": 48, "stored": {"0": [32, 64], "1": [48]}})
    assert plan["hit_tokens"] == 16 and plan["end_token"] == 48
    assert all(not x["load_keys"] for x in plan["groups"])
    plan = g.plan_hit({"num_tokens": 100, "local_computed_tokens": 48, "stored": {"0": [32, 64], "1": [64]}})
    assert plan["hit_tokens"] == 32 and plan["groups"][1]["load_keys"] == [64]


@pytest.mark.parametrize(
    ("retention", "resident"),
    [
        # vLLM runs (tests/test_store_conformance.py GPU_ROWS): one prefill chunk to 96 leaves the state at 96 alone
        (None, {"0": [32, 64, 96], "1": [96]}),  # dense, but a state exists only where a chunk ended
        (0, {"0": [32, 64, 96], "1": [96]}),  # only the replay boundary rdown(99, A) = 96
        (32, {"0": [32, 64, 96], "1": [96]}),
    ],
)
def test_gpu_prefix_cache_retention(retention, resident):
    g = kvgeom.resolve({**kvgeom.DEFAULT_CONFIG, "cache": {"retention_interval": retention}})
    cache = GPUPrefixCache(g)
    cache.cache_request(100)
    assert cache.resident() == resident


@pytest.mark.parametrize(
    ("retention", "budget", "resident"),
    [
        # vLLM runs: prefilled 32 tokens a step, chunks end at 32, 64, 96, 100
        (None, 32, {"0": [32, 64, 96], "1": [32, 64, 96]}),
        # 16 a step: every block boundary a chunk end, thinned to one state per 32 tokens plus 96 (vLLM run of
        # FA 16 + Mamba 16 without DCP: the same Mamba entries)
        (32, 16, {"0": [32, 64, 96], "1": [32, 64, 96]}),
        (None, 16, {"0": [32, 64, 96], "1": [16, 32, 48, 64, 80, 96]}),
    ],
)
def test_gpu_prefix_cache_keeps_mamba_states_where_chunks_ended(retention, budget, resident):
    g = kvgeom.resolve({**kvgeom.DEFAULT_CONFIG, "cache": {"retention_interval": retention}})
    cache = GPUPrefixCache(g)
    cache.cache_request(100, max_num_batched_tokens=budget)
    assert cache.resident() == resident
    given = GPUPrefixCache(g)
    given.cache_request(100, chunk_ends=sorted(cache.chunk_ends))
    assert given.resident() == resident
    # a request sharing only the first 32 tokens: a hit only where a chunk ended at 32
    assert prefix_hit(g, 40, {k: [e for e in v if e <= 32] for k, v in resident.items()}).hit_tokens == 32


def test_gpu_prefix_cache_bad_chunk_ends():
    g = kvgeom.resolve({**kvgeom.DEFAULT_CONFIG, "cache": {"retention_interval": None}})
    for kwargs, code in [({"chunk_ends": [32, 16, 100]}, "bad_chunk_ends"),
                         ({"chunk_ends": [32, 64]}, "bad_chunk_ends"),
                         ({"chunk_ends": [100], "max_num_batched_tokens": 16}, "conflicting_arguments"),
                         ({"chunk_ends": [-1, 100]}, "negative")]:
        with pytest.raises(kvgeom.QueryError) as e:
            GPUPrefixCache(g).cache_request(100, **kwargs)
        assert e.value.problems[0].code == code, kwargs


def test_gpu_prefix_cache_partial_tail_and_check():
    g = kvgeom.resolve(_DENSE)  # attention span 32 > H = 16: the prompt's last H boundary is a partial entry
    cache = GPUPrefixCache(g)
    cache.cache_request(90)  # tail rdown(89, 16) = 80
    assert cache.resident()["0"] == [32, 64, 80]
    hit = prefix_hit(g, 200, cache.resident())
    assert hit.hit_tokens == 80 and cache.check_adopted(hit) == []
    cache.evict(lambda grp, e: not (grp == 1 and e == 80))
    assert "not cached" in cache.check_adopted(hit)[0]


@pytest.mark.parametrize(("name", "cfg", "drop", "n", "resident", "hit", "blocks"), ROWS, ids=[r[0] for r in ROWS])
def test_batch_prefix_hits_match_the_rows(name, cfg, drop, n, resident, hit, blocks):
    """The batch twin on each row, beside an empty residency and a 0-token request of the same geometry."""
    geom = geometry(cfg, drop)
    H = geom.hash_block_size
    cols = n // H
    held = {}
    for g in geom.groups:
        m = np.zeros((3, cols), bool)
        for e in resident.get(str(g.index), ()):
            if e // H <= cols:
                m[0, e // H - 1] = m[2, e // H - 1] = True
        held[g.index] = m
    assert prefix_hits(geom, np.array([n, n, 0]), held).tolist() == [hit, prefix_hit(geom, n, {}).hit_tokens, 0]


@pytest.mark.parametrize("method", ["plan_hit", "prefix_hit", "plan_request"])
def test_scenario_keys_of_mixed_types_are_an_error_not_a_type_error(method):
    # the three JSON scenario contracts check their keys in one place (kvgeom._check.scenario); prefix_hit and
    # plan_request once sorted the unknown keys and raised TypeError on {1, "x"}
    g = kvgeom.resolve(kvgeom.DEFAULT_CONFIG)
    with pytest.raises(kvgeom.QueryError) as info:
        getattr(g, method)({"num_tokens": 1, 1: 2, "x": 3})
    assert info.value.code == "unknown_key"
