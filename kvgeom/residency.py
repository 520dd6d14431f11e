"""Which cache entries a tier holds: one residency type for the offload connector, the GPU prefix
cache and KV-aware routers.

A :class:`Residency` records, per cache group, which block hashes are held, and by which
*holders*. A holder is whatever the caller needs to tell apart: a single offload tier uses one
holder (``0``, the default); a router uses one holder per replica. Block hashes are opaque
hashable keys (vLLM's ``BlockHash`` bytes, or anything else): kvgeom never recomputes an engine's
hash function, the caller hands it the request's hash chain.

The hash chain of a request is the list of its block hashes at the hash unit H (hash *i* covers
tokens ``[0, (i+1)*H)``), so an entry of group g keyed by hash *i* is the entry whose prefix ends
at token ``(i+1)*H``. That is the link between residency and geometry: :meth:`Residency.probe`
turns a chain into the ``contains(group, end_token)`` question the lookups ask.

Invariants (tested in ``tests/test_residency.py``):

* every update is O(1) in the number of entries held (a dict operation and one integer bit
  operation);
* ``contains(g, h, holder)`` is true iff the last update of ``(g, h, holder)`` was an add;
* ``clear(holder)`` removes exactly that holder's entries and no one else's;
* ``version`` changes on every update that changes what is held, so derived caches know when to
  rebuild;
* batch reads: every hash the index has seen (held, or named by a chain passed to :meth:`intern`)
  has a stable integer id (``0`` is never a hash), and :meth:`held_array` is a bool array over those
  ids, equal at every moment to :meth:`contains` for that group and holder. Once asked for, it is
  kept current by every update (one array store per update, still O(1)); the batch lookup
  (:func:`kvgeom.batch.lookup.lookup_resident`) reads it with numpy, without converting any key.
  Ids are never reused, so the id table grows by one entry per distinct hash ever seen
  (``tests/property/test_resident_batch_laws.py``: any sequence of store and evict events leaves
  the index, its arrays and the request chains equal to ones rebuilt from scratch).

vLLM's offload key is the block hash bytes followed by the 4-byte big-endian group index
(OffloadingConnector ``make_offload_key``, vLLM 0.33); :meth:`add_key` / :meth:`discard_key` take
that form directly.

>>> r = Residency()
>>> r.add(0, b"h0"); r.add(0, b"h1"); r.add(1, b"h1")
>>> r.contains(0, b"h1"), r.contains(1, b"h0")
(True, False)
>>> r.discard(0, b"h1"); r.contains(0, b"h1")
False
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Sequence
from itertools import repeat
from operator import eq, or_
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from kvgeom.errors import QueryError

if TYPE_CHECKING:
    from kvgeom.geometry import Geometry

__all__ = ["BLOCK_HASH_SIZES", "GROUP_INDEX_BYTES", "Residency", "split_offload_key", "make_offload_key"]

GROUP_INDEX_BYTES = 4
"""vLLM appends the group index to the block hash as 4 big-endian bytes (``make_offload_key``)."""

BLOCK_HASH_SIZES = (16, 32)
"""The sizes of vLLM 0.33's block hashes in bytes: 16 for ``xxhash``/``xxhash_cbor``, 32 for ``sha256``/
``sha256_cbor`` (:func:`kvgeom.hashing.block_hashes`). An offload key is one of them plus the group index, so a
key of any other length (a 5-byte key, a bare 32-byte hash) is not vLLM's and is refused (issue 19)."""


_KEY_SIZES = frozenset(size + GROUP_INDEX_BYTES for size in BLOCK_HASH_SIZES)
"""The lengths of vLLM's offload keys; any other is read (and refused) by :func:`split_offload_key`."""


def _check_hash_size(size: int, what: str, field: str) -> None:
    if size not in BLOCK_HASH_SIZES:
        raise QueryError.single(
            "bad_offload_key",
            f"{what}; vLLM's block hashes are {BLOCK_HASH_SIZES[0]} bytes (xxhash) or {BLOCK_HASH_SIZES[1]} "
            f"(sha256), so its offload keys are {BLOCK_HASH_SIZES[0] + GROUP_INDEX_BYTES} or "
            f"{BLOCK_HASH_SIZES[1] + GROUP_INDEX_BYTES} bytes",
            field,
            size=size,
        )


