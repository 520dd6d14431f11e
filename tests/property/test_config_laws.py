"""Config-format laws: round trips through JSON and TOML, and bad input of any shape raises
only ``KVGeomError`` (never a stray ``KeyError``/``TypeError``/pydantic error)."""

from __future__ import annotations

import os
import tempfile
import tomllib

import _laws as laws
from _laws import H49964, H50287, H50883_D2, H50883_D8, LMC4809
from hypothesis import example, given
from hypothesis import strategies as st

import kvgeom
from kvgeom import _toml
from kvgeom.strategies import configs

# --------------------------------------------------------------------------- round trips


@example(cfg=H49964)
@example(cfg=H50883_D2)
@example(cfg=H50883_D8)
@example(cfg=H50287)
@example(cfg=LMC4809)
@example(cfg={**H49964, "cache": {"retention_interval": None}})  # dense retention: written as "dense"
@given(cfg=configs())
def test_config_roundtrips_json_and_toml(cfg):
    laws.check_roundtrip(cfg)


_keys = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=8)
_scalars = st.one_of(
    st.booleans(), st.integers(-(2**63), 2**63 - 1), st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]))
)
_tomlish = st.recursive(
    _scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_keys, inner, max_size=4),
    max_leaves=12,
)


@example(doc={"a b": {"c.d": [1, [2, 'x"\n\\']]}, "t": [{"x": 1}, {"y": {"z": True}}]})
@example(doc={"0\n": {}})  # found by the thorough profile: a key ending in a newline was written bare
@example(doc={"0\n": [{}]})
@example(doc={"0\n": []})
@given(doc=st.dictionaries(_keys, _tomlish, max_size=5))
def test_toml_writer_output_reads_back_equal(doc):
    # The writer's contract on every table it accepts (arbitrary keys, strings needing escapes,
    # nested arrays of tables); nulls excepted, which the config schema never puts in arrays.
    text = _toml.dumps(doc)
    assert tomllib.loads(text) == _normalise(doc)


def _normalise(v):
    if isinstance(v, dict):
        return {k: _normalise(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [_normalise(x) for x in v]
    return v


# --------------------------------------------------------------------------- arbitrary and mutated input

_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=20,
)
_KEYS = [
    "groups",
    "parallel",
    "cache",
    "offload",
    "kind",
    "block_size",
    "layers",
    "dcp",
    "tp",
    "pcp",
    "cp_interleave",
    "retention_interval",
    "blocks_per_chunk",
    "mamba_cache_mode",
    "dcp_sharded",
    "max_model_len",
    "prefix_match_unit",
    "sink_len",
    "schema_version",
]
_jsonish_configs = st.dictionaries(st.sampled_from(_KEYS) | st.text(max_size=6), _json, max_size=5)


def _paths(v, prefix=()):
    yield prefix
    if isinstance(v, dict):
        for k, x in v.items():
            yield from _paths(x, (*prefix, k))
    elif isinstance(v, list):
        for i, x in enumerate(v):
            yield from _paths(x, (*prefix, i))


_BAD_VALUES = st.one_of(
    st.just(-1),
    st.just(0),
    st.just(-16),
    st.just(2**70),
    st.just(True),
    st.just("16"),
    st.just(16.0),
    st.just(None),
    st.just([]),
    st.just({}),
    st.just("dense"),
    st.just("align"),
    st.just("uniform"),
    _json,
)


@st.composite
def mutated_configs(draw):
    """A valid config with one to three nodes deleted or replaced by a value of the wrong type or sign."""
    cfg = draw(configs())
    for _ in range(draw(st.integers(1, 3))):
        paths = [p for p in _paths(cfg) if p]
        if not paths:
            break
        path = draw(st.sampled_from(paths))
        parent = cfg
        for step in path[:-1]:
            parent = parent[step]
        if draw(st.booleans()):
            del parent[path[-1]]
        else:
            parent[path[-1]] = draw(_BAD_VALUES)
    return cfg


def _only_kvgeom_errors(value):
    try:
        kvgeom.resolve(value)
    except kvgeom.KVGeomError as e:
        assert e.problems and all(p.code and p.message for p in e.problems)


@example(value=[])  # not a table
@example(value={"groups": [{"kind": "uniform", "layers": [{"kind": "mamba"}, {"kind": "mla"}]}]})  # mixed container
@example(value={"groups": [{"kind": "mamba", "block_size": 16}], "parallel": {"dcp": 3}})  # tp not a multiple
@example(
    value={
        "groups": [{"kind": "full_attention", "block_size": 2**62}, {"kind": "mla", "block_size": 3}],
        "parallel": {"dcp": 1024, "tp": 1024},
    }
)  # span and lcm past int64
@given(value=_json | _jsonish_configs)
def test_arbitrary_json_raises_only_kvgeom_errors(value):
    _only_kvgeom_errors(value)


@given(cfg=mutated_configs())
def test_mutated_configs_raise_only_kvgeom_errors(cfg):
    _only_kvgeom_errors(cfg)


@example(text="groups = [", suffix=".toml")
@example(text='{"groups": [{"kind": "mla", "block_size": -1}]}', suffix=".json")
@example(text="\udcff", suffix=".json")
@given(text=st.text(max_size=60), suffix=st.sampled_from([".json", ".toml", ".yaml", ""]))
def test_arbitrary_file_text_raises_only_kvgeom_errors(text, suffix):
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "c" + suffix)
        with open(path, "w", encoding="utf-8", errors="surrogateescape") as f:
            f.write(text)
        _only_kvgeom_errors(path)
