"""kvgeom: KV-cache block geometry for LLM serving, in one place.

The public API inventory. Resolve a config once, then ask the geometry. The free functions take
Python values (``kvgeom.prefix_hit(geom, num_tokens, resident)``); the ``Geometry`` methods of the same
name are JSON-shaped conveniences (``geom.prefix_hit({"num_tokens": ..., "resident": ...})`` returns
the contract dict the CLI prints)::

    >>> import kvgeom
    >>> g = kvgeom.resolve(kvgeom.DEFAULT_CONFIG)
    >>> [(x.kind, x.span) for x in g.groups]
    [('full_attention', 32), ('mamba', 16)]
"""

import importlib
from typing import TYPE_CHECKING, Any

from kvgeom._resolve import resolve
from kvgeom.config import DEFAULT_CONFIG, CacheConfig, KVGeomConfig, OffloadConfig, load_config
from kvgeom.errors import (
    ConfigError,
    GeometryError,
    KVGeomError,
    OffloadConfigError,
    ParallelismError,
    Problem,
    QueryError,
)
from kvgeom.geometry import (
    Geometry,
    GeometryWarning,
    GroupGeometry,
    OffloadGeometry,
    OffloadGroupGeometry,
    SpeculativeGeometry,
)
from kvgeom.parallel import ParallelConfig
from kvgeom.prefill import MambaCheckpoint, mamba_checkpoint, prefill_chunk_ends
from kvgeom.presets import load_preset, preset_names
from kvgeom.residency import Residency, make_offload_key, split_offload_key
from kvgeom.specs import (
    ChunkedLocalSpec,
    CircularBufferSpec,
    CrossAttentionSpec,
    EncoderOnlySpec,
    FullAttentionSpec,
    GroupSpec,
    HiSparseHotSpec,
    HiSparseResidentSpec,
    MambaSpec,
    MLASpec,
    RSWASpec,
    SinkFullAttentionSpec,
    SlidingWindowMLASpec,
    SlidingWindowSpec,
    UniformSpec,
    is_dcp_sharded,
    is_prefix_cacheable,
)
from kvgeom.speculative_config import SpeculativeConfig

# isort: split
# `compat` and `fingerprint` are both functions and submodules: imported eagerly, so the
# function, bound last, is what `kvgeom.compat` names.
from kvgeom.compat import CompatReason, CompatReport, GroupCompat, compat, compat_main_text
from kvgeom.fingerprint import fingerprint, layout_fields
from kvgeom.pages import maybe_page_bytes, page_bytes
from kvgeom.prefix import PrefixHit, prefix_hit

# The layer-shape resolution loads on first use (PEP 562): it is the largest module and
# serving paths that only resolve a config never need it.
_LAZY = {
    "BlockSizeResolution": "kvgeom.resolution",
    "LayeredConfig": "kvgeom.resolution",
    "LayerSpec": "kvgeom.resolution",
    "ModelLayers": "kvgeom.resolution",
    "PagePadding": "kvgeom.resolution",
    "resolve_block_sizes": "kvgeom.resolution",
    # KV events and router scoring, also loaded on first use
    "KVEventError": "kvgeom.events",
    "KVEventReader": "kvgeom.events",
    "RouterScores": "kvgeom.router",
    "score_replicas": "kvgeom.router",
}

if TYPE_CHECKING:
    from kvgeom.events import KVEventError, KVEventReader
    from kvgeom.resolution import (
        BlockSizeResolution,
        LayeredConfig,
        LayerSpec,
        ModelLayers,
        PagePadding,
        resolve_block_sizes,
    )
    from kvgeom.router import RouterScores, score_replicas


#: Submodules reachable as attributes before anything imports them: ``kvgeom.speculative`` is a face
#: re-exporting rules from several modules, so it loads them on first use, not on ``import kvgeom``.
_LAZY_SUBMODULES = frozenset({"speculative"})


def __getattr__(name: str) -> Any:
    if name in _LAZY_SUBMODULES:
        return importlib.import_module(f"kvgeom.{name}")
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'kvgeom' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


__version__ = "0.3.0.dev0"

__all__ = [
    "__version__",
    # the input: config, group specs, parallelism, the speculative section, presets
    "DEFAULT_CONFIG",
    "CacheConfig",
    "ChunkedLocalSpec",
    "CircularBufferSpec",
    "EncoderOnlySpec",
    "HiSparseHotSpec",
    "HiSparseResidentSpec",
    "RSWASpec",
    "CrossAttentionSpec",
    "FullAttentionSpec",
    "GroupSpec",
    "KVGeomConfig",
    "MLASpec",
    "MambaSpec",
    "OffloadConfig",
    "ParallelConfig",
    "SinkFullAttentionSpec",
    "SlidingWindowMLASpec",
    "SlidingWindowSpec",
    "SpeculativeConfig",
    "UniformSpec",
    "is_dcp_sharded",
    "is_prefix_cacheable",
    "load_config",
    "load_preset",
    "preset_names",
    # errors
    "ConfigError",
    "GeometryError",
    "KVGeomError",
    "OffloadConfigError",
    "ParallelismError",
    "Problem",
    "QueryError",
    # the resolved geometry
    "Geometry",
    "GeometryWarning",
    "GroupGeometry",
    "OffloadGeometry",
    "OffloadGroupGeometry",
    "SpeculativeGeometry",
    "resolve",
    # layer shapes to block sizes, page bytes
    "BlockSizeResolution",
    "LayerSpec",
    "LayeredConfig",
    "ModelLayers",
    "PagePadding",
    "maybe_page_bytes",
    "page_bytes",
    "resolve_block_sizes",
    # layout identity: fingerprint and compatibility
    "CompatReason",
    "CompatReport",
    "GroupCompat",
    "compat",
    "compat_main_text",
    "fingerprint",
    "layout_fields",
    # the prefill split and the Mamba checkpoint
    "MambaCheckpoint",
    "mamba_checkpoint",
    "prefill_chunk_ends",
    # residency and offload keys (connector, prefix cache, router)
    "Residency",
    "make_offload_key",
    "split_offload_key",
    # GPU prefix-cache hits
    "PrefixHit",
    "prefix_hit",
    # KV events and router scores
    "KVEventError",
    "KVEventReader",
    "RouterScores",
    "score_replicas",
]