def make_offload_key(block_hash: bytes, group: int) -> bytes:
    """vLLM's offload key bytes for ``block_hash`` in ``group``.

    >>> make_offload_key(bytes(range(16)), 3)[-6:]
    b'\\x0e\\x0f\\x00\\x00\\x00\\x03'
    """
    if not isinstance(block_hash, bytes | bytearray | memoryview):
        raise QueryError.single(
            "bad_block_hash", f"a block hash for an offload key must be bytes, got {type(block_hash).__name__}",
            "block_hash",
        )
    if type(group) is not int or not 0 <= group < 2**32:
        raise QueryError.single(
            "bad_group_index", f"group index {group!r} does not fit vLLM's 4-byte key suffix", "group"
        )
    size = len(block_hash) if not isinstance(block_hash, memoryview) else block_hash.nbytes
    _check_hash_size(size, f"the block hash is {size} bytes", "block_hash")
    return bytes(block_hash) + group.to_bytes(GROUP_INDEX_BYTES, "big")


def split_offload_key(key: bytes) -> tuple[bytes, int]:
    """``(block_hash, group)`` of vLLM offload key bytes (the inverse of :func:`make_offload_key`).

    >>> block_hash, group = split_offload_key(bytes(16) + b'\\x00\\x00\\x00\\x03')
    >>> len(block_hash), group
    (16, 3)
    """
    if not isinstance(key, bytes | bytearray | memoryview) or len(key) <= GROUP_INDEX_BYTES:
        size = len(key) if isinstance(key, bytes | bytearray | memoryview) else None
        raise QueryError.single(
            "bad_offload_key",
            f"an offload key is block-hash bytes followed by a {GROUP_INDEX_BYTES}-byte group index; got "
            f"{type(key).__name__}" + (f" of {size} bytes" if size is not None else ""),
            "key",
        )
    raw = bytes(key)
    _check_hash_size(len(raw) - GROUP_INDEX_BYTES, f"the key is {len(raw)} bytes", "key")
    return raw[:-GROUP_INDEX_BYTES], int.from_bytes(raw[-GROUP_INDEX_BYTES:], "big")


def _holder(holder: int) -> int:
    if type(holder) is not int or holder < 0:
        raise QueryError.single(
            "bad_holder", f"a holder is a non-negative int (0 for a single tier), got {holder!r}", "holder"
        )
    return holder


