"""kvgeom.strategies: edge cases are reachable, bad arguments raise InvalidArgument, and
everything shrinks to the simplest full-attention geometry.

Reachability rows use ``hypothesis.find`` without shrinking (the first example that shows
the case; ``NoSuchExample`` would mean the strategy cannot produce it); the shrinking rows use
:func:`kvgeom.strategies.minimal` (find without the database or the explain phase).
"""

from __future__ import annotations

import subprocess
import sys

import pytest
from hypothesis import Phase, find, given, settings
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument

import kvgeom
from kvgeom import strategies as kst
from kvgeom.strategies import minimal


def _resolved(cfg):
    return kvgeom.resolve(cfg)


def _families(cfg):
    return [g.family for g in _resolved(cfg).groups]


# --------------------------------------------------------------------------- reachability

REACHABLE = [
    # any DCP size, not only powers of two (issue 4: "any DCP size")
    ("dcp_7", lambda c: c["parallel"]["dcp"] == 7),
    # the top of the range
    ("dcp_1024", lambda c: c["parallel"]["dcp"] == 1024),
    # a DCP size with a large odd factor
    ("dcp_odd_large", lambda c: c["parallel"]["dcp"] > 500 and c["parallel"]["dcp"] % 2 == 1),
    # a uniform container (DSA MLA + indexer, #50883)
    (
        "uniform_mla_indexer",
        lambda c: any(g["kind"] == "uniform" and g["layers"][-1].get("cache_role") == "indexer" for g in c["groups"]),
    ),
    # a uniform container of Mamba leaves next to a Mamba group (#50883, unit-test form)
    (
        "uniform_mamba_next_to_mamba",
        lambda c: _families(c).count("mamba") >= 2 and any(g["kind"] == "uniform" for g in c["groups"]),
    ),
    # a sliding-window group replicated under DCP (docs/deviations.md#dcp-sharded-windowed-rejected)
    (
        "sliding_window_under_dcp",
        lambda c: c["parallel"]["dcp"] > 1 and any(g["kind"] == "sliding_window" for g in c["groups"]),
    ),
    # a hybrid with two Mamba groups (one Mamba chunk for both, vLLM 0.33 resolve_mamba_align_size)
    ("two_mamba_groups", lambda c: sum(g["kind"] == "mamba" for g in c["groups"]) >= 2),
    # offloading with k > 1 blocks per chunk
    ("blocks_per_chunk_gt_1", lambda c: c.get("offload", {}).get("blocks_per_chunk", 1) > 1),
    # offloading with a chunk given in tokens
    ("offload_block_size", lambda c: "block_size" in c.get("offload", {})),
    # retention dense (null), zero and periodic
    ("retention_dense", lambda c: "retention_interval" in c["cache"] and c["cache"]["retention_interval"] is None),
    ("retention_zero", lambda c: c["cache"].get("retention_interval", "x") == 0),
    (
        "retention_periodic_offloaded_mamba",
        lambda c: (c["cache"].get("retention_interval") or 0) > 0 and "offload" in c and "mamba" in _families(c),
    ),
    # an interleave > 1 under DCP
    ("interleave_gt_1", lambda c: c["parallel"].get("cp_interleave", 1) > 1),
    # PCP with the pre-#46570 design (PCP shards KV)
    ("pcp_shards_kv", lambda c: c["parallel"].get("pcp_shards_kv") is True and c["parallel"]["dcp"] > 1),
    # a replicated full-attention draft under DCP (MRV2 drafts)
    (
        "replicated_draft",
        lambda c: (
            c["parallel"]["dcp"] > 1
            and any(g["kind"] == "full_attention" and g.get("dcp_sharded") is False for g in c["groups"])
        ),
    ),
    # fine-grained (partial) hash hits: A = H < L
    ("partial_hash_hits", lambda c: _resolved(c).partial_hash_hits),
    # attention 16 + Mamba 16 under DCP 2: the #49964 shape (spans differ by D)
    (
        "hybrid_spans_differ",
        lambda c: (
            len({g.span for g in _resolved(c).groups}) > 1 and "mamba" in _families(c) and c["parallel"]["dcp"] > 1
        ),
    ),
    # compressed attention (tokens_per_state > 1)
    ("tokens_per_state", lambda c: any(g.get("tokens_per_state", 1) > 1 for g in c["groups"])),
    # a sink longer than one span
    ("sink_len", lambda c: any(g.get("sink_len", 0) > 0 for g in c["groups"])),
    # prefix caching off with a non-align Mamba group
    ("mamba_none_mode", lambda c: any(g.mamba_mode == "none" for g in _resolved(c).groups)),
]


@pytest.mark.parametrize(("name", "condition"), REACHABLE, ids=[r[0] for r in REACHABLE])
def test_edge_case_is_reachable(name, condition):
    cfg = find(kst.configs(), condition, settings=settings(database=None, max_examples=5000, phases=[Phase.generate]))
    assert condition(cfg)
    kvgeom.resolve(cfg)  # a found example is valid too


def test_dcp_seven_shrinks_to_the_simplest_geometry_with_dcp_seven():
    # (The kind is not asserted: Hypothesis seeds generation with constants from the loaded modules, so
    # with other test modules loaded the shrinker can stop at another one-group geometry, e.g. a
    # hisparse_resident group of block 513 when tests/test_engines_lmcache.py and test_resolve.py run first:
    # a local minimum of that kind. Only a full-attention answer must reach block 1.)
    cfg = minimal(kst.configs(), lambda c: c["parallel"]["dcp"] == 7)
    assert len(cfg["groups"]) == 1
    assert cfg["groups"][0]["kind"] != "full_attention" or cfg["groups"][0]["block_size"] == 1
    assert cfg["parallel"]["dcp"] == 7 and cfg["parallel"]["tp"] == 7
    kvgeom.resolve(cfg)


