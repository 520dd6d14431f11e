"""Batch twins of :mod:`kvgeom.keys`: chunk keys and key maps of many chunks or prefixes at once.

``chunk_hash_index``, ``chunk_end_token``, ``chunk_state_block``, ``chunk_of_entry``,
``boundary_hash_index``, ``num_keys`` -> same names; ``chunk_for_end_token`` -> same name with ``-1``
for ``None``; ``chunk_block_entries`` -> :func:`chunk_first_entry` (the range is ``[first, first + k)``);
``key_map`` -> :func:`key_maps` (CSR arrays per group; ``KeyMaps.key_map(i)`` gives the scalar map
back). Results agree with the scalar element by element (``tests/property/test_batch_agrees_with_scalar.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from kvgeom.batch._arrays import I64, check_total, div, fits, ints, largest, offload_of, positive
from kvgeom.batch.boundaries import state_block_for_boundary
from kvgeom.batch.ranks import rank_lengths
from kvgeom.errors import QueryError
from kvgeom.geometry import Geometry
from kvgeom.keys import offload_group, positional_blocks_per_chunk

__all__ = [
    "GroupKeys",
    "KeyMaps",
    "boundary_hash_index",
    "chunk_end_token",
    "chunk_first_entry",
    "chunk_for_end_token",
    "chunk_hash_index",
    "chunk_of_entry",
    "chunk_state_block",
    "key_maps",
    "num_keys",
]


def chunk_hash_index(geom: Geometry, group: int, chunks: Any) -> I64:
    """:func:`kvgeom.keys.chunk_hash_index` per chunk: ``(chunk + 1) * hashes_per_chunk - 1``.

    >>> import kvgeom
    >>> chunk_hash_index(kvgeom.resolve(kvgeom.DEFAULT_CONFIG), 0, [0, 1]).tolist()
    [1, 3]
    """
    og = offload_group(geom, group)
    j = ints("chunk", chunks)
    fits("hash_index", (largest(j) + 1) * og.hashes_per_chunk - 1)
    return (j + 1) * og.hashes_per_chunk - 1


def chunk_end_token(geom: Geometry, group: int, chunks: Any) -> I64:
    """:func:`kvgeom.keys.chunk_end_token` per chunk: ``(chunk + 1) * tokens_per_chunk``.

    >>> import kvgeom
    >>> chunk_end_token(kvgeom.resolve(kvgeom.DEFAULT_CONFIG), 0, [0, 1]).tolist()
    [32, 64]
    """
    og = offload_group(geom, group)
    j = ints("chunk", chunks)
    fits("end_token", (largest(j) + 1) * og.tokens_per_chunk)
    return (j + 1) * og.tokens_per_chunk


def chunk_first_entry(geom: Geometry, group: int, chunks: Any) -> I64:
    """First block-table entry of each chunk (positional groups): :func:`kvgeom.keys.chunk_block_entries`
    is ``range(first, first + blocks_per_chunk)``.

    The last entry ``(chunk + 1) * k - 1`` must fit int64.

    >>> import kvgeom
    >>> g = kvgeom.resolve({**kvgeom.DEFAULT_CONFIG, "offload": {"blocks_per_chunk": 4}})
    >>> chunk_first_entry(g, 0, [0, 1, 2]).tolist()
    [0, 4, 8]
    """
    k = positional_blocks_per_chunk(geom, group)
    j = ints("chunk", chunks)
    fits("block entry", (largest(j) + 1) * k - 1)
    return j * k


def chunk_state_block(geom: Geometry, group: int, chunks: Any) -> I64:
    """:func:`kvgeom.keys.chunk_state_block` per chunk: the state block of the key ending at ``(chunk+1)*C``.

    >>> import kvgeom
    >>> g = kvgeom.resolve({**kvgeom.DEFAULT_CONFIG, "offload": {"blocks_per_chunk": 2}})
    >>> chunk_state_block(g, 1, [0, 1]).tolist()
    [1, 3]
    """
    ends = chunk_end_token(geom, group, chunks)
    return state_block_for_boundary(geom, group, ends)


def chunk_of_entry(geom: Geometry, group: int, entries: Any) -> I64:
    """:func:`kvgeom.keys.chunk_of_entry` per block-table entry: ``entry // blocks_per_chunk``.

    >>> import kvgeom
    >>> g = kvgeom.resolve({**kvgeom.DEFAULT_CONFIG, "offload": {"blocks_per_chunk": 4}})
    >>> chunk_of_entry(g, 0, [0, 5, 8]).tolist()
    [0, 1, 2]
    """
    k = positional_blocks_per_chunk(geom, group)
    e = ints("entry", entries)
    return div(e, k)


def chunk_for_end_token(geom: Geometry, group: int, end_tokens: Any) -> I64:
    """:func:`kvgeom.keys.chunk_for_end_token` per end token; ``-1`` where the scalar returns ``None``.

    End tokens must be positive.

    >>> import kvgeom
    >>> chunk_for_end_token(kvgeom.resolve(kvgeom.DEFAULT_CONFIG), 0, [64, 48]).tolist()
    [1, -1]
    """
    og = offload_group(geom, group)
    e = positive("end_token", end_tokens)
    q, r = np.divmod(e, og.tokens_per_chunk)
    return np.where(r == 0, q - 1, -1)


def boundary_hash_index(geom: Geometry, end_tokens: Any) -> I64:
    """:func:`kvgeom.keys.boundary_hash_index` per end token: ``end_token // H - 1`` (multiples of H only).

    >>> import kvgeom
    >>> boundary_hash_index(kvgeom.resolve(kvgeom.DEFAULT_CONFIG), [16, 48]).tolist()
    [0, 2]
    """
    e = positive("end_token", end_tokens)
    h = geom.hash_block_size
    q, r = np.divmod(e, h)
    if r.any():
        bad = int(e[np.argmax(r != 0)])
        raise QueryError.single(
            "not_on_hash_grid",
            f"end_token={bad} is not a multiple of the hash unit H={h}; keys exist only at multiples of H",
            "end_token",
            end_token=bad,
            hash_block_size=h,
        )
    return q - 1


def num_keys(geom: Geometry, group: int, num_tokens: Any) -> I64:
    """:func:`kvgeom.keys.num_keys` per token count: ``(n // H) // hashes_per_chunk``.

    >>> import kvgeom
    >>> num_keys(kvgeom.resolve(kvgeom.DEFAULT_CONFIG), 0, [0, 63, 70]).tolist()
    [0, 1, 2]
    """
    og = offload_group(geom, group)
    n = ints("num_tokens", num_tokens)
    return div(div(n, geom.hash_block_size), og.hashes_per_chunk)


@dataclass(frozen=True)
class GroupKeys:
    """One group's keys for many requests, as CSR arrays sorted by request (see :func:`key_maps`)."""

    index: int
    kind: str
    align_mamba: bool
    blocks_per_chunk: int
    indptr: I64
    request: I64
    chunk: I64
    hash_index: I64
    end_token: I64
    block: I64
    """First block-table entry of the chunk (positional groups) or its state block (align Mamba)."""
    rank_lengths: I64 | None
    """Per-rank lengths of each prefix, shape (requests, kv_shards), for a DCP-dealt group."""


@dataclass(frozen=True)
class KeyMaps:
    """Key maps of many prefixes: one :class:`GroupKeys` per offloaded group."""

    prefix_tokens: I64
    groups: tuple[GroupKeys, ...]

    def __len__(self) -> int:
        return int(self.prefix_tokens.shape[0])

    def key_map(self, i: int) -> dict[str, Any]:
        """Prefix ``i``'s map in the :meth:`kvgeom.Geometry.key_map` contract (compare with ``==``)."""
        groups = []
        for g in self.groups:
            lo, hi = int(g.indptr[i]), int(g.indptr[i + 1])
            keys = []
            for j in range(lo, hi):
                entry: dict[str, Any] = {
                    "chunk": int(g.chunk[j]),
                    "hash_index": int(g.hash_index[j]),
                    "end_token": int(g.end_token[j]),
                }
                b = int(g.block[j])
                if g.align_mamba:
                    entry["state_block"] = b
                else:
                    entry["block_entries"] = list(range(b, b + g.blocks_per_chunk))
                keys.append(entry)
            item: dict[str, Any] = {"index": g.index, "kind": g.kind, "keys": keys}
            if g.rank_lengths is not None:
                item["rank_lengths"] = g.rank_lengths[i].tolist()
            groups.append(item)
        return {"prefix_tokens": int(self.prefix_tokens[i]), "groups": groups}


def key_maps(geom: Geometry, prefix_tokens: Any) -> KeyMaps:
    """:func:`kvgeom.keys.key_map` for many prefixes: every complete chunk's key, per offloaded group.

    Per group, CSR arrays over all prefixes: request ``i``'s keys are
    ``[indptr[i], indptr[i+1])`` with chunk, hash index, end token and first
    block entry (align Mamba: state block), and for a DCP-dealt group the
    per-rank lengths. ``KeyMaps.key_map(i) == key_map(geom, prefix_tokens[i])``.

    >>> import kvgeom
    >>> km = key_maps(kvgeom.resolve(kvgeom.DEFAULT_CONFIG), [64, 40])
    >>> km.groups[1].request.tolist(), km.groups[1].block.tolist()
    ([0, 0, 0, 0, 1, 1], [0, 1, 2, 3, 0, 1])
    >>> km.key_map(1)["groups"][0]["rank_lengths"]
    [20, 20]
    """
    off = offload_of(geom)
    n = ints("prefix_tokens", prefix_tokens)
    size = n.shape[0]
    keyed = div(n, geom.hash_block_size)
    out = []
    for og in off.groups:
        g = geom.groups[og.index]
        C, hpc = og.tokens_per_chunk, og.hashes_per_chunk
        k = C // og.tokens_per_block
        counts = div(keyed, hpc)
        indptr = np.zeros(size + 1, dtype=np.int64)
        check_total("key_maps", int(counts.sum(dtype=np.float64)) if size else 0)
        np.cumsum(counts, out=indptr[1:])
        total = int(indptr[-1])
        req = np.repeat(np.arange(size, dtype=np.int64), counts)
        chunk = np.arange(total, dtype=np.int64)
        chunk -= np.repeat(indptr[:-1], counts)
        top = chunk + 1
        end = top * C
        block = div(end, g.block_size) - 1 if g.is_align_mamba else chunk * k
        lengths = rank_lengths(geom, og.index, n) if g.dealt else None
        out.append(
            GroupKeys(og.index, g.kind, g.is_align_mamba, k, indptr, req, chunk, top * hpc - 1, end, block, lengths)
        )
    return KeyMaps(n, tuple(out))
