"""Every invalid config raises a KVGeomError subclass whose message names the numbers.

Rows: (config, error class, code, field, substrings the message must contain).
"""

from __future__ import annotations

import json
import pickle

import pytest

import kvgeom
from kvgeom import ConfigError, GeometryError, OffloadConfigError, ParallelismError

FA16 = {"kind": "full_attention", "block_size": 16}
M16 = {"kind": "mamba", "block_size": 16}

ERROR_TABLE = [
    # zero block size
    ({"groups": [{"kind": "full_attention", "block_size": 0}]}, ConfigError, "out_of_range",
     "groups[0].block_size", ["got 0"]),
    # negative block size
    ({"groups": [{"kind": "mamba", "block_size": -16}]}, ConfigError, "out_of_range", "groups[0].block_size",
     ["-16"]),
    # unknown kind
    ({"groups": [{"kind": "lstm", "block_size": 16}]}, ConfigError, "unknown_kind", "groups[0]", ["'lstm'"]),
    # missing kind
    ({"groups": [{"block_size": 16}]}, ConfigError, "missing_kind", "groups[0]", ["kind"]),
    # unknown key at the top level and inside a group
    ({"groups": [FA16], "paralel": {}}, ConfigError, "unknown_key", "paralel", ["paralel"]),
    ({"groups": [{**FA16, "blocksize": 16}]}, ConfigError, "unknown_key", "groups[0].blocksize", ["blocksize"]),
    # wrong type: a string block size is not silently converted
    ({"groups": [{"kind": "full_attention", "block_size": "16"}]}, ConfigError, "wrong_type",
     "groups[0].block_size", ["'16'"]),
    # a bool is not a size
    ({"groups": [{"kind": "full_attention", "block_size": True}]}, ConfigError, "wrong_type",
     "groups[0].block_size", ["True"]),
    # no groups at all
    ({"groups": []}, ConfigError, "too_short", "groups", []),
    # uniform leaves with different block sizes
    ({"groups": [{"kind": "uniform", "block_size": 64, "layers": [{"kind": "mla", "block_size": 32}]}]},
     ConfigError, "invalid_value", "groups[0]", ["32", "64"]),
    # uniform mixing MLA and Mamba (different managers)
    ({"groups": [{"kind": "uniform", "block_size": 16, "layers": [{"kind": "mla"}, {"kind": "mamba"}]}]},
     GeometryError, "uniform_mixed_kinds", "groups[0].layers", ["full", "mamba"]),
    # uniform sliding leaves of two windows: vLLM 0.33 makes a group per width (its uniform-type test)
    ({"groups": [{"kind": "uniform", "block_size": 16, "layers": [
        {"kind": "sliding_window", "sliding_window": 64}, {"kind": "sliding_window", "sliding_window": 512}]}]},
     GeometryError, "uniform_mixed_windows", "groups[0].layers", ["64, 512", "one group per width"]),
    ({"groups": [{"kind": "uniform", "block_size": 16, "layers": [
        {"kind": "chunked_local", "attention_chunk_size": 256},
        {"kind": "chunked_local", "attention_chunk_size": 512}]}]},
     GeometryError, "uniform_mixed_windows", "groups[0].layers", ["256, 512"]),
    # uniform leaves that disagree on dcp_sharded
    ({"groups": [{"kind": "uniform", "block_size": 16,
                  "layers": [{"kind": "mla"}, {"kind": "mla", "dcp_sharded": False}]}]},
     GeometryError, "uniform_mixed_sharding", "groups[0].layers", ["True, False"]),
    # tp not divisible by dcp (vLLM 0.33 config/parallel.py)
    ({"groups": [FA16], "parallel": {"tp": 3, "dcp": 2}}, ParallelismError, "tp_not_divisible_by_dcp",
     "parallel.dcp", ["tp=3", "dcp=2"]),
    # PCP with a DCP that is not 1, P or TP*P
    ({"groups": [FA16], "parallel": {"tp": 4, "pcp": 2, "dcp": 4}}, ParallelismError, "pcp_dcp_combination",
     "parallel.dcp", ["dcp=4", "pcp=2"]),
    # interleave larger than the sharded block (docs/deviations.md#interleave-per-sharded-group)
    ({"groups": [FA16], "parallel": {"tp": 2, "dcp": 2, "cp_interleave": 32}}, ParallelismError,
     "interleave_mismatch", "parallel.cp_interleave", ["cp_interleave=32", "block_size=16"]),
    # interleave not dividing the 48-token group vLLM accepts (docs/deviations.md#interleave-per-sharded-group)
    ({"groups": [{"kind": "full_attention", "block_size": 32}, {"kind": "full_attention", "block_size": 48}],
      "parallel": {"tp": 2, "dcp": 2, "cp_interleave": 32}}, ParallelismError, "interleave_mismatch",
     "parallel.cp_interleave", ["48"]),
    # sharded sliding window under DCP (docs/deviations.md#dcp-sharded-windowed-rejected)
    ({"groups": [FA16, {"kind": "sliding_window", "block_size": 16, "sliding_window": 64}],
      "parallel": {"tp": 2, "dcp": 2}}, ParallelismError, "sharded_kind_under_dcp", "groups[1].dcp_sharded",
     ["dcp=2", "dcp_sharded=false"]),
    # sharded chunked local under DCP, even as the only group (docs/deviations.md#dcp-sharded-windowed-rejected)
    ({"groups": [{"kind": "chunked_local", "block_size": 16, "attention_chunk_size": 64}],
      "parallel": {"tp": 2, "dcp": 2}}, ParallelismError, "sharded_kind_under_dcp", "groups[0].dcp_sharded", []),
    # Mamba cannot be sharded
    ({"groups": [FA16, {**M16, "dcp_sharded": True}], "parallel": {"tp": 2, "dcp": 2}}, GeometryError,
     "mamba_cannot_shard", "groups[1].dcp_sharded", []),
    # Mamba none mode with prefix caching on (vLLM 0.33 MambaManager)
    ({"groups": [FA16, {**M16, "mamba_cache_mode": "none"}]}, GeometryError, "mamba_none_with_prefix_caching",
     "groups[1].mamba_cache_mode", ["align"]),
    # a span not divisible by the hash unit (explicit prefix_match_unit)
    ({"groups": [FA16, M16], "parallel": {"tp": 2, "dcp": 2}, "cache": {"prefix_match_unit": 32}},
     GeometryError, "span_not_divisible_by_hash_unit", "cache.prefix_match_unit", ["span 16", "H=32"]),
    # prefix_match_unit with one group (vLLM 0.33 resolve_kv_cache_block_sizes)
    ({"groups": [FA16], "cache": {"prefix_match_unit": 8}}, GeometryError, "prefix_match_unit_single_group",
     "cache.prefix_match_unit", ["prefix_match_unit=8", "L=16"]),
    # offload with both chunk settings (vLLM 0.33 build_offloading_config)
    ({"groups": [FA16], "offload": {"block_size": 64, "blocks_per_chunk": 4}}, OffloadConfigError,
     "offload_chunk_both", "offload", ["block_size=64", "blocks_per_chunk=4"]),
    # blocks_per_chunk must be > 0
    ({"groups": [FA16], "offload": {"blocks_per_chunk": 0}}, ConfigError, "out_of_range",
     "offload.blocks_per_chunk", ["got 0"]),
    # offload block_size with mixed spans (hybrid under DCP)
    ({"groups": [FA16, M16], "parallel": {"tp": 2, "dcp": 2}, "offload": {"block_size": 64}},
     OffloadConfigError, "offload_block_size_mixed_spans", "offload.block_size", ["[32, 16]", "blocks_per_chunk"]),
    # offload block_size not a multiple of the span
    ({"groups": [FA16], "offload": {"block_size": 40}}, OffloadConfigError, "offload_block_size_not_multiple",
     "offload.block_size", ["block_size=40", "48"]),
    # no offloadable group
    ({"groups": [{"kind": "circular_buffer", "block_size": 16}], "offload": {}}, OffloadConfigError,
     "no_offloadable_groups", "offload", []),
    # cross attention among offloaded groups (vLLM 0.33 get_sliding_window_size_in_chunks)
    ({"groups": [FA16, {"kind": "cross_attention", "block_size": 16}], "offload": {}}, OffloadConfigError,
     "cross_attention_offload", "groups[1]", ["cross"]),
    # Mamba group outside align mode forces H = L, then 16 % 32 fails with offloading (prefix caching off)
    ({"groups": [FA16, {**M16, "mamba_cache_mode": "none"}], "parallel": {"tp": 2, "dcp": 2},
      "cache": {"prefix_caching": False}, "offload": {}}, OffloadConfigError, "tokens_per_block_not_divisible",
     "groups[1].block_size", ["tokens_per_block=16", "tokens_per_hash=32"]),
    # retention not a multiple of L (vLLM 0.33 _validate_prefix_cache_retention_interval)
    ({"groups": [FA16, M16], "parallel": {"tp": 2, "dcp": 2}, "cache": {"retention_interval": 48}},
     GeometryError, "retention_not_multiple_of_scheduler_block", "cache.retention_interval", ["48", "L=32"]),
    # retention > 0 with nothing windowed
    ({"groups": [FA16], "cache": {"retention_interval": 64}}, GeometryError, "retention_without_windowed_group",
     "cache.retention_interval", ["64"]),
    # retention not a multiple of a windowed offload chunk (k = 4 -> Mamba chunk 64)
    ({"groups": [FA16, M16], "parallel": {"tp": 2, "dcp": 2}, "cache": {"retention_interval": 96},
      "offload": {"blocks_per_chunk": 4}}, OffloadConfigError, "retention_not_multiple_of_chunk",
     "cache.retention_interval", ["96", "tokens_per_chunk=64"]),
    # two align Mamba groups with different chunks (vLLM 0.33 resolve_mamba_align_size)
    ({"groups": [{"kind": "full_attention", "block_size": 32}, M16, {"kind": "mamba", "block_size": 32}],
      "offload": {}}, OffloadConfigError, "mamba_chunk_mismatch", "groups", []),
    # compressed attention state not aligned with A
    ({"groups": [{"kind": "mla", "block_size": 16, "tokens_per_state": 3}]}, GeometryError,
     "hit_alignment_not_multiple_of_compression", "groups[0].tokens_per_state", ["tokens_per_state=3", "A=16"]),
    # a per-rank block smaller than one compressed state: a 0-byte page vLLM 0.33 cannot plan (its
    # get_kv_cache_config_from_groups raises ZeroDivisionError, run); the span (2 x 2) alone would pass A
    ({"groups": [{"kind": "mla", "block_size": 2, "tokens_per_state": 4}], "parallel": {"tp": 2, "dcp": 2}},
     GeometryError, "block_smaller_than_state", "groups[0].tokens_per_state",
     ["tokens_per_state=4", "2-token block", "multiple of 4"]),
    ({"groups": [FA16, {"kind": "uniform", "block_size": 1, "layers": [
        {"kind": "mla"}, {"kind": "mla", "tokens_per_state": 2, "cache_role": "indexer"}]}],
      "parallel": {"tp": 2, "dcp": 2}},
     GeometryError, "block_smaller_than_state", "groups[1].layers[1].tokens_per_state", ["tokens_per_state=2"]),
    # sink not covering whole blocks under DCP
    ({"groups": [{"kind": "sink_full_attention", "block_size": 16, "sink_len": 16}], "parallel": {"tp": 2, "dcp": 2}},
     GeometryError, "sink_len_not_multiple_of_span", "groups[0].sink_len", ["sink_len=16", "span 32"]),
    # a circular buffer cannot be made cacheable
    ({"groups": [FA16, {"kind": "circular_buffer", "block_size": 16, "prefix_cacheable": True}]}, GeometryError,
     "circular_buffer_cacheable", "groups[1].prefix_cacheable", []),
    # not a table
    ([1, 2], ConfigError, "not_a_table", "", ["list"]),
    # unknown retention spelling
    ({"groups": [FA16], "cache": {"retention_interval": "sparse"}}, ConfigError, "wrong_type",
     "cache.retention_interval", []),
]