class Residency:
    """Per group, which block hashes are held and by which holders (a bit mask per hash).

    Updates are O(1); reads never copy the index. Use one instance per tier (GPU prefix cache, CPU
    tier, storage), with holder 0, or one instance per tier across replicas, one holder per replica.
    """

    __slots__ = ("_arrays", "_held", "_ids", "version")

    def __init__(self) -> None:
        self._held: dict[int, dict[Hashable, int]] = {}
        self._ids: dict[Hashable, int] = {}
        self._arrays: dict[tuple[int, int], npt.NDArray[np.bool_]] = {}
        self.version = 0

    # -- ids and arrays for batch reads -------------------------------------------------------------
    def _id(self, block_hash: Hashable) -> int:
        i = self._ids.get(block_hash)
        if i is None:
            i = self._ids[block_hash] = len(self._ids) + 1
            if self._arrays:
                self._grow(i)
        return i

    def _grow(self, top: int) -> None:
        for k, a in self._arrays.items():
            if top >= a.shape[0]:
                b = np.zeros(max(2 * a.shape[0], top + 1), dtype=np.bool_)
                b[: a.shape[0]] = a
                self._arrays[k] = b

    def intern(self, block_hashes: Iterable[Hashable]) -> npt.NDArray[np.int64]:
        """Stable integer ids of ``block_hashes`` (new hashes get new ids; ``0`` is never used), as int64.

        >>> r = Residency(); r.intern([b"a", b"b", b"a"]).tolist()
        [1, 2, 1]
        """
        ids = self._ids
        n0 = len(ids)
        try:
            out = [ids.setdefault(h, len(ids) + 1) for h in block_hashes]
        except TypeError as e:  # no iterable of hashes, or an unhashable one (a list): refused, arrays kept in step
            raise QueryError.single(
                "bad_block_hashes",
                f"block hashes must be an iterable of hashable values (bytes, as vLLM's BlockHash): {e}",
                "block_hashes",
            ) from None
        finally:
            if self._arrays and len(ids) != n0:
                self._grow(len(ids))
        return np.array(out, dtype=np.int64)

    @property
    def num_ids(self) -> int:
        """How many hashes have an id (ids run from 1 to this)."""
        return len(self._ids)

    def held_array(self, group: int, holder: int = 0) -> npt.NDArray[np.bool_]:
        """Bool array over hash ids: entry ``i`` is :meth:`contains` of ``group`` for the hash with id ``i``
        (entry 0 and ids past the array are never held). Built once from the index, O(entries held), then
        kept current by every update; do not write to it.

        >>> r = Residency(); r.add(0, b"a"); r.add(0, b"b"); r.discard(0, b"a")
        >>> r.held_array(0)[r.intern([b"a", b"b"])].tolist()
        [False, True]
        """
        bit = 1 << _holder(holder)
        key = (group, holder)
        a = self._arrays.get(key)
        if a is None:
            # Hashes get ids only once a batch reader asks for arrays: a reader that never does (a router
            # scoring on the holder masks) keeps no id table that outlives the entries it held.
            for held_group in self._held.values():
                for h in held_group:
                    self._id(h)
            a = np.zeros(max(len(self._ids) + 1, 64), dtype=np.bool_)
            held = self._held.get(group, {})
            ids = self._ids
            if held:
                idx = np.fromiter((ids[h] for h, m in held.items() if m & bit), dtype=np.int64)
                a[idx] = True
            self._arrays[key] = a
        return a

    def _mark(self, group: int, holder: int, block_hash: Hashable, value: bool) -> None:
        a = self._arrays.get((group, holder))
        if a is not None:
            a[self._ids[block_hash]] = value

    # -- updates ------------------------------------------------------------------------------------
    def add(self, group: int, block_hash: Hashable, holder: int = 0) -> None:
        """Record that ``holder`` holds the entry of ``group`` keyed by ``block_hash``."""
        bit = 1 << _holder(holder)
        held = self._held.get(group)
        if held is None:
            held = self._held[group] = {}
        old = held.get(block_hash, 0)
        if not old & bit:
            if not old and self._arrays:
                self._id(block_hash)
            held[block_hash] = old | bit
            self.version += 1
            if self._arrays:
                self._mark(group, holder, block_hash, True)

    def discard(self, group: int, block_hash: Hashable, holder: int = 0) -> None:
        """Record that ``holder`` no longer holds that entry (a no-op when it did not)."""
        bit = 1 << _holder(holder)
        held = self._held.get(group)
        if held is None:
            return
        old = held.get(block_hash, 0)
        if old & bit:
            new = old & ~bit
            if new:
                held[block_hash] = new
            else:
                del held[block_hash]
            self.version += 1
            if self._arrays:
                self._mark(group, holder, block_hash, False)

    def add_key(self, key: bytes, holder: int = 0) -> None:
        """:meth:`add` from vLLM offload key bytes (block hash + 4-byte group index)."""
        block_hash, group = split_offload_key(key)
        self.add(group, block_hash, holder)

    def discard_key(self, key: bytes, holder: int = 0) -> None:
        """:meth:`discard` from vLLM offload key bytes."""
        block_hash, group = split_offload_key(key)
        self.discard(group, block_hash, holder)

    def add_keys(self, keys: Iterable[bytes], holder: int = 0) -> None:
        """:meth:`add_key` for every key of a store-complete event (vLLM's ``complete_store`` keys), in one call.

        One pass over the event: each key's group suffix is read once per run of keys of one group (vLLM
        lists an event's keys group by group), and the index, ids and arrays are updated in place, with
        exactly the effect of :meth:`add_key` key by key.

        >>> a, b = b"a" * 16, b"b" * 16   # 16-byte block hashes, as vLLM's xxhash gives them
        >>> r = Residency()
        >>> r.add_keys([make_offload_key(a, 0), make_offload_key(b, 0), make_offload_key(a, 1)])
        >>> r.contains(0, b), r.contains(1, a), r.contains(1, b)
        (True, True, False)
        """
        self._update_keys(keys, holder, True)

    def discard_keys(self, keys: Iterable[bytes], holder: int = 0) -> None:
        """:meth:`discard_key` for every key of an evict event (vLLM's ``evicted_keys``), in one call (one
        pass, as :meth:`add_keys`).

        >>> a, b, c = b"a" * 16, b"b" * 16, b"c" * 16
        >>> r = Residency(); r.add_keys([make_offload_key(a, 0), make_offload_key(b, 0)])
        >>> r.discard_keys([make_offload_key(a, 0), make_offload_key(c, 3)]); r.contains(0, a), len(r)
        (False, 1)
        """
        self._update_keys(keys, holder, False)

    def _update_keys(self, keys: Iterable[bytes], holder: int, add: bool) -> None:
        bit = 1 << _holder(holder)
        index, arrays, ids = self._held, self._arrays, self._ids
        changed = 0
        suffix: bytes | None = None
        group = -1
        held: dict[Hashable, int] | None = None
        array: npt.NDArray[np.bool_] | None = None
        try:
            for key in keys:
                if type(key) is bytes and len(key) in _KEY_SIZES:
                    block_hash = key[:-GROUP_INDEX_BYTES]
                    tail = key[-GROUP_INDEX_BYTES:]
                    if tail != suffix:
                        suffix, group = tail, int.from_bytes(tail, "big")
                        held = index.get(group)
                        array = arrays.get((group, holder)) if arrays else None
                else:
                    block_hash, group = split_offload_key(key)  # raises bad_offload_key, or converts a bytearray
                    suffix = None  # the next key reads its group again
                    held = index.get(group)
                    array = arrays.get((group, holder)) if arrays else None
                if add:
                    if held is None:
                        held = index[group] = {}
                    old = held.get(block_hash, 0)
                    if old & bit:
                        continue
                    held[block_hash] = old | bit
                    changed += 1
                    if arrays:
                        i = ids.get(block_hash)
                        if i is None:
                            i = self._id(block_hash)  # may grow the arrays: read this group's again
                            array = arrays.get((group, holder))
                        if array is not None:
                            array[i] = True
                else:
                    if held is None:
                        continue
                    old = held.get(block_hash, 0)
                    if not old & bit:
                        continue
                    new = old & ~bit
                    if new:
                        held[block_hash] = new
                    else:
                        del held[block_hash]
                    changed += 1
                    if array is not None:
                        array[ids[block_hash]] = False
        finally:
            self.version += changed  # every update so far counts, even when a later key is refused

    # -- one event's hashes in one call (the KV-event reader's bulk path) ------------------------------
    def add_hashes(self, group: int, block_hashes: Sequence[Hashable], holder: int = 0) -> list[Hashable]:
        """:meth:`add` for every hash of ``block_hashes`` (one event's blocks of ``group``), in one call.
        Returns the hashes ``holder`` already held, in order (a hash named twice counts as held the
        second time): what a reader that counts duplicate announcements needs.

        >>> r = Residency(); r.add(0, b"a")
        >>> r.add_hashes(0, [b"a", b"b", b"b"]), r.contains(0, b"b")
        ([b'a', b'b'], True)
        """
        bit = 1 << _holder(holder)
        if self._arrays:  # batch readers keep id arrays current: one update at a time
            already = []
            for h in block_hashes:
                if self.contains(group, h, holder):
                    already.append(h)
                else:
                    self.add(group, h, holder)
            return already
        held = self._held.get(group)
        if held is None:
            held = self._held[group] = {}
        get = held.get
        olds = list(map(get, block_hashes, repeat(0)))
        news = list(map(or_, olds, repeat(bit)))
        if not any(map(eq, olds, news)) and len(set(block_hashes)) == len(olds):
            # the common event: new to this holder (every mask changed; comparing allocates nothing, unlike
            # an AND per hash), no hash twice. One C loop reads, one writes.
            if olds:
                held.update(zip(block_hashes, news, strict=False))  # equal lengths
                self.version += 1
            return []
        already = []
        changed = False
        for h in block_hashes:
            old = get(h, 0)
            if old & bit:
                already.append(h)
            else:
                held[h] = old | bit
                changed = True
        if changed:
            self.version += 1
        return already

    def add_masks(self, group: int, block_hashes: Sequence[Hashable], masks: Sequence[int]) -> None:
        """Record that the holders of each bit mask of ``masks`` hold ``group``'s entry keyed by the matching hash
        of ``block_hashes`` (holder masks as :meth:`holders` gives them; the entries others held stay held), in
        one call: the same index as :meth:`add` for every (hash, holder bit), and one version step. How an index
        kept elsewhere (:class:`kvgeom.holders.PackedHolders`) hands its entries over.

        >>> r = Residency(); r.add(0, b"a", holder=3)
        >>> r.add_masks(0, [b"a", b"b"], [0b101, 0b10]); r.holders(0, b"a"), r.holders(0, b"b")
        (13, 2)
        """
        if len(block_hashes) != len(masks):
            raise QueryError.single(
                "length_mismatch", f"{len(block_hashes)} hashes for {len(masks)} masks; give one mask per hash",
                "masks")
        for m in masks:
            if type(m) is not int or m < 0:
                raise QueryError.single(
                    "bad_holder", f"a holder mask is a non-negative int (bit r: holder r), got {m!r}", "masks")
        if self._arrays:  # batch readers keep id arrays current: one update at a time
            for h, m in zip(block_hashes, masks, strict=True):
                for r in range(m.bit_length()):
                    if m >> r & 1:
                        self.add(group, h, r)
            return
        held = self._held.get(group)
        if held is None:
            held = self._held[group] = {}
        get = held.get
        changed = False
        for h, m in zip(block_hashes, masks, strict=True):
            old = get(h, 0)
            if m & ~old:
                held[h] = old | m
                changed = True
        if changed:
            self.version += 1

    def discard_hashes(self, group: int, block_hashes: Iterable[Hashable], holder: int = 0) -> None:
        """:meth:`discard` for every hash of ``block_hashes`` (one event's blocks of ``group``), in one call.

        >>> r = Residency(); r.add_hashes(0, [b"a", b"b"]); r.discard_hashes(0, [b"a", b"c"]); len(r)
        []
        1
        """
        bit = 1 << _holder(holder)
        held = self._held.get(group)
        if held is None:
            return
        if self._arrays:
            for h in block_hashes:
                self.discard(group, h, holder)
            return
        get = held.get
        changed = False
        for h in block_hashes:
            old = get(h, 0)
            if old & bit:
                if old == bit:
                    del held[h]
                else:
                    held[h] = old ^ bit
                changed = True
        if changed:
            self.version += 1

    def clear(self, holder: int | None = None) -> None:
        """Forget every entry of ``holder`` (of every holder when None). O(entries held)."""
        if holder is None:
            if self._held:
                self._held.clear()
                self.version += 1
            for a in self._arrays.values():
                a[:] = False
            return
        keep = ~(1 << _holder(holder))
        changed = False
        for held in self._held.values():
            for h, mask in list(held.items()):
                if mask & ~keep:
                    changed = True
                    if mask & keep:
                        held[h] = mask & keep
                    else:
                        del held[h]
        if changed:
            self.version += 1
        for (_, h), a in self._arrays.items():
            if h == holder:
                a[:] = False

    # -- reads --------------------------------------------------------------------------------------
    def contains(self, group: int, block_hash: Hashable, holder: int = 0) -> bool:
        """Whether ``holder`` holds the entry of ``group`` keyed by ``block_hash``."""
        held = self._held.get(group)
        return held is not None and bool(held.get(block_hash, 0) >> holder & 1)

    def holders(self, group: int, block_hash: Hashable) -> int:
        """Bit mask of the holders of that entry (bit r set: holder r holds it); 0 when none."""
        held = self._held.get(group)
        return 0 if held is None else held.get(block_hash, 0)

    def chain_masks(self, group: int, block_hashes: Sequence[Hashable]) -> list[int]:
        """:meth:`holders` for every hash of a chain, in order (one dict read each, no copy)."""
        held = self._held.get(group)
        if held is None:
            return [0] * len(block_hashes)
        get = held.get
        return [get(h, 0) for h in block_hashes]

    def groups(self) -> tuple[int, ...]:
        """The groups with at least one entry held."""
        return tuple(sorted(g for g, held in self._held.items() if held))

    def entries(self, group: int) -> Iterable[Hashable]:
        """The hashes of ``group`` held by at least one holder (a live view; do not mutate while iterating)."""
        return self._held.get(group, {}).keys()

    def __len__(self) -> int:
        """Number of (group, hash) entries held by at least one holder."""
        return sum(len(h) for h in self._held.values())

    def probe(
        self, geom: Geometry, block_hashes: Sequence[Hashable], holder: int = 0
    ) -> Callable[[int, int], bool]:
        """``contains(group, end_token)`` for one request: whether ``holder`` holds the entry of
        ``group`` whose prefix ends at ``end_token``, given the request's hash chain at the hash
        unit H of ``geom`` (hash *i* ends at ``(i+1)*H``).

        End tokens off the H grid, or past the chain, are never held.

        >>> import kvgeom
        >>> g = kvgeom.resolve(kvgeom.DEFAULT_CONFIG)     # H = 16
        >>> r = Residency(); r.add(1, "h1")
        >>> contains = r.probe(g, ["h0", "h1", "h2"])
        >>> contains(1, 32), contains(1, 16), contains(1, 40), contains(0, 32)
        (True, False, False, False)
        """
        H = geom.hash_block_size
        bit = 1 << _holder(holder)
        held = self._held
        chain = block_hashes
        n = len(chain)

        def contains(group: int, end_token: int) -> bool:
            if end_token <= 0 or end_token % H:
                return False
            i = end_token // H - 1
            if i >= n:
                return False
            g = held.get(group)
            return g is not None and bool(g.get(chain[i], 0) & bit)

        return contains