def test_minimal_config_is_one_full_attention_group():
    cfg = minimal(kst.configs())
    assert cfg["groups"] == [{"kind": "full_attention", "block_size": 1}]
    assert cfg["parallel"] == {"dcp": 1, "tp": 1}
    assert "offload" not in cfg
    g = kvgeom.resolve(cfg)
    assert (g.scheduler_block_size, g.hash_block_size, g.hit_alignment_tokens) == (1, 1, 1)


def test_minimal_geometry_respects_min_block_size():
    g = minimal(kst.geometries(min_block_size=16))
    assert [(x.kind, x.span) for x in g.groups] == [("full_attention", 16)]


def test_minimal_failing_hybrid_shrinks_to_two_groups():
    # What a failure "needs a Mamba group under DCP" shrinks to: attention + Mamba, block 1, DCP 2.
    cfg = minimal(
        kst.configs(), lambda c: c["parallel"]["dcp"] > 1 and "mamba" in _families(c) and "full" in _families(c)
    )
    assert sorted(g["kind"] for g in cfg["groups"]) == ["full_attention", "mamba"]
    assert cfg["parallel"]["dcp"] == 2


@pytest.mark.parametrize(
    "strategy",
    [
        kst.full_attention_specs(),
        kst.mla_specs(),
        kst.sink_full_attention_specs(),
        kst.sliding_window_specs(),
        kst.sliding_window_mla_specs(),
        kst.chunked_local_specs(),
        kst.cross_attention_specs(),
        kst.circular_buffer_specs(),
        kst.mamba_specs(),
        kst.uniform_specs(),
    ],
    ids=lambda s: repr(s)[:40],
)
def test_spec_strategies_shrink_to_block_size_one(strategy):
    assert minimal(strategy).block_size == 1


@given(kst.group_specs())
def test_group_specs_round_trip_through_dict(spec):
    # Each drawn spec is a valid, immutable value (house style: model_validate(model_dump()) == model).
    assert type(spec).model_validate(spec.model_dump()) == spec


@given(kst.parallel_configs(sharded_block_sizes=(12, 18)))
def test_parallel_configs_are_accepted_and_interleave_fits(p):
    par = kvgeom.ParallelConfig.model_validate(p)
    assert 6 % par.cp_interleave == 0
    kvgeom.resolve(
        {"groups": [{"kind": "full_attention", "block_size": 12}, {"kind": "mla", "block_size": 18}], "parallel": p}
    )


def test_uniform_specs_reach_every_shape():
    assert minimal(kst.uniform_specs(), lambda u: u.layers[0].kind == "full_attention").kind == "uniform"
    assert minimal(kst.uniform_specs(), lambda u: u.layers[0].kind == "mamba").layers[1].kind == "mamba"


# --------------------------------------------------------------------------- invalid arguments

INVALID = [
    # bounds below 1
    lambda: kst.block_sizes(min_value=0),
    lambda: kst.dcp_sizes(min_value=0),
    # bounds crossed
    lambda: kst.block_sizes(min_value=64, max_value=16),
    lambda: kst.dcp_sizes(min_value=8, max_value=2),
    lambda: kst.configs(min_dcp=4, max_dcp=2),
    lambda: kst.configs(min_groups=3, max_groups=2),
    lambda: kst.configs(min_block_size=32, max_block_size=16),
    # past the supported range
    lambda: kst.dcp_sizes(max_value=1025),
    lambda: kst.configs(max_dcp=2048),
    # wrong types
    lambda: kst.block_sizes(min_value=1.5),
    lambda: kst.dcp_sizes(max_value=True),
    lambda: kst.configs(offload="yes"),
    lambda: kst.configs(kinds="mamba"),
    lambda: kst.full_attention_specs(block_size=0),
    lambda: kst.parallel_configs(sharded_block_sizes=(16, 0)),
    # unknown or empty kinds, impossible combinations
    lambda: kst.configs(kinds=["lstm"]),
    lambda: kst.configs(kinds=[]),
    lambda: kst.configs(kinds=["circular_buffer"], offload=True),
    lambda: kst.mamba_specs(modes=["sometimes"]),
    lambda: kst.mamba_specs(modes=[]),
    lambda: kst.group_specs(kinds=["nope"]),
    lambda: kst.minimal(kst.block_sizes(), max_examples=0),
]


@pytest.mark.parametrize("call", INVALID, ids=range(len(INVALID)))
def test_invalid_arguments_raise_invalid_argument(call):
    with pytest.raises(InvalidArgument):
        call()


def test_importing_kvgeom_does_not_import_strategies_or_hypothesis():
    code = "import sys, kvgeom; print('kvgeom.strategies' in sys.modules, 'hypothesis' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]


def test_a_plain_block_size_still_works_but_is_deprecated_in_favour_of_a_strategy():
    # Hypothesis' own API takes strategies: st.just(16) is the spelling; a plain 16 warns and means the same
    with pytest.warns(DeprecationWarning, match=r"block_size=16: pass a strategy, e.g. block_size=st\.just\(16\)"):
        plain = kst.mla_specs(block_size=16)
    assert minimal(plain).block_size == minimal(kst.mla_specs(block_size=st.just(16))).block_size == 16
