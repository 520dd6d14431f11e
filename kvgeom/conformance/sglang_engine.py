"""``kvgeom conform --engine sglang``: kvgeom's SGLang geometry against SGLang 0.5.23's own functions.

For each generated deployment (:func:`deployments`: page size, DCP and TP, pools, the model's Mamba
chunk, ``mamba_track_interval``, strategy, draft tokens, chunked prefill, PD mode, HiCache storage, and
a PD transfer to plan) both sides answer the same questions (:data:`QUESTIONS`):

========================  ===================================================================
question                  SGLang 0.5.23 code asked
========================  ===================================================================
``mamba_chunk``           ``arg_groups/overrides.mamba_cache_chunk_size`` (its assert = invalid)
``checkpoint_grid``       ``runtime_context.mamba_checkpoint_grid(page_size * dcp_size)``
``track_grid``            ``runtime_context.mamba_track_grid(page_size * dcp_size)``
``kv_event_block_size``   ``arg_groups/overrides.kv_event_block_size_of``
``extra_buffer``          ``arg_groups/mamba_hook.validate_mamba_extra_buffer`` (ok, refused, or
                          its chunked-prefill warning)
``no_buffer``             ``arg_groups/mamba_hook.validate_mamba_no_buffer``
``hicache_storage``       ``mem_cache/hicache_storage.HiCacheStorageConfig`` built for every TP rank
``transfer``              ``disaggregation/common/utils.build_dcp_token_transfer_plan``
========================  ===================================================================

SGLang's stand-ins: its server args are a ``ServerArgs(model_path="dummy")`` published with
``set_global_server_args_for_scheduler`` (the shipped radix-cache kit's route), the model config a
namespace holding ``hf_config.mamba_chunk_size``, and the two allow-list answers the extra-buffer
validator asks (model architecture, platform) are True. The transfer plan runs on identity page tables,
so SGLang's rows are token offsets. Every difference is a finding (:class:`SGLangReport`); Hypothesis
shrinks the first one of each kind. This module imports SGLang: it is collected only where SGLang is
installed (the root ``conftest.py``).
"""

from __future__ import annotations

import importlib.metadata
import json
import logging
import math
import types
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from hypothesis import HealthCheck, Phase, Verbosity, given, settings
from hypothesis import seed as hypothesis_seed
from hypothesis import strategies as st
from sglang.srt import runtime_context
from sglang.srt.arg_groups import mamba_hook, overrides
from sglang.srt.disaggregation.common.utils import build_dcp_token_transfer_plan
from sglang.srt.mem_cache.hicache_storage import HiCacheStorageConfig
from sglang.srt.server_args import ServerArgs, set_global_server_args_for_scheduler

from kvgeom.engines.sglang import (
    SGLangConfig,
    SGLangConfigError,
    dcp_transfer_plan,
    hit_warnings,
    load_sglang,
    mamba_cache_chunk_size,
    resolve_sglang,
)
from kvgeom.errors import KVGeomError

__all__ = ["QUESTIONS", "SGLANG_VERSION", "SGLangReport", "deployments", "kvgeom_sglang_answers", "run_sglang",
           "sglang_answers"]

SGLANG_VERSION = importlib.metadata.version("sglang")

QUESTIONS: tuple[str, ...] = ("mamba_chunk", "checkpoint_grid", "track_grid", "kv_event_block_size", "extra_buffer",
                              "no_buffer", "hicache_storage", "transfer")

_EXTRA_CODES = frozenset({"lazy_under_pd", "track_interval_below_draft", "track_interval_page"})
_NO_BUFFER_CODES = frozenset({"no_buffer_page_size", "no_buffer_overlap"})
_HICACHE_CODES = frozenset({"hicache_dcp_needs_mla"})


