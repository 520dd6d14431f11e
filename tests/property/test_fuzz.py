"""Fuzz laws: hostile input of any shape ends in a result or a ``KVGeomError``, quickly, in bounded words.

For the API entry points (``resolve``, ``load_config``, the vLLM adapter, ``key_map``, ``plan_hit``, the
rank and key queries, the batch functions) and for the CLI (``kvgeom.cli.main`` in-process, with files
written to a temporary directory):

* ``test_*_is_result_or_kvgeom_error``: the call returns or raises a :class:`kvgeom.KVGeomError` subclass,
  never a ``TypeError``/``RecursionError``/``AssertionError``/...;
* every message is bounded (``kvgeom.errors.MAX_MESSAGE`` characters, one line per problem, at most
  ``MAX_LISTED`` problems listed);
* the CLI exits 0, 1 or 2, never prints a traceback, and writes a bounded number of bounded stderr lines;
* each call finishes within :data:`CPU` seconds of this process's CPU time and :data:`WALL` seconds of
  wall-clock time (generous, and CPU time is what a loaded machine does not inflate: the bounds catch
  hangs and O(value) loops, which run for minutes, not to time anything).

Example counts follow the Hypothesis profile (a third of its ``max_examples``: 50 in ``ci``, 500 in
``thorough``). Each hang or crash class issue 13 reports has an explicit ``@example`` row or a test below.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import re
import time
from types import SimpleNamespace as NS
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import kvgeom
from kvgeom import _toml, batch, hits, keys, ranks
from kvgeom.adapters import vllm as adapter
from kvgeom.cli import main
from kvgeom.errors import MAX_FIELD, MAX_LISTED, MAX_MESSAGE

#: CPU seconds one call may take (the hangs this catches ran for minutes of CPU).
CPU = 15.0
#: Wall-clock seconds one call may take, on a loaded shared machine.
WALL = 120.0


@contextlib.contextmanager
def _timed(what: str) -> Any:
    t0, c0 = time.perf_counter(), time.process_time()
    yield
    cpu, wall = time.process_time() - c0, time.perf_counter() - t0
    assert cpu < CPU and wall < WALL, f"{what} took {cpu:.1f} s of CPU, {wall:.1f} s of wall-clock time"

FUZZ = settings(
    max_examples=max(settings.default.max_examples // 3, 10),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
)

# Hypothesis prints the strategies and failing values with repr(): a huge int would break that printing
# itself (Python's int-to-str digit limit), so huge values are produced by named functions from indices.
_HUGE = [2**53, 2**62, 2**63 - 1, 2**63, 2**64, -(2**63), 10**5000, -(10**5000), float("inf"), float("-inf"),
         float("nan"), 1e300]


def _huge(i: int) -> Any:
    return _HUGE[i]


def _odd(i: int) -> Any:
    return [np.int64(3), np.array(5), np.array([16, 32]), np.float64(1.5), np.bool_(True), b"16", 16.0,
            "16", " 1 ", "0_1", "\u0661", "x\ny", "x" * 5000, 1 + 2j, object(), NS(block_size=16)][i]


huge = st.integers(0, len(_HUGE) - 1).map(_huge)
odd = st.integers(0, 15).map(_odd)
scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.integers(-(2**70), 2**70), huge, st.floats(),
                    st.text(max_size=8), odd)
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6) | st.integers(-2, 3), inner,
                                                                 max_size=4),
    max_leaves=12,
)

_KEYS = ["groups", "parallel", "cache", "offload", "kind", "block_size", "layers", "dcp", "tp", "pcp",
         "cp_interleave", "sliding_window", "attention_chunk_size", "mamba_cache_mode", "blocks_per_chunk",
         "retention_interval", "prefix_caching", "schema_version", "dtype", "dcp_sharded", "mla"]
_KINDS = ["full_attention", "mla", "sliding_window", "chunked_local", "mamba", "uniform", "circular_buffer",
          "cross_attention", "sink_full_attention", "sliding_window_mla"]


@st.composite
def config_like(draw: st.DrawFn) -> Any:
    """Something near a config: real keys and kinds with arbitrary values, or an arbitrary value."""
    if draw(st.integers(0, 4)) == 0:
        return draw(values)
    group: dict[Any, Any] = {"kind": draw(st.sampled_from(_KINDS) | values)}
    for key in draw(st.lists(st.sampled_from(_KEYS), max_size=4)):
        group[key] = draw(values | st.integers(1, 2**63) | huge)
    cfg: dict[Any, Any] = {"groups": [group] * draw(st.integers(1, 3))}
    for section, fields in (("parallel", ["tp", "dcp", "pcp", "cp_interleave", "pcp_shards_kv"]),
                            ("cache", ["prefix_caching", "retention_interval", "prefix_match_unit"]),
                            ("offload", ["blocks_per_chunk", "block_size"])):
        if draw(st.booleans()):
            cfg[section] = {f: draw(st.integers(1, 2**63) | values) for f in draw(st.lists(st.sampled_from(fields),
                                                                                          max_size=3))}
    for key in draw(st.lists(st.sampled_from(_KEYS), max_size=2)):
        cfg[key] = draw(values)
    return cfg


def _check_error(e: kvgeom.KVGeomError) -> None:
    assert e.problems
    for p in e.problems:
        assert "\n" not in p.message and "\n" not in p.field
        assert len(p.message) <= MAX_MESSAGE + 40 and len(p.field) <= MAX_FIELD + 40
    text = str(e)
    assert text.count("\n") <= MAX_LISTED + 2
    assert len(text) <= (MAX_LISTED + 2) * (MAX_MESSAGE + MAX_FIELD + 100)


def _bounded(fn: Any, *args: Any, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)``: its result, or None after a well-formed KVGeomError; within WALL seconds."""
    with _timed(getattr(fn, "__name__", "call")):
        try:
            return fn(*args, **kwargs)
        except kvgeom.KVGeomError as e:
            _check_error(e)
            return None


