"""Cross-layout compatibility: examples (#41037; docs/fingerprint.md)."""

from __future__ import annotations

import json

import pytest

import kvgeom
from kvgeom.compat import compat, compat_main_text
from kvgeom.fingerprint import fingerprint
from kvgeom.resolution import resolve_block_sizes

HYBRID = {
    "groups": [
        {"kind": "full_attention", "block_size": 16, "num_kv_heads": 4, "head_size": 128, "dtype": "bfloat16"},
        {"kind": "mamba", "block_size": 16, "shapes": [[8, 64, 64]], "dtypes": ["float32"]},
    ],
    "offload": {},
}


def at(base, **parallel):
    return {**base, "parallel": parallel}


def codes(report, index):
    return [r.code for r in report.groups[index].reasons]


def test_prefill_dcp1_decode_dcp2():
    # prefill node TP 2 / DCP 1, decode node TP 2 / DCP 2 (the geometry of #49964): attention keys differ in span,
    # chunk and per-rank slicing; the replicated Mamba group (span 16 both sides) shares keys
    r = compat(at(HYBRID, tp=2, dcp=1), at(HYBRID, tp=2, dcp=2))
    assert not r.compatible and r.exit_code == 1
    assert codes(r, 0) == ["span", "chunk", "dcp_slicing"]
    assert codes(r, 1) == []
    span = r.groups[0].reasons[0]
    assert "blocks_per_chunk=2 on a and 1 on b" in span.remedy


def test_interleave_change_is_incompatible_and_explained():
    # docs/fingerprint.md: same DCP, different interleave -> vLLM's file tier would share keys; kvgeom says no, and why
    r = compat(at(HYBRID, tp=2, dcp=2, cp_interleave=1), at(HYBRID, tp=2, dcp=2, cp_interleave=16))
    assert not r.compatible
    assert codes(r, 0) == ["interleave"]
    assert r.groups[1].compatible
    assert "cp_interleave" in r.groups[0].reasons[0].message


def test_tp_change_moves_hybrid_block_41037():
    # #41037: TP 2 vs TP 4 resolve to attention blocks 144 vs 160 (arithmetic in test_resolution.py), so spans, pages
    # and the TP slicing all differ
    def layered(tp):
        return resolve_block_sizes(
            {
                "model": {
                    "layers": [
                        {"kind": "full_attention", "total_num_kv_heads": 8, "head_size": 128, "dtype": "bfloat16"},
                        {
                            "kind": "mamba",
                            "total_shapes": [[32, 64, 64], [3, 4096]],
                            "tp_axes": [0, None],
                            "dtypes": ["float32", "bfloat16"],
                        },
                    ]
                },
                "parallel": {"tp": tp},
                "offload": {},
            }
        ).config

    r = compat(layered(2), layered(4))
    assert not r.compatible
    assert {"span", "tp_slicing", "page_layout"} <= set(codes(r, 0))
    assert "--block-size 160" in r.groups[0].reasons[0].remedy
    assert {"span", "tp_slicing", "page_layout"} <= set(codes(r, 1))
    assert "hash_unit" in [x.code for x in r.reasons]


CASES = [
    # same layout written twice
    (at(HYBRID, tp=2, dcp=2), at(HYBRID, tp=2, dcp=2), True, []),
    # only max_model_len differs: not byte-relevant
    (at(HYBRID, tp=2), {**at(HYBRID, tp=2), "cache": {"max_model_len": 4096}}, True, []),
    # k differs
    (at(HYBRID, tp=2), {**at(HYBRID, tp=2), "offload": {"blocks_per_chunk": 2}}, False, ["chunk"]),
    # dtype differs
    (
        at(HYBRID, tp=2),
        {**at(HYBRID, tp=2), "groups": [{**HYBRID["groups"][0], "dtype": "fp8"}, HYBRID["groups"][1]]},
        False,
        ["page_layout"],
    ),
    # page fields only on one side
    (
        at(HYBRID, tp=2),
        {**at(HYBRID, tp=2), "groups": [{"kind": "full_attention", "block_size": 16}, HYBRID["groups"][1]]},
        False,
        ["page_layout_unknown"],
    ),
    # TP differs for GQA heads
    (at(HYBRID, tp=2), at(HYBRID, tp=4), False, ["tp_slicing"]),
]


@pytest.mark.parametrize(("a", "b", "ok", "group0"), CASES)
def test_compat_table(a, b, ok, group0):
    r = compat(a, b)
    assert r.compatible is ok
    assert codes(r, 0) == group0
    assert r.compatible == (fingerprint(a) == fingerprint(b))


def test_global_reasons():
    # different number of groups, no offload on one side, different PP
    one = {"groups": [HYBRID["groups"][0]], "offload": {}}
    r = compat(at(HYBRID, tp=2), at(one, tp=2))
    assert "group_count" in [x.code for x in r.reasons]
    assert codes(r, 1) == ["missing_group"]
    r = compat(at(HYBRID, tp=2), {**at(HYBRID, tp=2), "offload": None})
    assert [x.code for x in r.reasons] == ["offload_missing"]
    r = compat(at(HYBRID, tp=2, pp=2), at(HYBRID, tp=2))
    assert [x.code for x in r.reasons] == ["pp"]


def test_mla_tp_change_is_compatible():
    # MLA latents are whole on every TP rank: TP 2 / DCP 2 and TP 4 / DCP 2 share keys
    mla = {"groups": [{"kind": "mla", "block_size": 64, "head_size": 576, "dtype": "bfloat16"}], "offload": {}}
    assert compat(at(mla, tp=2, dcp=2), at(mla, tp=4, dcp=2)).compatible


def test_accepts_geometry_and_report_is_json():
    g = kvgeom.resolve(at(HYBRID, tp=2, dcp=2))
    r = compat(g, at(HYBRID, tp=2, dcp=1))
    d = json.loads(json.dumps(r.to_dict()))
    assert d["compatible"] is False and d["groups"][0]["reasons"][0]["code"] == "span"
    text = compat_main_text(r)
    assert text.startswith("NOT compatible") and "group 1 (mamba): compatible" in text
