"""Every decision :func:`resolve` takes, drafter decisions included, in one private package.

:func:`resolve` is a pipeline of named steps, each called once, in order; each step lives in the
module named for its concept: :mod:`~kvgeom._resolve.groups` (per-group checks, sharding, Mamba mode,
spans, row widths, window needs), :mod:`~kvgeom._resolve.units` (L, H, partial hash hits, A,
compression, retention), :mod:`~kvgeom._resolve.speculative` (every drafter decision),
:mod:`~kvgeom._resolve.offload` (the connector geometry), :mod:`~kvgeom._resolve.warnings` and
:mod:`~kvgeom._resolve.problems` (the collector that reports every problem at once).

Floors: this package sits above :mod:`kvgeom.geometry` (the resolved values) and below every rule
module; rule modules never import it, they read fields of :class:`kvgeom.Geometry`. The rules restate
vLLM 0.33 (``v1/core/kv_cache_utils.py``, ``offloading/config.py``,
``SchedulerOffloadConfig.from_spec``); where vLLM is wrong kvgeom does the correct thing and says so.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from kvgeom._resolve import groups as _groups
from kvgeom._resolve import speculative as _spec
from kvgeom._resolve import units as _units
from kvgeom._resolve.offload import resolve_offload_geometry
from kvgeom._resolve.problems import Collector
from kvgeom._resolve.warnings import geometry_warnings
from kvgeom.config import KVGeomConfig, load_config
from kvgeom.errors import GeometryError, ParallelismError
from kvgeom.geometry import Geometry
from kvgeom.parallel import check_parallel

__all__ = ["resolve"]


def resolve(source: KVGeomConfig | Mapping[str, Any] | str | os.PathLike[str]) -> Geometry:
    """Resolve a config (dict, ``.json``/``.toml`` path or :class:`KVGeomConfig`) into a :class:`Geometry`.

    Raises :class:`kvgeom.ConfigError` for malformed input and a
    :class:`kvgeom.GeometryError` (or subclass) listing every rule the config
    breaks. Nothing else escapes.

    Postconditions: each span is ``block_size * kv_shards`` if the group is
    sharded, else ``block_size``; ``scheduler_block_size`` is the lcm of the
    spans; ``hash_block_size`` divides every prefix-cacheable span;
    ``hit_alignment_tokens`` is ``hash_block_size`` or ``scheduler_block_size``.

    >>> from kvgeom import DEFAULT_CONFIG
    >>> g = resolve(DEFAULT_CONFIG)
    >>> [x.span for x in g.groups], g.scheduler_block_size, g.hash_block_size
    ([32, 16], 32, 16)
    >>> [o.tokens_per_block for o in g.offload.groups]
    [32, 16]
    """
    cfg = _spec.apply_defaults(load_config(source))
    out = Collector()
    out.extend(GeometryError, _spec.check_drafters(cfg))
    out.extend(ParallelismError, check_parallel(cfg.parallel))
    groups = _groups.resolve_group_list(cfg, out)
    _groups.check_spans(groups, out)
    out.raise_if_any()

    managed = _groups.scheduler_groups(groups)  # without the encoder-only group vLLM's scheduler never sees
    L = _units.scheduler_block(managed)
    H, hash_ok, warnings = _units.hash_unit(cfg, managed, L, out)
    partial = _units.partial_hash_hits(cfg, managed, H, hash_ok)
    A = _units.hit_alignment(H, L, partial)
    _units.check_compression(groups, A, out)
    _units.check_retention(cfg, groups, L, out)

    speculative = _spec.speculative_geometry(cfg)
    groups, spec_problems = _spec.resolve_groups(cfg, groups, speculative, L, H, partial)
    out.extend(GeometryError, spec_problems)
    offload, offload_warnings = resolve_offload_geometry(cfg, groups, H, L, hash_ok, out)
    if offload is not None:
        offload = _spec.resolve_offload(offload, groups, H, A, partial)
    out.raise_if_any()

    warnings += offload_warnings
    warnings += geometry_warnings(cfg, groups, L, H, A, offload)
    warnings += _spec.speculative_warnings(cfg, groups, A, offload, speculative)
    return Geometry(
        config=cfg,
        groups=tuple(groups),
        scheduler_block_size=L,
        hash_block_size=H,
        hit_alignment_tokens=A,
        partial_hash_hits=partial,
        offload=offload,
        warnings=tuple(warnings),
        speculative=speculative,
        gpu_drop_groups=_spec.gpu_dropping_groups(groups, speculative),
    )
