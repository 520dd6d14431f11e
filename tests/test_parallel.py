"""Example tables for ``kvgeom.parallel``: how ranks split a KV cache (``ParallelConfig``, ``kv_shards``) and the
combinations vLLM 0.33's ``ParallelConfig`` rejects (``check_parallel``; ``config/parallel.py``). Each error row
checks the code, the field and the numbers the message quotes.
"""

from __future__ import annotations

import pytest

import kvgeom
from kvgeom.parallel import ParallelConfig, check_parallel


def test_defaults_are_vllms():
    # every size 1 and PCP not sharding KV (vLLM #46570)
    p = ParallelConfig()
    assert (p.dcp, p.pcp, p.cp_interleave, p.tp, p.pp, p.pcp_shards_kv) == (1, 1, 1, 1, 1, False)


@pytest.mark.parametrize(
    ("kw", "shards"),
    [
        ({}, 1),  # nothing parallel: one shard
        ({"tp": 2, "dcp": 2}, 2),  # DCP 2 deals positions over 2 ranks
        ({"tp": 8, "dcp": 8, "pp": 4}, 8),  # PP splits layers, not positions
        ({"tp": 4, "dcp": 2, "pcp": 2}, 2),  # PCP splits prefill compute and shards nothing (vLLM #46570)
        ({"tp": 4, "dcp": 2, "pcp": 2, "pcp_shards_kv": True}, 4),  # the design before #46570: dcp * pcp
        ({"tp": 2, "pcp": 4, "pcp_shards_kv": True}, 4),  # dcp 1 with pcp sharding: pcp alone
    ],
)
def test_kv_shards(kw, shards):
    assert ParallelConfig(**kw).kv_shards == shards


@pytest.mark.parametrize(
    ("kw", "code", "values", "words"),
    [
        # tp 3 is not divisible by dcp 2; the fix lists tp's divisors
        ({"tp": 3, "dcp": 2}, "tp_not_divisible_by_dcp", {"tp": 3, "dcp": 2}, ["tp=3", "dcp=2", "[1, 3]"]),
        # dcp larger than tp
        ({"tp": 4, "dcp": 8}, "tp_not_divisible_by_dcp", {"tp": 4, "dcp": 8}, ["tp=4", "dcp=8", "[1, 2, 4]"]),
        # PCP 2: dcp must be 1, pcp (2) or tp * pcp (8); 4 is none of them
        ({"tp": 4, "pcp": 2, "dcp": 4}, "pcp_dcp_combination", {"tp": 4, "dcp": 4, "pcp": 2},
         ["dcp=4", "pcp=2", "(dcp=2)", "(dcp=8)"]),
    ],
)
def test_check_parallel_errors(kw, code, values, words):
    [p] = check_parallel(ParallelConfig(**kw))
    assert (p.code, p.field, p.values) == (code, "parallel.dcp", values)
    assert all(w in p.message for w in words)


@pytest.mark.parametrize(
    "kw",
    [
        {"tp": 4, "dcp": 4},  # dcp equal to tp
        {"tp": 4, "pcp": 2, "dcp": 1},  # PCP without DCP
        {"tp": 4, "pcp": 2, "dcp": 2},  # DCP spanning the PCP axis
        {"tp": 4, "pcp": 2, "dcp": 8},  # DCP spanning TP x PCP
        {"tp": 3, "pcp": 2, "dcp": 2},  # with PCP the tp % dcp rule does not apply
    ],
)
def test_check_parallel_accepts(kw):
    assert check_parallel(ParallelConfig(**kw)) == []


def test_resolve_reports_check_parallel_as_a_parallelism_error():
    # the same problem through kvgeom.resolve, with the numbers as attributes
    with pytest.raises(kvgeom.ParallelismError) as info:
        kvgeom.resolve({"groups": [{"kind": "full_attention", "block_size": 16}], "parallel": {"tp": 3, "dcp": 2}})
    assert (info.value.code, info.value.field, info.value.tp, info.value.dcp) == (
        "tp_not_divisible_by_dcp", "parallel.dcp", 3, 2)


@pytest.mark.parametrize(
    ("data", "code", "field"),
    [
        ({"dcp": 0}, "out_of_range", "parallel.dcp"),  # sizes are positive
        ({"tpp": 2}, "unknown_key", "parallel.tpp"),  # extra="forbid": a misspelt key is an error
        ({"tp": "2"}, "wrong_type", "parallel.tp"),  # strict: no string-to-int conversion
    ],
)
def test_parallel_config_input_errors(data, code, field):
    with pytest.raises(kvgeom.ConfigError) as info:
        ParallelConfig.model_validate(data)
    assert (info.value.code, info.value.field) == (code, field)


def test_parallel_config_is_a_frozen_value():
    p = ParallelConfig(tp=2, dcp=2)
    assert ParallelConfig.model_validate(p.model_dump()) == p and hash(p) == hash(ParallelConfig(tp=2, dcp=2))
    with pytest.raises(ValueError):
        p.tp = 4
