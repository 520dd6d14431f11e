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
  a shared-prefix junction) keeps block ``rdown(t, alignment)/B_m - 1``;
* sliding window: the ``cdiv(sliding_window - 1, S)`` blocks before each
  retention segment end and each aligned reachable boundary; dense when the
  alignment is not a multiple of the span.

**Deliberate difference from vLLM 0.33** (``docs/deviations.md``, ``swa-mask-own-span``): vLLM's
sliding-window mask multiplies the block by the global DCP size, although a
sliding-window group under DCP is replicated; its grid is then D times too
coarse. kvgeom uses the group's span.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, assert_never

from kvgeom._check import nonneg
from kvgeom._math import cdiv, rdown
from kvgeom.errors import QueryError
from kvgeom.geometry import Geometry
from kvgeom.specs import sliding_window_of

__all__ = ["MAX_SCALAR_RESULT", "default_alignment", "reachable_block_mask"]

_UNSET: Any = object()


#: The most block indices a scalar mask or plan lists; past it the scalar path refuses
#: (``result_too_large``) and :mod:`kvgeom.batch` is the tool.
MAX_SCALAR_RESULT = 1 << 24


def _fits(count: int) -> None:
    if count > MAX_SCALAR_RESULT:
        raise QueryError.single(
            "result_too_large",
            f"the answer lists {count} blocks, more than the scalar path builds ({MAX_SCALAR_RESULT}); use "
            "kvgeom.batch for counts this large, or narrow the range (first_block / stored_chunks)",
            "num_blocks",
            count=count,
        )


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


def reachable_block_mask(
    geom: Geometry,
    group: int,
    num_blocks: int,
    *,
    first_block: int = 0,
    reachable: Iterable[int] = (),
    retention: int | None = _UNSET,
    alignment: int | None = _UNSET,
) -> frozenset[int] | None:
    """Blocks in ``[first_block, num_blocks)`` of ``group`` worth storing, or ``None`` for all of them.

    ``retention`` defaults to the config's ``retention_interval`` and
    ``alignment`` to :func:`default_alignment`. A mask of more than
    :data:`MAX_SCALAR_RESULT` blocks is refused with :class:`kvgeom.QueryError`
    ``result_too_large`` (use :mod:`kvgeom.batch`). Postcondition: every returned
    index is in ``[first_block, num_blocks)``, and for Mamba each kept block ``i`` ends on
    a boundary ``(i+1)*B_m`` that is a multiple of R or an aligned reachable
    boundary.

    >>> import kvgeom
    >>> g = kvgeom.resolve(kvgeom.DEFAULT_CONFIG)
    >>> sorted(reachable_block_mask(g, 1, 4, retention=32, alignment=32))  # #49964's regression case
    [1, 3]
    >>> reachable_block_mask(g, 1, 4, retention=None) is None
    True
    """
    g = geom.group(group)
    n = nonneg("num_blocks", num_blocks)
    lo = nonneg("first_block", first_block)
    R = geom.config.cache.retention_interval if retention is _UNSET else retention
    align = default_alignment(geom, group) if alignment is _UNSET else alignment
    points = [nonneg("reachable boundary", t) for t in reachable]
    if R is not None:
        R = nonneg("retention", R)
    span = g.span
    match g.family:
        case "full" | "chunked" | "cross" | "circular":
            return None
        case "mamba":
            if R is None or (R and span >= R):
                return None
            keep: set[int] = set()
            if R:
                step = R // span if R % span == 0 else None
                if step is None:
                    return None  # R off the block grid: resolve() rejects this with offloading; stay dense
                first = step - 1 + cdiv(max(lo - step + 1, 0), step) * step
                _fits(max(n - first, 0) // step)
                keep.update(range(first, n, step))
            if align:
                for t in points:
                    b = rdown(t, align)
                    if b > 0 and b % span == 0 and lo <= b // span - 1 < n:
                        keep.add(b // span - 1)
            return frozenset(keep)
        case "sliding":
            if R is None or not align or align % span:
                return None
            window = sliding_window_of(g.spec)
            tail = cdiv(window[0] - 1, span) if window is not None else 0
            ends = [rdown(t, align) for t in points]
            if R:
                if R % span:
                    return None
                # segment ends whose tail reaches [lo, n)
                first_end = max(R, cdiv(lo * span, R) * R)
                _fits((n * span - first_end) // R * tail)
                ends.extend(range(first_end, n * span + 1, R))
            keep = set()
            for e in ends:
                stop = min(e // span, n)
                keep.update(range(max(stop - tail, lo), stop))
            return frozenset(keep)
    assert_never(g.family)
