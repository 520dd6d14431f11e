"""The GPU prefix-cache question of the conformance checker, without vLLM: kvgeom's answer, the
residencies and drafter configs the run draws, and how declined lookups are compared. The questions
asked of a real vLLM are in ``tests/test_conformance.py``."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import kvgeom
from kvgeom.conformance import QUESTIONS, compare, kvgeom_answers
from kvgeom.conformance.answers import check_scenario
from kvgeom.conformance.gpu_prefix import (
    PREFIX_QUESTIONS,
    check_resident,
    drafter_configs,
    gpu_residencies,
    prefix_answers,
)
from kvgeom.conformance.run import cases
from kvgeom.prefix import prefix_hit

DEFAULT = kvgeom.resolve(kvgeom.DEFAULT_CONFIG)  # full attention span 32 + Mamba 16, H = A = 16
#: chunked local (span 47) beside DCP-2 full attention (span 94): kvgeom (and vLLM) cannot look it up
CHUNKED_WIDE = kvgeom.resolve({
    "groups": [{"kind": "chunked_local", "block_size": 47, "dcp_sharded": False, "attention_chunk_size": 731},
               {"kind": "full_attention", "block_size": 47}],
    "parallel": {"dcp": 2, "tp": 2},
})


def test_prefix_questions_are_sheet_questions():
    assert set(PREFIX_QUESTIONS) <= set(QUESTIONS)


@pytest.mark.parametrize(
    "n, resident",
    [
        (100, {"0": [32, 64, 80], "1": [16, 48, 80]}),  # partial hash hit at 80 on both groups
        (100, {"0": [32, 64], "1": [16, 48, 80]}),  # attention stops at 64, Mamba holds no state there
        (70, {"0": [], "1": [16, 32]}),  # attention holds nothing: no hit
        (0, {}),  # empty request, empty cache
    ],
)
def test_kvgeom_answer_is_prefix_hit(n, resident):
    hit = prefix_hit(DEFAULT, n, resident)
    sheet = kvgeom_answers(DEFAULT, {"num_tokens": n, "gpu_resident": resident})
    assert sheet["prefix.hit_tokens"] == hit.hit_tokens
    assert sheet["prefix.groups"] == {str(g.index): list(g.end_tokens) for g in hit.groups}


def test_no_residency_no_prefix_answer():
    assert prefix_answers(DEFAULT, {"num_tokens": 80}) == {}
    assert not set(PREFIX_QUESTIONS) & set(kvgeom_answers(DEFAULT, {"num_tokens": 80}))


def test_declined_lookup_is_not_compared():
    ours = kvgeom_answers(CHUNKED_WIDE, {"num_tokens": 0, "gpu_resident": {}})
    assert ours["prefix.declined"] == "chunked_local_span_not_alignment"
    engine = {**ours, "prefix.error": "AssertionError (planted)", "prefix.hit_tokens": 0}
    del engine["prefix.declined"]
    assert compare(engine, ours) == []


def test_an_engine_crash_in_the_lookup_is_a_difference():
    ours = kvgeom_answers(DEFAULT, {"num_tokens": 40, "gpu_resident": {"0": [32]}})
    engine = {k: v for k, v in ours.items() if k not in PREFIX_QUESTIONS}
    engine["prefix.error"] = "AssertionError (planted)"
    assert [d.question for d in compare(engine, ours)] == [*PREFIX_QUESTIONS, "prefix.error"]


@pytest.mark.parametrize(
    "resident, code",
    [
        ([16], "bad_resident"),  # not a mapping
        ({"0": [8]}, "not_on_hash_grid"),  # 8 is not a multiple of H = 16
        ({"2": [16]}, "no_such_group"),  # two groups only
        ({"0": "16"}, "bad_resident"),  # a string is not a list of end tokens
    ],
)
def test_bad_residencies_are_query_errors(resident, code):
    with pytest.raises(kvgeom.QueryError) as e:
        kvgeom_answers(DEFAULT, {"num_tokens": 40, "gpu_resident": resident})
    assert e.value.problems[0].code == code


def test_residency_is_kept_by_check_scenario():
    assert check_scenario({"num_tokens": 4, "gpu_resident": {"0": []}})["gpu_resident"] == {"0": []}
    assert "gpu_resident" not in check_scenario({"num_tokens": 4})


@settings(max_examples=60, deadline=None)
@given(st.data(), drafter_configs(), st.integers(0, 200))
def test_residencies_hold_valid_entries_of_the_chain(data, cfg, n):
    geom = kvgeom.resolve(cfg)
    resident = data.draw(gpu_residencies(geom, n))
    assert check_resident(geom, resident) == resident  # normalised, on the H grid, cacheable groups
    assert set(resident) == {str(g.index) for g in geom.groups if g.prefix_cacheable}
    assert all(e <= n + 2 * geom.hash_block_size for ends in resident.values() for e in ends)
    sheet = prefix_answers(geom, {"num_tokens": n, "gpu_resident": resident})
    for g, ends in sheet.get("prefix.groups", {}).items():
        assert set(ends) <= set(resident.get(g, []))  # a hit reuses only resident entries


def test_drafter_configs_draw_drafters_with_and_without_the_gpu_drop():
    seen = set()

    @settings(max_examples=80, deadline=None, database=None)
    @given(drafter_configs())
    def collect(cfg):
        geom = kvgeom.resolve(cfg)
        assert any(g.eagle_group for g in geom.groups)
        seen.add(geom.speculative.gpu_drop)

    collect()
    assert seen == {True, False}


def test_every_case_carries_a_residency():
    @settings(max_examples=40, deadline=None, database=None)
    @given(cases())
    def check(case):
        cfg, scenario = case
        geom = kvgeom.resolve(cfg)
        assert check_resident(geom, scenario["gpu_resident"]) == scenario["gpu_resident"]

    check()
