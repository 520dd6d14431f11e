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