@pytest.mark.parametrize(("config", "cls", "code", "field", "needles"), ERROR_TABLE)
def test_invalid_configs(config, cls, code, field, needles):
    with pytest.raises(cls) as info:
        kvgeom.resolve(config)
    err = info.value
    assert type(err) is cls
    codes = [(p.code, p.field) for p in err.problems]
    assert (code, field) in codes, codes
    message = str(err)
    for needle in needles:
        assert needle in message, (needle, message)
    assert isinstance(err, ValueError)


def test_several_problems_reported_at_once():
    config = {
        "groups": [
            {"kind": "full_attention", "block_size": 16},
            {"kind": "sliding_window", "block_size": 16, "sliding_window": 64},
            {"kind": "mamba", "block_size": 16, "dcp_sharded": True},
        ],
        "parallel": {"tp": 3, "dcp": 2},
    }
    with pytest.raises(GeometryError) as info:
        kvgeom.resolve(config)
    codes = {p.code for p in info.value.problems}
    assert codes == {"tp_not_divisible_by_dcp", "sharded_kind_under_dcp", "mamba_cannot_shard"}
    assert type(info.value) is GeometryError  # mixed classes -> the common base


def test_error_carries_numbers_as_attributes():
    with pytest.raises(ParallelismError) as info:
        kvgeom.resolve({"groups": [FA16], "parallel": {"tp": 3, "dcp": 2}})
    e = info.value
    assert (e.code, e.tp, e.dcp) == ("tp_not_divisible_by_dcp", 3, 2)
    assert e.values == {"tp": 3, "dcp": 2}
    again = pickle.loads(pickle.dumps(e))
    assert again.problems == e.problems


def test_direct_construction_raises_config_error():
    with pytest.raises(ConfigError) as info:
        kvgeom.FullAttentionSpec(block_size=-1)
    assert info.value.field == "block_size"
    with pytest.raises(ConfigError) as info:
        kvgeom.ParallelConfig(dcp=0)
    assert info.value.field == "parallel.dcp"


def test_file_errors(tmp_path):
    with pytest.raises(ConfigError) as info:
        kvgeom.resolve(tmp_path / "missing.json")
    assert info.value.code == "unreadable_file"
    bad = tmp_path / "bad.json"
    bad.write_text("{\"groups\": [")
    with pytest.raises(ConfigError) as info:
        kvgeom.resolve(bad)
    assert info.value.code == "unparsable_file" and "line 1" in str(info.value)
    badt = tmp_path / "bad.toml"
    badt.write_text("groups = [")
    with pytest.raises(ConfigError) as info:
        kvgeom.resolve(badt)
    assert info.value.code == "unparsable_file"
    yml = tmp_path / "g.yaml"
    yml.write_text(json.dumps({"groups": [FA16]}))
    with pytest.raises(ConfigError) as info:
        kvgeom.resolve(yml)
    assert info.value.code == "unknown_file_type"