# -- cases ----------------------------------------------------------------------------------------------
@st.composite
def _deployment(draw: st.DrawFn) -> dict[str, Any]:
    dcp = draw(st.sampled_from([1, 1, 2, 4, 8]))
    page = draw(st.sampled_from([1, 2, 4, 8, 16, 32, 48, 64, 128, 256]))
    strategy = draw(st.sampled_from(["extra_buffer", "extra_buffer", "extra_buffer_lazy", "no_buffer"]))
    cfg: dict[str, Any] = {
        "page_size": page,
        "dcp_size": dcp,
        "tp_size": dcp * draw(st.sampled_from([1, 2])),
        "pools": draw(st.sampled_from([["full", "mamba"], ["mla", "mamba"], ["full"], ["mla"]])),
        "mamba_chunk_size": draw(st.none() | st.sampled_from([32, 64, 128, 192, 256])),
        "mamba_track_interval": draw(st.sampled_from([1, 8, 64, 128, 192, 256, 384, 512])),
        "mamba_radix_cache_strategy": strategy,
        "speculative_num_draft_tokens": draw(st.none() | st.integers(1, 16)),
        "chunked_prefill_size": draw(st.none() | st.sampled_from([-1, 16, 100, 4096])),
        "disaggregation_mode": draw(st.sampled_from(["null", "null", "prefill", "decode"])),
        "disable_overlap_schedule": draw(st.booleans()),
        "enable_hierarchical_cache": draw(st.booleans()),
    }
    if cfg["enable_hierarchical_cache"]:
        cfg["hicache_storage_backend"] = "file"
    virtual = page * dcp
    cfg["_transfer"] = {
        "num_kv_tokens": draw(st.integers(0, 48)),
        "dcp_rank": draw(st.integers(0, dcp - 1)),
        "decode_prefix_len": draw(st.integers(0, 3)) * virtual + draw(st.sampled_from([0, 0, 0, 1])),
        "src_page_offset": draw(st.integers(0, 3)),
    }
    return cfg


def deployments() -> st.SearchStrategy[dict[str, Any]]:
    """SGLang deployments (an ``sglang`` section plus ``_transfer``, the PD transfer to plan)."""
    return _deployment()


