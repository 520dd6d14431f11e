"""Offload keys: which request hash names a chunk, and which blocks a key covers.

The request hashes are chained every H tokens: hash *i* fingerprints tokens
``[0, (i+1)*H)``. Offload chunk *j* of group *g* (``C_g = S_g * k`` tokens) is
keyed by hash ``(j+1) * C_g / H - 1`` together with the group index, so it
fingerprints exactly the prefix ``[0, (j+1)*C_g)`` (vLLM 0.33 `offloading/scheduler.py::update_offload_keys`).

* Positional groups (attention, MLA, sliding window, non-align Mamba): chunk *j*
  is block-table entries ``[j*k, (j+1)*k)`` of that group; each DCP rank stores
  its own slice of those pages under the same key (`offloading/scheduler.py::_build_store_jobs`).
* Align-mode Mamba: the key ending at token *b* holds the state after exactly
  *b* tokens, taken from state block ``b / B_m - 1``
  (:func:`kvgeom.boundaries.state_block_for_boundary`).

Keys need an offload section in the config (``{}`` for k = 1); with k = 1 the
same arithmetic is the GPU prefix cache's per-group hash view.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from kvgeom._check import nonneg, positive, result
from kvgeom._format import show
from kvgeom.boundaries import state_block_for_boundary
from kvgeom.errors import QueryError
from kvgeom.geometry import Geometry, OffloadGroupGeometry

__all__ = [
    "OffloadKey",
    "boundary_hash_index",
    "chunk_block_entries",
    "chunk_end_token",
    "chunk_for_end_token",
    "chunk_hash_index",
    "chunk_of_entry",
    "chunk_state_block",
    "key_map",
    "num_keys",
    "offload_group",
]


class OffloadKey(NamedTuple):
    """An offload key: the request-hash index and the group index (key bytes = hash || group)."""

    hash_index: int
    group: int


def offload_group(geom: Geometry, group: int) -> OffloadGroupGeometry:
    """The offload geometry of ``group``; :class:`QueryError` without offloading or for a group not offloaded."""
    if geom.offload is not None:  # fast path: an offloaded group, O(1) however many groups (benchmarks)
        found = geom.offload.get(group)
        if found is not None:
            return found
    if geom.offload is None:
        raise QueryError.single(
            "no_offload",
            "this geometry has no offloading connector, so it has no offload keys; add an \"offload\" section "
            "to the config ({} means blocks_per_chunk=1)",
            "offload",
        )
    geom.group(group)
    raise QueryError.single(
        "group_not_offloaded",
        f"group {group} ({geom.groups[group].kind}) is not offloaded (not prefix-cacheable); offloaded groups are "
        f"{show([og.index for og in geom.offload.groups])}",
        "group",
        group=group,
    )


def chunk_hash_index(geom: Geometry, group: int, chunk: int) -> int:
    """Request-hash index of chunk ``chunk``'s key: ``(chunk+1) * hashes_per_chunk - 1``.

    Postcondition: ``(result + 1) * H == chunk_end_token(...)``.

    >>> import kvgeom
    >>> g = kvgeom.resolve(kvgeom.DEFAULT_CONFIG)
    >>> [chunk_hash_index(g, 0, j) for j in range(2)], [chunk_hash_index(g, 1, j) for j in range(4)]
    ([1, 3], [0, 1, 2, 3])
    """
    og = offload_group(geom, group)
    return result("hash_index", (nonneg("chunk", chunk) + 1) * og.hashes_per_chunk - 1)


def chunk_end_token(geom: Geometry, group: int, chunk: int) -> int:
    """End of the prefix chunk ``chunk``'s key fingerprints: ``(chunk+1) * tokens_per_chunk``.

    >>> import kvgeom
    >>> chunk_end_token(kvgeom.resolve(kvgeom.DEFAULT_CONFIG), 0, 1)
    64
    """
    og = offload_group(geom, group)
    return result("end_token", (nonneg("chunk", chunk) + 1) * og.tokens_per_chunk)


def positional_blocks_per_chunk(geom: Geometry, group: int) -> int:
    """k, the block-table entries one key covers, for a positional group; :class:`QueryError`
    ``not_positional`` for an align-mode Mamba group (its key holds one state block)."""
    offload_group(geom, group)
    if geom.groups[group].is_align_mamba:
        raise QueryError.single(
            "not_positional",
            f"group {group} is an align-mode Mamba group: its key ending at b holds one state block "
            "(chunk_state_block), not a run of block-table entries",
            "group",
            group=group,
        )
    assert geom.offload is not None  # offload_group raised otherwise
    return geom.offload.blocks_per_chunk


def chunk_block_entries(geom: Geometry, group: int, chunk: int) -> range:
    """Block-table entries chunk ``chunk`` covers in a positional group: ``[chunk*k, (chunk+1)*k)``.

    Each entry is one per-rank page of ``block_size`` local tokens standing for
    ``span`` positions. Align-mode Mamba groups are not positional: use
    :func:`chunk_state_block`.

    >>> import kvgeom
    >>> g = kvgeom.resolve({**kvgeom.DEFAULT_CONFIG, "offload": {"blocks_per_chunk": 4}})
    >>> chunk_block_entries(g, 0, 1)
    range(4, 8)
    """
    k = positional_blocks_per_chunk(geom, group)
    j = nonneg("chunk", chunk)
    return range(j * k, result("block entry", (j + 1) * k - 1) + 1)  # the last entry must fit int64


def chunk_state_block(geom: Geometry, group: int, chunk: int) -> int:
    """State block an align-mode Mamba key holds: the state after ``chunk_end_token`` tokens.

    >>> import kvgeom
    >>> g = kvgeom.resolve({**kvgeom.DEFAULT_CONFIG, "offload": {"blocks_per_chunk": 2}})
    >>> chunk_end_token(g, 1, 0), chunk_state_block(g, 1, 0)
    (32, 1)
    """
    return state_block_for_boundary(geom, group, chunk_end_token(geom, group, chunk))


def chunk_of_entry(geom: Geometry, group: int, entry: int) -> int:
    """The chunk whose key covers block-table entry ``entry`` (positional groups): ``entry // k``.

    >>> import kvgeom
    >>> g = kvgeom.resolve({**kvgeom.DEFAULT_CONFIG, "offload": {"blocks_per_chunk": 4}})
    >>> chunk_of_entry(g, 0, 5)
    1
    """
    return nonneg("entry", entry) // positional_blocks_per_chunk(geom, group)


def chunk_for_end_token(geom: Geometry, group: int, end_token: int) -> int | None:
    """The chunk whose key ends at ``end_token``, or ``None`` when it is not a chunk end.

    >>> import kvgeom
    >>> g = kvgeom.resolve(kvgeom.DEFAULT_CONFIG)
    >>> chunk_for_end_token(g, 0, 64), chunk_for_end_token(g, 0, 48)
    (1, None)
    """
    og = offload_group(geom, group)
    e = positive("end_token", end_token)
    return e // og.tokens_per_chunk - 1 if e % og.tokens_per_chunk == 0 else None


def boundary_hash_index(geom: Geometry, end_token: int) -> int:
    """Request-hash index of the boundary key ending at ``end_token`` (a multiple of H): ``end_token // H - 1``.

    When ``end_token`` is a multiple of a group's chunk it equals that chunk's key.

    >>> import kvgeom
    >>> boundary_hash_index(kvgeom.resolve(kvgeom.DEFAULT_CONFIG), 48)
    2
    """
    e = positive("end_token", end_token)
    h = geom.hash_block_size
    if e % h:
        raise QueryError.single(
            "not_on_hash_grid",
            f"end_token={e} is not a multiple of the hash unit H={h}; keys exist only at multiples of H",
            "end_token",
            end_token=e,
            hash_block_size=h,
        )
    return e // h - 1


def num_keys(geom: Geometry, group: int, num_tokens: int) -> int:
    """Complete-chunk keys a request of ``num_tokens`` tokens has in ``group``: ``(n // H) // hashes_per_chunk``.

    >>> import kvgeom
    >>> g = kvgeom.resolve(kvgeom.DEFAULT_CONFIG)
    >>> num_keys(g, 0, 70), num_keys(g, 1, 70)
    (2, 4)
    """
    og = offload_group(geom, group)
    return (nonneg("num_tokens", num_tokens) // geom.hash_block_size) // og.hashes_per_chunk


#: The most values (keys, the block entries they list, per-rank lengths) one :func:`key_map` builds; past it the call
#: is refused up front with ``result_too_large`` (``kvgeom.batch.key_maps`` handles long prefixes).
MAX_KEY_MAP_ENTRIES = 1 << 20


def _key_map_fits(geom: Geometry, n: int) -> None:
    """Refuse (``result_too_large``) a key map past :data:`MAX_KEY_MAP_ENTRIES`, before building any of it."""
    assert geom.offload is not None
    k = geom.offload.blocks_per_chunk
    total = 0
    for og in geom.offload.groups:
        g = geom.groups[og.index]
        keys = (n // geom.hash_block_size) // og.hashes_per_chunk
        total += keys * (1 if g.is_align_mamba else 1 + k) + (geom.kv_shards if g.dealt else 0)  # + rank_lengths
        if total > MAX_KEY_MAP_ENTRIES:
            raise QueryError.single(
                "result_too_large",
                f"the key map of a {n}-token prefix lists more than {MAX_KEY_MAP_ENTRIES} keys, block entries and "
                "rank lengths (the most one scalar key_map builds); ask for a shorter prefix, or use kvgeom.batch",
                "prefix_tokens",
                prefix_tokens=n,
                limit=MAX_KEY_MAP_ENTRIES,
            )


def key_map(geom: Geometry, prefix_tokens: int) -> dict[str, Any]:
    """The keys of the complete chunks within ``prefix_tokens``, per offloaded group (the
    :meth:`kvgeom.Geometry.key_map` contract). A map past :data:`MAX_KEY_MAP_ENTRIES` keys and block
    entries is refused up front (:class:`QueryError` ``result_too_large``)."""
    from kvgeom.ranks import rank_lengths

    n = nonneg("prefix_tokens", prefix_tokens)
    if geom.offload is None:
        offload_group(geom, 0)  # raises no_offload
    assert geom.offload is not None
    _key_map_fits(geom, n)
    groups = []
    for og in geom.offload.groups:
        g = geom.groups[og.index]
        keys = []
        for j in range(num_keys(geom, og.index, n)):
            entry: dict[str, Any] = {
                "chunk": j,
                "hash_index": chunk_hash_index(geom, og.index, j),
                "end_token": chunk_end_token(geom, og.index, j),
            }
            if g.is_align_mamba:
                entry["state_block"] = chunk_state_block(geom, og.index, j)
            else:
                entry["block_entries"] = list(chunk_block_entries(geom, og.index, j))
            keys.append(entry)
        item: dict[str, Any] = {"index": g.index, "kind": g.kind, "keys": keys}
        if g.dealt:
            item["rank_lengths"] = list(rank_lengths(geom, og.index, n))
        groups.append(item)
    return {"prefix_tokens": n, "groups": groups}
