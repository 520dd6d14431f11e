"""Strict reading of config files and dicts (issue 13, item 4): each row is input kvgeom used to misread."""

from __future__ import annotations

import json

import pytest

import kvgeom
from kvgeom.config import MAX_FILE_BYTES

MLA = {"kind": "mla", "block_size": 16}

FILE_ROWS = [
    # JSON duplicate keys were last-wins: block_size 0 then 64 checked green
    ("dup.json", '{"groups": [{"kind": "mla", "block_size": 0, "block_size": 64}]}', "duplicate_key", "'block_size'"),
    # two "groups" lists checked green against the second alone
    ("dup-groups.json", '{"groups": [{"kind": "mla", "block_size": 3}], "groups": [{"kind": "mla", "block_size": 8}]}',
     "duplicate_key", "'groups'"),
    # TOML: tomllib refuses a key given twice itself
    ("dup.toml", '[[groups]]\nkind = "mla"\nblock_size = 16\nblock_size = 32\n', "unparsable_file", "TOML"),
    # a huge integer was reported as "not valid TOML"
    ("big.json", '{"groups": [{"kind": "mla", "block_size": ' + "9" * 5000 + "}]}", "integer_too_large", "5000 digits"),
    ("big.toml", '[[groups]]\nkind = "mla"\nblock_size = ' + "9" * 5000 + "\n", "integer_too_large", "4300-digit"),
    # deep nesting escaped as a RecursionError
    ("deep.json", "[" * 100_000 + "]" * 100_000, "nested_too_deep", "too deeply"),
    ("deep.toml", "a = " + "[" * 100_000 + "]" * 100_000, "nested_too_deep", "too deeply"),
    # nesting the reader survives but no config has
    ("deep2.json", '{"groups": ' + "[" * 40 + "]" * 40 + "}", "nested_too_deep", "32 levels"),
    # read whole whatever the size
    ("huge.json", " " * (MAX_FILE_BYTES + 1), "file_too_large", str(MAX_FILE_BYTES)),
]


@pytest.mark.parametrize(("name", "text", "code", "says"), FILE_ROWS, ids=[r[0] for r in FILE_ROWS])
def test_file_is_refused(tmp_path, name, text, code, says):
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    with pytest.raises(kvgeom.ConfigError) as info:
        kvgeom.load_config(path)
    assert info.value.code == code
    assert says in str(info.value)
    assert "\n" not in str(info.value)


DICT_ROWS = [
    # booleans took "off", "no" and 1.0
    ({"groups": [MLA], "cache": {"prefix_caching": "off"}}, "cache.prefix_caching", "'off' (str)"),
    ({"groups": [MLA], "cache": {"prefix_caching": "no"}}, "cache.prefix_caching", "'no' (str)"),
    ({"groups": [{**MLA, "dcp_sharded": 1.0}]}, "groups[0].dcp_sharded", "1.0 (float)"),
    ({"groups": [MLA], "parallel": {"pcp_shards_kv": 1}}, "parallel.pcp_shards_kv", "1 (int)"),
    # integers took true (and 1.0 was refused, stays refused)
    ({"groups": [{"kind": "mla", "block_size": True}]}, "groups[0].block_size", "True (bool)"),
    ({"groups": [{"kind": "mla", "block_size": 16.0}]}, "groups[0].block_size", "16.0 (float)"),
    # schema_version took true
    ({"schema_version": True, "groups": [MLA]}, "schema_version", "True (bool)"),
    ({"schema_version": 1.0, "groups": [MLA]}, "schema_version", "1.0 (float)"),
    # an integer past int64 passed check and broke fingerprint JSON and messages
    ({"groups": [{"kind": "mla", "block_size": 2**63}]}, "groups[0].block_size", "9223372036854775808"),
    ({"groups": [{"kind": "mla", "block_size": 10**5000}]}, "groups[0].block_size", "about 5001 digits"),
    # fp8_ds_mla on a KV-head group passed check, then AssertionError in to_report/explain/compat
    ({"groups": [{"kind": "full_attention", "block_size": 16, "dtype": "fp8_ds_mla"}]}, "groups[0]", "fp8_ds_mla"),
    # an unknown key named like a kind lost its path
    ({"groups": [MLA], "mla": 1}, "mla", "unknown key 'mla'"),
    ({"groups": [{**MLA, "mamba": 1}]}, "groups[0].mamba", "unknown key 'mamba'"),
    # a key holding a newline split "one line per problem"
    ({"groups": [{**MLA, "a\nb": 1}]}, "groups[0].'a\\nb'", "unknown key 'a\\nb'"),
]


@pytest.mark.parametrize(("cfg", "field", "says"), DICT_ROWS)
def test_dict_is_refused_naming_what_was_given(cfg, field, says):
    with pytest.raises(kvgeom.ConfigError) as info:
        kvgeom.resolve(cfg)
    assert [p.field for p in info.value.problems] == [field]
    assert says in info.value.problems[0].message
    assert "\n" not in str(info.value)


def test_accepted_spellings_still_read():
    # the strict types refuse only what was misread: true/false, plain ints, "dense"
    cfg = kvgeom.load_config({"schema_version": 1, "groups": [{**MLA, "dcp_sharded": False}],
                              "cache": {"prefix_caching": False, "retention_interval": "dense"},
                              "parallel": {"tp": 2**62}})
    assert cfg.cache.prefix_caching is False and cfg.cache.retention_interval is None
    assert cfg.groups[0].dcp_sharded is False and cfg.parallel.tp == 2**62


def test_100k_unknown_keys_record_at_most_1000_problems():
    from kvgeom.errors import MAX_LISTED, MAX_PROBLEMS

    with pytest.raises(kvgeom.ConfigError) as info:
        kvgeom.resolve({"groups": [{**MLA, **{f"k{i}": 1 for i in range(100_000)}}]})
    problems = info.value.problems
    assert len(problems) == MAX_PROBLEMS + 1
    assert problems[-1].code == "too_many_problems" and str(100_000 - MAX_PROBLEMS) in problems[-1].message
    assert str(info.value).count("\n") == MAX_LISTED + 1  # header + 50 lines + the count line


def test_a_schema_problem_does_not_hide_a_parallel_layout_problem(tmp_path):
    # issue 22: an unknown key in groups stopped tp_not_divisible_by_dcp from being reported at all
    cfg = {"groups": [{"kind": "mla", "block_size": 64, "colour": 1}], "parallel": {"tp": 3, "dcp": 2}}
    path = tmp_path / "two.json"
    path.write_text(json.dumps(cfg), encoding="utf-8")
    for source in (cfg, path, str(path)):
        with pytest.raises(kvgeom.ConfigError) as e:
            kvgeom.resolve(source)
        assert [(p.code, p.field) for p in e.value.problems] == [
            ("unknown_key", "groups[0].colour"), ("tp_not_divisible_by_dcp", "parallel.dcp")]


def test_a_malformed_parallel_section_is_reported_once():
    cfg = {"groups": [{"kind": "mla", "block_size": 0}], "parallel": {"tp": 3, "dcp": -2}}
    with pytest.raises(kvgeom.ConfigError) as e:
        kvgeom.resolve(cfg)
    assert [p.field for p in e.value.problems] == ["groups[0].block_size", "parallel.dcp"]
