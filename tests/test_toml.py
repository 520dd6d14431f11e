"""Example table for the TOML writer (kvgeom._toml) and KVGeomConfig.to_toml."""

from __future__ import annotations

import tomllib

import pytest

import kvgeom
from kvgeom import _toml


@pytest.mark.parametrize(
    ("config", "expected_lines"),
    [
        # dense retention (null) is written as the string the reader maps back to None
        ({"cache": {"retention_interval": None}}, ["[cache]", 'retention_interval = "dense"']),
        # other nulls are the field's default: omitted
        ({"offload": {"blocks_per_chunk": None, "block_size": 64}}, ["[offload]", "block_size = 64"]),
        # a uniform container's layers become [[groups.layers]] under their [[groups]]
        (
            {"groups": [{"kind": "uniform", "block_size": 64, "layers": [{"kind": "mla"}]}]},
            ["[[groups]]", 'kind = "uniform"', "block_size = 64", "", "[[groups.layers]]", 'kind = "mla"'],
        ),
        # Mamba shapes: nested inline arrays; keys needing quotes are quoted; strings escaped
        ({"t": {"shapes": [[1, 2], [3]], "a b": 'x"y\n'}}, ["[t]", "shapes = [[1, 2], [3]]", '"a b" = "x\\"y\\n"']),
        # an empty offload table still appears (it means blocks_per_chunk = 1)
        ({"offload": {}}, ["[offload]"]),
    ],
)
def test_dumps_writes_the_schema(config, expected_lines):
    text = _toml.dumps(config)
    assert text.splitlines() == expected_lines
    tomllib.loads(text)


def test_default_config_round_trips_through_to_toml():
    # the bundled #49964 hybrid: groups, parallel, cache (retention 0) and an empty offload table
    cfg = kvgeom.load_config(kvgeom.DEFAULT_CONFIG)
    assert kvgeom.load_config(tomllib.loads(cfg.to_toml())) == cfg


@pytest.mark.parametrize(
    ("config", "code"),
    [
        ([1, 2], "not_a_table"),  # not a table
        ({"a": [1, None]}, "toml_null_in_array"),  # TOML has no null
        ({"a": {1, 2}}, "toml_unsupported_value"),  # a set
        ({"a": {3: 1}}, "toml_bad_key"),  # a non-string key
    ],
)
def test_dumps_refuses_what_toml_cannot_hold(config, code):
    with pytest.raises(kvgeom.ConfigError) as e:
        _toml.dumps(config)
    assert e.value.code == code
