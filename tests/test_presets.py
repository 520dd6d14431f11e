"""Bundled presets: each resolves cleanly, reproduces the numbers its source cites, and passes the JSON Schema."""

from __future__ import annotations

import json
import tomllib
from importlib import resources
from pathlib import Path

import jsonschema
import pytest

import kvgeom
from kvgeom.cli import config_schema
from kvgeom.presets import load_preset, preset_description, preset_names, preset_text

INVALID = Path(__file__).parent / "invalid"

# name, spans, L, H, offload tokens_per_chunk per group; source of the numbers
EXPECTED = [
    ("seed-hybrid", [32, 16], 32, 16, [32, 16]),  # vllm-geometry.md Example 1, #49964
    ("glm52-dsa-dcp2", [128], 128, 128, [128]),  # Example 5, #50883: 64*2, not 64
    ("glm52-dsa-dcp8", [512], 512, 512, [512]),  # Example 5, #50883: 64*8, not 64
    ("kimi-k3-dcp8", [12288, 1536], 12288, 1536, [12288, 1536]),  # #55168: attention 12288, KDA 1536
    ("glm5next-dcp4", [9216, 2304], 9216, 2304, [9216, 2304]),  # Example 11, LMCache #4809 -> #4834
    ("gemma3-swa", [16, 16], 16, 16, [16, 16]),  # no DCP: spans are the block sizes
    ("deepseek-v3-mla-dcp8", [512], 512, 512, [512]),  # MLA is DCP-sharded: 64*8
    ("falcon-mamba", [16], 16, 16, [64]),  # #44599 shape: Mamba chunk B*k = 16*4
    ("qwen35-mtp-hybrid", [528, 528], 528, 528, [528, 528]),  # #40696: 528-token attention block; MTP
    ("llama31-eagle3", [16], 16, 16, [16]),  # one group: the EAGLE3 head shares the target's spec
]


def test_expected_table_covers_every_preset():
    assert sorted(name for name, *_ in EXPECTED) == list(preset_names())


@pytest.mark.parametrize(("name", "spans", "L", "H", "chunks"), EXPECTED)
def test_preset_resolves_to_its_cited_numbers(name, spans, L, H, chunks):
    geom = kvgeom.resolve(load_preset(name))
    assert [g.span for g in geom.groups] == spans
    assert (geom.scheduler_block_size, geom.hash_block_size) == (L, H)
    assert geom.offload is not None
    assert [og.tokens_per_chunk for og in geom.offload.groups] == chunks


def test_seed_hybrid_is_the_default_config():
    assert load_preset("seed-hybrid") == kvgeom.load_config(kvgeom.DEFAULT_CONFIG)


def test_glm5next_chunk_is_the_lcm_not_the_cli_block():
    # LMCache #4809: the buggy chunk was CLI block 256 * dcp 4 = 1024; the right one is lcm(9216, 2304).
    geom = kvgeom.resolve(load_preset("glm5next-dcp4"))
    assert geom.scheduler_block_size == 9216 != 256 * geom.config.parallel.dcp


@pytest.mark.parametrize("name", preset_names())
def test_preset_file_starts_with_description_and_source(name):
    lines = preset_text(name).splitlines()
    assert lines[0].startswith("# ") and preset_description(name) == lines[0][2:].strip()
    comments = [line for line in lines if line.startswith("#")]
    assert any("#" in line[1:] or "section" in line or "report" in line for line in comments[1:]), comments


@pytest.mark.parametrize("name", preset_names())
def test_preset_is_package_data(name):
    # Loaded with importlib.resources, so it ships in the wheel (pyproject package-data presets/*.toml).
    entry = resources.files("kvgeom.presets") / f"{name}.toml"
    assert entry.is_file()
    assert load_preset(name) == kvgeom.load_config(tomllib.loads(entry.read_text(encoding="utf-8")))


def test_unknown_preset_is_a_config_error():
    with pytest.raises(kvgeom.ConfigError) as e:
        load_preset("gpt-17")
    assert e.value.code == "unknown_preset" and "seed-hybrid" in str(e.value)


# ------------------------------------------------------------------ JSON Schema

VALIDATOR = jsonschema.Draft202012Validator(config_schema())


def test_schema_is_a_valid_draft_2020_12_schema():
    jsonschema.Draft202012Validator.check_schema(config_schema())


@pytest.mark.parametrize("name", preset_names())
def test_schema_validates_every_preset(name):
    assert list(VALIDATOR.iter_errors(tomllib.loads(preset_text(name)))) == []


def _data(path: Path) -> object:
    text = path.read_text(encoding="utf-8")
    return json.loads(text) if path.suffix == ".json" else tomllib.loads(text)


# Files whose content the schema must reject: the malformed examples (kvgeom check exits 2) and
# offload-both (a format rule the schema states with "not required both").
SCHEMA_REJECTS = [
    "zero-block-size.json",
    "negative-block-size.toml",
    "unknown-kind.json",
    "unknown-key.json",
    "wrong-type.json",
    "offload-both.json",
]
# Well-formed files with an impossible geometry: JSON Schema cannot state cross-field arithmetic
# (tp % dcp, span % H, families of uniform layers, kind vs dcp), so only `kvgeom check` rejects them (exit 1).
SCHEMA_ACCEPTS_CHECK_REJECTS = [
    "mixed-uniform-leaves.json",
    "tp-not-divisible-by-dcp.json",
    "span-not-divisible-by-prefix-match-unit.json",
    "sharded-sliding-window-under-dcp.json",
]


@pytest.mark.parametrize("name", SCHEMA_REJECTS)
def test_schema_rejects_malformed_example(name):
    assert not VALIDATOR.is_valid(_data(INVALID / name))


@pytest.mark.parametrize("name", SCHEMA_ACCEPTS_CHECK_REJECTS)
def test_geometry_rules_beyond_the_schema_are_caught_by_resolve(name):
    data = _data(INVALID / name)
    assert VALIDATOR.is_valid(data)
    with pytest.raises(kvgeom.GeometryError):
        kvgeom.resolve(data)


def test_schema_accepts_the_documented_spellings():
    # A uniform layer inherits the container's block_size; "dense" is a null retention interval.
    cfg = {
        "groups": [{"kind": "uniform", "layers": [{"kind": "mla", "block_size": 64}, {"kind": "mla"}]}],
        "cache": {"retention_interval": "dense"},
    }
    assert VALIDATOR.is_valid(cfg)
    kvgeom.resolve(cfg)
