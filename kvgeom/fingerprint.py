"""Layout fingerprint: a short, versioned digest of everything behind an offload key's bytes.

Two deployments may share a persistent KV tier only if the same key means the
same bytes. vLLM's file tier namespaces DCP, PCP, spans and H but not the
interleave (vLLM 0.33 `v1/kv_offload/file_mapper.py`; ``docs/fingerprint.md``), so two deployments with different
``cp_kv_cache_interleave_size`` read each other's differently dealt pages.
:func:`fingerprint` is ``"kvg2-"`` followed by the first 16 hex digits of the
SHA-256 of a canonical JSON (sorted keys, no spaces, ASCII) of
:func:`layout_fields` -- plain integers, strings, booleans and nulls, so the
value is the same in every process, Python version and platform.

What goes in (``docs/fingerprint.md`` says why for each):

* top level: ``hash_block_size`` (H), ``blocks_per_chunk`` (k, null without
  offloading), ``pp`` when > 1;
* per group, in group order (the group index is part of every key): ``kind``
  and ``tokens_per_state`` of its representative (first) layer, ``span``,
  per-rank ``block_size``, ``offloaded``, ``mamba_mode``, ``page_bytes`` (null
  when unknown), the layout of each layer (dtype, heads, head sizes,
  compression, alignment, Mamba shapes and dtypes) -- ``null`` as a whole when
  the config gives no page field for the group, ``kv_slicing`` -- DCP size, the interleave and PCP when it shards,
  only for a sharded group with more than one KV shard -- and ``tp`` when TP
  splits the group's heads (not for latent MLA caches, which every TP rank
  holds whole).

Version 2 covers only facts both of vLLM's views of a deployment can compute:
without page fields, a worker-side ``UniformTypeKVCacheSpecs`` group (MLA +
indexer) and the scheduler side's flattened first layer give equal fields
(version 1 listed every layer and the container's label, which the scheduler
side cannot know). With page fields, compute it from the worker side.

What deliberately does not: the model name, weights revision and cache salt
(they belong to the caller's namespace), windows, sink lengths, retention
intervals, ``max_model_len``, row widths, hit alignment, warnings (they decide
*which* keys are stored or hit, not what a key's bytes are).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from typing import Any, assert_never

from kvgeom._resolve import resolve
from kvgeom.config import KVGeomConfig
from kvgeom.geometry import Geometry, GroupGeometry
from kvgeom.pages import maybe_page_bytes
from kvgeom.specs import (
    AnyLeaf,
    ChunkedLocalSpec,
    CircularBufferSpec,
    CrossAttentionSpec,
    EncoderOnlySpec,
    FullAttentionSpec,
    HiSparseHotSpec,
    HiSparseResidentSpec,
    MambaSpec,
    MLASpec,
    RSWASpec,
    SinkFullAttentionSpec,
    SlidingWindowMLASpec,
    SlidingWindowSpec,
    Standalone,
    is_latent,
    iter_leaves,
)

__all__ = [
    "FINGERPRINT_VERSION",
    "as_geometry",
    "canonical_json",
    "fingerprint",
    "layout_fields",
    "pages_known",
    "splits_heads_over_tp",
]

#: Bumped whenever :func:`layout_fields` changes meaning; it prefixes every fingerprint.
FINGERPRINT_VERSION = 2


def as_geometry(source: Geometry | KVGeomConfig | Mapping[str, Any] | str | os.PathLike[str]) -> Geometry:
    """A :class:`Geometry` as is; anything else through :func:`kvgeom.resolve` (its errors propagate).

    >>> g = as_geometry({"groups": [{"kind": "mla", "block_size": 64}]})
    >>> as_geometry(g) is g
    True
    """
    return source if isinstance(source, Geometry) else resolve(source)


def splits_heads_over_tp(leaf: AnyLeaf | Standalone) -> bool:
    """Whether TP ranks hold different slices of this layer's cache.

    Attention kinds split KV heads over TP and Mamba layers split state
    features; latent MLA caches (``mla``, ``sliding_window_mla``) hold one
    latent vector per token that every TP rank keeps whole.

    >>> splits_heads_over_tp(MLASpec(block_size=64)), splits_heads_over_tp(MambaSpec(block_size=16))
    (False, True)
    """
    return not is_latent(leaf)


def _leaf_layout(leaf: AnyLeaf | Standalone) -> dict[str, Any]:
    match leaf:
        case HiSparseHotSpec() | HiSparseResidentSpec():
            return {"kind": leaf.kind, "page_size": leaf.page_size}
        case MambaSpec():
            return {
                "kind": leaf.kind,
                "shapes": None if leaf.shapes is None else [list(s) for s in leaf.shapes],
                "dtypes": None if leaf.dtypes is None else list(leaf.dtypes),
            }
        case (
            FullAttentionSpec()
            | MLASpec()
            | SinkFullAttentionSpec()
            | SlidingWindowSpec()
            | SlidingWindowMLASpec()
            | ChunkedLocalSpec()
            | CrossAttentionSpec()
            | CircularBufferSpec()
            | RSWASpec()
            | EncoderOnlySpec()
        ):
            return {
                "kind": leaf.kind,
                "dtype": leaf.dtype,
                "num_kv_heads": leaf.num_kv_heads,
                "head_size": leaf.head_size,
                "head_size_v": getattr(leaf, "head_size_v", None),
                "tokens_per_state": leaf.tokens_per_state,
                "alignment": getattr(leaf, "alignment", None),
                "cache_role": getattr(leaf, "cache_role", None),
            }
        case _:
            assert_never(leaf)


#: Per-layer fields that describe the page; a layer with none of them set has an unknown page layout.
_PAGE_FIELDS = ("dtype", "num_kv_heads", "head_size", "head_size_v", "alignment", "shapes", "dtypes", "page_size")


def pages_known(leaves: list[AnyLeaf | Standalone]) -> bool:
    """Whether the config says anything about the pages of these layers (a dtype, heads, head sizes,
    alignment, or Mamba shapes/dtypes on some layer).

    >>> pages_known([MLASpec(block_size=64)]), pages_known([MLASpec(block_size=64, dtype="bfloat16")])
    (False, True)
    """
    return any(getattr(leaf, name, None) is not None for leaf in leaves for name in _PAGE_FIELDS)


def _group_fields(geometry: Geometry, g: GroupGeometry, offloaded: set[int]) -> dict[str, Any]:
    par = geometry.parallel
    leaves = list(iter_leaves(g.spec))
    slicing = None
    if g.dealt:
        slicing = {
            "dcp": par.dcp,
            "interleave": par.cp_interleave,
            "pcp": par.pcp if par.pcp_shards_kv and par.pcp > 1 else None,
        }
    split = par.tp > 1 and any(splits_heads_over_tp(leaf) for leaf in leaves)
    # The representative layer is the one vLLM's scheduler-side KVCacheConfig keeps for a container
    # (generate_scheduler_kv_cache_config flattens it to its first layer spec): both views know it.
    first = leaves[0]
    known = pages_known(leaves)
    return {
        "kind": first.kind,
        "tokens_per_state": first.tokens_per_state if hasattr(first, "tokens_per_state") else None,
        "span": g.span,
        "block_size": g.block_size,
        "offloaded": g.index in offloaded,
        "mamba_mode": g.mamba_mode,
        "page_bytes": maybe_page_bytes(g.spec),
        "layers": [_leaf_layout(leaf) for leaf in leaves] if known else None,
        "kv_slicing": slicing,
        "tp": par.tp if split else None,
    }


def layout_fields(source: Geometry | KVGeomConfig | Mapping[str, Any] | str | os.PathLike[str]) -> dict[str, Any]:
    """The canonical, JSON-ready fields the fingerprint digests (see the module docstring).

    Contract: two geometries have equal fields exactly when the same offload key
    stands for the same bytes on the same rank, as far as their configs say
    (unknown page fields are ``null``). Only plain JSON values appear.

    >>> f = layout_fields({"groups": [{"kind": "mla", "block_size": 64}], "parallel": {"tp": 2, "dcp": 2}})
    >>> f["groups"][0]["span"], f["groups"][0]["kv_slicing"], f["groups"][0]["tp"]
    (128, {'dcp': 2, 'interleave': 1, 'pcp': None}, None)
    """
    geometry = as_geometry(source)
    par = geometry.parallel
    off = geometry.offload
    offloaded = set() if off is None else {og.index for og in off.groups}
    return {
        "version": FINGERPRINT_VERSION,
        "hash_block_size": geometry.hash_block_size,
        "blocks_per_chunk": None if off is None else off.blocks_per_chunk,
        "pp": par.pp if par.pp > 1 else None,
        "groups": [_group_fields(geometry, g, offloaded) for g in geometry.groups],
    }


def canonical_json(fields: Mapping[str, Any]) -> str:
    """The byte-stable text that is hashed: sorted keys, no whitespace, ASCII only, no NaN.

    >>> print(canonical_json({"b": [1, None], "a": "x"}))
    {"a":"x","b":[1,null]}
    """
    return json.dumps(fields, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)


def fingerprint(source: Geometry | KVGeomConfig | Mapping[str, Any] | str | os.PathLike[str]) -> str:
    """``"kvg2-"`` + 16 hex digits of SHA-256 over :func:`canonical_json` of :func:`layout_fields`.

    Contract: equal for two layouts exactly when their :func:`layout_fields`
    are equal (up to SHA-256 collisions); the same in every process and on
    every platform; the prefix names the field-set version.

    >>> a = fingerprint({"groups": [{"kind": "mla", "block_size": 64}], "parallel": {"tp": 2, "dcp": 2}})
    >>> b = fingerprint({"groups": [{"kind": "mla", "block_size": 64}],
    ...                  "parallel": {"tp": 2, "dcp": 2, "cp_interleave": 64}})
    >>> a.startswith("kvg2-"), len(a), a == b
    (True, 21, False)
    """
    digest = hashlib.sha256(canonical_json(layout_fields(source)).encode("ascii")).hexdigest()
    return f"kvg{FINGERPRINT_VERSION}-{digest[:16]}"
