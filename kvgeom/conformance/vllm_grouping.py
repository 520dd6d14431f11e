"""Which layer sits in which group, asked of vLLM 0.33's own grouping (needs an installed vLLM).

:func:`kvgeom.resolve_block_sizes` decides the groups of a layered model (``docs/resolution.md``
step 5). This harness hands vLLM's ``get_kv_cache_groups`` (``v1/core/kv_cache_planning.py``) one real
spec per layer, named by the layer's kvgeom label, in model order, and reads back vLLM's groups: their
layer names (the membership) and each group's ``block_size`` (so each layer's block).

What is built, and what is bypassed:

* **The per-layer specs**: each layer's spec is the vLLM spec of the group kvgeom put it in
  (:func:`kvgeom.conformance.vllm_objects.build_kv_cache_spec`: the resolved per-rank block, window,
  chunk, Mamba mode; a ``uniform`` group gives each layer its own leaf). Under a layer-outermost layout
  their pages are padded to one common size, as step 4 leaves them, so vLLM's page unification has nothing
  left to change and the check isolates the grouping (step 5); the page arithmetic has its own laws.
  Under a block-outermost layout (``model.kv_cache_layout`` BLHNC, BLNHC or BHLNC) the pages are left as
  they are, so vLLM's packed grouping (``_get_packed_kv_cache_groups``, step 5b) sees the pages of steps
  2-3. Those specs come from kvgeom's own answer, so :func:`differences` also checks that no layer's block
  was scaled (every block is the attention or the Mamba block of steps 2-3): a kvgeom that wrongly unified
  the pages would hand vLLM equal pages, and vLLM would then agree with it.
* **The VllmConfig**: a stand-in with a real ``CacheConfig`` whose KV-cache layout is the resolution's
  ``model.kv_cache_layout`` or, unset, layer-outermost (``LBNHC``, vLLM's legacy ``NHD``); the hybrid
  manager is on; no HiSparse config.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from types import SimpleNamespace
from typing import Any

os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")

import torch
from vllm.config import CacheConfig
from vllm.v1.core.kv_cache_planning import get_kv_cache_groups
from vllm.v1.kv_cache_interface import (
    AttentionSpec,
    KVCacheSpec,
    MambaSpec,
    MLAAttentionSpec,
    SlidingWindowMLASpec,
    UniformTypeKVCacheSpecs,
)

from kvgeom.conformance.vllm_objects import build_kv_cache_spec
from kvgeom.pages import page_bytes
from kvgeom.resolution import BLOCK_OUTERMOST_LAYOUTS, BlockSizeResolution, resolve_block_sizes
from kvgeom.specs import UniformSpec

__all__ = ["VllmGrouping", "differences", "vllm_grouping"]


@dataclasses.dataclass(frozen=True)
class VllmGrouping:
    """vLLM 0.33's answer: the layer labels of each group (group order) and each layer's block."""

    group_layers: tuple[tuple[str, ...], ...]
    layer_block_sizes: tuple[tuple[str, int], ...]


def _block_outermost(r: BlockSizeResolution) -> bool:
    return r.kv_cache_layout in BLOCK_OUTERMOST_LAYOUTS


def _layer_specs(r: BlockSizeResolution) -> dict[str, KVCacheSpec]:
    """One vLLM spec per layer label, in model order: every page padded to the largest under a layer-outermost
    layout; under a block-outermost one each layer keeps its own page (:func:`_own_page`)."""
    geom = r.resolve()
    outermost = _block_outermost(r)
    per_label: dict[str, KVCacheSpec] = {}
    for g, labels in enumerate(r.group_layers):
        spec = build_kv_cache_spec(geom, g)
        ours = geom.group(g).spec
        pairs: list[tuple[KVCacheSpec, Any]]
        if isinstance(spec, UniformTypeKVCacheSpecs):
            assert isinstance(ours, UniformSpec)
            pairs = list(zip(spec.kv_cache_specs.values(), ours.layers, strict=True))
        else:
            pairs = [(spec, ours)] * len(labels)
        for label, (theirs, leaf) in zip(labels, pairs, strict=True):
            per_label[label] = _own_page(theirs, leaf, label) if outermost else theirs
    if outermost:
        return {label: per_label[label] for label in r.layer_labels}
    page = max(s.page_size_bytes for s in per_label.values())
    return {label: dataclasses.replace(per_label[label], page_size_padded=page) for label in r.layer_labels}


_TORCH_DTYPES = {
    "float64": torch.float64,
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "fp8": torch.uint8,
    "fp8_e4m3": torch.uint8,
    "fp8_e5m2": torch.uint8,
}


def _own_page(theirs: KVCacheSpec, leaf: Any, label: str) -> KVCacheSpec:
    """``theirs`` (built with the checker's stand-in dtype) with the layer's own dtypes, ``head_size_v``, MLA
    ``alignment`` and Mamba padding, so its page is the layer's: vLLM's packed grouping reads the pages.

    Raises ``ValueError`` when vLLM's page still differs from :func:`kvgeom.pages.page_bytes` of the layer
    (a format this checker does not rebuild, e.g. ``fp8_ds_mla``): the check would not be about this model."""
    if isinstance(theirs, MambaSpec):
        own: KVCacheSpec = dataclasses.replace(
            theirs,
            dtypes=tuple(_TORCH_DTYPES[d] for d in leaf.dtypes),
            page_size_padded=leaf.page_size_padded,
        )
    elif isinstance(theirs, AttentionSpec) and leaf.dtype in _TORCH_DTYPES:
        changes: dict[str, Any] = {"dtype": _TORCH_DTYPES[leaf.dtype]}
        if not isinstance(theirs, MLAAttentionSpec | SlidingWindowMLASpec):
            changes["head_size_v"] = leaf.head_size_v or leaf.head_size
        elif leaf.alignment is not None:
            changes["alignment"] = leaf.alignment
        own = dataclasses.replace(theirs, **changes)
    else:
        own = theirs
    if own.page_size_bytes != page_bytes(leaf):
        raise ValueError(
            f"{label}: vLLM's page of the rebuilt spec is {own.page_size_bytes} bytes, kvgeom's is "
            f"{page_bytes(leaf)}; this checker cannot rebuild the layer's format ({type(own).__name__})"
        )
    return own


def vllm_grouping(source: BlockSizeResolution | Mapping[str, Any]) -> VllmGrouping:
    """Run vLLM's ``get_kv_cache_groups`` on the layers of a layered config (or of its resolution).

    >>> r = vllm_grouping({"model": {"layers": [
    ...     {"kind": "full_attention", "num_kv_heads": 2, "head_size": 128, "dtype": "bfloat16", "count": 2},
    ...     {"kind": "sliding_window", "sliding_window": 64, "num_kv_heads": 2, "head_size": 128,
    ...      "dtype": "bfloat16", "count": 4}]}})
    >>> r.group_layers  # vLLM deals the four sliding layers round-robin over two groups
    (('layers[0]#0', 'layers[0]#1'), ('layers[1]#0', 'layers[1]#2'), ('layers[1]#1', 'layers[1]#3'))
    >>> packed = vllm_grouping({"model": {"kv_cache_layout": "BLHNC", "layers": [
    ...     {"kind": "full_attention", "num_kv_heads": 2, "head_size": 128, "dtype": "bfloat16", "count": 4},
    ...     {"kind": "sliding_window", "sliding_window": 64, "num_kv_heads": 4, "head_size": 128,
    ...      "dtype": "bfloat16", "count": 4}]}})
    >>> packed.group_layers[1:]  # pages 8 KiB and 16 KiB stay: a block holds 4 full pages, so 2 sliding ones
    (('layers[1]#0', 'layers[1]#2'), ('layers[1]#1', 'layers[1]#3'))
    >>> sorted({b for _, b in packed.layer_block_sizes})  # no block scaled (layer-outermost: full 32, sliding 16)
    [16]
    """
    r = source if isinstance(source, BlockSizeResolution) else resolve_block_sizes(source)
    cache = CacheConfig()
    cache.kv_cache_layout = r.kv_cache_layout or "LBNHC"
    config = SimpleNamespace(
        scheduler_config=SimpleNamespace(disable_hybrid_kv_cache_manager=False),
        cache_config=cache,
        attention_config=None,
    )
    groups = get_kv_cache_groups(config, _layer_specs(r))
    block_of = {name: g.kv_cache_spec.block_size for g in groups for name in g.layer_names}
    return VllmGrouping(
        group_layers=tuple(tuple(g.layer_names) for g in groups),
        layer_block_sizes=tuple((label, block_of[label]) for label in r.layer_labels),
    )


def differences(source: BlockSizeResolution | Mapping[str, Any]) -> dict[str, tuple[Any, Any]]:
    """``{field: (kvgeom, vllm)}`` where kvgeom's grouping and per-layer blocks differ from vLLM's; ``{}`` agrees."""
    r = source if isinstance(source, BlockSizeResolution) else resolve_block_sizes(source)
    theirs = vllm_grouping(r)
    out: dict[str, tuple[Any, Any]] = {}
    if r.group_layers != theirs.group_layers:
        out["group_layers"] = (r.group_layers, theirs.group_layers)
    if r.layer_block_sizes() != theirs.layer_block_sizes:
        out["layer_block_sizes"] = (r.layer_block_sizes(), theirs.layer_block_sizes)
    if _block_outermost(r):
        # vLLM's packed grouping keeps the specs it is given, so its echo proves nothing about them: no block
        # may differ from the attention and Mamba blocks of steps 2-3 and no attention page may be padded
        # (neither page unification nor packing happened before vLLM's grouping)
        steps_2_3 = {r.attention_block_size, r.mamba_block_size}
        scaled = tuple((label, b) for label, b in r.layer_block_sizes() if b not in steps_2_3)
        if scaled:
            out["scaled_blocks"] = (scaled, ())
        padded = tuple(
            label
            for group, labels in zip(r.config["groups"], r.group_layers, strict=True)
            for leaf, label in zip(group.get("layers", [group] * len(labels)), labels, strict=True)
            if leaf["kind"] != "mamba" and "page_size_padded" in leaf
        )
        if padded:
            out["padded_attention_pages"] = (padded, ())
    return out
