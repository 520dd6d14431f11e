"""Numpy batch paths: the scalar reference functions over many positions or requests.

Every function here has exactly the meaning of a scalar function in
:mod:`kvgeom.ranks`, :mod:`kvgeom.keys`, :mod:`kvgeom.boundaries` or
:mod:`kvgeom.hits`, applied element by element (a property test checks this,
``tests/property/test_batch_agrees_with_scalar.py``). Arrays go in and come
out as ``int64``; nothing is rounded, clipped or wrapped differently.

Input rules (all raise :class:`kvgeom.QueryError`; checked once, in :mod:`kvgeom.batch._arrays`):

* token counts, positions, chunks and block ids are integer arrays of the
  stated shape (any numpy integer dtype or a list of Python ints); bool and
  float arrays are refused, except that an empty input of any dtype is fine;
* negative values are refused (``negative``), and so are values or results
  past what int64 holds (``int64_overflow``): kvgeom checks with a max
  reduction before it computes, so no result ever wraps around;
* per-request arrays of one call must have the same length.

Twins (scalar -> batch); each scalar module ``kvgeom.X`` has its twins in ``kvgeom.batch.X``, and
this package re-exports the names below (a face: it holds no rule of its own):

* :mod:`kvgeom.ranks`: ``dcp_placement`` -> :func:`placements` (rank ``-1``
  for "every rank"), ``dcp_slot`` -> :func:`slot_mapping`, ``rank_lengths``
  -> :func:`rank_lengths`;
* :mod:`kvgeom.keys`: ``chunk_hash_index``, ``chunk_end_token``,
  ``chunk_state_block``, ``chunk_of_entry``, ``boundary_hash_index``,
  ``num_keys`` -> same names; ``chunk_for_end_token`` -> same name with ``-1``
  for ``None``; ``chunk_block_entries`` -> :func:`chunk_first_entry` (the
  range is ``[first, first + k)``); ``key_map`` -> :func:`key_maps`;
* :mod:`kvgeom.boundaries`: ``state_block_for_boundary``,
  ``restore_read_block``, ``running_state_block``, ``is_restorable``,
  ``max_restorable_tokens`` -> same names;
* :mod:`kvgeom.hits`: ``lookup_hit`` -> :func:`lookup_hits`, ``plan_load`` ->
  :func:`plan_loads`, ``plan_store`` -> :func:`plan_stores`,
  ``skipped_tokens``, ``rswa_gap_blocks`` -> same names (the latter as ``(start, stop)``
  arrays). Each result object gives the scalar value
  of one element back (``Hits.hit(i)``, ``LoadPlans.plan(i)``,
  ``StorePlans.plan(i)``, ``KeyMaps.key_map(i)``) for comparison.

Scalar functions without a batch twin, and why:

* :meth:`kvgeom.Geometry.plan_hit` / :func:`kvgeom.hits.plan_hit`: they parse
  one scenario dict into the JSON contract; the batch form is
  :func:`lookup_hits` then :func:`plan_loads`;
* :func:`kvgeom.keys.offload_group`, :func:`kvgeom.boundaries.mamba_chunk_tokens`,
  :func:`kvgeom.masks.default_alignment`: per-group constants, no per-element
  argument;
* :func:`kvgeom.masks.reachable_block_mask` returns a set per call; its
  conditions are evaluated per chunk, vectorised, inside :func:`plan_stores`
  (the store plan is the only consumer of a mask), and the agreement
  property compares the resulting store plans (:mod:`kvgeom.batch.masks`).

Twin modules beyond the names re-exported here: :mod:`kvgeom.batch.handoff` (Mamba hand-offs and
partial tails per request), :mod:`kvgeom.batch.probes` (held-key views), :mod:`kvgeom.batch.prefix`
(GPU prefix-cache hits of many residencies), :mod:`kvgeom.batch.lookup` (lookups over a
:class:`kvgeom.Residency`); :mod:`kvgeom.batch.speculative` re-exports the speculative twins by their
former home.

Where the scalar accepts a result past int64 as a Python int (a slot, hash
index, end token or block entry of an int64-sized input; ``computed +
scheduled`` in ``running_state_block``), the batch function raises
``int64_overflow`` instead: it never wraps.
"""

from __future__ import annotations

from kvgeom.batch._arrays import I64 as I64  # the array types, for annotations of callers
from kvgeom.batch._arrays import Bools as Bools
from kvgeom.batch.boundaries import (
    is_restorable,
    max_restorable_tokens,
    restore_read_block,
    running_state_block,
    state_block_for_boundary,
)
from kvgeom.batch.hits import (
    GroupLoads,
    GroupStores,
    Hits,
    LoadPlans,
    StorePlans,
    lookup_hits,
    plan_loads,
    plan_stores,
    rswa_gap_blocks,
    skipped_tokens,
)
from kvgeom.batch.keys import (
    GroupKeys,
    KeyMaps,
    boundary_hash_index,
    chunk_end_token,
    chunk_first_entry,
    chunk_for_end_token,
    chunk_hash_index,
    chunk_of_entry,
    chunk_state_block,
    key_maps,
    num_keys,
)
from kvgeom.batch.ranks import Placements, placements, rank_lengths, slot_mapping

__all__ = [
    "GroupKeys",
    "GroupLoads",
    "KeyMaps",
    "GroupStores",
    "Hits",
    "LoadPlans",
    "Placements",
    "StorePlans",
    "boundary_hash_index",
    "chunk_end_token",
    "chunk_first_entry",
    "chunk_for_end_token",
    "chunk_hash_index",
    "chunk_of_entry",
    "chunk_state_block",
    "is_restorable",
    "key_maps",
    "lookup_hits",
    "max_restorable_tokens",
    "num_keys",
    "placements",
    "plan_loads",
    "plan_stores",
    "rank_lengths",
    "restore_read_block",
    "running_state_block",
    "rswa_gap_blocks",
    "skipped_tokens",
    "slot_mapping",
    "state_block_for_boundary",
]
