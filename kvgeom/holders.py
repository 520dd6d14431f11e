"""Packed holder rows: per cache group, which holders hold each block hash, as rows of 64-bit words.

:class:`kvgeom.Residency` keeps one Python integer of holder bits per hash: O(1) updates, and a router's
bit-parallel rules run on those integers. Reading a whole request's chain for 1,000 replicas that way
costs a big-integer operation per hash. :class:`PackedHolders` keeps the same bits as a numpy matrix,
one row per hash (holder r is bit ``r % 64`` of word ``r // 64``, little-endian), so a chain's rows come
out with one dict read per hash and one numpy gather, and a leading-run rule runs as a few numpy passes
over all replicas at once (:func:`kvgeom.router.score_replicas` reads it through
:meth:`kvgeom.events.KVEventReader.packed`). It is the read-optimised twin of a ``Residency``: it holds no
counts and no id table for batch lookups. A reader keeps it as its only index until someone asks for a
``Residency`` (:meth:`add_hashes` reports duplicates as ``Residency.add_hashes`` does; :meth:`held_masks`
hands the entries over to ``Residency.add_masks``).

Invariants (``tests/property/test_router_laws.py::test_packed_holders_match_the_residency``):

* bit r of :meth:`rows` for ``(group, h)`` is set iff the last update of ``(group, h, r)`` was an add:
  the same answer as :meth:`Residency.contains <kvgeom.Residency.contains>` under the same updates;
* an update names a whole event's hashes in one call: one dict operation per hash and a fixed number of
  numpy calls per event (never one per hash);
* a hash that no holder holds any more gives its row back, so the matrix never holds more rows than the
  most hashes held at once (plus doubling slack): the same memory bound as the residency's dicts.

>>> p = PackedHolders()
>>> p.add_many(0, [b"a", b"b"], holder=0); p.add_many(0, [b"b"], holder=65)
>>> p.rows(0, [b"b", b"c", b"a"]).tolist()     # two words: holders 0..63, 64..127
[[1, 2], [0, 0], [1, 0]]
>>> p.discard_many(0, [b"b"], holder=0); p.holders(0, b"b")
36893488147419103232
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from itertools import chain, compress, count, repeat
from operator import ne
from struct import pack
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from kvgeom.errors import QueryError

if TYPE_CHECKING:
    from kvgeom.residency import Residency

__all__ = ["PackedHolders", "WORD_BITS"]

WORD_BITS = 64
"""Holders per word of a packed row."""

Words = npt.NDArray[np.uint64]
_WORD = np.dtype("<u8")  # little-endian, so a row's bytes are the holder bits in order (numpy.unpackbits)


def _holder(holder: int) -> int:
    if type(holder) is not int or holder < 0:
        raise QueryError.single(
            "bad_holder", f"a holder is a non-negative int (a replica's bit), got {holder!r}", "holder")
    return holder


def _index(rows: list[int]) -> npt.NDArray[np.int64]:
    """Row numbers as an index array: packed by ``struct`` (one C conversion, about 2.5x faster than
    ``array('q')``, which appends item by item, and several times faster than numpy's element-by-element
    conversion of a list index or of an iterator, ``np.fromiter``). Rows are small non-negative ints."""
    return np.frombuffer(pack(f"={len(rows)}q", *rows), dtype=np.int64)


_FREED = object()
"""``back[row]`` of a row given back: equal to no hash, so :meth:`PackedHolders.leading_rows` never matches it."""


def _run_length(back: list[Hashable], row: int, hashes: Sequence[Hashable], i: int, width: int = 16) -> int:
    """How many of ``hashes[i:]`` are, in order, the hashes kept for rows ``row, row + 1, ...`` (``back``):
    compared with ``==`` as the dict compares keys, in windows of ``width``, 4x that, 16x, ... rows, so a run
    costs sequential reads and a short run stops after one small window."""
    n, top = len(hashes), len(back)
    start = i
    while i < n and row < top:
        m = min(width, n - i, top - row)
        j = next(compress(count(), map(ne, back[row : row + m], hashes[i : i + m])), m)
        i += j
        row += j
        if j < m:
            break
        width *= 4
    return i - start


class _RowIds(dict[Hashable, int]):
    """Hash -> row. Reading a hash that has no row gives it one (a freed row first, else the next new one):
    ``map(ids.__getitem__, hashes)`` reads known hashes in C and steps into Python only for new ones."""

    __slots__ = ("back", "free")

    def __init__(self) -> None:
        super().__init__()
        self.back: list[Hashable] = [None]  # back[row]: the hash back (row 0: the empty row of unknown hashes)
        self.free: list[int] = []

    def __missing__(self, h: Hashable) -> int:
        if self.free:
            r = self.free.pop()
            self.back[r] = h
        else:
            r = len(self.back)
            self.back.append(h)
        self[h] = r
        return r


class _Group:
    """One group's rows: ``ids[h]`` is the row of hash ``h`` (row 0 is never used: the empty row of unknown
    hashes), ``keys[row]`` the hash back, ``ids.free`` the rows given back."""

    __slots__ = ("bits", "ids", "maybe_empty")

    def __init__(self, words: int) -> None:
        self.ids = _RowIds()
        self.maybe_empty: list[int] = []  # rows that lost a holder since the last sweep
        self.bits: Words = np.zeros((64, words), dtype=_WORD)

    @property
    def keys(self) -> list[Hashable]:
        return self.ids.back

    def sweep(self) -> None:
        """Give back the rows of ``maybe_empty`` that no holder holds (one numpy pass for all of them)."""
        if self.maybe_empty:
            idx = np.unique(np.asarray(self.maybe_empty, dtype=np.intp))
            self.maybe_empty = []
            ids, keys = self.ids, self.ids.back
            for row in idx[~self.bits[idx].any(axis=1)].tolist():
                del ids[keys[row]]
                keys[row] = _FREED
                ids.free.append(row)

    def row_runs(self, hashes: Sequence[Hashable]) -> list[tuple[int, int]]:
        """The rows of ``hashes`` as runs ``(start, stop)`` of consecutive rows, in order, giving new hashes
        rows (freed ones first, else on the end): :meth:`row_ids` read by runs. An event's blocks get
        consecutive rows when first stored, so a later event naming them costs one dict read per run (the
        rest compared with the hashes kept for the rows, :func:`_run_length`); a stretch of new hashes, named
        once each, is given the next new rows in one dict update when no freed row waits.

        Invariant: the runs' rows, flattened, are ``row_ids(hashes)`` (the same rows given out)."""
        ids = self.ids
        back = ids.back
        get = ids.get
        n = len(hashes)
        runs: list[tuple[int, int]] = []
        i = 0
        while i < n:
            h = hashes[i]
            first = get(h, 0)
            if first:  # an event has at most a few hundred blocks: one or two windows
                stop = first + 1 + _run_length(back, first + 1, hashes, i + 1, 128)
            elif ids.free:
                first = ids[h]  # a freed row: one at a time
                stop = first + 1
            else:  # new hashes on the end: the stretch of hashes without a row, if none is named twice
                j = next(compress(count(), map(ids.__contains__, hashes[i:])), n - i)
                first = len(back)
                fresh = dict(zip(hashes[i : i + j], range(first, first + j), strict=True))
                if len(fresh) == j:
                    ids.update(fresh)
                    back.extend(hashes[i : i + j])
                    stop = first + j
                else:
                    first = ids[h]
                    stop = first + 1
            if runs and runs[-1][1] == first:
                runs[-1] = (runs[-1][0], stop)
            else:
                runs.append((first, stop))
            i += stop - first
        if len(back) > self.bits.shape[0]:
            self._grow(len(back))
        return runs

    def _grow(self, top: int) -> None:
        grown = np.zeros((max(2 * self.bits.shape[0], top), self.bits.shape[1]), dtype=_WORD)
        grown[: self.bits.shape[0]] = self.bits
        self.bits = grown

    def row_ids(self, hashes: Sequence[Hashable]) -> list[int]:
        """Rows of ``hashes``, giving new hashes a row (freed ones first): one dict read per hash in C, a
        Python step only for a hash seen for the first time."""
        rows = list(map(self.ids.__getitem__, hashes))
        top = len(self.ids.back)
        if top > self.bits.shape[0]:
            self._grow(top)
        return rows


