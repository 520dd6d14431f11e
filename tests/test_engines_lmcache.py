"""kvgeom's model of LMCache 0.5.6 (``kvgeom/engines/lmcache.py``): its invariants as property tests, its
findings' reproducers, and ``kvgeom check --lmcache``. Needs no LMCache: the model is checked against the
installed LMCache in ``tests/test_lmcache_conformance.py``."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

import kvgeom
from kvgeom.cli import main
from kvgeom.engines import lmcache as lm
from kvgeom.errors import GeometryError, KVGeomError
from kvgeom.strategies import configs

KINDS = ("full_attention", "mla", "mamba", "sliding_window", "chunked_local", "circular_buffer")


@given(configs(kinds=KINDS, max_groups=3, max_dcp=4, max_block_size=64, max_model_len=False))
def test_spans_and_scheduler_block(cfg):
    geom = kvgeom.resolve(cfg)
    dcp = geom.parallel.dcp
    spans = [lm.lmcache_span(g, dcp) for g in geom.groups]
    for g, s in zip(geom.groups, spans, strict=True):
        assert s % g.block_size == 0
        assert (s == 0) == (not g.prefix_cacheable)
        if dcp == 1 and g.prefix_cacheable and not geom.parallel.pcp_shards_kv:
            assert s == g.span  # at DCP 1 LMCache's spans are vLLM's
    live = [s for s in spans if s]
    if live:
        block = lm.scheduler_block(spans)
        assert all(block % s == 0 for s in live)
        assert block == math.lcm(*live)
    else:
        with pytest.raises(lm.LMCacheRefusal):
            lm.scheduler_block(spans)
    for p in lm.partings(geom):
        assert p.finding is None or p.finding in lm.FINDINGS
        assert p.lmcache != p.vllm


@given(st.lists(st.sampled_from([0, 1, 2, 4, 8, 16]), min_size=1, max_size=4), st.integers(1, 4),
       st.integers(0, 3))
def test_slicing_consecutive_ranges_concatenates(spans, k, cut):
    unit = math.lcm(*[s for s in spans if s] or [1])
    end = unit * (k + cut)
    ids = {g: list(range(100 * g, 100 * g + (end // s if s else 0))) for g, s in enumerate(spans)}
    whole = lm.slice_block_ids(ids, spans, 0, end)
    parts = [lm.slice_block_ids(ids, spans, 0, unit * k), lm.slice_block_ids(ids, spans, unit * k, end)]
    assert whole == [a + b for a, b in zip(*parts, strict=True)]


def test_slicing_refuses_off_grid_and_reversed_ranges():
    with pytest.raises(lm.LMCacheRangeError, match="off group 0's span grid") as e:
        lm.slice_block_ids({0: [1, 2]}, [16], 8, 16)
    assert e.value.values["span"] == 16
    with pytest.raises(lm.LMCacheRangeError, match="before its start"):
        lm.slice_block_ids({0: [1, 2]}, [16], 32, 16)


@given(st.integers(0, 5000), st.sampled_from([32, 256]))
def test_lookup_end_is_whole_chunks(n, chunk):
    geom = kvgeom.resolve(kvgeom.DEFAULT_CONFIG)
    g = lm.lmcache_geometry(geom, lm.LMCacheSettings(chunk_size=chunk))
    end = lm.lookup_end(g, n)
    assert end % chunk == 0 and end <= n and (end < n or n == 0)  # a Mamba hybrid holds back the last token


def test_identity_collision_is_symmetric_and_needs_a_layout_difference():
    one = lm.lmcache_geometry(kvgeom.resolve({"groups": [{"kind": "full_attention", "block_size": 16}]}))
    assert not lm.identities_collide(one, one)
    four = lm.lmcache_geometry(kvgeom.resolve({"groups": [{"kind": "full_attention", "block_size": 16}],
                                               "parallel": {"tp": 4, "dcp": 4, "cp_interleave": 16}}))
    assert four.identity.endswith("d4-interleave16")
    assert not lm.identities_collide(one, four) and not lm.identities_collide(four, one)


@pytest.mark.parametrize("fid", sorted(lm.FINDINGS))
def test_every_finding_reproducer_hits_it(fid):
    f = lm.FINDINGS[fid]
    cfg = {k: v for k, v in f.reproducer.items() if k != "lmcache"}
    found = lm.partings(kvgeom.resolve(cfg), lm.LMCacheSettings(**f.reproducer.get("lmcache", {})))
    assert fid in {p.finding for p in found}


@pytest.mark.parametrize("bad", [{"chunk_size": 0}, {"servers": -1}, {"chunk_size": 2.5}, {"model": ""},
                                 {"max_num_batched_tokens": True}, {"save_decode_cache": 1}])
def test_bad_settings_are_kvgeom_errors_naming_the_field(bad):
    with pytest.raises(lm.LMCacheSettingsError) as e:
        lm.LMCacheSettings(**bad)
    assert isinstance(e.value, KVGeomError) and e.value.field == f"lmcache.{next(iter(bad))}"


def test_refusals_name_field_numbers_and_fix():
    geom = kvgeom.resolve({"groups": [{"kind": "full_attention", "block_size": 16}], "parallel": {"tp": 2, "dcp": 2}})
    with pytest.raises(lm.LMCacheRefusal) as e:
        lm.lmcache_geometry(geom, lm.LMCacheSettings(servers=2))
    assert e.value.code == "lmcache_servers" and e.value.values == {"servers": 2, "ranks": 2, "dcp": 2}
    assert "use at most 1 server" in str(e.value)


def _check(tmp_path, capsys, cfg, *args):
    path = tmp_path / "c.json"
    path.write_text(json.dumps(cfg))
    capsys.readouterr()
    code = main(["check", str(path), "--format", "json", *args])
    return code, json.loads(capsys.readouterr().out)["files"][0]["warnings"]


def test_check_warns_only_with_lmcache_in_front(tmp_path, capsys):
    cfg = lm.FINDINGS["replicated-attention-span"].reproducer
    code, warnings = _check(tmp_path, capsys, cfg)
    assert code == 0 and warnings == []
    code, warnings = _check(tmp_path, capsys, cfg, "--lmcache")
    assert code == 0 and [w["code"] for w in warnings] == ["lmcache_replicated_attention_span"]
    msg = warnings[0]["message"]
    assert "span 32 differs from vLLM's 16" in msg and "Consequence:" in msg and "Fix:" in msg
    code, _ = _check(tmp_path, capsys, cfg, "--lmcache", "--strict")
    assert code == 1
    _, warnings = _check(tmp_path, capsys, cfg, "--lmcache", "--lmcache-chunk-size", "48")
    assert "lmcache_refuses" in [w["code"] for w in warnings]


def test_the_docs_page_code_blocks_run():
    import re
    from pathlib import Path

    page = Path(__file__).resolve().parents[1] / "docs" / "engines" / "lmcache.md"
    blocks = re.findall(r"```python\n(.*?)```", page.read_text(encoding="utf-8"), flags=re.S)
    assert blocks
    for block in blocks:
        exec(compile(block, str(page), "exec"), {})
    text = page.read_text(encoding="utf-8")
    assert [fid for fid in lm.FINDINGS if f"**{fid}**" not in text] == []  # the page states every finding


@pytest.mark.skipif(__import__("importlib").util.find_spec("lmcache") is not None, reason="LMCache is installed")
def test_conform_without_lmcache_exits_2_naming_the_install(capsys):
    assert main(["conform", "--engine", "lmcache", "--examples", "5"]) == 2
    assert "lmcache is not installed" in capsys.readouterr().err


# ----------------------------------------------------------------- staging, hold-back, relocation, the chunk map

_SETTINGS = st.builds(lm.LMCacheSettings, chunk_size=st.sampled_from([64, 128, 256, 512]))


@given(configs(kinds=KINDS, max_groups=3, max_dcp=4, max_block_size=64, max_model_len=False), _SETTINGS,
       st.integers(0, 3))
def test_staged_ids_are_each_chunks_tail(cfg, settings, chunks):
    geom = kvgeom.resolve(cfg)
    try:
        g = lm.lmcache_geometry(geom, settings)
    except lm.LMCacheRefusal:
        return
    C = settings.chunk_size
    ids = {i: list(range(1000 * i, 1000 * i + chunks * C // s)) for i, s in enumerate(g.spans) if s}
    staged = lm.stage_block_ids(g, ids, chunks)
    for i, span in enumerate(g.spans):
        keep = g.staged_blocks[i]
        assert keep <= (C // span if span else 0)
        assert len(staged[i]) == chunks * keep
        for c in range(chunks):  # chunk c's staged ids are the last `keep` of its slice
            part = lm.slice_block_ids(ids, g.spans, c * C, (c + 1) * C)[i]
            assert staged[i][c * keep:(c + 1) * keep] == (part[len(part) - keep:] if keep else [])
        w = g.windows[i]
        if span and (w is None or w >= C):
            assert keep == C // span  # nothing windowed below a chunk: every block is staged


def test_staging_rows():
    # LMCache's own example (downsample_and_stage_block_ids): window 64 of 32-token blocks, 128-token chunks
    geom = kvgeom.resolve({"groups": [{"kind": "full_attention", "block_size": 32},
                                      {"kind": "sliding_window", "block_size": 32, "sliding_window": 64}]})
    g = lm.lmcache_geometry(geom, lm.LMCacheSettings(chunk_size=128))
    assert lm.stage_block_ids(g, {0: list(range(1, 9)), 1: list(range(11, 19))}, 2) == [
        list(range(1, 9)), [13, 14, 17, 18]]
    # an align-mode Mamba group: one state per chunk, the one ending on the chunk's last token
    g = lm.lmcache_geometry(kvgeom.resolve(kvgeom.DEFAULT_CONFIG))
    assert g.windows == (None, 16) and g.staged_blocks == (8, 1)
    assert lm.stage_block_ids(g, {0: list(range(16)), 1: list(range(32))}, 2)[1] == [15, 31]


def test_window_off_the_span_grid_is_refused_by_the_workers():
    geom = kvgeom.resolve(lm.FINDINGS["window-grid"].reproducer)
    with pytest.raises(lm.LMCacheRefusal) as e:
        lm.lmcache_geometry(geom)
    assert e.value.code == "lmcache_window_grid"
    assert e.value.values == {"group": 1, "window": 40, "span": 16, "chunk_size": 256}
    assert lm.lmcache_geometry(geom, lm.LMCacheSettings(chunk_size=32)).staged_blocks == (2, 2)  # window >= chunk


def test_servers_must_split_the_ranks_evenly():
    geom = kvgeom.resolve({"groups": [{"kind": "full_attention", "block_size": 16}], "parallel": {"tp": 3}})
    with pytest.raises(lm.LMCacheRefusal) as e:
        lm.lmcache_geometry(geom, lm.LMCacheSettings(servers=2))
    assert e.value.code == "lmcache_servers_split" and e.value.values == {"servers": 2, "ranks": 3}
    geom = kvgeom.resolve({"groups": [{"kind": "full_attention", "block_size": 16}], "parallel": {"tp": 2, "pp": 2}})
    with pytest.raises(lm.LMCacheRefusal) as e:
        lm.lmcache_geometry(geom, lm.LMCacheSettings(servers=2))
    assert e.value.code == "lmcache_servers_pp"


def test_window_staging_short_needs_two_retained_tokens():
    def found(extra):
        geom = kvgeom.resolve({"groups": [{"kind": "full_attention", "block_size": 16}, {
            "kind": "sliding_window", "block_size": 16, "sliding_window": 64, "extra_retained_tokens": extra}]})
        return [(p.finding, p.lmcache, p.vllm) for p in lm.staging_partings(geom)]

    assert found(0) == [] and found(1) == []  # cdiv(63 + extra, 16) == 4 == 64 // 16
    assert found(2) == [("window-staging-short", 4, 5)]


@pytest.mark.parametrize(("cfg", "n", "end"), [
    ({"groups": [{"kind": "full_attention", "block_size": 16}]}, 512, 512),  # no Mamba: whole chunks
    (kvgeom.DEFAULT_CONFIG, 512, 256),  # align-mode Mamba: the last token is held back
    (kvgeom.DEFAULT_CONFIG, 513, 512),
    (kvgeom.DEFAULT_CONFIG, 256, 0),  # a one-chunk prompt: nothing left to look up
])
def test_lookup_end_rows(cfg, n, end):
    assert lm.lookup_end(lm.lmcache_geometry(kvgeom.resolve(cfg)), n) == end


def test_relocation_window_is_the_draft_count_in_align_mode_only():
    base = {"groups": [{"kind": "full_attention", "block_size": 16},
                       {"kind": "mamba", "block_size": 16, "mamba_cache_mode": "align"}]}
    spec = {"speculative": {"method": "mtp", "num_speculative_tokens": 3}}
    assert lm.relocation_window(kvgeom.resolve(base)) == 0
    assert lm.relocation_window(kvgeom.resolve({**base, **spec})) == 3
    full = {"groups": [{"kind": "full_attention", "block_size": 16}]}
    assert lm.relocation_window(kvgeom.resolve({**full, **spec})) == 0


@given(configs(kinds=KINDS, max_groups=3, max_dcp=2, max_block_size=32, max_model_len=False, offload=True),
       _SETTINGS, st.integers(0, 1500))
def test_chunk_map_tiles_whole_chunks_and_reverses(cfg, settings, n):
    geom = kvgeom.resolve(cfg)
    try:
        cover = lm.chunk_map(geom, n, settings)
    except lm.LMCacheRefusal:
        return
    C, H = settings.chunk_size, geom.hash_block_size
    assert [(c.start, c.end) for c in cover] == [(i * C, (i + 1) * C) for i in range(n // C)]  # partial dropped
    g = lm.lmcache_geometry(geom, settings)
    for c in cover:
        assert c.hash_index == (c.end // H - 1 if c.end % H == 0 else None)
        for key in c.keys:  # the reverse map finds the chunk back
            assert c.chunk in lm.chunks_of_key(geom, key, settings)
        for i, r in enumerate(c.lmcache_blocks):
            assert all(lm.lmcache_chunk_of_block(geom, i, e, settings) == c.chunk for e in r)
            assert (r == c.blocks[i]) == (g.spans[i] == geom.groups[i].span or not g.spans[i])
            assert list(c.staged[i]) == list(r)[len(r) - g.staged_blocks[i]:] if g.staged_blocks[i] else not c.staged[i]


def test_chunk_map_errors_name_the_field():
    geom = kvgeom.resolve({**kvgeom.DEFAULT_CONFIG, "offload": {}})
    with pytest.raises(KVGeomError) as e:
        lm.chunk_map(geom, -1)
    assert e.value.field == "num_tokens"
    from kvgeom.keys import OffloadKey
    with pytest.raises(KVGeomError) as e:
        lm.chunks_of_key(geom, OffloadKey(-5, 0))
    assert e.value.code == "not_a_chunk_key"
    with pytest.raises(KVGeomError) as e:
        lm.stage_block_ids(lm.lmcache_geometry(geom), {}, -1)
    assert e.value.field == "num_chunks"


# --------------------------------------------------------------------------- vLLM 0.33's newer spec kinds (issue 19)

_FA = {"kind": "full_attention", "block_size": 16}
_MB = {"kind": "mamba", "block_size": 32, "mamba_cache_mode": "align"}
_RSWA = {"kind": "rswa", "block_size": 16, "rswa_window": 40}
_HOT = {"kind": "hisparse_hot", "block_size": 16, "blocks_per_request": 4}
_RES = {"kind": "hisparse_resident", "block_size": 16}
_ENC = {"kind": "encoder_only", "block_size": 16}
_DCP2 = {"tp": 2, "dcp": 2}

#: (config, LMCache's refusal code or None, spans, scheduler block, staged block ids per 256-token chunk), each
#: row as LMCache 0.5.6 answered it on vLLM 0.33's spec objects (tests/test_lmcache_conformance.py reruns them)
KIND_ROWS = [
    # rswa alone: an attention class, span = block, every block of a chunk staged (no window for LMCache)
    ({"groups": [_RSWA]}, None, [16], 16, [16]),
    # rswa before full attention: both full-attention-like
    ({"groups": [_RSWA, _FA]}, None, [16, 16], 16, [16, 16]),
    # beside full attention and align-mode Mamba: the Mamba group stages its last block only
    ({"groups": [_FA, _MB, _RSWA]}, None, [16, 32, 16], 32, [16, 1, 16]),
    # under DCP rswa is sharded like full attention: span block * dcp on both sides
    ({"groups": [_FA, _RSWA], "parallel": _DCP2}, None, [32, 32], 32, [8, 8]),
    # HiSparse hot alone: a scratch group, nothing to store; LMCache refuses (max() of no span)
    ({"groups": [_HOT]}, "lmcache_no_cacheable_group", None, None, None),
    # HiSparse hot beside full attention: span 0, no block staged
    ({"groups": [_HOT, _FA]}, None, [0, 16], 16, [0, 16]),
    ({"groups": [_FA, _MB, _HOT]}, None, [16, 32, 0], 32, [16, 1, 0]),
    ({"groups": [_FA, _HOT], "parallel": _DCP2}, None, [32, 0], 32, [8, 0]),
    # HiSparse resident: the same as hot
    ({"groups": [_RES]}, "lmcache_no_cacheable_group", None, None, None),
    ({"groups": [_RES, _FA]}, None, [0, 16], 16, [0, 16]),
    ({"groups": [_FA, _MB, _RES]}, None, [16, 32, 0], 32, [16, 1, 0]),
    ({"groups": [_FA, _RES], "parallel": _DCP2}, None, [32, 0], 32, [8, 0]),
    # an encoder-only model: LMCache's scheduler assumes one group of block * dcp, its worker fails to register
    ({"groups": [_ENC]}, "lmcache_worker_no_kv_cache", [16], 16, None),
    ({"groups": [_ENC], "parallel": _DCP2}, "lmcache_worker_no_kv_cache", [32], 32, None),
    # the encoder-only group beside others never reaches LMCache: span 0, nothing staged
    ({"groups": [_FA, _ENC]}, None, [16, 0], 16, [16, 0]),
    ({"groups": [_FA, _MB, _ENC]}, None, [16, 32, 0], 32, [16, 1, 0]),
    ({"groups": [_FA, _ENC], "parallel": _DCP2}, None, [32, 0], 32, [8, 0]),
]


@pytest.mark.parametrize(("cfg", "refused", "spans", "block", "staged"), KIND_ROWS)
def test_new_kinds_rows_from_lmcache_runs(cfg, refused, spans, block, staged):
    geom = kvgeom.resolve(cfg)
    sheet = lm.sheet(geom)
    assert sheet.get("refused_code") == refused
    assert sheet.get("spans") == spans and sheet.get("scheduler_block") == block
    if refused is None:
        assert list(lm.lmcache_geometry(geom).staged_blocks) == staged
    assert all(p.finding in lm.FINDINGS for p in lm.partings(geom))  # every difference from vLLM is registered


@given(configs(max_groups=3, max_dcp=4, max_block_size=64, max_model_len=False))
def test_lmcache_spans_are_one_per_group_and_an_encoder_group_changes_nothing(cfg):
    geom = kvgeom.resolve(cfg)
    spans = lm.lmcache_spans(geom)
    assert len(spans) == len(geom.groups)
    assert all(s % g.block_size == 0 for g, s in zip(geom.groups, spans, strict=True))
    others = [g for g in cfg["groups"] if g["kind"] != "encoder_only"]
    if len(others) == len(cfg["groups"]) or not others:
        return
    without = kvgeom.resolve({**cfg, "groups": others})
    assert spans[-1] == 0 and list(spans[:-1]) == list(lm.lmcache_spans(without))
    a, b = lm.sheet(geom), lm.sheet(without)
    assert a.get("refused_code") == b.get("refused_code") and a.get("scheduler_block") == b.get("scheduler_block")


#: (rswa_window, LMCache settings, entries LMCache stores that vLLM has freed) for full attention + rswa, 16-token
#: blocks, as LMCache 0.5.6's store metadata and vLLM 0.33's coordinator answered them
DECODE_ROWS = [
    (40, {}, []),  # LMCache's default stores prompt chunks only: nothing vLLM frees
    (40, {"save_decode_cache": True}, [*range(16, 29), *range(32, 45)]),  # 13 of 16 entries of each decode chunk
    (40, {"save_decode_cache": True, "chunk_size": 64}, [4, 8]),  # one entry of each 64-token decode chunk
    (40, {"save_decode_cache": True, "chunk_size": 48}, []),  # chunk <= window + span: freed only after storing
    (300, {"save_decode_cache": True}, []),  # a window wider than the chunk
]


@pytest.mark.parametrize(("window", "opts", "freed"), DECODE_ROWS)
def test_decode_store_rows_from_lmcache_runs(window, opts, freed):
    geom = kvgeom.resolve({"groups": [_FA, {"kind": "rswa", "block_size": 16, "rswa_window": window}]})
    settings = lm.LMCacheSettings(**opts)
    assert lm.decode_stored_freed(geom, settings) == {1: freed}
    assert [p.finding for p in lm.partings(geom, settings)] == (["rswa-decode-store"] if freed else [])


@given(st.sampled_from([1, 2, 4, 8, 16]), st.integers(0, 200), st.integers(1, 8), st.booleans())
def test_decode_store_frees_iff_saving_and_the_chunk_outgrows_window_plus_span(block, window, k, save):
    geom = kvgeom.resolve({"groups": [{"kind": "rswa", "block_size": block, "rswa_window": window}]})
    chunk = k * 16
    freed = lm.decode_stored_freed(geom, lm.LMCacheSettings(chunk_size=chunk, save_decode_cache=save))[0]
    assert bool(freed) == (save and window + block < chunk)
    assert all(chunk // block <= b < (1 + lm.DECODE_PROBE_CHUNKS) * chunk // block for b in freed)  # decode chunks


# compressed attention under DCP: (block, dcp, tokens_per_state, chunk) -> LMCache's refusal code, from
# LMCache 0.5.6's worker registration run on vLLM 0.33's specs (tests/test_lmcache_conformance.py)
COMPRESSED_ROWS = [
    (33, 2, 2, 264, "lmcache_compressed_grid"),
    (7, 2, 2, 224, "lmcache_compressed_grid"),
    (7, 2, 2, 14, "lmcache_compressed_grid"),
    (32, 2, 2, 256, None),
    (34, 2, 2, 272, None),
]


@pytest.mark.parametrize(("block", "dcp", "tps", "chunk", "refused"), COMPRESSED_ROWS)
def test_compressed_grid_rows_from_lmcache_runs(block, dcp, tps, chunk, refused):
    geom = kvgeom.resolve({"groups": [{"kind": "full_attention", "block_size": block, "tokens_per_state": tps}],
                           "parallel": {"tp": dcp, "dcp": dcp}})
    s = lm.LMCacheSettings(chunk_size=chunk)
    assert lm.sheet(geom, s).get("refused_code") == refused
    if refused:
        with pytest.raises(lm.LMCacheRefusal) as e:
            lm.lmcache_geometry(geom, s)
        slots = block // tps
        assert e.value.field == "groups[0].block_size"
        assert e.value.values == {"group": 0, "span": block * dcp, "states_per_block": slots, "block_size": block,
                                  "tokens_per_state": tps}
        assert f"multiple of tokens_per_state ({tps})" in str(e.value)
        assert "compressed-grid" in {p.finding for p in lm.partings(geom, s)}


def test_a_block_holding_no_state_is_refused_before_lmcache():
    # tokens_per_state above the per-rank block: vLLM 0.33 cannot plan the cache (a 0-byte page: its
    # get_kv_cache_config_from_groups raises ZeroDivisionError, run), so kvgeom refuses the geometry and there
    # is no LMCache registration to predict
    with pytest.raises(GeometryError) as e:
        kvgeom.resolve({"groups": [{"kind": "full_attention", "block_size": 1, "tokens_per_state": 2}],
                        "parallel": {"tp": 2, "dcp": 2}})
    assert [(p.code, p.field) for p in e.value.problems] == [("block_smaller_than_state", "groups[0].tokens_per_state")]


@st.composite
def _compressed_configs(draw: st.DrawFn) -> dict:
    """Compressed attention (tokens_per_state 2-8) beside an optional plain group, DCP 1-4, blocks 1-64 that
    prefix-cache hits land on (vLLM's A is a multiple of tokens_per_state)."""
    dcp, tps = draw(st.integers(1, 4)), draw(st.integers(2, 8))
    block = draw(st.integers(1, 64).filter(lambda b: b * dcp % tps == 0))
    groups = [{"kind": draw(st.sampled_from(["full_attention", "mla"])), "block_size": block,
               "tokens_per_state": tps}]
    if draw(st.booleans()):
        groups.append({"kind": "full_attention", "block_size": block})
    return {"groups": groups, "parallel": {"tp": dcp, "dcp": dcp}}


@given(_compressed_configs(), st.integers(1, 4))
def test_a_registered_compressed_group_spans_whole_blocks_of_states(cfg, k):
    try:
        geom = kvgeom.resolve(cfg)
    except KVGeomError:
        return  # e.g. two groups whose A is not a multiple of tokens_per_state
    s = lm.LMCacheSettings(chunk_size=k * geom.scheduler_block_size)
    for g in geom.groups:
        assert 0 <= lm.states_per_block(g) <= g.block_size
    try:
        lmg = lm.lmcache_geometry(geom, s)
    except lm.LMCacheRefusal as e:
        if e.code == "lmcache_compressed_grid":
            g = geom.groups[e.values["group"]]
            assert e.values["span"] % lm.states_per_block(g) != 0
        return
    for g, span in zip(geom.groups, lmg.spans, strict=True):
        slots = lm.states_per_block(g)
        assert not (span and slots) or span % slots == 0