DEFAULT = kvgeom.resolve(kvgeom.DEFAULT_CONFIG)
SWA = kvgeom.resolve({"groups": [{"kind": "full_attention", "block_size": 16},
                                 {"kind": "sliding_window", "block_size": 16, "sliding_window": 32}],
                      "offload": {}})
NO_OFFLOAD = kvgeom.resolve({"groups": [{"kind": "mla", "block_size": 64}], "parallel": {"tp": 4, "dcp": 4}})
GEOMS = st.sampled_from([DEFAULT, SWA, NO_OFFLOAD])


def _deep(n: int) -> Any:
    v: Any = 16
    for _ in range(n):
        v = [v]
    return v


# --------------------------------------------------------------------------- resolve, load_config, reports


#: The config classes of issue 13, one row each (built lazily: Hypothesis would print them on failure).
HOSTILE_CONFIGS = {
    "deep lists (RecursionError)": lambda: {"groups": _deep(5000)},
    "deep mapping": lambda: {"groups": [_deep_map(5000)]},
    "cyclic list": lambda: {"groups": _cyclic()},
    "int past the int-to-str limit": lambda: {"groups": [{"kind": "full_attention", "block_size": 10**5000}]},
    "10 MB kind name": lambda: {"groups": [{"kind": "x" * 10_000_000}]},
    "100k unknown keys": lambda: {"groups": [{"kind": "mla", "block_size": 16,
                                              **{f"k{i}": 1 for i in range(100_000)}}]},
    "key holding a newline": lambda: {"groups": [{"kind": "mla", "block_size": 16, "x\ny": 1}]},
    "tp near 2**53 (divisor list)": lambda: {"groups": [{"kind": "mla", "block_size": 16}],
                                             "parallel": {"tp": 2**53 + 1, "dcp": 2}},
    "1M-element list as a value": lambda: {"groups": [{"kind": "mla", "block_size": 16,
                                                       "dtype": list(range(10**6))}]},
    "fp8_ds_mla on full attention": lambda: {"groups": [{"kind": "full_attention", "block_size": 16,
                                                         "dtype": "fp8_ds_mla"}]},
    "schema_version true": lambda: {"schema_version": True, "groups": [{"kind": "mla", "block_size": 16}]},
    "boolean written off": lambda: {"groups": [{"kind": "mla", "block_size": 16}], "cache": {"prefix_caching": "off"}},
    "int written 1.0": lambda: {"groups": [{"kind": "mla", "block_size": 16.0}]},
}


def _deep_map(n: int) -> Any:
    v: Any = 16
    for _ in range(n):
        v = {"kind": v}
    return v


def _cyclic() -> Any:
    v: list[Any] = []
    v.append(v)
    return v


@pytest.mark.parametrize("name", sorted(HOSTILE_CONFIGS))
def test_each_issue_13_config_is_refused_quickly_in_bounded_words(name):
    cfg = HOSTILE_CONFIGS[name]()
    for fn in (kvgeom.resolve, kvgeom.fingerprint):
        with _timed(name), pytest.raises(kvgeom.KVGeomError) as info:
            fn(cfg)
        _check_error(info.value)
    _bounded(kvgeom.load_config, cfg)  # a well-formed file of an impossible geometry loads; the rest do not


@given(cfg=config_like())
@FUZZ
def test_resolve_is_result_or_kvgeom_error(cfg):
    geom = _bounded(kvgeom.resolve, cfg)
    _bounded(kvgeom.load_config, cfg)
    if geom is not None:  # check accepts it: every report works, within bounds
        _bounded(geom.to_report)
        _bounded(kvgeom.fingerprint, geom)
        if geom.offload is not None:
            _bounded(geom.key_map, 64)


# --------------------------------------------------------------------------- queries with wrong types


@example(geom=DEFAULT, value=10**8)  # issue 13: a scalar key_map of 10**8 tokens, refused at once
@example(geom=DEFAULT, value=np.array(64))  # a 0-d array
@example(geom=DEFAULT, value=float("inf"))
@given(geom=GEOMS, value=values | st.integers(0, 2**63) | huge)
@FUZZ
def test_key_map_and_rank_queries_are_result_or_kvgeom_error(geom, value):
    _bounded(geom.key_map, value)
    _bounded(geom.group, value)
    _bounded(ranks.rank_lengths, geom, 0, value)
    _bounded(ranks.dcp_placement, geom, 0, value)
    _bounded(ranks.dcp_slot, geom, 0, value, [7, 9, 11])
    _bounded(ranks.dcp_slot, geom, 0, 37, value)  # issue 13: a non-list block row
    _bounded(ranks.dcp_slot, geom, value, 37, [7, 9, 11])
    _bounded(keys.num_keys, geom, 0, value)
    _bounded(keys.chunk_block_entries, geom, 0, value)


