"""Laws of the conformance checker's kvgeom side, on the cases the checker itself generates
(:func:`kvgeom.conformance.run.cases`): what kvgeom answers, what the tier holds, how sheets compare."""

from __future__ import annotations

import json

from hypothesis import example, given

import kvgeom
from kvgeom.conformance import RULES, classify, compare, kvgeom_answers, tier_contents
from kvgeom.conformance.run import cases
from kvgeom.deviations import DEVIATIONS

FA16_M24 = {"groups": [{"kind": "full_attention", "block_size": 16},
                       {"kind": "mamba", "block_size": 24, "mamba_cache_mode": "align"}], "offload": {}}


@example((FA16_M24, {"num_tokens": 80, "stored_tokens": 73, "local_computed_tokens": 0, "evict": []}))
@given(cases())
def test_kvgeom_sheet_restores_the_state_after_the_hit_end(case):
    cfg, scenario = case
    sheet = kvgeom_answers(kvgeom.resolve(cfg), scenario)
    for state in sheet.get("mamba_state_after", {}).values():
        assert state == sheet["end_token"]
    if "hit_tokens" in sheet:
        assert sheet["end_token"] == sheet["hit_tokens"] + (
            scenario["local_computed_tokens"] - scenario["local_computed_tokens"] % sheet["scheduler_block_size"])
    json.dumps(sheet)  # a sheet is JSON


@given(cases())
def test_tier_holds_only_stored_chunk_ends(case):
    cfg, scenario = case
    g = kvgeom.resolve(cfg)
    held = tier_contents(g, scenario)
    limit = min(scenario["stored_tokens"], scenario["num_tokens"])
    for og in g.offload.groups if g.offload else ():
        ends = held[og.index]
        assert ends == sorted(ends)
        assert all(e % og.tokens_per_chunk == 0 and 0 < e <= limit for e in ends)


@given(cases())
def test_a_sheet_never_differs_from_itself(case):
    cfg, scenario = case
    sheet = kvgeom_answers(kvgeom.resolve(cfg), scenario)
    assert compare(sheet, dict(sheet)) == []
    assert classify([], sheet, sheet) is None


def test_every_rule_is_a_registered_deviation():
    assert set(RULES) <= set(DEVIATIONS)
