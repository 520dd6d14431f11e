"""Which layer sits in which group, asked of vLLM 0.33's own grouping (needs an installed vLLM).

:func:`kvgeom.resolve_block_sizes` decides the groups of a layered model (``docs/resolution.md``
step 5). This harness hands vLLM's ``get_kv_cache_groups`` (``v1/core/kv_cache_planning.py``) one real
spec per layer, named by the layer's kvgeom label, in model order, and reads back vLLM's groups: their
layer names (the membership) and each group's ``block_size`` (so each layer's block).

What is built, and what is bypassed:

* **The per-layer specs**: each layer's spec is the vLLM spec of the group kvgeom put it in
  (:func:`kvgeom.conformance.vllm_objects.build_kv_cache_spec`: the resolved per-rank block, window,
  chunk, Mamba mode; a ``uniform`` group gives each layer its own leaf). Their pages are padded to one
  common size, as step 4 leaves them, so vLLM's page unification has nothing left to change and the
  check isolates the grouping (step 5); the page arithmetic has its own laws.
* **The VllmConfig**: a stand-in with a real ``CacheConfig`` whose KV-cache layout is layer-outermost
  (``LBNHC``, vLLM's legacy ``NHD``): vLLM's block-outermost packing path (``_get_packed_kv_cache_groups``)
  is not modelled by kvgeom and is not asked; the hybrid manager is on; no HiSparse config.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from types import SimpleNamespace
from typing import Any

os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")

from vllm.config import CacheConfig
from vllm.v1.core.kv_cache_planning import get_kv_cache_groups
from vllm.v1.kv_cache_interface import KVCacheSpec, UniformTypeKVCacheSpecs

from kvgeom.conformance.vllm_objects import build_kv_cache_spec
from kvgeom.resolution import BlockSizeResolution, resolve_block_sizes

__all__ = ["VllmGrouping", "differences", "vllm_grouping"]


@dataclasses.dataclass(frozen=True)
class VllmGrouping:
    """vLLM 0.33's answer: the layer labels of each group (group order) and each layer's block."""

    group_layers: tuple[tuple[str, ...], ...]
    layer_block_sizes: tuple[tuple[str, int], ...]


def _layer_specs(r: BlockSizeResolution) -> dict[str, KVCacheSpec]:
    """One vLLM spec per layer label, in model order, every page padded to the largest."""
    geom = r.resolve()
    per_label: dict[str, KVCacheSpec] = {}
    for g, labels in enumerate(r.group_layers):
        spec = build_kv_cache_spec(geom, g)
        if isinstance(spec, UniformTypeKVCacheSpecs):
            leaves = list(spec.kv_cache_specs.values())
            per_label.update(zip(labels, leaves, strict=True))
        else:
            per_label.update((label, spec) for label in labels)
    page = max(s.page_size_bytes for s in per_label.values())
    return {label: dataclasses.replace(per_label[label], page_size_padded=page) for label in r.layer_labels}


def vllm_grouping(source: BlockSizeResolution | Mapping[str, Any]) -> VllmGrouping:
    """Run vLLM's ``get_kv_cache_groups`` on the layers of a layered config (or of its resolution).

    >>> r = vllm_grouping({"model": {"layers": [
    ...     {"kind": "full_attention", "num_kv_heads": 2, "head_size": 128, "dtype": "bfloat16", "count": 2},
    ...     {"kind": "sliding_window", "sliding_window": 64, "num_kv_heads": 2, "head_size": 128,
    ...      "dtype": "bfloat16", "count": 4}]}})
    >>> r.group_layers  # vLLM deals the four sliding layers round-robin over two groups
    (('layers[0]#0', 'layers[0]#1'), ('layers[1]#0', 'layers[1]#2'), ('layers[1]#1', 'layers[1]#3'))
    """
    r = source if isinstance(source, BlockSizeResolution) else resolve_block_sizes(source)
    cache = CacheConfig()
    cache.kv_cache_layout = "LBNHC"
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
    return out