@example(geom=DEFAULT, scenario={"num_tokens": 64, "stored": {"0": [float("inf")]}})  # issue 13: inf in stored
@example(geom=DEFAULT, scenario={"num_tokens": 64, "stored": {"0": np.array(32)}})  # a 0-d array of ends
@example(geom=DEFAULT, scenario={"num_tokens": 64, "stored": {np.int64(0): [32], "1": [np.array(16)]}})  # numpy
@example(geom=DEFAULT, scenario={"num_tokens": 64, "stored": {"0_1": [32]}})  # non-canonical group keys
@example(geom=DEFAULT, scenario={"num_tokens": 64, "stored": {1.9: [16]}})
@example(geom=DEFAULT, scenario={"num_tokens": 64, 1: 2, "x": 3})  # unknown keys of mixed types
@given(geom=GEOMS, scenario=st.one_of(
    values,
    st.fixed_dictionaries({"num_tokens": st.integers(0, 2**63) | values}, optional={
        "stored": values | st.dictionaries(values.filter(lambda v: isinstance(v, str | int)), values, max_size=3),
        "local_computed_tokens": st.integers(0, 256) | values,
        "max_load_tokens": st.integers(0, 256) | values,
        "num_prompt_tokens": st.integers(0, 256) | values,
    }),
))
@FUZZ
def test_plan_hit_is_result_or_kvgeom_error(geom, scenario):
    _bounded(geom.plan_hit, scenario)
    if isinstance(scenario, dict):
        _bounded(hits.lookup_hit, geom, scenario.get("num_tokens"), stored=scenario.get("stored", {}))
        _bounded(hits.plan_store, geom, num_tokens=scenario.get("num_tokens"),
                 num_computed_tokens=scenario.get("local_computed_tokens", 0))


@example(geom=DEFAULT, a=[2**40], b=None)  # a key map of 2**40 tokens: refused before allocating
@example(geom=DEFAULT, a=[2_306_965_904], b=None)  # thorough profile: 2e8 keys under the old 2**28 cap took 112 s
@example(geom=DEFAULT, a=[10**5000], b=None)
@example(geom=DEFAULT, a=[], b=[[-(2**63) - 1]])  # thorough profile: a block-table entry below int64 (OverflowError)
@given(geom=GEOMS, a=values | st.lists(st.integers(0, 2**63) | huge, max_size=3), b=values)
@FUZZ
def test_batch_functions_are_result_or_kvgeom_error(geom, a, b):
    for name in ("chunk_hash_index", "chunk_end_token", "num_keys", "state_block_for_boundary", "restore_read_block",
                 "is_restorable", "skipped_tokens", "rank_lengths", "placements", "chunk_first_entry"):
        _bounded(getattr(batch, name), geom, 0, a)
        _bounded(getattr(batch, name), geom, b, [16])
    _bounded(batch.key_maps, geom, a)
    _bounded(batch.lookup_hits, geom, a, stored=b)
    _bounded(batch.plan_stores, geom, num_tokens=a, num_computed_tokens=b)
    _bounded(batch.slot_mapping, geom, 0, a, b, [0])


# --------------------------------------------------------------------------- the vLLM adapter


FullAttentionSpec = type("FullAttentionSpec", (NS,), {})
MLAAttentionSpec = type("MLAAttentionSpec", (NS,), {})


@example(kv=3, vc=4, offload=None)  # issue 13: the adapter given ints where objects are expected
@example(kv=NS(kv_cache_groups=7), vc=None, offload=None)
@example(kv=NS(kv_cache_groups=[NS(kv_cache_spec=FullAttentionSpec(block_size=16))]), vc=None, offload=5)
@given(
    kv=values | st.builds(lambda v: NS(kv_cache_groups=v), values)
    | st.builds(lambda b, d, h: NS(kv_cache_groups=[NS(kv_cache_spec=FullAttentionSpec(
        block_size=b, dtype=d, num_kv_heads=h, head_size=64))]), values | st.integers(1, 64), values, values),
    vc=values | st.builds(lambda tp, pc, t: NS(parallel_config=NS(tensor_parallel_size=tp),
                                               cache_config=NS(enable_prefix_caching=pc), kv_transfer_config=t),
                          values, values, values),
    offload=st.none() | values,
)
@FUZZ
def test_vllm_adapter_is_result_or_kvgeom_error(kv, vc, offload):
    _bounded(adapter.config_from_vllm, kv, vc, offload=offload)
    _bounded(adapter.geometry_from_vllm, kv, vc)
    _bounded(adapter.dtype_name, kv)


# --------------------------------------------------------------------------- the CLI