def _split(case: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    cfg = {k: v for k, v in case.items() if k != "_transfer"}
    return cfg, dict(case["_transfer"])


# -- SGLang's answers -----------------------------------------------------------------------------------
def _model_ns(c: SGLangConfig) -> types.SimpleNamespace:
    hf = types.SimpleNamespace() if c.mamba_chunk_size is None else types.SimpleNamespace(
        mamba_chunk_size=c.mamba_chunk_size)
    return types.SimpleNamespace(page_size=c.page_size, dcp_size=c.dcp_size, model_path="dummy",
                                 _model_config=types.SimpleNamespace(hf_config=hf))


class _Warnings(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def _engine_transfer(c: SGLangConfig, t: Mapping[str, Any]) -> Any:
    n, page = t["num_kv_tokens"], c.page_size
    pages = np.arange(4 * (n + 4 * page * c.dcp_size) + 64, dtype=np.int32)
    try:
        plan = build_dcp_token_transfer_plan(
            pages, pages, physical_page_size=page, dcp_size=c.dcp_size, dcp_rank=t["dcp_rank"],
            src_page_offset=t["src_page_offset"], decode_prefix_len=t["decode_prefix_len"], num_kv_tokens=n)
    except ValueError:
        return "refused"
    return [plan.target_src_token_indices.tolist(), plan.target_dst_token_indices.tolist(),
            plan.draft_src_token_indices.tolist(), plan.draft_dst_token_indices.tolist()]


def sglang_answers(case: Mapping[str, Any]) -> dict[str, Any]:
    """SGLang 0.5.23's answers for a generated case (see the module docstring)."""
    cfg, transfer = _split(case)
    c = load_sglang(cfg)
    sheet: dict[str, Any] = {}
    ns = _model_ns(c)
    sheet["kv_event_block_size"] = overrides.kv_event_block_size_of(ns)
    try:
        chunk: int | None = overrides.mamba_cache_chunk_size(ns)
    except AssertionError:
        chunk = None
    sheet["mamba_chunk"] = chunk if chunk is not None else "refused"
    if chunk is not None:
        args = ServerArgs(model_path="dummy", page_size=c.page_size, mamba_track_interval=c.mamba_track_interval)
        args._mamba_cache_chunk_size = chunk
        set_global_server_args_for_scheduler(args)
        tree = c.page_size * c.dcp_size
        sheet["checkpoint_grid"] = runtime_context.mamba_checkpoint_grid(tree)
        sheet["track_grid"] = runtime_context.mamba_track_grid(tree)
        view = types.SimpleNamespace(**c.model_dump())
        handler = _Warnings()
        log = logging.getLogger(mamba_hook.__name__)
        log.addHandler(handler)
        saved = (mamba_hook.supports_mamba_cache_extra_buffer, mamba_hook._platform_supports_mamba_cache_extra_buffer)
        mamba_hook.supports_mamba_cache_extra_buffer = lambda *a: True
        mamba_hook._platform_supports_mamba_cache_extra_buffer = lambda: True
        try:
            if c.mamba_radix_cache_strategy != "no_buffer":
                try:
                    mamba_hook.validate_mamba_extra_buffer(view, None, mamba_cache_chunk_size_of=lambda: chunk)
                    sheet["extra_buffer"] = "warned" if handler.messages else "ok"
                except AssertionError:
                    sheet["extra_buffer"] = "refused"
            else:
                nb = types.SimpleNamespace(**c.model_dump(), attention_backend="fa3")
                try:
                    mamba_hook.validate_mamba_no_buffer(nb, "dummy")
                    sheet["no_buffer"] = "ok"
                except AssertionError:
                    sheet["no_buffer"] = "refused"
        finally:
            mamba_hook.supports_mamba_cache_extra_buffer, mamba_hook._platform_supports_mamba_cache_extra_buffer = saved
            log.removeHandler(handler)
    if c.enable_hierarchical_cache and c.hicache_storage_backend is not None and c.tp_size % c.dcp_size == 0:
        try:
            for r in range(c.tp_size):
                HiCacheStorageConfig(
                    tp_rank=r, tp_size=c.tp_size, pp_rank=0, pp_size=1, attn_cp_rank=0, attn_cp_size=1,
                    is_mla_model=c.is_mla, enable_storage_metrics=False, is_page_first_layout=False,
                    model_name="dummy", dcp_size=c.dcp_size, dcp_rank=r % c.dcp_size,
                    logical_page_size=c.page_size * c.dcp_size)
            sheet["hicache_storage"] = "ok"
        except ValueError:
            sheet["hicache_storage"] = "refused"
    sheet["transfer"] = _engine_transfer(c, transfer)
    return sheet


# -- kvgeom's answers -----------------------------------------------------------------------------------
def kvgeom_sglang_answers(case: Mapping[str, Any]) -> dict[str, Any]:
    """kvgeom's answers to the same questions, from :mod:`kvgeom.engines.sglang`."""
    cfg, t = _split(case)
    c = load_sglang(cfg)
    sheet: dict[str, Any] = {"kv_event_block_size": c.page_size * c.dcp_size}
    try:
        chunk: int | None = mamba_cache_chunk_size(c.mamba_chunk_size, c.page_size)
    except SGLangConfigError:
        chunk = None
    sheet["mamba_chunk"] = chunk if chunk is not None else "refused"
    codes: set[str] = set()
    warned = {w.code for w in hit_warnings({**cfg, "pools": sorted(set(c.pools) | {"mamba"})})}
    try:
        geom = resolve_sglang({**cfg, "pools": sorted(set(c.pools) | {"mamba"})})
        grid, tgrid = geom.checkpoint_grid, geom.track_grid
    except SGLangConfigError as e:
        codes = {p.code for p in e.problems}
        grid = tgrid = None
        if chunk is not None:
            grid = math.lcm(chunk, c.page_size * c.dcp_size)
            tgrid = math.lcm(grid, c.mamba_track_interval)
    if chunk is not None:
        sheet["checkpoint_grid"], sheet["track_grid"] = grid, tgrid
        if c.mamba_radix_cache_strategy != "no_buffer":
            sheet["extra_buffer"] = ("refused" if codes & _EXTRA_CODES
                                     else "warned" if "chunked_prefill_below_chunk" in warned else "ok")
        else:
            sheet["no_buffer"] = "refused" if codes & _NO_BUFFER_CODES else "ok"
    if c.enable_hierarchical_cache and c.hicache_storage_backend is not None and c.tp_size % c.dcp_size == 0:
        sheet["hicache_storage"] = "refused" if codes & _HICACHE_CODES else "ok"
    try:
        p = dcp_transfer_plan(t["num_kv_tokens"], physical_page_size=c.page_size, dcp_size=c.dcp_size,
                              dcp_rank=t["dcp_rank"], decode_prefix_len=t["decode_prefix_len"],
                              src_page_offset=t["src_page_offset"])
        sheet["transfer"] = [list(p.target_src), list(p.target_dst), list(p.draft_src), list(p.draft_dst)]
    except SGLangConfigError:
        sheet["transfer"] = "refused"
    return sheet


# -- the run --------------------------------------------------------------------------------------------
@dataclass
class SGLangReport:
    """The outcome of :func:`run_sglang`: every shrunk finding (a question on which the two sides differ)."""

    examples: int
    seed: int
    cases_checked: int = 0
    findings: list[dict[str, Any]] = field(default_factory=list)
    engine_version: str = SGLANG_VERSION

    @property
    def exit_code(self) -> int:
        return 1 if self.findings else 0

    def to_dict(self) -> dict[str, Any]:
        return {"engine": "sglang", "engine_version": self.engine_version, "examples": self.examples,
                "seed": self.seed, "cases_checked": self.cases_checked, "exit_code": self.exit_code,
                "findings": self.findings}

    def render(self) -> str:
        lines = [f"kvgeom conform: sglang {self.engine_version}, {self.cases_checked} cases "
                 f"(seed {self.seed}, {self.examples} examples per round)"]
        for f in self.findings:
            lines.append(f"NEW FINDING: sglang {self.engine_version} differs from kvgeom")
            lines.append(f"  case: {json.dumps(f['case'], sort_keys=True)}")
            for d in f["differences"]:
                lines.append(f"  {d['question']}: SGLang {json.dumps(d['engine'])} | kvgeom {json.dumps(d['kvgeom'])}")
            lines.append("  reproducer:")
            lines.append("    from kvgeom.conformance.sglang_engine import kvgeom_sglang_answers, sglang_answers")
            lines.append(f"    case = {f['case']!r}")
            lines.append("    print(sglang_answers(case), kvgeom_sglang_answers(case))")
        if not self.findings:
            lines.append("no new finding")
        return "\n".join(lines)


class _Found(Exception):
    def __init__(self, finding: dict[str, Any]) -> None:
        super().__init__(finding["signature"])
        self.finding = finding


def compare_sheets(engine: Mapping[str, Any], ours: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One difference per question of :data:`QUESTIONS` whose answers differ (missing = None)."""
    return [{"question": q, "engine": engine.get(q), "kvgeom": ours.get(q)}
            for q in QUESTIONS if engine.get(q) != ours.get(q)]


def run_sglang(*, examples: int = 200, seed: int = 0) -> SGLangReport:
    """Generate ``examples`` cases per round (at most six rounds), ask both sides, shrink each new kind of
    difference to a minimal case."""
    report = SGLangReport(examples, seed)
    seen: set[str] = set()
    known: set[tuple[str, ...]] = set()

    def check(case: dict[str, Any]) -> None:
        seen.add(json.dumps(case, sort_keys=True))
        try:
            ours = kvgeom_sglang_answers(case)
        except KVGeomError as e:  # pragma: no cover - the strategy draws well-formed sections only
            ours = {"error": str(e)}
        diffs = compare_sheets(sglang_answers(case), ours)
        signature = tuple(d["question"] for d in diffs)
        if diffs and signature not in known:
            raise _Found({"case": case, "differences": diffs, "signature": signature})

    for _ in range(6):
        @hypothesis_seed(seed)
        @settings(max_examples=examples, database=None, deadline=None, derandomize=False,
                  phases=[Phase.generate, Phase.shrink], report_multiple_bugs=False,
                  suppress_health_check=list(HealthCheck), verbosity=Verbosity.quiet)
        @given(deployments())
        def search(case: dict[str, Any]) -> None:
            check(case)

        try:
            search()
        except _Found as e:
            known.add(e.finding["signature"])
            report.findings.append({k: v for k, v in e.finding.items() if k != "signature"})
            continue
        break
    report.cases_checked = len(seen)
    return report


