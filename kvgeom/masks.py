"""Sparsity masks: which blocks of a group are worth storing (vLLM 0.33 `reachable_block_mask`).

vLLM 0.33 keeps the masks in ``v1/core/single_type_kv_cache_manager.py`` (one per manager).

A mask is ``None`` (dense: every block) or a frozenset of block indices. Every
mask is computed in the group's own span: a Mamba group's blocks are
``B_m`` tokens wide whatever the DCP size, and so is a sliding-window group
replicated under DCP.

* full attention, chunked local, cross attention: dense;
* Mamba, by retention interval R: ``None`` dense; ``0`` only the reachable
  boundaries; ``R > 0`` one state per R tokens (blocks ``R/B_m - 1``,
  ``2R/B_m - 1``, ...; dense when ``R <= B_m``), plus the reachable
  boundaries. A reachable boundary t (the replay boundary ``num_prompt - 1``,
  a shared-prefix junction) keeps block ``rdown(t, alignment) // B_m - 1``, the last block ending at or
  below the aligned boundary (vLLM 0.33 floors a boundary off the block grid);
* sliding window (the connector's store mask, vLLM 0.33
  ``SlidingWindowManager.reachable_block_mask`` as ``_reachable_store_block_mask`` calls it): a
  hit at an aligned boundary needs the ``need = cdiv(sliding_window - 1 + extra_retained_tokens, S)``
  blocks before it (the connector widens the window by ``extra_retained_tokens`` because a
  restore brings back all the retained history). Segments are ``alignment`` tokens for
  ``R = None``, ``R`` tokens for ``R > 0``, none for ``R = 0``; a block is kept when it is one of
  the last ``need`` blocks of its segment (``i % per_segment >= per_segment - need``), and the
  mask is dense when ``need >= per_segment`` (the tails cover every block). With ``R = None`` the
  request's last, partial segment (up to ``final_segment_end_block``) keeps its own tail; with
  ``R >= 0`` every aligned reachable boundary keeps the ``need`` blocks before it. Dense when the
  alignment is not a multiple of the span. ``R = None`` is therefore *not* "every block".

  **EAGLE** (a sliding-window manager with the drop, vLLM 0.33 ``SlidingWindowManager.reachable_block_mask``
  with ``use_eagle``): a hit matches one block past its boundary and drops it, so every kept run is one
  block longer (``need + 1``) and ends one block later: block ``i >= 1`` is kept when
  ``(i - 1) % per_segment >= per_segment - need - 1``, a reachable boundary keeps blocks
  ``[end + 1 - need - 1, end + 1)``, and there is no final-segment tail. Which managers run with the drop
  depends on the *side* (:func:`mask_side`): the connector's store mask follows the offload group's
  ``eagle_group`` flag (no fallback), the GPU prefix cache's mask the GPU drop set
  (``Geometry.gpu_drop_groups``); the GPU side's window is not widened by ``extra_retained_tokens``.

**Deliberate difference from vLLM 0.33** (``docs/deviations.md``, ``swa-mask-own-span``): vLLM's
sliding-window mask multiplies the block by the global DCP size, although a
sliding-window group under DCP is replicated; its grid is then D times too
coarse. kvgeom uses the group's span.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Literal, assert_never

from kvgeom._check import bounded_ints, flag, nonneg
from kvgeom._format import show
from kvgeom._math import cdiv, rdown
from kvgeom.errors import QueryError
from kvgeom.geometry import Geometry, GroupGeometry

__all__ = [
    "MAX_SCALAR_RESULT",
    "MAX_STORE_BLOCKS",
    "MaskSide",
    "check_result_size",
    "check_store_size",
    "default_alignment",
    "mask_side",
    "reachable_block_mask",
    "reachable_points",
    "swa_run",
    "swa_store_horizon",
]

MaskSide = Literal["offload", "gpu"]
"""Whose mask: the offloading connector's store mask (``"offload"``) or the GPU prefix cache's
``cache_blocks`` mask (``"gpu"``)."""

_UNSET: Any = object()


#: The most block indices a scalar mask or plan lists; past it the scalar path refuses
#: (``result_too_large``) and :mod:`kvgeom.batch` is the tool.
MAX_SCALAR_RESULT = 1 << 24


def check_result_size(count: int) -> None:
    """Refuse a scalar answer that would list more than :data:`MAX_SCALAR_RESULT` blocks
    (:class:`kvgeom.QueryError` ``result_too_large``, with ``count``); the bound itself is still built.
    Shared by the masks here and the store plans of :mod:`kvgeom.hits`.

    >>> check_result_size(MAX_SCALAR_RESULT)
    >>> try:
    ...     check_result_size(MAX_SCALAR_RESULT + 1)
    ... except QueryError as e:
    ...     print(e.problems[0].code)
    result_too_large
    """
    if count > MAX_SCALAR_RESULT:
        raise QueryError.single(
            "result_too_large",
            f"the answer lists {show(count)} blocks, more than the scalar path builds ({MAX_SCALAR_RESULT}); use "
            "kvgeom.batch for counts this large, or narrow the range (first_block / stored_chunks)",
            "num_blocks",
            count=count,
        )


#: The most blocks one scalar store plan (or hand-off walk) visits, over all its groups: each costs a few
#: microseconds of Python, so 2^18 blocks (4M tokens of 16-token blocks) answer within about a second; past
#: it the plan is refused before the work (issue 19: 10^9 tokens took minutes) and :mod:`kvgeom.batch` is
#: the tool (``plan_stores``), or ``stored_chunks`` narrows the range.
MAX_STORE_BLOCKS = 1 << 18


def check_store_size(count: int) -> None:
    """Refuse a store plan or Mamba hand-off walk over more than :data:`MAX_STORE_BLOCKS` blocks
    (:class:`kvgeom.QueryError` ``result_too_large``, with ``count`` and ``limit``); the bound itself is walked.

    >>> check_store_size(MAX_STORE_BLOCKS)
    >>> try:
    ...     check_store_size(MAX_STORE_BLOCKS + 1)
    ... except QueryError as e:
    ...     print(e.problems[0].code, e.problems[0].values)
    result_too_large {'count': 262145, 'limit': 262144}
    """
    if count > MAX_STORE_BLOCKS:
        raise QueryError.single(
            "result_too_large",
            f"the store plan walks {show(count)} blocks, more than the scalar path visits ({MAX_STORE_BLOCKS}); use "
            "kvgeom.batch.plan_stores for requests this long, or narrow the range (stored_chunks)",
            "num_tokens",
            count=count,
            limit=MAX_STORE_BLOCKS,
        )


def reachable_points(reachable: Any) -> list[int]:
    """``reachable`` (token boundaries a hit may resume at) checked: an iterable, not a string, of at most
    :data:`MAX_STORE_BLOCKS` ints in ``[0, int64 max]`` (``bad_reachable``, ``result_too_large``,
    ``not_an_integer``, ...: a ``range`` of 10^12 boundaries is refused before it is walked, issue 19).

    >>> reachable_points((99, 63))
    [99, 63]
    """
    return bounded_ints("reachable", reachable, MAX_STORE_BLOCKS, "reachable boundary", "token boundaries")


def default_alignment(geom: Geometry, group: int) -> int | None:
    """The alignment a group's mask rounds reachable boundaries to.

    Align-mode Mamba groups are thinned by the GPU manager, which aligns to the
    hit alignment A; positional groups by the connector, which aligns to its
    ``alignment_tokens`` (the attention chunk; vLLM 0.33 `SchedulerOffloadConfig.from_spec`).
    """
    g = geom.group(group)
    if g.is_align_mamba or geom.offload is None:
        return geom.hit_alignment_tokens
    return geom.offload.alignment_tokens


def mask_side(geom: Geometry, side: MaskSide | None) -> MaskSide:
    """The side a mask is taken for: ``side`` itself, or by default ``"offload"`` when the geometry has an
    offload section and ``"gpu"`` without one. Anything else is a :class:`kvgeom.QueryError` ``bad_side``.

    >>> import kvgeom
    >>> g = kvgeom.resolve(kvgeom.DEFAULT_CONFIG)   # it has an offload section
    >>> mask_side(g, None), mask_side(g, "gpu")
    ('offload', 'gpu')
    """
    if side is None:
        return "offload" if geom.offload is not None else "gpu"
    if side not in ("offload", "gpu"):
        raise QueryError.single(
            "bad_side", f"side must be 'offload' (the connector's store mask) or 'gpu' (the GPU prefix cache's), "
            f"got {side!r}", "side", side=repr(side),
        )
    return side


def swa_run(geom: Geometry, group: int, side: MaskSide | None = None) -> tuple[int, int]:
    """``(need, shift)`` of a sliding-window group's mask on ``side`` (:func:`mask_side`): the contiguous
    blocks a hit at an aligned boundary needs, and how many blocks past the boundary the run ends.

    ``need = cdiv(window, S) + eagle`` and ``shift = eagle``, where the window is ``window_need``
    (``sliding_window - 1 + extra_retained_tokens``) on the connector's side and ``gpu_window_need``
    (``sliding_window - 1``) on the GPU's, and ``eagle`` is 1 when that side's manager runs with the
    EAGLE drop (offload: the offload group's ``eagle_group``; GPU: ``Geometry.gpu_drop_groups``; vLLM 0.33
    ``SlidingWindowManager._contiguous_blocks_for_hit``). ``(0, 0)`` for every other family. On the
    connector's side of a geometry without an offload section (a connector other than vLLM's, as the
    LMCache model asks) no group runs the drop.
    Invariant: ``shift in (0, 1)`` and ``need >= shift``.

    >>> import kvgeom
    >>> swa = kvgeom.resolve({"groups": [{"kind": "full_attention", "block_size": 16},
    ...     {"kind": "sliding_window", "block_size": 16, "sliding_window": 32, "drafter": True}],
    ...     "speculative": {"method": "eagle", "num_speculative_tokens": 1}, "offload": {}})
    >>> swa_run(swa, 1), swa_run(swa, 1, "gpu")   # the window's 2 blocks plus the one the drop pops
    ((3, 1), (3, 1))
    """
    g = geom.group(group)
    if g.family != "sliding" or g.window_need is None or g.gpu_window_need is None:
        return 0, 0
    if mask_side(geom, side) == "offload":
        og = geom.offload.get(g.index) if geom.offload is not None else None
        eagle = og is not None and og.eagle_group
        window = g.window_need
    else:
        eagle = g.index in geom.gpu_drop_groups
        window = g.gpu_window_need
    shift = int(eagle)
    return cdiv(window, g.span) + shift, shift


def reachable_block_mask(
    geom: Geometry,
    group: int,
    num_blocks: int,
    *,
    first_block: int = 0,
    reachable: Iterable[int] = (),
    retention: int | None = _UNSET,
    alignment: int | None = _UNSET,
    final_segment_end_block: int | None = None,
    side: MaskSide | None = None,
) -> frozenset[int] | None:
    """Blocks in ``[first_block, num_blocks)`` of ``group`` worth storing, or ``None`` for all of them.

    ``retention`` defaults to the config's ``retention_interval`` and
    ``alignment`` to :func:`default_alignment`. ``final_segment_end_block`` (sliding window,
    ``retention=None`` only) is the exclusive end of the request's last segment, as
    :func:`swa_store_horizon` gives it; its tail is kept even when the segment is partial. A mask of more than
    :data:`MAX_SCALAR_RESULT` blocks is refused with :class:`kvgeom.QueryError`
    ``result_too_large`` (use :mod:`kvgeom.batch`). Postcondition: every returned
    index is in ``[first_block, num_blocks)``, and for Mamba each kept block ``i`` ends on
    a boundary ``(i+1)*B_m`` that is a multiple of R or the last block boundary at or below an
    aligned reachable boundary; for a sliding window each kept block ``i`` is among the last ``need`` blocks of its
    segment, of the final segment, or before an aligned reachable boundary (``R`` not None). ``side``
    (:func:`mask_side`; default: the connector's with an offload section, else the GPU's) decides a
    sliding-window group's window and whether it runs with the EAGLE drop (:func:`swa_run`: the run is
    ``need + 1`` blocks, one block later, no final tail).

    >>> import kvgeom
    >>> g = kvgeom.resolve(kvgeom.DEFAULT_CONFIG)
    >>> sorted(reachable_block_mask(g, 1, 4, retention=32, alignment=32))  # #49964's regression case
    [1, 3]
    >>> reachable_block_mask(g, 1, 4, retention=None) is None
    True
    >>> swa = kvgeom.resolve({"groups": [{"kind": "full_attention", "block_size": 64},
    ...     {"kind": "sliding_window", "block_size": 32, "sliding_window": 16}], "offload": {}})
    >>> sorted(reachable_block_mask(swa, 1, 6, retention=None))  # one block before each 64-token boundary
    [1, 3, 5]
    >>> eagle = kvgeom.resolve({"groups": [{"kind": "full_attention", "block_size": 16},
    ...     {"kind": "sliding_window", "block_size": 16, "sliding_window": 32, "drafter": True}],
    ...     "speculative": {"method": "eagle", "num_speculative_tokens": 1}, "offload": {}})
    >>> sorted(reachable_block_mask(eagle, 1, 13, retention=64))  # run by vLLM 0.33: ends 48-80, 112-144, 176-208
    [2, 3, 4, 6, 7, 8, 10, 11, 12]
    """
    g = geom.group(group)
    n = nonneg("num_blocks", num_blocks)
    lo = nonneg("first_block", first_block)
    R = geom.config.cache.retention_interval if retention is _UNSET else retention
    if alignment is _UNSET:
        align = default_alignment(geom, group)
    else:  # a string or float alignment was used unchecked, or raised TypeError (issue 19)
        align = None if alignment is None else nonneg("alignment", alignment)
    points = reachable_points(reachable)
    if final_segment_end_block is not None:
        final_segment_end_block = nonneg("final_segment_end_block", final_segment_end_block)
    if R is not None:
        R = nonneg("retention", R)
    span = g.span
    match g.family:
        case "full" | "chunked" | "cross" | "circular" | "hisparse" | "encoder":
            return None
        case "mamba":
            if R is None or not align or (R and span >= R):
                return None  # dense (vLLM: no retention interval, or no alignment to thin against)
            keep: set[int] = set()
            if R:
                step = R // span if R % span == 0 else None
                if step is None:
                    return None  # R off the block grid: resolve() rejects this with offloading; stay dense
                first = step - 1 + cdiv(max(lo - step + 1, 0), step) * step
                check_result_size(max(n - first, 0) // step)
                keep.update(range(first, n, step))
            for t in points:
                # the last block ending at or below the aligned boundary (vLLM 0.33
                # MambaManager.reachable_block_mask floors a boundary that is off the block grid)
                b = rdown(t, align) // span - 1
                if lo <= b < n:
                    keep.add(b)
            return frozenset(keep)
        case "sliding":
            need, shift = swa_run(geom, group, side)
            if not align or align % span:
                return None
            return _sliding_window_kept(
                lo, n, span, need, align, R, points, None if shift else final_segment_end_block, shift
            )
    assert_never(g.family)


def swa_store_need(g: GroupGeometry, span: int) -> int:
    """Contiguous blocks a sliding-window hit needs before its boundary, on the connector's store side.

    ``cdiv(sliding_window - 1 + extra_retained_tokens, span)``: vLLM 0.33's offloading scheduler
    (``_reachable_store_block_mask``) widens the window by ``extra_retained_tokens`` before it asks the
    manager for the mask, because its lookup needs the widened window (``load_window_size_in_chunks``).
    """
    if g.family != "sliding" or g.window_need is None:
        return 0
    return cdiv(g.window_need, span)


def _sliding_window_kept(
    lo: int,
    n: int,
    span: int,
    need: int,
    align: int,
    R: int | None,
    points: list[int],
    final_end: int | None,
    shift: int = 0,
) -> frozenset[int] | None:
    """The sliding-window store mask over blocks ``[lo, n)`` (see the module docstring for the rules);
    ``shift`` 1 under the EAGLE drop (the runs end one block later)."""
    segment = align if R is None else (R or None)
    keep: set[int] = set()
    if segment is not None:
        per = segment // span
        if need >= per:
            return None  # the tails cover every block of a segment
        if need == 0:
            return frozenset()  # a one-token window needs no history: nothing is worth storing
        # the last `need` blocks of every segment [m*per, (m+1)*per) meeting [lo, n), moved `shift` blocks on
        first_seg, last_seg = max(lo - shift, 0) // per, max(n - 1 - shift, 0) // per
        check_result_size(min(n - lo, (last_seg - first_seg + 1) * need))
        for m in range(first_seg, last_seg + 1):
            keep.update(range(max(m * per + per - need + shift, lo), min((m + 1) * per + shift, n)))
        if R is None and final_end is not None and final_end % per:
            start = final_end - final_end % per
            keep.update(range(max(start, final_end - need, lo), min(n, final_end)))
    if R is not None:
        for t in points:
            end = rdown(t, align) // span + shift
            keep.update(range(max(lo, end - need), min(n, end)))
    return frozenset(keep)


def swa_store_horizon(
    geom: Geometry,
    group: int,
    *,
    storable_chunks: int,
    prompt_chunks: int,
    finished: bool,
) -> int | None:
    """The chunk that ends a sliding-window group's last store segment, or None (no final tail).

    vLLM 0.33 ``_build_store_jobs``: with ``retention_interval = None`` a non-EAGLE group keeps the
    tail of the request's last, partial segment: for a finished request it ends at the storable
    chunks, while the storable chunks are within the prompt (``prompt_chunks``, the prompt's
    offloadable tokens // chunk) at the prompt's end, and during decode past the prompt nowhere.
    With a retention interval there is no final tail (the reachable boundaries play that part), and
    neither for an EAGLE group (``OffloadGroupGeometry.eagle_group``: vLLM gives it no store horizon).

    >>> import kvgeom
    >>> swa = kvgeom.resolve({"groups": [{"kind": "full_attention", "block_size": 64},
    ...     {"kind": "sliding_window", "block_size": 32, "sliding_window": 16}],
    ...     "cache": {"retention_interval": None}, "offload": {}})
    >>> swa_store_horizon(swa, 1, storable_chunks=3, prompt_chunks=7, finished=False)
    7
    """
    family = geom.group(group).family
    storable_chunks = nonneg("storable_chunks", storable_chunks)
    prompt_chunks = nonneg("prompt_chunks", prompt_chunks)
    finished = flag("finished", finished)
    if geom.config.cache.retention_interval is not None or family != "sliding":
        return None
    og = geom.offload.get(group) if geom.offload is not None else None
    if og is not None and og.eagle_group:
        return None  # an EAGLE group's runs end past the boundary: vLLM gives it no store horizon
    if finished:
        return storable_chunks
    if storable_chunks <= prompt_chunks:
        return prompt_chunks
    return None
