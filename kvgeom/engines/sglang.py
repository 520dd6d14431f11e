"""SGLang 0.5.23's KV-cache geometry, from what an SGLang deployment states.

SGLang pages every KV pool with one ``page_size``; under decode context parallelism (DCP) its
allocator and radix tree page at ``page_size * dcp_size`` (the *tree page*). Mamba states are not
paged: a state hangs off a radix node as a *checkpoint*, and a node can only carry one whose depth
lies on the tree page. This module derives, from an :class:`SGLangConfig` (SGLang's server-args names,
a ``sglang:`` section of a kvgeom file or a file of its own), every number that follows
(:class:`SGLangGeometry`):

* the tree page ``page_size * dcp_size``, which is also the KV-event block size and HiCache's
  logical page (:func:`tree_page`);
* the Mamba cache chunk ``max(model chunk or 64, page_size)``, one of which must divide the other
  (:func:`mamba_cache_chunk_size`);
* the checkpoint grid ``lcm(chunk, tree page)`` (:func:`checkpoint_grid`: the fix of SGLang #34808,
  #35412 and #39115; before it, checkpoints sat on the chunk grid and, when DCP widened the page past
  a divisor of the chunk, landed off the tree page) and the track grid ``lcm(checkpoint grid,
  mamba_track_interval)`` (:func:`track_grid`);
* where checkpoints can exist for a prompt (:func:`checkpoint_positions`) and the hit a prefix can
  give (:func:`prefix_hit`);
* the PD transfer plan under DCP, target KV strided by rank and draft KV replicated
  (:func:`dcp_transfer_plan`);
* SGLang's start-up validators (errors) and the combinations it accepts that lose or corrupt hits
  (warnings), each naming the field, the numbers and the fix.

Every rule here was established by calling SGLang 0.5.23's installed code on CPU
(``kvgeom/conformance/sglang_*.py`` does so on every run); the code is kvgeom's own.

Invariants (laws in ``tests/property/test_sglang_laws.py``):

* ``tree_page == page_size * dcp_size == kv_event_block_size == hicache_logical_page``;
* the checkpoint grid is a multiple of both the tree page and the Mamba chunk, and the smallest such
  number; the track grid is a multiple of the checkpoint grid and of ``mamba_track_interval``;
* every checkpoint position is on the tree page (with ``checkpoint_grid="lcm"``);
* a prefix hit never exceeds the matched tokens, the full-KV hit is a multiple of the tree page and the
  Mamba branch point is a checkpoint at or below it;
* a config either resolves or raises :class:`SGLangConfigError` (never an ``assert``).

>>> g = resolve_sglang({"page_size": 64, "dcp_size": 2, "tp_size": 2, "pools": ["full", "mamba"],
...                     "mamba_chunk_size": 192})
>>> g.tree_page, g.mamba_chunk, g.checkpoint_grid, g.track_grid, g.kv_event_block_size
(128, 192, 384, 768, 128)
>>> [w.code for w in g.warnings]
['checkpoint_grid_widened', 'track_interval_widened']
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from kvgeom._check import bounded_ints, positive
from kvgeom._format import show
from kvgeom._pydantic import FrozenModel, NonNegativeInt, PositiveInt, StrictBool
from kvgeom.config import read_file
from kvgeom.errors import ConfigError, GeometryError, Problem, QueryError
from kvgeom.masks import MAX_SCALAR_RESULT, check_result_size

if TYPE_CHECKING:
    from kvgeom.events import KVEventReader
    from kvgeom.geometry import Geometry

__all__ = [
    "FLA_CHUNK_SIZE",
    "GLOSSARY",
    "POOLS",
    "SGLANG_VERSION",
    "STRATEGIES",
    "DCPTransferPlan",
    "SGLangConfig",
    "SGLangConfigError",
    "SGLangGeometry",
    "SGLangHit",
    "SGLangWarning",
    "checkpoint_grid",
    "checkpoint_positions",
    "dcp_transfer_plan",
    "event_geometry",
    "event_reader",
    "explain_sglang",
    "hit_warnings",
    "is_sglang_source",
    "load_sglang",
    "mamba_cache_chunk_size",
    "prefix_hit",
    "resolve_sglang",
    "swa_tombstones",
    "track_grid",
    "tree_page",
]

SGLANG_VERSION = "0.5.23"
"""The SGLang release every rule here was checked against."""

FLA_CHUNK_SIZE = 64
"""The FLA kernel chunk SGLang uses when the model states no ``mamba_chunk_size``."""

STRATEGIES: tuple[str, ...] = ("no_buffer", "extra_buffer", "extra_buffer_lazy")
"""``mamba_radix_cache_strategy`` values (SGLang's ``auto`` resolves to one of these per model)."""

POOLS: tuple[str, ...] = ("full", "mla", "swa", "mamba", "dsa")
"""Pools a deployment can have: full-attention KV, MLA latent KV, sliding-window KV, Mamba state, the
DSA index."""

GLOSSARY: dict[str, str] = {
    "tree page": "page_size * dcp_size (get_alloc_page_size, the radix tree's and allocator's page)",
    "Mamba chunk": "mamba_cache_chunk_size (arg_groups/overrides.py)",
    "checkpoint grid": "mamba_checkpoint_grid(tree_page) (runtime_context.py)",
    "track grid": "mamba_track_grid(tree_page) (runtime_context.py)",
    "KV-event block size": "kv_event_block_size_of (arg_groups/overrides.py)",
    "HiCache logical page": "HiCacheStorageConfig.logical_page_size (mem_cache/hicache_storage.py)",
    "PD transfer plan": "build_dcp_token_transfer_plan (disaggregation/common/utils.py)",
    "virtual page": "physical_page_size * dcp_size in build_dcp_token_transfer_plan",
    "full-KV hit": "the full component's match length in UnifiedRadixCache.match_prefix",
    "Mamba branch point": "the depth of the deepest node holding a mamba_value on the matched path",
    "checkpoint": "a Mamba state (mamba_value) attached to a radix-tree node",
    "model chunk": "hf_config.mamba_chunk_size (FLA CHUNK_SIZE 64 when absent)",
    "SWA window": "CacheInitParams.swa_retain_window (max of sliding_window_size and draft_swa_window)",
    "SWA tombstone": "a radix node whose SWA component value is None (evicted; its full KV stays)",
    "evicted tokens": "swa_evicted_seqlen (InsertParams.get_evicted_seqlen(ComponentType.SWA))",
    "pools": "the pools the model and server args create (full KV, MLA, SWA, Mamba state, DSA index)",
}
"""kvgeom's term -> SGLang 0.5.23's name for it (:data:`SGLANG_NAMES` is the other direction)."""

SGLANG_NAMES: dict[str, str] = {v.split(" (")[0]: k for k, v in GLOSSARY.items()}
"""SGLang's name -> kvgeom's term (the keys of :data:`GLOSSARY` read backwards)."""

Strategy = Literal["no_buffer", "extra_buffer", "extra_buffer_lazy"]
Pool = Literal["full", "mla", "swa", "mamba", "dsa"]


class SGLangConfigError(GeometryError):
    """An SGLang deployment that SGLang 0.5.23 refuses at start-up (or would fail on at its first
    transfer): each problem names the server arg, the numbers and the fix."""


@dataclass(frozen=True, slots=True)
class SGLangWarning:
    """A combination SGLang accepts that loses or corrupts prefix hits: ``code``, ``field`` and a
    message naming the numbers and the fix."""

    code: str
    field: str
    message: str


class SGLangConfig(FrozenModel):
    """What an SGLang deployment states, under SGLang's server-args names (``--page-size`` is
    ``page_size``). Unknown keys, wrong types and out-of-range values are :class:`kvgeom.ConfigError`
    naming ``sglang.<field>``.

    ``mamba_chunk_size`` is the model's (``hf_config.mamba_chunk_size``; None: the FLA kernel's 64).
    ``checkpoint_grid`` is kvgeom's, not a server arg: the grid the SGLang build places Mamba
    checkpoints on, ``"lcm"`` for 0.5.23 (after #34808/#35412/#39115) or ``"chunk"`` for builds
    before the fix, whose checkpoints land off the tree page when DCP widens it.
    ``sliding_window_size`` is the model's (the ``swa`` pool's attention window) and
    ``draft_swa_window`` the tokens a fused draft model reads back in that pool (0 without one); the
    radix tree keeps ``max`` of the two (:attr:`SGLangGeometry.swa_window`).
    """

    FIELD_PREFIX: ClassVar[str] = "sglang"

    page_size: PositiveInt = 1
    dcp_size: PositiveInt = 1
    tp_size: PositiveInt = 1
    pools: tuple[Pool, ...] = ("full",)
    mamba_chunk_size: PositiveInt | None = None
    mamba_track_interval: PositiveInt = 256
    mamba_radix_cache_strategy: Strategy = "extra_buffer"
    speculative_num_draft_tokens: PositiveInt | None = None
    chunked_prefill_size: int | None = None
    disaggregation_mode: Literal["null", "prefill", "decode"] = "null"
    enable_hierarchical_cache: StrictBool = False
    hicache_storage_backend: str | None = None
    enable_unified_memory: StrictBool = False
    disable_overlap_schedule: StrictBool = False
    enable_mixed_chunk: StrictBool = False
    checkpoint_grid: Literal["lcm", "chunk"] = "lcm"
    sliding_window_size: PositiveInt | None = None
    draft_swa_window: NonNegativeInt = 0

    @property
    def has_mamba(self) -> bool:
        return "mamba" in self.pools

    @property
    def is_mla(self) -> bool:
        return "mla" in self.pools


# -- the rules ----------------------------------------------------------------------------------------
def tree_page(page_size: int, dcp_size: int = 1) -> int:
    """The page SGLang's allocator and radix tree use: ``page_size * dcp_size``; also the KV-event block
    size and HiCache's logical page. Invariant: a multiple of ``page_size`` and of ``dcp_size``.

    >>> tree_page(64, 2), tree_page(1)
    (128, 1)
    """
    return positive("page_size", page_size) * positive("dcp_size", dcp_size)


def mamba_cache_chunk_size(model_chunk: int | None, page_size: int) -> int:
    """SGLang's Mamba cache chunk: ``max(model_chunk or 64, page_size)``, where one of the two must
    divide the other (else :class:`SGLangConfigError` naming both). Invariant: a multiple of both.

    >>> mamba_cache_chunk_size(None, 16), mamba_cache_chunk_size(128, 256)
    (64, 256)
    >>> mamba_cache_chunk_size(192, 128)
    Traceback (most recent call last):
    ...
    kvgeom.engines.sglang.SGLangConfigError: sglang.page_size: page_size=128 and the model's Mamba chunk 192 ...
    """
    chunk = FLA_CHUNK_SIZE if model_chunk is None else positive("model_chunk", model_chunk)
    page_size = positive("page_size", page_size)
    if max(chunk, page_size) % min(chunk, page_size):
        raise SGLangConfigError.single(
            "mamba_chunk_page_mismatch",
            f"page_size={page_size} and the model's Mamba chunk {chunk} must divide one another (SGLang asserts "
            f"it at start-up); use a page_size that divides {chunk}, e.g. {math.gcd(chunk, page_size)}",
            "sglang.page_size", page_size=page_size, mamba_chunk=chunk)
    return max(chunk, page_size)


def checkpoint_grid(chunk: int, tree_page: int) -> int:
    """Where Mamba checkpoints can sit in SGLang 0.5.23: ``lcm(chunk, tree_page)``, the smallest depth
    that is both a Mamba chunk end and a tree-page end (the #34808/#35412/#39115 fix).

    >>> checkpoint_grid(64, 128), checkpoint_grid(192, 128), checkpoint_grid(256, 64)
    (128, 384, 256)
    """
    return math.lcm(positive("chunk", chunk), positive("tree_page", tree_page))


def track_grid(grid: int, mamba_track_interval: int) -> int:
    """Where decode-tracked checkpoints can sit: ``lcm(checkpoint grid, mamba_track_interval)``.

    >>> track_grid(384, 256)
    768
    """
    return math.lcm(positive("grid", grid), positive("mamba_track_interval", mamba_track_interval))


# -- the resolved geometry ------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class SGLangGeometry:
    """An SGLang deployment's resolved geometry (see the module docstring for each number)."""

    config: SGLangConfig
    tree_page: int
    mamba_chunk: int | None
    """The Mamba cache chunk (None without a Mamba pool)."""
    checkpoint_grid: int | None
    """Where this build puts prefill checkpoints: lcm(chunk, tree page), or the chunk for a pre-fix
    build (``checkpoint_grid="chunk"``). None without a Mamba pool."""
    track_grid: int | None
    kv_event_block_size: int
    hicache_logical_page: int
    warnings: tuple[SGLangWarning, ...]
    swa_window: int | None = None
    """The history the tree keeps for a sliding-window pool, ``max(sliding_window_size,
    draft_swa_window)``: a prefix hit needs this many SWA-resident tokens since the last tombstone.
    None without an ``swa`` pool or without a stated ``sliding_window_size``."""

    def to_dict(self) -> dict[str, Any]:
        """The numbers, the config and the warnings as plain JSON values."""
        return {
            "engine": "sglang",
            "sglang_version": SGLANG_VERSION,
            "config": self.config.model_dump(mode="json"),
            "tree_page": self.tree_page,
            "mamba_chunk": self.mamba_chunk,
            "checkpoint_grid": self.checkpoint_grid,
            "track_grid": self.track_grid,
            "kv_event_block_size": self.kv_event_block_size,
            "hicache_logical_page": self.hicache_logical_page,
            "swa_window": self.swa_window,
            "warnings": [{"code": w.code, "field": w.field, "message": w.message} for w in self.warnings],
        }


def _problems(c: SGLangConfig, chunk: int | None) -> list[Problem]:
    """SGLang's start-up validators (mamba_hook, kv_cache_hook, HiCacheStorageConfig), as problems."""
    out: list[Problem] = []

    def bad(code: str, field: str, message: str, **values: Any) -> None:
        out.append(Problem(code, message, "sglang." + field, values))

    if c.has_mamba and c.mamba_radix_cache_strategy == "no_buffer":
        if c.page_size != 1:
            bad("no_buffer_page_size", "page_size",
                f"mamba_radix_cache_strategy='no_buffer' needs page_size=1, got {c.page_size}; set page_size=1 or "
                "use 'extra_buffer'", page_size=c.page_size)
        if not c.disable_overlap_schedule:
            bad("no_buffer_overlap", "disable_overlap_schedule",
                "mamba_radix_cache_strategy='no_buffer' does not support the overlap schedule; set "
                "disable_overlap_schedule=true or use 'extra_buffer'")
    if c.has_mamba and c.mamba_radix_cache_strategy != "no_buffer":
        if c.mamba_radix_cache_strategy == "extra_buffer_lazy" and c.disaggregation_mode != "null":
            bad("lazy_under_pd", "mamba_radix_cache_strategy",
                f"'extra_buffer_lazy' is refused under PD disaggregation (disaggregation_mode="
                f"{c.disaggregation_mode!r}); use 'extra_buffer'", disaggregation_mode=c.disaggregation_mode)
        n = c.speculative_num_draft_tokens
        if n is not None and c.mamba_track_interval < n:
            bad("track_interval_below_draft", "mamba_track_interval",
                f"mamba_track_interval={c.mamba_track_interval} is below speculative_num_draft_tokens={n}; "
                f"use a mamba_track_interval of at least {n} (and a multiple of page_size={c.page_size})",
                mamba_track_interval=c.mamba_track_interval, speculative_num_draft_tokens=n)
        if c.mamba_track_interval % c.page_size:
            fix = math.lcm(c.page_size, max(c.mamba_track_interval // c.page_size, 1) * c.page_size)
            bad("track_interval_page", "mamba_track_interval",
                f"mamba_track_interval={c.mamba_track_interval} is not a multiple of page_size={c.page_size}; "
                f"use e.g. {fix}", mamba_track_interval=c.mamba_track_interval, page_size=c.page_size)
    if c.dcp_size > 1 and c.tp_size % c.dcp_size:
        bad("dcp_tp", "dcp_size",
            f"dcp_size={c.dcp_size} does not divide tp_size={c.tp_size}: DCP groups are contiguous within TP; "
            f"use a dcp_size that divides {c.tp_size}", dcp_size=c.dcp_size, tp_size=c.tp_size)
    if c.enable_hierarchical_cache and c.hicache_storage_backend is not None and c.dcp_size > 1 and not c.is_mla:
        bad("hicache_dcp_needs_mla", "dcp_size",
            f"HiCache storage (hicache_storage_backend={c.hicache_storage_backend!r}) under dcp_size={c.dcp_size} "
            "needs an MLA model (HiCacheStorageConfig); add the 'mla' pool, or use dcp_size=1 or no storage backend",
            dcp_size=c.dcp_size)
    if c.enable_unified_memory and c.dcp_size > 1:
        if not c.is_mla:
            bad("unified_memory_dcp_mla", "enable_unified_memory",
                f"enable_unified_memory with dcp_size={c.dcp_size} supports MLA models only; add the 'mla' pool or "
                "turn one of them off", dcp_size=c.dcp_size)
        if "swa" in c.pools:
            bad("unified_memory_dcp_swa", "enable_unified_memory",
                f"enable_unified_memory with dcp_size={c.dcp_size} does not support sliding-window pools; turn "
                "one of them off", dcp_size=c.dcp_size)
        if c.disaggregation_mode != "null":
            bad("unified_memory_dcp_pd", "enable_unified_memory",
                f"enable_unified_memory with dcp_size={c.dcp_size} does not support PD disaggregation "
                f"(disaggregation_mode={c.disaggregation_mode!r}); turn one of them off", dcp_size=c.dcp_size)
    return out


def _warnings(
    c: SGLangConfig, page: int, chunk: int | None, grid: int | None, tgrid: int | None
) -> list[SGLangWarning]:
    out: list[SGLangWarning] = []
    if chunk is None or grid is None or tgrid is None:
        return out
    if c.mamba_radix_cache_strategy == "no_buffer":
        out.append(SGLangWarning(
            "no_buffer_insert_ends", "sglang.mamba_radix_cache_strategy",
            "mamba_radix_cache_strategy='no_buffer' keeps Mamba states only where a request's insert ends: a "
            "later request that branches inside a cached prefix finds no state there and hits 0 tokens "
            "(SGLang #22935, #38625); use 'extra_buffer' for checkpoints on the grid"))
        return out
    if grid > chunk and c.checkpoint_grid == "lcm":
        fits = [p for p in range(c.page_size, 0, -1) if chunk % (p * c.dcp_size) == 0]
        hint = (f"page_size={fits[0]} (tree page {fits[0] * c.dcp_size}, a divisor of {chunk})" if fits
                else f"a page_size with page_size*dcp_size dividing {chunk}")
        out.append(SGLangWarning(
            "checkpoint_grid_widened", "sglang.page_size",
            f"the tree page page_size*dcp_size={c.page_size}*{c.dcp_size}={page} does not divide the Mamba chunk "
            f"{chunk}, so checkpoints sit every lcm({chunk}, {page})={grid} tokens instead of every {chunk}: a "
            f"prefix hit can lose up to {grid - 1} tokens (the #34808 fix keeps them on the tree page); use {hint}"))
    if tgrid > c.mamba_track_interval:
        out.append(SGLangWarning(
            "track_interval_widened", "sglang.mamba_track_interval",
            f"mamba_track_interval={c.mamba_track_interval} is not a multiple of the checkpoint grid {grid}, so "
            f"decode tracks a state every lcm({grid}, {c.mamba_track_interval})={tgrid} tokens, not every "
            f"{c.mamba_track_interval}; use a multiple of {grid}"))
    cps = c.chunked_prefill_size
    if cps is not None and 0 < cps < chunk:
        out.append(SGLangWarning(
            "chunked_prefill_below_chunk", "sglang.chunked_prefill_size",
            f"chunked_prefill_size={cps} is below the Mamba chunk {chunk}: an unfinished chunked prefill can skip "
            f"its Mamba checkpoint (SGLang warns at start-up); use a chunked_prefill_size of at least {chunk}"))
    if c.enable_mixed_chunk:
        out.append(SGLangWarning(
            "mixed_chunk_checkpoints", "sglang.enable_mixed_chunk",
            "enable_mixed_chunk skips the extra-buffer write but still donates the slot, corrupting Mamba "
            "checkpoints (SGLang #39342); turn enable_mixed_chunk off with a Mamba radix cache"))
    if c.enable_hierarchical_cache:
        out.append(SGLangWarning(
            "hicache_mamba_host_hit", "sglang.enable_hierarchical_cache",
            "a host-tier HiCache hit on a Mamba (GDN) hybrid has answered wrongly (SGLang #39830) and host "
            "Mamba slots sized by the device ratio leave host KV dead (#39436); verify host hits or keep "
            "HiCache off for Mamba hybrids"))
    if "dsa" in c.pools:
        out.append(SGLangWarning(
            "dsa_wider_page", "sglang.pools",
            "a DSA index widens the tree page and a Mamba checkpoint can land past the cache key (SGLang "
            "#38212); check the widened page against the checkpoint grid"))
    return out


def hit_warnings(source: SGLangConfig | Mapping[str, Any]) -> tuple[SGLangWarning, ...]:
    """The warnings of a deployment (combinations SGLang accepts that lose or corrupt hits), also for a
    deployment whose other settings SGLang refuses: nothing about them depends on the refused settings.

    >>> [w.code for w in hit_warnings({"page_size": 16, "pools": ["full", "mamba"], "chunked_prefill_size": 32})]
    ['chunked_prefill_below_chunk']
    """
    c = load_sglang(source)
    if not c.has_mamba:
        return ()
    page = tree_page(c.page_size, c.dcp_size)
    try:
        chunk = mamba_cache_chunk_size(c.mamba_chunk_size, c.page_size)
    except SGLangConfigError:
        return ()
    grid = checkpoint_grid(chunk, page) if c.checkpoint_grid == "lcm" else chunk
    return tuple(_warnings(c, page, chunk, grid, track_grid(grid, c.mamba_track_interval)))


def load_sglang(source: SGLangConfig | Mapping[str, Any] | str | os.PathLike[str]) -> SGLangConfig:
    """An :class:`SGLangConfig` from a model, a mapping (the ``sglang`` section itself, or a table holding
    one) or a ``.json``/``.toml`` path whose top level has a ``sglang`` table. Bad input is a
    :class:`kvgeom.ConfigError` naming the field.

    >>> load_sglang({"sglang": {"page_size": 16}}).page_size
    16
    >>> load_sglang({"page_size": 0})
    Traceback (most recent call last):
    ...
    kvgeom.errors.ConfigError: sglang.page_size: ...
    """
    if isinstance(source, SGLangConfig):
        return source
    data: Any = read_file(Path(source)) if isinstance(source, str | os.PathLike) else source
    if isinstance(data, Mapping) and "sglang" in data:
        data = data["sglang"]
    if not isinstance(data, Mapping):
        raise ConfigError.single("not_a_table", f"the sglang section is a table, got {type(data).__name__}", "sglang")
    return SGLangConfig.model_validate(dict(data))


def is_sglang_source(data: Any) -> bool:
    """True for a parsed file whose top level holds a ``sglang`` table (an SGLang deployment).

    >>> is_sglang_source({"sglang": {}}), is_sglang_source({"groups": []})
    (True, False)
    """
    return isinstance(data, Mapping) and "sglang" in data


def resolve_sglang(source: SGLangConfig | Mapping[str, Any] | str | os.PathLike[str]) -> SGLangGeometry:
    """Resolve an SGLang deployment (see :func:`load_sglang` for ``source``). Every start-up check SGLang
    0.5.23 makes is one problem of one :class:`SGLangConfigError`; combinations it accepts that lose or
    corrupt hits are :class:`SGLangWarning` on the result.

    A pre-fix build (``checkpoint_grid="chunk"``) whose Mamba chunk is not a multiple of the tree page is
    an error: its checkpoints land off the tree page (#34808).

    >>> resolve_sglang({"page_size": 64, "dcp_size": 4, "tp_size": 4, "pools": ["full", "mamba"],
    ...                 "checkpoint_grid": "chunk"})
    Traceback (most recent call last):
    ...
    kvgeom.engines.sglang.SGLangConfigError: sglang.checkpoint_grid: checkpoints on the Mamba chunk grid ...
    """
    c = load_sglang(source)
    page = tree_page(c.page_size, c.dcp_size)
    chunk = grid = tgrid = None
    problems: list[Problem] = []
    if c.has_mamba:
        try:
            chunk = mamba_cache_chunk_size(c.mamba_chunk_size, c.page_size)
        except SGLangConfigError as e:
            problems.extend(e.problems)
    problems.extend(_problems(c, chunk))
    if chunk is not None:
        lcm = checkpoint_grid(chunk, page)
        if c.checkpoint_grid == "chunk" and chunk % page:
            problems.append(Problem(
                "checkpoint_off_tree_page",
                f"checkpoints on the Mamba chunk grid (every {chunk} tokens) land off the tree page "
                f"page_size*dcp_size={c.page_size}*{c.dcp_size}={page}: a checkpoint at {chunk} is on no radix "
                f"node, the state lands on the wrong node and hits are counted twice (SGLang #34808); upgrade to "
                f"an SGLang with the lcm grid (#35412, #39115: every {lcm} tokens) or make page_size*dcp_size "
                f"divide {chunk}", "sglang.checkpoint_grid",
                {"mamba_chunk": chunk, "tree_page": page, "lcm": lcm}))
        grid = lcm if c.checkpoint_grid == "lcm" else chunk
        tgrid = track_grid(grid, c.mamba_track_interval)
    if problems:
        raise SGLangConfigError(problems)
    return SGLangGeometry(
        config=c, tree_page=page, mamba_chunk=chunk, checkpoint_grid=grid, track_grid=tgrid,
        kv_event_block_size=page, hicache_logical_page=page,
        warnings=tuple(_warnings(c, page, chunk, grid, tgrid)),
        swa_window=(max(c.sliding_window_size, c.draft_swa_window)
                    if "swa" in c.pools and c.sliding_window_size is not None else None))


# -- questions about a request ----------------------------------------------------------------------
def _sglang_geometry(geom: Any) -> None:
    if not isinstance(geom, SGLangGeometry):
        raise QueryError.single(
            "not_sglang_geometry",
            f"geom must be an SGLangGeometry (kvgeom.engines.sglang.resolve_sglang), got {type(geom).__name__}",
            "geom",
        )


def checkpoint_positions(geom: SGLangGeometry, num_tokens: int) -> tuple[int, ...]:
    """The depths at which a ``num_tokens``-token prompt can leave a Mamba checkpoint in the tree: every
    multiple of the checkpoint grid up to ``num_tokens`` (``extra_buffer``), or only the insert end
    (``no_buffer``, #22935). Empty without a Mamba pool. Invariant (lcm grid): each is a multiple of the
    tree page and of the Mamba chunk.

    >>> g = resolve_sglang({"page_size": 64, "dcp_size": 2, "tp_size": 2, "pools": ["full", "mamba"]})
    >>> checkpoint_positions(g, 300)
    (128, 256)
    """
    _sglang_geometry(geom)
    if type(num_tokens) is not int or num_tokens < 0:
        raise QueryError.single("bad_num_tokens", f"num_tokens must be an int >= 0, got {show(num_tokens)}",
                                "num_tokens", num_tokens=num_tokens)
    grid = geom.checkpoint_grid
    if grid is None:
        return ()
    if geom.config.mamba_radix_cache_strategy == "no_buffer":
        return (num_tokens,) if num_tokens else ()
    check_result_size(num_tokens // grid)  # 2^62 tokens would list 2^55 depths: refused (issue 19)
    return tuple(range(grid, num_tokens + 1, grid))


@dataclass(frozen=True, slots=True)
class SGLangHit:
    """What a prefix match gives, as SGLang's ``match_prefix`` reports it: the device prefix (what the
    request reuses: the deepest matched node every pool accepts), the full-KV hit (tree pages matched)
    and the Mamba branch point (the deepest checkpoint at or below the full-KV hit; None without a Mamba
    pool). Without a sliding-window pool the device prefix of a Mamba hybrid is its branch point.
    Checked against SGLang's unified radix cache kit (``kvgeom/conformance/sglang_radix.py``)."""

    device_prefix: int
    full_kv_hit: int
    mamba_branch_point: int | None

    @property
    def hit_tokens(self) -> int:
        """The tokens the request reuses (the device prefix)."""
        return self.device_prefix


def _ranges(geom: SGLangGeometry, tombstones: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    """``tombstones`` checked (a sliding-window pool with a window; ``0 <= start < stop``) and merged."""
    if tombstones and geom.swa_window is None:
        fix = ("set sglang.sliding_window_size" if "swa" in geom.config.pools
               else "add the 'swa' pool and its sliding_window_size")
        raise QueryError.single("swa_tombstones_without_window",
                                f"swa_tombstones={show(tombstones)} need a sliding-window pool with a window; {fix}",
                                "swa_tombstones")
    if isinstance(tombstones, str | bytes | Mapping) or not isinstance(tombstones, Sequence | set | frozenset):
        raise QueryError.single("bad_swa_tombstone",
                                f"swa_tombstones must be a list of (start, stop) token ranges, got {show(tombstones)}",
                                "swa_tombstones")
    check_result_size(len(tombstones))
    for r in tombstones:  # every range checked before they are sorted (mixed types must not reach sorted())
        if (not isinstance(r, tuple | list) or len(r) != 2 or not all(type(x) is int for x in r)
                or not 0 <= r[0] < r[1]):
            raise QueryError.single("bad_swa_tombstone",
                                    f"a tombstone is a token range (start, stop) with 0 <= start < stop, got {show(r)}",
                                    "swa_tombstones", tombstone=show(r))
    out: list[tuple[int, int]] = []
    for start, stop in sorted((t[0], t[1]) for t in tombstones):
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], stop))
        else:
            out.append((start, stop))
    return out


def _swa_accepts(depth: int, window: int, tombstones: Sequence[tuple[int, int]]) -> bool:
    """SGLang's SWA match validator at a node ending at ``depth``: the node is SWA-resident and at least
    ``window`` SWA-resident tokens lie between the last tombstone and ``depth`` (any number when no
    tombstone lies above it)."""
    if depth == 0:
        return True
    last_end = None
    for start, stop in tombstones:
        if start < depth <= stop:
            return False
        if stop < depth:
            last_end = stop
    return last_end is None or depth - last_end >= window


def prefix_hit(
    geom: SGLangGeometry, matched_tokens: int, checkpoints: Sequence[int] = (), *,
    swa_tombstones: Sequence[tuple[int, int]] = (),
) -> SGLangHit:
    """The hit of a prefix whose first ``matched_tokens`` tokens are in the tree, given the depths that
    hold Mamba checkpoints and the token ranges ``[start, stop)`` of the path whose sliding-window KV is
    evicted (SWA tombstones: see :func:`swa_tombstones`). The tree matches whole tree pages; a Mamba
    hybrid can stop only at a checkpoint; a sliding-window pool accepts a node that has at least
    :attr:`SGLangGeometry.swa_window` SWA-resident tokens since the last tombstone above it (every node
    when none lies above). The device prefix is the deepest depth every pool accepts.

    Invariants: ``device_prefix <= full_kv_hit <= matched_tokens``; ``full_kv_hit`` is a multiple of the
    tree page; the Mamba branch point is a checkpoint at or below the full-KV hit and never below the
    device prefix; no tombstones: the device prefix is the branch point (Mamba) or the full-KV hit.

    >>> g = resolve_sglang({"page_size": 64, "dcp_size": 2, "tp_size": 2, "pools": ["full", "mamba"]})
    >>> prefix_hit(g, 300, checkpoint_positions(g, 300))
    SGLangHit(device_prefix=256, full_kv_hit=256, mamba_branch_point=256)
    >>> prefix_hit(g, 300, [128])
    SGLangHit(device_prefix=128, full_kv_hit=256, mamba_branch_point=128)
    >>> prefix_hit(g, 300, [128]).hit_tokens
    128

    A sliding window of 4 with tokens [0, 6) evicted: 10 matched tokens keep 4 since the tombstone and
    hit; 9 keep 3 and fall back to the tombstone's start, 0.

    >>> w = resolve_sglang({"pools": ["full", "swa"], "sliding_window_size": 4})
    >>> prefix_hit(w, 10, swa_tombstones=[(0, 6)]).device_prefix, prefix_hit(w, 9, swa_tombstones=[(0, 6)])
    (10, SGLangHit(device_prefix=0, full_kv_hit=9, mamba_branch_point=None))
    """
    _sglang_geometry(geom)
    if type(matched_tokens) is not int or matched_tokens < 0:
        raise QueryError.single("bad_num_tokens", f"matched_tokens must be an int >= 0, got {show(matched_tokens)}",
                                "matched_tokens", matched_tokens=matched_tokens)
    tombs = _ranges(geom, swa_tombstones)
    full = matched_tokens - matched_tokens % geom.tree_page
    window = geom.swa_window
    if geom.checkpoint_grid is None:
        # Run ends are the only depths to try: validity only grows along a tombstone-free run.
        candidates = [full, *(s for s, _ in tombs if s <= full)]
        branch = None
    else:
        depths = bounded_ints("checkpoints", checkpoints, MAX_SCALAR_RESULT, "checkpoints[]", "depths")  # issue 19
        candidates = [c for c in depths if 0 < c <= full]
        branch = max(candidates, default=0)
    if window is not None and tombs:
        candidates = [d for d in candidates if _swa_accepts(d, window, tombs)]
    return SGLangHit(max(candidates, default=0), full, branch)


def swa_tombstones(geom: SGLangGeometry, inserts: Sequence[tuple[int, int]]) -> tuple[tuple[int, int], ...]:
    """Where a prompt's path carries SWA tombstones after a run of inserts, each given, in order, as
    ``(shared_tokens, evicted_tokens)``: the insert shares its first ``shared_tokens`` tokens with the
    prompt, and its request had already freed the sliding-window KV of its first ``evicted_tokens``
    (SGLang's ``swa_evicted_seqlen``, a multiple of the tree page). SGLang's rule on insert: the
    request's live window ``[evicted_tokens, shared_tokens)`` is SWA-resident afterwards (a tombstone
    there is recovered from the request's KV); below it, what the tree already held keeps its state
    and what the insert adds is a tombstone.

    Invariant: the ranges are disjoint, sorted, on the tree page and inside ``[0, max shared_tokens)``;
    no insert with evicted tokens: no tombstone.

    >>> w = resolve_sglang({"pools": ["full", "swa"], "sliding_window_size": 4})
    >>> swa_tombstones(w, [(12, 6)]), swa_tombstones(w, [(12, 6), (8, 2)]), swa_tombstones(w, [(4, 0), (12, 8)])
    (((0, 6),), ((0, 2),), ((4, 8),))
    """
    page = geom.tree_page
    covered = 0
    live: list[bool] = []
    for item in inserts:
        shared, evicted = item
        for name, v in (("shared_tokens", shared), ("evicted_tokens", evicted)):
            if type(v) is not int or v < 0 or v % page:
                raise QueryError.single(
                    "bad_swa_insert", f"{name}={v!r} must be an int >= 0 and a multiple of the tree page {page} "
                    f"(SGLang keeps whole pages); use {v - v % page if type(v) is int and v > 0 else 0}",
                    "inserts", **{name: v})
        check_result_size(shared)  # one flag per shared token: a huge insert is refused, not allocated (issue 19)
        live.extend([False] * max(0, shared - len(live)))
        for p in range(shared):
            if p >= evicted:
                live[p] = True
            elif p >= covered:
                live[p] = False
        covered = max(covered, shared)
    out: list[tuple[int, int]] = []
    for p, alive in enumerate(live):
        if alive:
            continue
        if out and out[-1][1] == p:
            out[-1] = (out[-1][0], p + 1)
        else:
            out.append((p, p + 1))
    return tuple(out)


@dataclass(frozen=True, slots=True)
class DCPTransferPlan:
    """Token rows one DCP rank sends in a PD transfer: target KV strided by rank (``target_src`` token
    offsets of the prefill side, ``target_dst`` the rank-local slots on the decode side) and draft KV
    replicated (every token, ``draft_dst`` on the virtual page)."""

    target_src: tuple[int, ...]
    target_dst: tuple[int, ...]
    draft_src: tuple[int, ...]
    draft_dst: tuple[int, ...]


def dcp_transfer_plan(
    num_kv_tokens: int, *, physical_page_size: int, dcp_size: int, dcp_rank: int,
    decode_prefix_len: int = 0, src_page_offset: int = 0,
) -> DCPTransferPlan:
    """The PD transfer plan of one DCP rank, with identity page tables: the rank owns the tokens whose
    global position ``decode_prefix_len + src_page_offset*physical_page_size + t`` is ``dcp_rank`` modulo
    ``dcp_size`` and writes them to consecutive local slots; draft KV goes to every rank. The decode
    prefix must be a multiple of the virtual page ``physical_page_size * dcp_size``.

    Invariants: the ranks' target rows partition the tokens; draft rows are all tokens.

    >>> p = dcp_transfer_plan(6, physical_page_size=2, dcp_size=2, dcp_rank=1)
    >>> p.target_src, p.target_dst, p.draft_src
    ((1, 3, 5), (0, 1, 2), (0, 1, 2, 3, 4, 5))
    >>> dcp_transfer_plan(4, physical_page_size=2, dcp_size=2, dcp_rank=0, decode_prefix_len=2)
    Traceback (most recent call last):
    ...
    kvgeom.engines.sglang.SGLangConfigError: decode_prefix_len: decode_prefix_len=2 is not a multiple ...
    """
    virtual = physical_page_size * dcp_size
    if decode_prefix_len % virtual:
        raise SGLangConfigError.single(
            "transfer_prefix_unaligned",
            f"decode_prefix_len={decode_prefix_len} is not a multiple of the virtual page "
            f"physical_page_size*dcp_size={physical_page_size}*{dcp_size}={virtual}; a PD transfer under DCP starts "
            f"on a virtual page: use a prefix of {decode_prefix_len - decode_prefix_len % virtual} or "
            f"{decode_prefix_len - decode_prefix_len % virtual + virtual}", "decode_prefix_len",
            decode_prefix_len=decode_prefix_len, virtual_page=virtual)
    base = src_page_offset * physical_page_size
    start = decode_prefix_len + base
    target = [t for t in range(num_kv_tokens) if (start + t) % dcp_size == dcp_rank]
    return DCPTransferPlan(
        target_src=tuple(target),
        target_dst=tuple((base + t) // dcp_size for t in target),
        draft_src=tuple(range(num_kv_tokens)),
        draft_dst=tuple(base + t for t in range(num_kv_tokens)),
    )


# -- KV events and the router ---------------------------------------------------------------------------
def event_geometry(geom: SGLangGeometry) -> Geometry:
    """A kvgeom :class:`~kvgeom.Geometry` whose one full-attention group spans the tree page: the
    geometry SGLang's KV events are keyed on (each stored block covers ``page_size * dcp_size`` tokens),
    for :class:`kvgeom.events.KVEventReader` and :func:`kvgeom.router.score_replicas`.

    >>> event_geometry(resolve_sglang({"page_size": 16, "dcp_size": 2, "tp_size": 2})).hash_block_size
    32
    """
    from kvgeom._resolve import resolve

    return resolve({"groups": [{"kind": "full_attention", "block_size": geom.kv_event_block_size}]})


def event_reader(geom: SGLangGeometry, **options: Any) -> KVEventReader:
    """A :class:`kvgeom.events.KVEventReader` for SGLang replicas running ``geom`` (``options`` as the
    reader takes them): it reads blocks of ``page_size * dcp_size`` tokens and refuses any other size.

    >>> g = resolve_sglang({"page_size": 16})
    >>> r = event_reader(g)
    >>> r.apply({"type": "BlockStored", "block_hashes": [7], "parent_block_hash": None,
    ...          "token_ids": list(range(16)), "block_size": 16, "lora_id": None, "medium": "GPU"}, replica=1)
    >>> r.residency("GPU").holders(0, 7)
    2
    """
    from kvgeom.events import KVEventReader

    return KVEventReader(event_geometry(geom), **options)


# -- text -------------------------------------------------------------------------------------------------
def explain_sglang(geom: SGLangGeometry, label: str = "") -> str:
    """The geometry in words, one line per number, then the warnings.

    >>> print(explain_sglang(resolve_sglang({"page_size": 16})))  # doctest: +NORMALIZE_WHITESPACE
    SGLang 0.5.23 deployment
      tree page: 16 tokens (page_size 16 x dcp_size 1); KV events and HiCache pages are 16 tokens
      pools: full
    """
    _sglang_geometry(geom)
    if not isinstance(label, str):
        raise QueryError.single("bad_label", f"label must be a string, got {type(label).__name__}", "label")
    c = geom.config
    head = f"SGLang {SGLANG_VERSION} deployment" + (f" {label}" if label else "")
    lines = [head,
             f"  tree page: {geom.tree_page} tokens (page_size {c.page_size} x dcp_size {c.dcp_size}); "
             f"KV events and HiCache pages are {geom.kv_event_block_size} tokens",
             f"  pools: {', '.join(c.pools)}"]
    if geom.mamba_chunk is not None:
        lines.append(f"  Mamba chunk: {geom.mamba_chunk} tokens (max(model chunk "
                     f"{c.mamba_chunk_size or FLA_CHUNK_SIZE}, page_size {c.page_size}))")
        lines.append(f"  Mamba radix cache: {c.mamba_radix_cache_strategy}")
        if c.mamba_radix_cache_strategy == "no_buffer":
            lines.append("  checkpoints: only where a request's insert ends")
        else:
            how = "lcm(chunk, tree page)" if c.checkpoint_grid == "lcm" else "the chunk (a pre-#34808 build)"
            lines.append(f"  checkpoint grid: every {geom.checkpoint_grid} tokens ({how})")
            lines.append(f"  track grid: every {geom.track_grid} tokens (lcm(checkpoint grid, "
                         f"mamba_track_interval {c.mamba_track_interval}))")
    for w in geom.warnings:
        lines.append(f"  warning: {w.message} [{w.code}]")
    return "\n".join(lines)