class PackedHolders:
    """Per group, the holders of each block hash as a packed ``uint64`` row (see the module docstring).

    Updates take a whole event's hashes; reads give a chain's rows as one ``(len(chain), words)`` array.
    """

    __slots__ = ("_groups", "_top", "_words")

    def __init__(self) -> None:
        self._groups: dict[int, _Group] = {}
        self._words = 1
        self._top = -1

    @property
    def top_holder(self) -> int:
        """The highest holder ever added (-1 before any): no row has a bit above it."""
        return self._top

    @property
    def words(self) -> int:
        """Words per row: holders ``0 .. 64 * words - 1`` fit."""
        return self._words

    def _group(self, group: int) -> _Group:
        g = self._groups.get(group)
        if g is None:
            g = self._groups[group] = _Group(self._words)
        return g

    def _widen(self, holder: int) -> None:
        words = max(holder // WORD_BITS + 1, 2 * self._words)  # doubling: O(log) copies as replicas join
        if holder // WORD_BITS + 1 > self._words:
            for g in self._groups.values():
                wide = np.zeros((g.bits.shape[0], words), dtype=_WORD)
                wide[:, : self._words] = g.bits
                g.bits = wide
            self._words = words

    def add_many(self, group: int, block_hashes: Sequence[Hashable], holder: int = 0) -> None:
        """``holder`` holds ``group``'s entries keyed by every hash of ``block_hashes`` (one event's blocks)."""
        bit = _holder(holder)
        if not block_hashes:
            return
        if bit > self._top:
            self._top = bit
            if bit >= WORD_BITS * self._words:
                self._widen(bit)
        g = self._group(group)
        rows = g.row_ids(block_hashes)
        col = g.bits[:, bit // WORD_BITS]
        if len(rows) == 1:
            col[rows[0]] |= np.uint64(1 << bit % WORD_BITS)
        else:  # through _index: a list index would be converted element by element, several times slower
            col[_index(rows)] |= np.uint64(1 << bit % WORD_BITS)

    def add_hashes(self, group: int, block_hashes: Sequence[Hashable], holder: int = 0) -> list[Hashable]:
        """:meth:`add_many`, returning the hashes ``holder`` already held, in order (a hash named twice counts as
        held the second time): the contract of :meth:`Residency.add_hashes <kvgeom.Residency.add_hashes>`, so a
        reader that counts duplicate announcements can keep these rows as its only index. The rows are read by
        runs (:meth:`_Group.row_runs`: one dict read per run of consecutive rows, the event's first store
        giving its new blocks consecutive rows), and an event whose rows are one run is set with slices; a
        fixed number of numpy calls per event either way.

        >>> p = PackedHolders(); p.add_many(0, [b"a"], holder=70)
        >>> p.add_hashes(0, [b"a", b"b", b"b"], holder=70), p.holders(0, b"b") == 1 << 70
        ([b'a', b'b'], True)
        """
        bit = holder if type(holder) is int and holder >= 0 else _holder(holder)
        if not block_hashes:
            return []
        if bit > self._top:
            self._top = bit
            if bit >= WORD_BITS * self._words:
                self._widen(bit)
        g = self._groups.get(group) or self._group(group)
        one = np.uint64(1 << bit % WORD_BITS)
        runs = g.row_runs(block_hashes)
        col = g.bits[:, bit // WORD_BITS]
        # the common event: its blocks' rows are one run or a few, set with slices, no index array; runs are
        # set one after another, so a row a later run names again reads as held (a hash named twice)
        if len(runs) <= 4:
            already: list[Hashable] = []
            at = 0
            for a, b in runs:
                run = col[a:b]
                held = run & one
                run |= one
                if held.any():
                    already.extend(compress(block_hashes[at : at + b - a], held.tolist()))
                at += b - a
            return already
        rows = list(chain.from_iterable(map(range, *zip(*runs, strict=True))))  # many runs: one index
        idx = _index(rows)
        old = col[idx]
        held = old & one
        col[idx] = old | one
        if not held.any() and len(set(rows)) == len(rows):  # the common event: every hash new to the holder
            return []
        seen: set[int] = set()
        already = []
        for h, r, was in zip(block_hashes, rows, held.tolist(), strict=True):
            if was or r in seen:
                already.append(h)
            seen.add(r)
        return already

    def add_events(self, events: Sequence[tuple[int, Sequence[Hashable], int]]) -> None:
        """:meth:`add_many` for many ``(group, block_hashes, holder)`` events in one batch: one dict read per
        hash and a fixed number of numpy calls per group, however many events (how a reader applies the
        stores noted since the last query). Same rows as calling :meth:`add_many` on each in turn.

        >>> p = PackedHolders(); p.add_events([(0, [b"a", b"b"], 0), (0, [b"b"], 65), (1, [b"a"], 2)])
        >>> p.rows(0, [b"a", b"b"]).tolist(), p.holders(1, b"a")
        ([[1, 0], [1, 2]], 4)
        """
        by_group: dict[int, list[tuple[Sequence[Hashable], int]]] = {}
        for group, hashes, holder in events:
            _holder(holder)
            if hashes:
                by_group.setdefault(group, []).append((hashes, holder))
        for group, evs in by_group.items():
            top = max(h for _, h in evs)
            if top > self._top:
                self._top = top
                if top >= WORD_BITS * self._words:
                    self._widen(top)
            g = self._group(group)
            rows = _index(g.row_ids(list(chain.from_iterable(hs for hs, _ in evs))))
            holders = np.repeat(np.asarray([h for _, h in evs], dtype=np.int64),
                                np.asarray([len(hs) for hs, _ in evs], dtype=np.int64))
            masks = np.left_shift(np.uint64(1), (holders & (WORD_BITS - 1)).astype(np.uint64))
            np.bitwise_or.at(g.bits, (rows, holders // WORD_BITS), masks)

    def discard_many(self, group: int, block_hashes: Sequence[Hashable], holder: int = 0) -> None:
        """``holder`` no longer holds those entries (hashes it did not hold are ignored). Rows no holder
        holds any more are given back in sweeps: one numpy pass once as many rows may be empty as a
        quarter of the rows in use (amortised O(1) per hash)."""
        bit = _holder(holder)
        g = self._groups.get(group)
        if g is None or bit > self._top or not block_hashes:
            return
        get = g.ids.get
        keep = ~np.uint64(1 << bit % WORD_BITS)
        col = g.bits[:, bit // WORD_BITS]
        if len(block_hashes) == 1:
            row = get(block_hashes[0])
            if row is None:
                return
            col[row] &= keep
            g.maybe_empty.append(row)
        else:
            rows = [r for r in map(get, block_hashes) if r is not None]
            if not rows:
                return
            col[rows] &= keep
            g.maybe_empty.extend(rows)
        if len(g.maybe_empty) > max(256, len(g.ids) >> 2):
            g.sweep()

    def set_rows(self, group: int, block_hashes: Sequence[Hashable], masks: Sequence[int]) -> None:
        """Set the rows of ``block_hashes`` to the holder ``masks`` (Python ints, as
        :meth:`Residency.holders <kvgeom.Residency.holders>` gives them), in one call: how a reader brings
        the rows of the hashes that changed since its last query up to date. A mask of 0 gives the row back.

        >>> p = PackedHolders(); p.set_rows(0, [b"a", b"b"], [5, 0]); p.holders(0, b"a"), len(p)
        (5, 1)
        """
        if not block_hashes:
            return
        top = max(masks).bit_length() - 1
        if top > self._top:
            self._top = top
            if top >= WORD_BITS * self._words:
                self._widen(top)
        g = self._group(group)
        rows = g.row_ids(block_hashes)
        nb = self._words * 8
        g.bits[rows] = np.frombuffer(b"".join([m.to_bytes(nb, "little") for m in masks]),
                                     dtype=_WORD).reshape(len(rows), self._words)
        g.maybe_empty.extend(r for r, m in zip(rows, masks, strict=True) if not m)
        if len(g.maybe_empty) > max(256, len(g.ids) >> 2):
            g.sweep()

    def clear(self, holder: int | None = None) -> None:
        """Forget every entry of ``holder`` (of every holder when None)."""
        if holder is None:
            self._groups.clear()
            return
        bit = _holder(holder)
        if bit >= WORD_BITS * self._words:
            return
        one = np.uint64(1 << bit % WORD_BITS)
        keep = ~one
        for g in self._groups.values():
            col = g.bits[:, bit // WORD_BITS]
            held = np.flatnonzero(col[: len(g.keys)] & one)
            if held.size:
                col[held] &= keep
                g.maybe_empty.extend(held.tolist())
                g.sweep()

    def rows(self, group: int, block_hashes: Sequence[Hashable], *, sentinel: bool = False) -> Words:
        """The packed holder rows of a chain, in order: shape ``(len(block_hashes), words)``, zero for a
        hash no holder holds. A new array (a gather), safe to modify. With ``sentinel`` one zero row more
        follows (a run of held rows always ends inside the array: what a leading-run kernel reads).

        >>> p = PackedHolders(); p.add_many(0, [b"a"], holder=2)
        >>> p.rows(0, [b"a", b"b"], sentinel=True).tolist()
        [[4], [0], [0]]
        """
        g = self._groups.get(group)
        if g is None:
            return np.zeros((len(block_hashes) + sentinel, self._words), dtype=_WORD)
        ids = list(map(g.ids.get, block_hashes, repeat(0)))
        if sentinel:
            ids.append(0)  # row 0: the empty row of unknown hashes
        out: Words = g.bits.take(_index(ids), axis=0)
        return out

    def leading_rows(self, group: int, block_hashes: Sequence[Hashable], *, sentinel: bool = False) -> Words:
        """The rows of the chain's leading hashes that have a row, stopping before the first hash that has
        none (no holder holds it, so no leading run passes it): ``rows(group, block_hashes)[:k]`` for that k,
        without reading the hashes past it, and with ``sentinel`` one zero row after them (a leading run
        always ends inside the array). Rows may still be empty (a hash whose last holder left). A new array.

        Read by runs, not by a dict read per hash: the blocks of one event get consecutive rows when first
        stored, so a chain's hashes mostly sit in a few runs of rows. The first hash of a run is looked up;
        the hashes after it are compared (``==``, as the dict compares keys) with the hashes kept for the
        next rows, in windows of 16, 64, 256, ... until one differs. A chain of 512 hashes in 5 runs costs 5
        dict reads and sequential reads of the kept hashes: with the caches emptied between queries (a
        router's case), about half the time of :meth:`rows` (benchmarks/README.md, issue 23).

        Invariant (``tests/property/test_router_laws.py``): with ``sentinel`` the result is
        ``rows(group, block_hashes)[:k]`` plus a zero row, and ``k == len(block_hashes)`` or the row of hash k
        is empty; without it, the same less the zero row.

        >>> p = PackedHolders(); p.add_many(0, [b"a", b"c"], holder=1)
        >>> p.leading_rows(0, [b"a", b"b", b"c"]).tolist(), p.leading_rows(0, [b"a", b"c"], sentinel=True).tolist()
        ([[2]], [[2], [2], [0]])
        """
        g = self._groups.get(group)
        if g is None:
            return np.zeros((int(sentinel), self._words), dtype=_WORD)
        get, back = g.ids.get, g.ids.back
        n = len(block_hashes)
        runs: list[tuple[int, int]] = []
        i = 0
        while i < n:
            first = get(block_hashes[i], 0)
            if not first:
                break
            j = _run_length(back, first + 1, block_hashes, i + 1)
            runs.append((first, first + 1 + j))
            i += 1 + j
        bits = g.bits
        out: Words = np.empty((i + sentinel, bits.shape[1]), dtype=_WORD)
        at = 0
        for a, b in runs:
            out[at : at + b - a] = bits[a:b]
            at += b - a
        if sentinel:
            out[i] = 0
        return out

    def holders(self, group: int, block_hash: Hashable) -> int:
        """The holders of one entry as a Python int (bit r: holder r), like :meth:`Residency.holders`."""
        g = self._groups.get(group)
        row = None if g is None else g.ids.get(block_hash)
        if g is None or row is None:
            return 0
        return int.from_bytes(g.bits[row].tobytes(), "little")

    def __len__(self) -> int:
        """Number of (group, hash) entries held by at least one holder."""
        for g in self._groups.values():
            g.sweep()
        return sum(len(g.ids) for g in self._groups.values())

    def groups(self) -> tuple[int, ...]:
        """The groups that ever had an entry (their rows exist, maybe all empty), in ascending order."""
        return tuple(sorted(self._groups))

    def held_masks(self, group: int) -> tuple[list[Hashable], list[int]]:
        """Every hash of ``group`` some holder holds, and its holders as a Python int (bit r: holder r), in row
        order: what :meth:`Residency.add_masks <kvgeom.Residency.add_masks>` takes to rebuild the same index.
        O(rows) numpy work, one int conversion per held hash.

        >>> p = PackedHolders(); p.add_many(0, [b"a", b"b"], holder=1); p.add_many(0, [b"b"], holder=64)
        >>> p.discard_many(0, [b"a"], holder=1); p.held_masks(0) == ([b"b"], [2 | 1 << 64])
        True
        """
        g = self._groups.get(group)
        if g is None:
            return [], []
        n = len(g.keys)
        idx = np.flatnonzero(g.bits[1:n].any(axis=1)) + 1
        nb = self._words * 8
        raw = g.bits[idx].tobytes()
        keys = g.keys
        return [keys[i] for i in idx.tolist()], [int.from_bytes(raw[i : i + nb], "little")
                                                 for i in range(0, len(raw), nb)]

    def has_group(self, group: int) -> bool:
        """Whether ``group`` ever had an entry (its rows exist, maybe all empty)."""
        return group in self._groups

    @property
    def nbytes(self) -> int:
        """Bytes of the packed matrices (the dicts that map hashes to rows come on top)."""
        return sum(g.bits.nbytes for g in self._groups.values())

    @classmethod
    def from_residency(cls, residency: Residency) -> PackedHolders:
        """The packed twin of ``residency`` as it is now: O(entries held), once."""
        out = cls()
        for group in residency.groups():
            hashes = list(residency.entries(group))
            masks = [residency.holders(group, h) for h in hashes]
            top = max(masks, default=0).bit_length()
            out._top = max(out._top, top - 1)
            if top > WORD_BITS * out._words:
                out._widen(top - 1)
            g = out._group(group)
            rows = g.row_ids(hashes)
            nb = out._words * 8
            packed = np.frombuffer(b"".join([m.to_bytes(nb, "little") for m in masks]), dtype=_WORD)
            g.bits[rows] = packed.reshape(len(masks), out._words)
        return out
