"""Batch twins of :mod:`kvgeom.probes`: held-key views, the membership question of many lookups at once.

A scalar lookup asks a :class:`kvgeom.probes.Probe` whether one key is held; a batch lookup asks a
held-key view for many ``(request, chunk)`` pairs in one numpy gather. A view is any object with

* ``view(rows, chunks)``: whether chunk ``chunks`` of request ``rows`` is held (the key ending at
  ``(chunk + 1) * C``);
* ``view.hashes(rows, cols)``: whether the key of request ``rows`` ending at ``(cols + 1) * H`` is
  held (a partial-tail boundary);
* ``view.chunks``: the chunk count past which nothing is held.

:class:`HeldMatrix` is the view of the bool matrices :func:`kvgeom.batch.lookup_hits` takes
(:func:`stored_matrices` checks them, with the group keys :func:`kvgeom.probes.stored_group_index`
accepts); :mod:`kvgeom.batch.lookup` has the view of a :class:`kvgeom.Residency`; and
:func:`eagle_pair_held` wraps any view for an eagle group's pair probe. Columns outside a matrix
read as not held, as a probe answers for keys past its bound.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from kvgeom._format import show
from kvgeom.batch._arrays import I64, Bools
from kvgeom.errors import QueryError
from kvgeom.geometry import Geometry, OffloadGeometry
from kvgeom.probes import stored_group_index

__all__ = ["HeldMatrix", "eagle_pair_held", "stored_matrices"]


def stored_matrices(geom: Geometry, off: OffloadGeometry, stored: Any, size: int) -> dict[int, Bools]:
    """``stored`` of :func:`kvgeom.batch.lookup_hits` checked: one bool matrix (requests x hash indices) per
    offloaded group, an empty one for a group ``stored`` leaves out (``bad_stored`` otherwise)."""
    if not isinstance(stored, Mapping):
        raise QueryError.single(
            "bad_stored",
            f"stored must map a group index to a bool matrix (requests x hash indices), got {type(stored).__name__}",
            "stored",
        )
    out = {og.index: np.zeros((size, 0), dtype=np.bool_) for og in off.groups}
    for key, m in stored.items():
        index = stored_group_index(key, out)
        a = _matrix(key, m, size)
        if a.ndim != 2 or a.shape[0] != size or (a.size and a.dtype != np.bool_):
            raise QueryError.single(
                "bad_stored",
                f"stored[{key!r}] must be a bool matrix of shape (num requests={size}, hash indices), "
                f"got shape {a.shape} dtype {a.dtype}; column i means the key ending at (i+1)*H is held",
                f"stored.{key}",
            )
        out[index] = a.astype(np.bool_, copy=False)
    return out


def _matrix(key: Any, m: Any, size: int) -> np.ndarray:
    """``np.asarray(m)``, refused (``bad_stored``) before a wrong-length sequence is copied and when numpy
    cannot build it (a ``range`` of 10**12 ends: a MemoryError, issue 19)."""
    if isinstance(m, np.ndarray):
        return m
    try:
        rows = len(m)
    except (TypeError, OverflowError):
        rows = size
    why = f"it has {rows} rows"
    if rows == size:
        try:
            return np.asarray(m)
        except (ValueError, TypeError, OverflowError, MemoryError) as e:
            why = f"numpy cannot read it as one ({type(e).__name__}: {show(str(e), 80)})"
    raise QueryError.single(
        "bad_stored",
        f"stored[{show(key, 40)}] must be a bool matrix of shape (num requests={size}, hash indices); {why}",
        f"stored.{show(key, 40)}",
    )


class HeldMatrix:
    """A group's stored-key matrix viewed by chunk: chunk ``j`` is column ``(j + 1) * hpc - 1``."""

    def __init__(self, matrix: Bools, hashes_per_chunk: int) -> None:
        self.flat = np.ascontiguousarray(matrix).ravel()
        self.width = matrix.shape[1]
        self.hpc = hashes_per_chunk
        self.chunks = self.width // hashes_per_chunk

    def __call__(self, rows: I64, chunks: I64) -> Bools:
        """Whether chunk ``chunks`` of request ``rows`` is held (chunks past the matrix are not)."""
        return _gather_flat(self.flat, self.width, rows, (chunks + 1) * self.hpc - 1)

    def hashes(self, rows: I64, cols: I64) -> Bools:
        """Whether the key of request ``rows`` ending at ``(cols + 1) * H`` is held (a partial-tail boundary)."""
        return _gather_flat(self.flat, self.width, rows, cols)


def _gather_flat(flat: Bools, width: int, rows: I64, cols: I64) -> Bools:
    """``matrix[rows, cols]`` of a row-major bool matrix; columns outside ``[0, width)`` read as False."""
    shape = np.broadcast_shapes(rows.shape, cols.shape)
    if width == 0:
        return np.zeros(shape, dtype=np.bool_)
    inside = (cols >= 0) & (cols < width)
    idx = rows * width + np.where(inside, cols, 0)
    return np.take(flat, idx, mode="clip") & inside


class _PairView:
    """A held-key view (see this module's docstring) in which chunk ``j`` reads as held iff chunks
    ``j`` and ``j + 1`` are both held; keys by hash index read through unchanged."""

    def __init__(self, view: Any) -> None:
        self.view = view
        self.chunks = view.chunks

    def __call__(self, rows: I64, chunks: I64) -> Bools:
        out: Bools = self.view(rows, chunks) & self.view(rows, chunks + 1)
        return out

    def hashes(self, rows: I64, cols: I64) -> Bools:
        out: Bools = self.view.hashes(rows, cols)
        return out


def eagle_pair_held(view: Any) -> Any:
    """:func:`kvgeom.speculative.eagle_pair_held` for a held-key view: chunk ``j`` reads as held iff chunks
    ``j`` and ``j + 1`` are both held (the scan's start keeps ``j + 1`` inside the queried range)."""
    return _PairView(view)