def _run_cli(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with _timed(f"kvgeom {' '.join(argv)[:80]}"), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    assert code in {0, 1, 2}
    stderr = err.getvalue()
    assert "Traceback" not in stderr
    lines = stderr.splitlines()
    assert len(lines) <= MAX_LISTED + 4
    assert all(len(line) <= MAX_MESSAGE + MAX_FIELD + 400 for line in lines)
    return code, out.getvalue(), stderr


def _dump(v: Any) -> str:
    try:
        return json.dumps(v, default=str)
    except (ValueError, TypeError, RecursionError):
        return "{not json"


_TEXTS = {
    "deep.json": "[" * 100_000 + "]" * 100_000,  # issue 13: RecursionError, exit 1 with a traceback
    "deep-obj.json": '{"groups": ' + '{"a": ' * 5000 + "1" + "}" * 5001,
    "huge-int.json": '{"groups": [{"kind": "mla", "block_size": ' + "9" * 5000 + "}]}",  # not "not valid TOML"
    "huge-int.toml": '[[groups]]\nkind = "mla"\nblock_size = ' + "9" * 5000 + "\n",
    "dup.json": '{"groups": [{"kind": "mla", "block_size": 0, "block_size": 64}]}',  # last-wins, silently
    "dup-groups.json": '{"groups": [{"kind": "mla", "block_size": 0}], "groups": [{"kind": "mla", "block_size": 8}]}',
    "dup.toml": '[[groups]]\nkind = "mla"\nblock_size = 16\nblock_size = 32\n',
    "bool.json": '{"groups": [{"kind": "mla", "block_size": 16}], "cache": {"prefix_caching": "off"}}',
    "newline-key.json": '{"groups": [{"kind": "mla", "block_size": 16, "a\\nb": 1}]}',
    "many-keys.json": json.dumps({"groups": [{"kind": "mla", "block_size": 16,
                                              **{f"k{i}": 1 for i in range(100_000)}}]}),
    "long-kind.json": json.dumps({"groups": [{"kind": "k" * 1_000_000, "block_size": 16}]}),
    "kind-key.json": '{"groups": [{"kind": "mla", "block_size": 16}], "mla": 1}',
    "bad-utf8.json": b"\xff\xfe{".decode("latin-1"),
    "fp8.json": '{"groups": [{"kind": "full_attention", "block_size": 16, "dtype": "fp8_ds_mla"}]}',
    "many-groups.json": json.dumps({"groups": [{"kind": "full_attention", "block_size": 16}] * 10_000,
                                    "offload": {}}),
    "huge-tp.json": '{"groups": [{"kind": "mla", "block_size": 16}], "parallel": {"tp": 9007199254740993, "dcp": 2}}',
    "huge-span.json": '{"groups": [{"kind": "mla", "block_size": 4611686018427387904}], "offload": {}}',
    "coprime.json": json.dumps({"groups": [{"kind": "full_attention", "block_size": 2**31 - 1},
                                           {"kind": "full_attention", "block_size": 2**31}], "offload": {}}),
    "wide.json": json.dumps({"groups": [{"kind": "mla", "block_size": 1}], "parallel": {"tp": 2**40, "dcp": 2**40},
                             "offload": {}}),
}


_HEAVY = {"many-keys.json", "long-kind.json", "many-groups.json", "deep.json", "deep-obj.json"}


# The heavy files go through the same reader and loader in every command: check and explain --prefix only.
_CLI_ROWS = [(name, command) for name in sorted(_TEXTS)
             for command in ("check", "explain", "explain-prefix", "diagram", "compat")
             if name not in _HEAVY or command in {"check", "explain-prefix"}]


@pytest.mark.parametrize(("name", "command"), _CLI_ROWS)
def test_cli_on_each_issue_13_file_exits_cleanly(tmp_path, name, command):
    path = tmp_path / name
    path.write_text(_TEXTS[name], encoding="latin-1" if name == "bad-utf8.json" else "utf-8")
    argv = {
        "check": ["check", str(path)],
        "explain": ["explain", str(path)],
        "explain-prefix": ["explain", str(path), "--prefix", "64"],
        "diagram": ["diagram", str(path), "-o", "-"],
        "compat": ["compat", str(path), "preset:seed-hybrid"],
    }[command]
    code, _, stderr = _run_cli(argv)
    if name not in {"many-groups.json", "huge-span.json", "coprime.json", "wide.json", "huge-tp.json"}:
        assert code == 2 and stderr, (code, stderr)  # malformed: one line per problem, exit 2


@example(doc={"groups": [{"kind": "mla", "block_size": 16}]}, suffix=".json", prefix="100000000")  # 10**8 keys
@example(doc={"groups": [{"kind": "mla", "block_size": 16}], "offload": {}}, suffix=".json", prefix="1" + "0" * 5000)
@given(doc=config_like(), suffix=st.sampled_from([".json", ".toml"]),
       prefix=st.sampled_from(["0", "64", "1000", "-1", "x", "100000000", str(2**63)]))
@FUZZ
def test_cli_is_exit_code_never_traceback(tmp_path_factory, doc, suffix, prefix):
    path = tmp_path_factory.mktemp("fuzz") / f"cfg{suffix}"
    if suffix == ".json":
        path.write_text(_dump(doc), encoding="utf-8")
    else:
        try:
            text = _toml.dumps(doc) if isinstance(doc, dict) else "x = 1"
        except (kvgeom.KVGeomError, RecursionError, ValueError):
            text = "not = [toml"
        path.write_text(text, encoding="utf-8")
    for argv in (["check", str(path)], ["check", "--format", "json", str(path)],
                 ["explain", str(path), "--prefix", prefix], ["diagram", str(path), "-o", "-", "--prefix", prefix]):
        _run_cli(argv)


@example(scenario={"num_tokens": 64, "stored": {"0": [32], "0": [64]}})  # noqa: F601 - the file has both
@given(scenario=values | st.fixed_dictionaries({"num_tokens": st.integers(0, 2**64) | values,
                                                "stored": values}))
@FUZZ
def test_cli_hit_is_exit_code_never_traceback(tmp_path_factory, scenario):
    path = tmp_path_factory.mktemp("hit") / "scenario.json"
    path.write_text(_dump(scenario), encoding="utf-8")
    code, _, _ = _run_cli(["hit", "preset:seed-hybrid", str(path)])
    assert code in {0, 2}


# --------------------------------------------------------------------------- the hang classes, one by one


def _fast(fn: Any, *args: Any) -> kvgeom.KVGeomError | None:
    with _timed(getattr(fn, "__name__", "call")):
        try:
            fn(*args)
        except kvgeom.KVGeomError as e:
            return e
    return None


def test_scalar_key_map_of_1e8_tokens_is_refused_at_once():
    # issue 13: it ground for minutes; now refused by its result size, like the batch paths
    e = _fast(DEFAULT.key_map, 10**8)
    assert e is not None and e.code == "result_too_large"


def test_key_map_with_10000_groups_is_linear():
    geom = kvgeom.resolve({"groups": [{"kind": "full_attention", "block_size": 16}] * 10_000, "offload": {}})
    assert _fast(geom.key_map, 64) is None
    assert _fast(geom.group, 9_999) is None
    assert _fast(geom.offload.group, 9_999) is None


def test_divisor_message_for_tp_near_2_53_is_quick():
    e = _fast(kvgeom.resolve, {"groups": [{"kind": "mla", "block_size": 16}],
                               "parallel": {"tp": 2**53 + 1, "dcp": 2}})
    assert e is not None and e.code == "tp_not_divisible_by_dcp" and "..." in str(e)


def test_million_element_list_in_a_message_is_cut_with_a_count():
    e = _fast(kvgeom.resolve, {"groups": [{"kind": "mla", "block_size": list(range(1_000_000))}]})
    assert e is not None and len(str(e)) < 2 * MAX_MESSAGE and "1000000 items" in str(e)


def test_huge_integer_in_a_message_is_shown_by_its_size():
    e = _fast(kvgeom.resolve, {"groups": [{"kind": "mla", "block_size": 10**5000}]})
    assert e is not None and "integer of about 5001 digits" in str(e)


def test_a_count_past_the_digit_limit_is_refused_with_its_size():
    # thorough profile, 2026-12-02: checkpoint_positions(geom, 10**5000) reached the result-size check, whose
    # message put the count through str() and raised Python's int-to-str ValueError instead of result_too_large
    from kvgeom.engines.sglang import checkpoint_positions, resolve_sglang
    from kvgeom.masks import check_result_size, check_store_size

    geom = resolve_sglang({"page_size": 64, "pools": ["full", "mamba"]})
    for call in (lambda: checkpoint_positions(geom, 10**5000), lambda: check_result_size(10**5000),
                 lambda: check_store_size(10**5000)):
        e = _fast(call)
        assert isinstance(e, kvgeom.QueryError) and e.code == "result_too_large"
        assert re.search(r"an integer of about (4999|5001) digits", str(e)), str(e)


def test_explain_and_diagram_of_unbounded_geometries_are_refused_or_quick():
    # spans 2**31-1 and 2**31: L is about 2**62; a default diagram would draw 2**31 blocks
    geom = kvgeom.resolve({"groups": [{"kind": "full_attention", "block_size": 2**31 - 1},
                                      {"kind": "full_attention", "block_size": 2**31}], "offload": {}})
    from kvgeom.diagram import render_svg
    from kvgeom.report import explain_text

    assert _fast(render_svg, geom) is None  # lanes too fine to draw say so instead of drawing 2**31 boxes
    assert "too fine to draw" in render_svg(geom)
    assert _fast(render_svg, geom, 2**62) is None  # a prefix of 2**62 tokens likewise: bounded per lane
    assert _fast(explain_text, geom, "x", 2**62) is not None  # the key map is refused
    assert _fast(explain_text, geom, "x") is None


def test_problem_lines_stay_one_line_and_bounded():
    e = _fast(kvgeom.resolve, {"groups": [{"kind": "mla", "block_size": 16, "a\nb": 1, "c" * 10_000: 2}]})
    assert e is not None and len(e.problems) == 2
    assert str(e).count("\n") == 2  # the header and two problems, each on one line
    assert all(len(p.field) <= MAX_FIELD + 40 for p in e.problems)


def test_unknown_key_named_like_a_kind_keeps_its_path():
    e = _fast(kvgeom.resolve, {"groups": [{"kind": "full_attention", "block_size": 16, "mla": 1}], "mamba": 2})
    assert e is not None and sorted(p.field for p in e.problems) == ["groups[0].mla", "mamba"]


def test_formatting_never_raises_on_hostile_objects():
    from kvgeom._format import show

    class Bad:
        def __repr__(self) -> str:
            raise RuntimeError("no")

    cyclic: list[Any] = []
    cyclic.append(cyclic)
    for v in (Bad(), cyclic, _deep(100_000), 10**100_000, -(10**5000), float("nan"), {"k": Bad()}, "\u2028" * 10):
        text = show(v)
        assert "\n" not in text and "\u2028" not in text and len(text) <= 300
    assert math.isnan(float("nan"))  # the loop above ran on a NaN without comparing it


@example(value="a\u2028b\x85c\r\nd")  # every character splitlines() breaks on
@example(value=[10**5000, -(10**5000)])
@given(value=values | st.text() | st.lists(st.text(), max_size=300) | st.integers(-(2**20000), 2**20000))
@FUZZ
def test_show_is_one_bounded_line_and_never_raises(value):
    from kvgeom._format import MAX_SHOWN, show

    text = show(value)
    assert len(text.splitlines()) <= 1 and len(text) <= MAX_SHOWN + 60


def test_many_groups_dealt_over_many_ranks_are_refused_not_built():
    # 100 groups x 65536 ranks: a key map (or diagram) would list 6.5M per-rank lengths
    from kvgeom.diagram import render_svg

    geom = kvgeom.resolve({"groups": [{"kind": "mla", "block_size": 1}] * 100,
                           "parallel": {"tp": 65536, "dcp": 65536}, "offload": {}})
    assert _fast(geom.key_map, 64).code == "result_too_large"
    assert _fast(render_svg, geom).code == "result_too_large"


# --------------------------------------------------------------------------- issue 19: inputs that still hurt


def _primes(n: int) -> list[int]:
    out: list[int] = []
    k = 2
    while len(out) < n:
        if all(k % p for p in out if p * p <= k):
            out.append(k)
        k += 1
    return out


#: 2000 coprime spans: their lcm has about 7500 digits, past Python's 4300-digit int-to-str limit.
LCM_BLOWUP = {"groups": [{"kind": "full_attention", "block_size": p} for p in _primes(2000)], "offload": {}}


def test_lcm_past_the_int_to_str_limit_is_a_geometry_error(tmp_path):
    # issue 19: the message printed L with str(), a ValueError (a CLI traceback, exit 1)
    e = _fast(kvgeom.resolve, LCM_BLOWUP)
    assert e is not None and e.code == "scheduler_block_too_large" and "digits" in str(e)
    _check_error(e)
    path = tmp_path / "lcm.json"
    path.write_text(json.dumps(LCM_BLOWUP), encoding="utf-8")
    for argv in (["check", str(path)], ["check", "--format", "json", str(path)], ["explain", str(path)],
                 ["diagram", str(path), "-o", "-"]):
        code, out, stderr = _run_cli(argv)
        assert code == 1 and "scheduler_block_too_large" in stderr + out


@pytest.mark.parametrize("cfg", [
    {"groups": list(range(10**6))},  # issue 19: 4 s to build the validation error
    {"groups": [{"kind": "mla", "block_size": 0}] * 10**6},  # 9 s
    {"groups": [{"kind": "full_attention", "block_size": 16}] * 100_000, "offload": {}},  # resolved in 12 s
    {"groups": [{"kind": "mla", "block_size": 16}], "parallel": {"tp": list(range(10**6))}},
    {"groups": [{"kind": "uniform", "layers": [{"kind": "mla", "block_size": 16}] * 20_000}]},
], ids=["1M ints as groups", "1M bad groups", "100k groups", "1M-list tp", "20k uniform layers"])
def test_an_array_past_max_items_is_refused_before_validation(cfg):
    from kvgeom.config import MAX_ITEMS

    for fn in (kvgeom.resolve, kvgeom.load_config):
        e = _fast(fn, cfg)
        assert e is not None and e.code == "too_many_items" and e.problems[0].values["limit"] == MAX_ITEMS
        _check_error(e)


def test_max_items_groups_still_resolve():
    from kvgeom.config import MAX_ITEMS

    assert _fast(kvgeom.resolve, {"groups": [{"kind": "full_attention", "block_size": 16}] * MAX_ITEMS}) is None


def test_a_stored_range_of_1e12_end_tokens_is_refused_before_it_is_checked():
    from kvgeom.probes import MAX_STORED_ENDS

    huge = range(16, 16 * 10**12, 16)
    for call in (lambda: hits.plan_hit(DEFAULT, {"num_tokens": 64, "stored": {"0": huge}}),
                 lambda: hits.lookup_hit(DEFAULT, 64, stored={0: huge}),
                 lambda: hits.plan_hit(DEFAULT, {"num_tokens": 64, "stored": {"1": range(16, 10**30, 16)}})):
        e = _fast(call)
        assert e is not None and e.code == "too_many_stored" and e.problems[0].values["limit"] == MAX_STORED_ENDS
    # the bound itself is checked and answered
    ends = list(range(16, 16 * (MAX_STORED_ENDS + 1), 16))
    assert _fast(hits.plan_hit, DEFAULT, {"num_tokens": 64, "stored": {"0": ends}}) is None
    # the batch twin: a matrix of the wrong row count is refused before numpy copies it
    e = _fast(lambda: batch.lookup_hits(DEFAULT, [64], stored={0: huge}))
    assert e is not None and e.code == "bad_stored"


def _preset(name: str) -> kvgeom.Geometry:
    from kvgeom.presets import load_preset

    return kvgeom.resolve(load_preset(name))


@pytest.mark.parametrize("name", ["falcon-mamba", "deepseek-v3-mla-dcp8", "seed-hybrid", "glm5next-dcp4",
                                  "qwen35-mtp-hybrid", "gemma3-swa"])
def test_store_plans_of_1e9_tokens_are_refused_before_the_work(name):
    # issue 19: falcon-mamba took 152 s for an empty plan; seed-hybrid's half-computed prompt minutes
    from kvgeom import handoff
    from kvgeom.masks import MAX_STORE_BLOCKS

    geom = _preset(name)
    for computed in (10**9, 10**9 // 2):
        e = _fast(lambda c=computed: hits.plan_store(geom, num_tokens=10**9, num_computed_tokens=c))
        assert e is not None and e.code == "result_too_large"
    mamba = [g.index for g in geom.groups if g.is_align_mamba]
    if mamba:  # refused, or answered at once (under the GPU drop the split has a few chunks: qwen35)
        e = _fast(handoff.mamba_handoffs, geom, mamba[0], 10**9, 10**9)
        assert e is None or (e.code == "result_too_large" and e.problems[0].values["limit"] == MAX_STORE_BLOCKS)
    from kvgeom.prefill import prefill_tail_stop

    assert _fast(prefill_tail_stop, geom, 10**9) is None


def test_store_plan_walk_bound_is_inclusive():
    from kvgeom.masks import MAX_STORE_BLOCKS

    geom = _preset("falcon-mamba")  # Mamba 16, k = 4: a 64-token chunk walks 4 blocks
    n = 16 * MAX_STORE_BLOCKS
    assert _fast(lambda: hits.plan_store(geom, num_tokens=n, num_computed_tokens=n)) is None
    e = _fast(lambda: hits.plan_store(geom, num_tokens=n + 64, num_computed_tokens=n + 64))
    assert e is not None and e.values == {"count": MAX_STORE_BLOCKS + 4, "limit": MAX_STORE_BLOCKS}


WIDE = kvgeom.resolve({"groups": [{"kind": "mla", "block_size": 1}], "parallel": {"tp": 2**40, "dcp": 2**40},
                       "offload": {}})


def test_rank_lengths_over_2_40_ranks_are_refused_not_allocated():
    # issue 19: batch.rank_lengths raised MemoryError (an (n, 2^40) int64 array)
    for call in (lambda: ranks.rank_lengths(WIDE, 0, 2**30), lambda: batch.rank_lengths(WIDE, 0, [2**30]),
                 lambda: batch.key_maps(WIDE, [2**30])):
        e = _fast(call)
        assert e is not None and e.code == "result_too_large"


@pytest.mark.parametrize("call", [
    lambda m: m.reachable_block_mask(DEFAULT, 1, 4, retention=0, alignment="32", reachable=[40]),
    lambda m: m.reachable_block_mask(SWA, 1, 4, retention=0, alignment=32.0, reachable=[40]),
    lambda m: m.reachable_block_mask(DEFAULT, 1, 4, retention=32, alignment="32"),  # was silently ignored
    lambda m: m.reachable_block_mask(DEFAULT, 1, 4, retention=0, reachable=40),
    lambda m: m.reachable_block_mask(DEFAULT, 1, 4, retention=0, reachable="40"),
    lambda m: m.reachable_block_mask(DEFAULT, 1, 4, retention=0, reachable=range(10**12)),
    lambda m: m.swa_store_horizon(SWA, 1, storable_chunks="3", prompt_chunks=7, finished=False),
    lambda m: m.swa_store_horizon(SWA, 1, storable_chunks=3, prompt_chunks=7, finished="no"),
    lambda m: m.default_alignment(DEFAULT, "1"),
], ids=["str alignment", "float alignment", "unused str alignment", "int reachable", "str reachable",
        "1e12 reachable", "str storable_chunks", "str finished", "str group"])
def test_masks_given_wrong_types_raise_query_errors(call):
    from kvgeom import masks

    e = _fast(call, masks)
    assert e is not None
    _check_error(e)


def test_diagram_of_a_config_check_accepts_exits_0(tmp_path):
    # issue 19: a Mamba group outside prefix caching is not offloaded; the diagram asked its chunk (exit 1)
    cfg = {"groups": [{"kind": "full_attention", "block_size": 16},
                      {"kind": "mamba", "block_size": 16, "prefix_cacheable": False}], "offload": {}}
    path = tmp_path / "mamba-off.json"
    path.write_text(json.dumps(cfg), encoding="utf-8")
    assert _run_cli(["check", str(path)])[0] == 0
    code, svg, _ = _run_cli(["diagram", str(path), "-o", "-"])
    assert code == 0 and svg.count('class="state"') > 0 and 'fill="#222" stroke="#222"' not in svg


def test_a_short_hash_chain_is_refused_not_answered_0():
    from kvgeom.batch.lookup import lookup_resident

    tier = kvgeom.Residency()
    chain = [bytes([i]) * 32 for i in range(4)]
    tier.add_keys(kvgeom.make_offload_key(chain[i], g) for i in range(4) for g in (0, 1))
    assert hits.lookup_hit(DEFAULT, 64, stored=tier, block_hashes=chain).hit_tokens == 48
    for call in (lambda: hits.lookup_hit(DEFAULT, 64, stored=tier, block_hashes=chain[:1]),
                 lambda: lookup_resident(DEFAULT, tier, [chain[:1]], [64])):
        e = _fast(call)
        assert e is not None and e.code == "block_hashes_too_short"
        assert {k: e.values[k] for k in ("num_hashes", "needed")} == {"num_hashes": 1, "needed": 4}


@pytest.mark.parametrize("key", [b"12345", bytes(32), bytes(21), bytes(40), b"", "x" * 36])
def test_offload_keys_not_of_vllm_size_are_refused(key):
    e = _fast(kvgeom.split_offload_key, key)
    assert e is not None and e.code == "bad_offload_key"
    e = _fast(kvgeom.Residency().add_key, key)
    assert e is not None and e.code == "bad_offload_key"


@pytest.mark.parametrize("size", [16, 32])
def test_offload_keys_of_vllm_size_round_trip(size):
    key = kvgeom.make_offload_key(bytes(range(size)), 7)
    assert len(key) == size + 4 and kvgeom.split_offload_key(key) == (bytes(range(size)), 7)
    assert _fast(kvgeom.make_offload_key, b"x" * 5, 0).code == "bad_offload_key"


# The same shapes elsewhere (issue 19's sweep): every public query, batch twin, engine helper, the router and
# the simulator given one hostile argument returns or raises a bounded KVGeomError, quickly.
_HOSTILE_ARGS = {"str": "32", "float": 32.0, "nan": float("nan"), "negative": -1, "huge": 10**30, "2^62": 2**62,
                 "5001 digits": 10**5000, "None": None, "range 1e12": range(16, 16 * 10**12, 16),
                 "list 1e5": list(range(1, 10**5)),
                 "object": object(), "bool": True, "dict": {"a": 1}, "2-d array": np.zeros((2, 2)),
                 "0-d array": np.array(5)}  # Sized by type, no len(): chain_matrix raised TypeError (thorough)


def _sglang_geom() -> Any:
    from kvgeom.engines.sglang import resolve_sglang

    return resolve_sglang({"page_size": 64, "dcp_size": 2, "tp_size": 2, "pools": ["full", "mamba"]})


def _calls() -> list[tuple[str, Any, dict[str, Any]]]:
    from kvgeom import handoff, masks, prefill, router, sim
    from kvgeom.batch import lookup
    from kvgeom.engines import lmcache, sglang

    sg = _sglang_geom()
    res = kvgeom.Residency()
    return [
        ("handoff.state_ends", handoff.state_ends, dict(geom=DEFAULT, num_prompt_tokens=64, num_computed_tokens=64,
                                                        chunk_ends=None, above=0, upto=None)),
        ("handoff.mamba_handoffs", handoff.mamba_handoffs, dict(geom=DEFAULT, group=1, num_prompt_tokens=64,
                                                                num_computed_tokens=64, chunk_ends=None,
                                                                reachable=None, above=0, upto=None)),
        ("handoff.mamba_cacheable_tokens", handoff.mamba_cacheable_tokens, dict(geom=DEFAULT, group=1,
                                                                                num_computed_tokens=64)),
        ("prefill.mamba_checkpoint_position", prefill.mamba_checkpoint_position,
         dict(num_tokens=100, unit=16, drop=False, lookahead_tokens=0)),
        ("masks.reachable_block_mask", masks.reachable_block_mask,
         dict(geom=DEFAULT, group=1, num_blocks=4, first_block=0, reachable=(), final_segment_end_block=None)),
        ("hits.plan_store", hits.plan_store, dict(geom=DEFAULT, num_tokens=64, num_computed_tokens=64,
                                                  stored_chunks=None, allocated_blocks=None, reachable=None,
                                                  chunk_ends=None, finished=False, partial_tail_stored=False)),
        ("hits.plan_store_steps", hits.plan_store_steps, dict(geom=DEFAULT, num_prompt_tokens=64, chunk_ends=None,
                                                              finished=True, loaded_from_offload=False,
                                                              max_offload_tokens=None)),
        ("handoff.cached_state_ends", handoff.cached_state_ends, dict(geom=DEFAULT, group=1, num_prompt_tokens=64,
                                                                      num_computed_tokens=64, chunk_ends=None,
                                                                      above=0, upto=None)),
        ("handoff.checked_prefill_split", handoff.checked_prefill_split, dict(chunk_ends=[32, 64], num_tokens=64)),
        ("handoff.default_chunk_ends", handoff.default_chunk_ends, dict(geom=DEFAULT, num_prompt_tokens=64)),
        ("handoff.handed_over_tokens", handoff.handed_over_tokens, dict(geom=DEFAULT, group=1, num_prompt_tokens=64,
                                                                        num_computed_tokens=32)),
        ("batch.num_keys", batch.num_keys, dict(geom=DEFAULT, group=0, num_tokens=[64])),
        ("batch.plan_stores", batch.plan_stores, dict(geom=DEFAULT, num_tokens=[64], num_computed_tokens=[64],
                                                      finished=False, loaded_from_offload=False,
                                                      partial_tail_stored=False)),
        ("batch.lookup_hits", batch.lookup_hits, dict(geom=DEFAULT, num_tokens=[64], stored={})),
        ("lookup.lookup_resident", lookup.lookup_resident, dict(geom=DEFAULT, residency=res,
                                                                chains=[[b"h" * 16] * 4], num_tokens=[64])),
        ("sglang.tree_page", sglang.tree_page, dict(page_size=64, dcp_size=2)),
        ("sglang.mamba_cache_chunk_size", sglang.mamba_cache_chunk_size, dict(model_chunk=64, page_size=16)),
        ("sglang.checkpoint_grid", sglang.checkpoint_grid, dict(chunk=64, tree_page=128)),
        ("sglang.track_grid", sglang.track_grid, dict(grid=128, mamba_track_interval=256)),
        ("sglang.checkpoint_positions", sglang.checkpoint_positions, dict(geom=sg, num_tokens=300)),
        ("sglang.prefix_hit", sglang.prefix_hit, dict(geom=sg, matched_tokens=300, checkpoints=[128])),
        ("sglang.explain_sglang", sglang.explain_sglang, dict(geom=sg, label="")),
        ("lmcache.scheduler_block", lmcache.scheduler_block, dict(spans=[32, 16])),
        ("lmcache.is_coarse", lmcache.is_coarse, dict(spans=[32, 16])),
        ("lmcache.lmcache_geometry", lmcache.lmcache_geometry, dict(geom=DEFAULT, settings=None)),
        ("router.chain_matrix", router.chain_matrix, dict(residency=res, group=0, chain=["a"], num_replicas=2)),
        ("router.score_replicas", router.score_replicas, dict(geom=DEFAULT, residency=res, chains=[["a"] * 4],
                                                              num_tokens=64, num_replicas=2, tiers=None)),
        ("sim.run_request", sim.run_request, dict(geom=DEFAULT, num_tokens=64, first_tokens=None, evict_gpu=None,
                                                  evict_tier=None)),
        ("sim.run_scenario", sim.run_scenario, dict(geom=DEFAULT, num_tokens=64, evict=None)),
        ("diagram.render_svg", __import__("kvgeom.diagram").diagram.render_svg, dict(geom=DEFAULT, title="")),
    ]


_CALLS = _calls()
_SWEEP = [(name, arg) for name, _, kwargs in _CALLS for arg in kwargs if arg not in {"geom", "residency"}]


@pytest.mark.parametrize(("name", "arg"), _SWEEP, ids=[f"{n}({a})" for n, a in _SWEEP])
def test_each_public_call_given_a_hostile_argument_is_result_or_kvgeom_error(name, arg):
    fn, kwargs = next((f, k) for n, f, k in _CALLS if n == name)
    for value in _HOSTILE_ARGS.values():
        _bounded(fn, **{**kwargs, arg: value})


@given(call=st.sampled_from(range(len(_CALLS))), arg=st.data(), value=values | huge | odd)
@FUZZ
def test_public_calls_on_drawn_hostile_arguments_are_result_or_kvgeom_error(call, arg, value):
    _, fn, kwargs = _CALLS[call]
    names = [a for a in kwargs if a not in {"geom", "residency"}]
    name = arg.draw(st.sampled_from(names))
    _bounded(fn, **{**kwargs, name: value})
