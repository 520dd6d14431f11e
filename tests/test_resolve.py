"""The resolve pipeline (``kvgeom._resolve``) and the fields it decides once so no query recomputes them.

Example rows, then laws named after the invariant each field keeps:

* ``GroupGeometry.window_need`` is the connector's look-back, computed once from the spec; every
  connector-side rule reads it (the lookup's window scan, ``masks.swa_store_need``, ``hits.skipped_tokens``
  and its batch twin, ``OffloadGroupGeometry.window_chunks``);
* ``GroupGeometry.gpu_window_need`` is the GPU prefix cache's look-back; every GPU-side rule reads it
  (``prefix.lookup_groups`` ``window``/``chunk`` for the scalar, batch and router lookups, the ``sim``
  resume check, ``events`` windows, the explain text);
* ``Geometry.gpu_drop_groups`` equals :func:`kvgeom.speculative.gpu_dropping_groups` and is empty
  without a drafter.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import assume, example, given
from hypothesis import strategies as st

import kvgeom
from kvgeom import batch, geometry
from kvgeom._math import cdiv, rdown
from kvgeom.hits import skipped_tokens
from kvgeom.masks import swa_store_need
from kvgeom.router import lookup_groups
from kvgeom.specs import attention_chunk_size_of, sliding_window_of
from kvgeom.speculative import gpu_dropping_groups
from kvgeom.strategies import configs

SLIDING_EXTRA = {
    "groups": [
        {"kind": "full_attention", "block_size": 16},
        {"kind": "sliding_window", "block_size": 16, "sliding_window": 40, "extra_retained_tokens": 3},
    ],
    "offload": {},
}
EAGLE_DCP2 = {
    "groups": [
        {"kind": "full_attention", "block_size": 16},
        {"kind": "mamba", "block_size": 16},
        {"kind": "full_attention", "block_size": 16, "num_kv_heads": 4, "drafter": True},
    ],
    "parallel": {"tp": 2, "dcp": 2},
    "offload": {},
    "speculative": {"method": "eagle", "num_speculative_tokens": 2},
}


@pytest.mark.parametrize(
    ("cfg", "needs"),
    [
        # the default hybrid: full attention and Mamba have no bounded window
        (kvgeom.DEFAULT_CONFIG, [(None, None), (None, None)]),
        # sliding window 40 with 3 extra retained tokens: the connector needs 42, the GPU cache 39
        (SLIDING_EXTRA, [(None, None), (42, 39)]),
        # chunked local 64: the hit's own chunk, at most 63 positions, on both sides
        ({"groups": [{"kind": "chunked_local", "block_size": 16, "attention_chunk_size": 64}]}, [(63, 63)]),
        # a uniform group is decided by its first layer (the scheduler view)
        (
            {"groups": [{"kind": "uniform", "block_size": 16, "layers": [
                {"kind": "sliding_window", "block_size": 16, "sliding_window": 8},
                {"kind": "sliding_window", "block_size": 16, "sliding_window": 8}]}]},
            [(7, 7)],
        ),
        # a sliding window of 1 needs no position before the hit
        ({"groups": [{"kind": "sliding_window", "block_size": 16, "sliding_window": 1}]}, [(0, 0)]),
    ],
)
def test_window_need_examples(cfg, needs):
    geom = kvgeom.resolve(cfg)
    assert [(g.window_need, g.gpu_window_need) for g in geom.groups] == needs


def test_gpu_drop_groups_examples():
    # no drafter: empty
    assert kvgeom.resolve(kvgeom.DEFAULT_CONFIG).gpu_drop_groups == frozenset()
    # offload section = connector, so no lookahead hashes: the GPU drop is on for the flagged group only
    assert kvgeom.resolve(EAGLE_DCP2).gpu_drop_groups == frozenset({2})
    # lookahead hashes (no connector) prove the boundary token: no GPU drop
    cfg = {**EAGLE_DCP2, "offload": None}
    assert kvgeom.resolve(cfg).gpu_drop_groups == frozenset()


def test_geometry_resolve_is_the_same_function_for_old_callers():
    # kvgeom.geometry.resolve is served at call time (PEP 562), never imported by geometry.py itself
    assert geometry.resolve is kvgeom.resolve
    with pytest.raises(AttributeError):
        _ = geometry.no_such_name  # type: ignore[attr-defined]


@st.composite
def geometries(draw: st.DrawFn) -> kvgeom.Geometry:
    """Drawn configs, some with a drafter (multi-module MTP gives sliding windows extra retained tokens)."""
    cfg: dict[str, Any] = draw(configs(max_dcp=8, max_block_size=64, max_groups=3))
    if draw(st.booleans()):
        k = draw(st.integers(1, 3))
        groups = [{**g, "drafter": True} if g["kind"] != "mamba" and draw(st.booleans()) else g
                  for g in cfg["groups"]]
        cfg = {**cfg, "groups": groups, "speculative": {
            "method": draw(st.sampled_from(["eagle", "eagle3", "mtp", "dflash"])), "num_speculative_tokens": k,
            "mtp_modules": draw(st.integers(1, 3)), "lookahead_hashes": draw(st.booleans())}}
    try:
        return kvgeom.resolve(cfg)
    except kvgeom.KVGeomError:
        assume(False)
        raise


@example(geom=kvgeom.resolve(SLIDING_EXTRA))
@example(geom=kvgeom.resolve(EAGLE_DCP2))
@given(geom=geometries())
def test_window_need_is_what_every_connector_call_site_computes(geom):
    for g in geom.groups:
        window, size = sliding_window_of(g.spec), attention_chunk_size_of(g.spec)
        assert (g.window_need is None) == (window is None and size is None)
        if window is not None:
            assert g.window_need == window[0] - 1 + window[1]
            assert swa_store_need(g, g.span) == cdiv(g.window_need, g.span)  # masks store side
        ends = [0, 1, g.span, 3 * g.span + 1, 1000]
        scalar = [skipped_tokens(geom, g.index, n) for n in ends]  # hits.skipped_tokens
        assert batch.skipped_tokens(geom, g.index, np.array(ends)).tolist() == scalar  # batch._skipped
        if g.family == "sliding":
            assert g.window_need is not None
            assert scalar == [max(n - g.window_need, 0) for n in ends]
        elif g.family == "chunked":
            assert g.window_need is not None
            assert scalar == [rdown(n, g.window_need + 1) for n in ends]


@example(geom=kvgeom.resolve(SLIDING_EXTRA))
@given(geom=geometries())
def test_gpu_window_need_is_what_every_gpu_call_site_computes(geom):
    for g in geom.groups:
        window, size = sliding_window_of(g.spec), attention_chunk_size_of(g.spec)
        assert (g.gpu_window_need is None) == (g.window_need is None)
        if g.window_need is not None:
            assert g.gpu_window_need is not None and g.window_need >= g.gpu_window_need
        if window is not None:  # prefix._lookup / explain, batch.prefix, sim, events, cli: window[0] - 1
            assert g.gpu_window_need == window[0] - 1
        if size is not None:  # prefix / sim / cli chunked local: the chunk itself
            assert g.gpu_window_need == size - 1
    try:
        groups = lookup_groups(geom)
    except kvgeom.QueryError:  # a layout vLLM has no lookup for (cross attention, chunked local off A)
        return
    for lg in groups:  # router: window and chunk per lookup group
        g = geom.groups[lg.group_ids[0]]
        w = g.gpu_window_need
        assert lg.window == (w + 1 if g.family == "sliding" and w is not None else None)
        assert lg.chunk == (w + 1 if g.family == "chunked" and w is not None else None)


@example(geom=kvgeom.resolve(SLIDING_EXTRA))
@given(geom=geometries())
def test_window_chunks_cover_the_window_need(geom):
    if geom.offload is None:
        return
    for og in geom.offload.groups:
        g = geom.groups[og.index]
        C = og.tokens_per_chunk
        match g.family:
            case "sliding":
                assert g.window_need is not None and g.gpu_window_need is not None
                assert og.window_chunks == max(cdiv(g.gpu_window_need + 1, C), cdiv(g.window_need, C))
            case "chunked":
                assert g.window_need is not None
                assert og.window_chunks == cdiv(g.window_need + 1, C)
            case "mamba":
                assert og.window_chunks == 1
            case _:
                assert og.window_chunks is None


@example(geom=kvgeom.resolve(EAGLE_DCP2))
@given(geom=geometries())
def test_gpu_drop_groups_is_the_dropping_set(geom):
    assert geom.gpu_drop_groups == gpu_dropping_groups(list(geom.groups), geom.speculative)
    if geom.speculative is None or not geom.speculative.gpu_drop:
        assert geom.gpu_drop_groups == frozenset()


def test_hash_lookahead_tokens_is_p_only_under_lookahead_hashes():
    # with an offload section (a KV connector) there are no lookahead hashes: 0
    assert kvgeom.resolve(EAGLE_DCP2).hash_lookahead_tokens == 0
    # without a connector the hashes look ahead P = 1 token (EAGLE)
    no_connector = kvgeom.resolve({**EAGLE_DCP2, "offload": None})
    assert no_connector.speculative.lookahead_hashes
    assert no_connector.hash_lookahead_tokens == no_connector.speculative.prefill_lookahead_tokens == 1
    # no drafter: 0
    assert kvgeom.resolve(kvgeom.DEFAULT_CONFIG).hash_lookahead_tokens == 0


@given(geom=geometries())
def test_hash_lookahead_tokens_equals_p_under_lookahead_hashes_else_zero(geom):
    sg = geom.speculative
    want = sg.prefill_lookahead_tokens if sg is not None and sg.lookahead_hashes else 0
    assert geom.hash_lookahead_tokens == want
