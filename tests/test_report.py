"""kvgeom.report: the contract dicts behind Geometry's query methods, and the explain text.

Rows check the report's stable key set, that ``vllm_names`` only adds names, that each ``*_dict`` is
exactly what the ``Geometry`` method returns (the one door forwards, nothing else), and the drafter lines
of ``explain_lines``. The whole explain text is pinned by tests/golden (explain-default*.txt and the API
corpus).
"""

from __future__ import annotations

import pytest

import kvgeom
from kvgeom import report

SEED = kvgeom.resolve(kvgeom.DEFAULT_CONFIG)  # full attention 16 + Mamba 16 at TP 2 / DCP 2, offload k = 1
EAGLE = kvgeom.resolve(
    {
        "groups": [
            {"kind": "full_attention", "block_size": 16},
            {"kind": "mamba", "block_size": 16},
            {"kind": "full_attention", "block_size": 16, "num_kv_heads": 4, "drafter": True},
        ],
        "parallel": {"tp": 2, "dcp": 2},
        "offload": {},
        "speculative": {"method": "eagle", "num_speculative_tokens": 2},
    }
)


def test_report_key_set_is_the_stable_contract():
    r = report.to_report(SEED)
    assert sorted(r) == [
        "fingerprint", "groups", "hash_block_size", "hit_alignment_tokens", "offload", "partial_hash_hits",
        "scheduler_block_size", "speculative", "warnings",
    ]
    # the seed hybrid: attention span 32 (16 x DCP 2), Mamba 16; L = 32, H = A = 16
    assert [g["span"] for g in r["groups"]] == [32, 16]
    assert (r["scheduler_block_size"], r["hash_block_size"], r["hit_alignment_tokens"]) == (32, 16, 16)
    assert r["speculative"] is None  # no drafter section


def test_vllm_names_only_add_keys_with_equal_values():
    plain, named = report.to_report(SEED), report.to_report(SEED, vllm_names=True)
    added = set(named) - set(plain)
    assert added == {"cache_hit_alignment_tokens", "enable_partial_hash_hits"}
    assert named["cache_hit_alignment_tokens"] == plain["hit_alignment_tokens"]
    assert named["enable_partial_hash_hits"] == plain["partial_hash_hits"]
    assert all(named[k] == plain[k] for k in plain if k not in {"groups", "offload"})
    assert [g["kv_cache_group_id"] for g in named["groups"]] == [0, 1]


@pytest.mark.parametrize(
    ("method", "scenario"),
    [
        # Mamba keys at 16, 32, 48 and attention keys at 32, 64: the hit is 48 (the last Mamba state)
        ("plan_hit", {"num_tokens": 64, "stored": {"0": [32, 64], "1": [16, 32, 48]}}),
        # GPU residency: attention blocks ending 32, 64 and one Mamba state at 48
        ("prefix_hit", {"num_tokens": 65, "resident": {"0": [32, 64], "1": [48]}}),
        # GPU hit 48 first, then the connector has nothing past it
        ("plan_request", {"num_tokens": 100, "resident": {"0": [32, 64], "1": [48]},
                          "stored": {"0": [32, 64], "1": [48]}}),
    ],
)
def test_geometry_methods_are_the_report_dicts(method, scenario):
    assert getattr(SEED, method)(scenario) == getattr(report, f"{method}_dict")(SEED, scenario)


def test_key_map_and_fingerprint_forward_to_report():
    assert SEED.key_map(64) == report.key_map_dict(SEED, 64)
    assert SEED.fingerprint() == report.fingerprint(SEED)
    assert SEED.to_report() == report.to_report(SEED)


def test_plan_hit_dict_row():
    got = report.plan_hit_dict(SEED, {"num_tokens": 64, "stored": {"0": [32, 64], "1": [16, 32, 48]}})
    # hit 48: attention keys 32 and 64 are loaded (block entries 0, 1); the Mamba key 48 fills state block 2
    assert got == {
        "hit_tokens": 48,
        "end_token": 48,
        "groups": [
            {"index": 0, "load_keys": [32, 64], "block_entries": [0, 1], "state_block": None},
            {"index": 1, "load_keys": [48], "block_entries": [2], "state_block": 2},
        ],
    }


def test_explain_lines_name_each_lane_and_what_the_drafter_changes():
    assert report.explain_lines(SEED) == []  # no speculative section: no lines
    lines = report.explain_lines(EAGLE)
    assert lines[0] == "speculative: method=eagle K=2 block_drop=on lookahead_hashes=off gpu_drop=on P=1"
    assert lines[1] == "  group 0 (full_attention): target lane"
    # Mamba never drops; its checkpoint moves down one A
    assert lines[2] == "  group 1 (mamba): target lane; no drop; its prefill checkpoint moves down one A=16"
    # the flagged drafter group: GPU proof margin H = 16, offload pops one extra chunk of its span 32
    assert lines[3].startswith("  group 2 (full_attention): drafter lane; eagle group; GPU lookup matches 16 tokens")
    assert lines[3].endswith("offload: queries one extra chunk of 32 and pops it")


def test_explain_text_heads_with_the_label_and_the_parallel_sizes():
    head = report.explain_text(SEED, "my.toml").splitlines()[:3]
    assert head[0] == "kvgeom geometry of my.toml"
    assert head[2].startswith("parallel: tp=2 dcp=2 pcp=1 pp=1 cp_interleave=1")
