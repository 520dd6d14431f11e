"""Law: every config ``kvgeom check`` accepts can be reported, explained, drawn and fingerprinted.

A CI gate that passes a file the other commands then crash on (issue 13: ``dtype = "fp8_ds_mla"`` on a
full-attention group passed ``check`` and then raised an AssertionError in ``to_report``, ``explain`` and
``compat``) is worse than one that fails. So: ``resolve`` succeeds  =>  ``to_report()`` (and its JSON),
the ``kvgeom explain`` text (with and without a prefix), the ``kvgeom diagram`` SVG and the fingerprint all
succeed too. Configs come from :mod:`kvgeom.strategies`, optionally with page-shape fields of any dtype added
to each attention group (which ``check`` then either accepts or refuses).
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from typing import Any

from hypothesis import example, given
from hypothesis import strategies as st

import kvgeom
from kvgeom.diagram import default_prefix, render_svg
from kvgeom.report import explain_text
from kvgeom.specs import DTYPE_BYTES
from kvgeom.strategies import configs

_ATTENTION = {"full_attention", "sink_full_attention", "sliding_window", "chunked_local", "cross_attention",
              "circular_buffer", "mla", "sliding_window_mla"}


@st.composite
def _with_page_fields(draw: st.DrawFn, cfg: dict[str, Any]) -> dict[str, Any]:
    groups = []
    for g in cfg["groups"]:
        if g["kind"] in _ATTENTION and draw(st.booleans()):
            g = {**g, "num_kv_heads": draw(st.integers(1, 8)), "head_size": draw(st.sampled_from([64, 128, 576])),
                 "dtype": draw(st.sampled_from(sorted(DTYPE_BYTES)))}
            if g["kind"] in {"mla", "sliding_window_mla"}:
                del g["num_kv_heads"]
        groups.append(g)
    return {**cfg, "groups": groups}


FP8_DS_MLA_ON_FULL = {"groups": [{"kind": "full_attention", "block_size": 16, "dtype": "fp8_ds_mla"}]}
FP8_DS_MLA_ON_MLA = {"groups": [{"kind": "mla", "block_size": 64, "dtype": "fp8_ds_mla"}], "offload": {}}


@example(cfg=FP8_DS_MLA_ON_FULL)  # issue 13: passed check, then AssertionError in to_report/explain/compat
@example(cfg=FP8_DS_MLA_ON_MLA)  # the packed format where it belongs: accepted, and every report works
@example(cfg=kvgeom.DEFAULT_CONFIG)
@example(cfg={  # thorough profile: L = 5316 with span-1 lanes; the default diagram was refused as too large
    "groups": [{"block_size": 1, "dcp_sharded": False, "prefix_cacheable": False, "kind": "cross_attention"},
               {"block_size": 6, "kind": "full_attention"},
               {"block_size": 1, "dcp_sharded": False, "kind": "full_attention"}],
    "parallel": {"dcp": 886, "tp": 886, "cp_interleave": 1},
    "cache": {"prefix_caching": True, "max_model_len": 1},
    "offload": {},
})
@given(cfg=st.one_of(configs(), configs().flatmap(_with_page_fields)))
def test_check_accepts_means_reported_explained_drawn_fingerprinted(cfg):
    try:
        geom = kvgeom.resolve(cfg)
    except kvgeom.KVGeomError:
        return  # check refuses it: nothing further is promised
    report = geom.to_report()
    assert json.loads(json.dumps(report)) == report
    assert report["fingerprint"] == geom.fingerprint() == kvgeom.fingerprint(cfg)
    text = explain_text(geom, "cfg")
    assert f"layout fingerprint: {report['fingerprint']}" in text
    prefix = default_prefix(geom)
    assert "token axis" in explain_text(geom, "cfg", prefix)
    root = ET.fromstring(render_svg(geom))
    lanes = [g for g in root.iter("{http://www.w3.org/2000/svg}g") if g.get("class") == "lane"]
    assert len(lanes) == len(geom.groups)


def test_fp8_ds_mla_on_a_kv_head_group_is_refused_by_check():
    # refused with the field and the fix, not accepted and crashed on later
    try:
        kvgeom.resolve(FP8_DS_MLA_ON_FULL)
    except kvgeom.ConfigError as e:
        assert e.field == "groups[0]" and "fp8_ds_mla" in str(e) and "mla" in str(e)
    else:
        raise AssertionError("fp8_ds_mla on full_attention was accepted")
