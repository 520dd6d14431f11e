"""Example tables for the spec accessors (``kvgeom.specs``): the one home of each per-kind question -- the
manager ``family``, ``is_dcp_sharded``, ``is_prefix_cacheable``, ``sliding_window_of`` -- and specs as values
(frozen, hashable, ``model_validate(model_dump()) == spec``). The per-kind answers restate the table in the
module docstring (vLLM 0.33 ``v1/kv_cache_interface.py``).
"""

from __future__ import annotations

import hypothesis
import pytest

import kvgeom
import kvgeom.strategies
from kvgeom.specs import family, is_dcp_sharded, is_prefix_cacheable, sliding_window_of

MLA = {"kind": "mla"}


def mla(b, **kw):
    return {**MLA, "block_size": b, **kw}


def spec_of(group):
    """The validated spec of one group dict."""
    return kvgeom.load_config({"groups": [group]}).groups[0]


SW = {"kind": "sliding_window", "sliding_window": 64}

# (group, family, DCP-sharded, prefix-cacheable, (sliding_window, extra_retained_tokens) or None)
ACCESSOR_TABLE = [
    # full attention: the full manager, dealt across DCP ranks, cacheable
    ({"kind": "full_attention", "block_size": 16}, "full", True, True, None),
    # MLA: a full-manager kind, sharded like attention
    ({"kind": "mla", "block_size": 64}, "full", True, True, None),
    # attention with sinks: a full-manager kind
    ({"kind": "sink_full_attention", "block_size": 16}, "full", True, True, None),
    # a sliding window reports its window and no extra tokens
    ({**SW, "block_size": 16}, "sliding", True, True, (64, 0)),
    # extra_retained_tokens widens what a query looks back at
    ({**SW, "block_size": 16, "extra_retained_tokens": 16}, "sliding", True, True, (64, 16)),
    # sliding-window MLA: sliding, cacheable unless bounded_replay
    ({"kind": "sliding_window_mla", "block_size": 16, "sliding_window": 64}, "sliding", True, True, (64, 0)),
    # bounded_replay: not prefix-cacheable
    ({"kind": "sliding_window_mla", "block_size": 16, "sliding_window": 64, "bounded_replay": True}, "sliding",
     True, False, (64, 0)),
    # chunked local attention: its own manager, no window
    ({"kind": "chunked_local", "block_size": 16, "attention_chunk_size": 64}, "chunked", True, True, None),
    # cross attention
    ({"kind": "cross_attention", "block_size": 16}, "cross", True, True, None),
    # Mamba: replicated, never dealt across DCP ranks (#49964)
    ({"kind": "mamba", "block_size": 16}, "mamba", False, True, None),
    # a circular buffer is not prefix-cacheable
    ({"kind": "circular_buffer", "block_size": 16}, "circular", True, False, None),
    # explicit fields win over the kind: a replicated attention group that is not cached
    ({"kind": "full_attention", "block_size": 16, "dcp_sharded": False, "prefix_cacheable": False}, "full", False,
     False, None),
    # a uniform container of MLA and its indexer: sharded exactly as its layers (#50883), never by class
    ({"kind": "uniform", "block_size": 64, "layers": [MLA, {**MLA, "cache_role": "indexer"}]}, "full", True, True,
     None),
    # a uniform container answers for its first layer: family and window of the scheduler view
    ({"kind": "uniform", "block_size": 16, "layers": [{**SW, "extra_retained_tokens": 16}] * 2}, "sliding", True,
     True, (64, 16)),
]


@pytest.mark.parametrize(("group", "fam", "sharded", "cacheable", "window"), ACCESSOR_TABLE)
def test_spec_accessors(group, fam, sharded, cacheable, window):
    s = spec_of(group)
    assert family(s) == fam
    assert is_dcp_sharded(s) is sharded
    assert is_prefix_cacheable(s) is cacheable
    assert sliding_window_of(s) == window


@pytest.mark.parametrize(("group", "_fam", "_sharded", "_cacheable", "_window"), ACCESSOR_TABLE)
def test_specs_are_frozen_hashable_and_round_trip(group, _fam, _sharded, _cacheable, _window):
    s = spec_of(group)
    again = type(s).model_validate(s.model_dump())
    assert again == s and hash(again) == hash(s)
    with pytest.raises(ValueError):
        s.block_size = 32  # frozen: a spec is a value


def test_spec_sequences_are_tuples():
    # tuples, not lists, so a spec stays hashable
    s = kvgeom.MambaSpec(block_size=16, shapes=[[2, 3]], dtypes=["bfloat16"])
    assert s.shapes == ((2, 3),) and s.dtypes == ("bfloat16",)
    u = spec_of({"kind": "uniform", "block_size": 64, "layers": [MLA, MLA]})
    assert isinstance(u.layers, tuple)


def test_uniform_block_size_is_shared_both_ways():
    # the container's block size fills its layers, and vice versa
    a = kvgeom.UniformSpec.model_validate({"kind": "uniform", "block_size": 64, "layers": [MLA, MLA]})
    b = kvgeom.UniformSpec.model_validate({"kind": "uniform", "layers": [mla(64), MLA]})
    assert a == b
    assert all(layer.block_size == 64 for layer in a.layers)


def test_specs_are_hashable_values():
    s = kvgeom.MambaSpec(block_size=16, shapes=[[2, 3]], dtypes=["bfloat16"])
    assert hash(s) == hash(kvgeom.MambaSpec.model_validate(s.model_dump()))
    assert kvgeom.MambaSpec.model_validate(s.model_dump()) == s
    cfg_model = kvgeom.load_config(kvgeom.DEFAULT_CONFIG)
    assert kvgeom.KVGeomConfig.model_validate(cfg_model.to_dict()) == cfg_model


@hypothesis.given(kvgeom.strategies.configs(max_groups=3))
def test_dcp_sharding_default_has_one_home(cfg):
    # is_dcp_sharded of a group that sets no dcp_sharded is dcp_sharded_by_default(kind), the default the
    # layered resolver also reads; an explicit value always wins
    from kvgeom.specs import dcp_sharded_by_default

    for spec in kvgeom.load_config(cfg).groups:
        if spec.kind == "uniform":
            continue
        want = spec.dcp_sharded if spec.dcp_sharded is not None else dcp_sharded_by_default(spec.kind)
        assert is_dcp_sharded(spec) == want
    assert not dcp_sharded_by_default("mamba") and dcp_sharded_by_default("full_attention")
