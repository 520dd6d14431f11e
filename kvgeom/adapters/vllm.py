"""vLLM adapter: a kvgeom config from vLLM's ``KVCacheConfig`` and ``VllmConfig``.

Duck typing only: the adapter reads attributes (``getattr``) and the spec's
class *name* (``type(spec).__name__``); it never imports vllm or torch. A
``torch.dtype`` is read through ``str(dtype)`` (``"torch.bfloat16"``).

Both forms of a ``KVCacheConfig`` are accepted and give the same geometry
(reference §1.4): the worker-side config keeps ``UniformTypeKVCacheSpecs``
containers (mapped to a ``uniform`` group of their layers), the scheduler-side
config flattens each container to its first layer spec (mapped to that leaf).
Spans, L, H and offload chunks agree because the container is sharded exactly
when its layers are (:func:`kvgeom.specs.is_dcp_sharded`). Page bytes do not
agree -- a flattened config no longer knows the other layers -- so publish
fingerprints from worker-side configs, or pass ``include_pages=False`` on both.

``docs/adapters.md`` lists the mapping field by field.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any, ParamSpec, TypeVar

from kvgeom._format import show
from kvgeom.errors import ConfigError, KVGeomError, Problem
from kvgeom.geometry import Geometry, resolve
from kvgeom.specs import LATENT_KINDS

__all__ = ["SPEC_KINDS", "config_from_vllm", "dtype_name", "geometry_from_vllm"]

#: vLLM 0.33 spec class name -> kvgeom kind.
SPEC_KINDS: dict[str, str] = {
    "FullAttentionSpec": "full_attention",
    "MLAAttentionSpec": "mla",
    "HiddenStateCacheSpec": "mla",
    "SinkFullAttentionSpec": "sink_full_attention",
    "SlidingWindowSpec": "sliding_window",
    "SlidingWindowMLASpec": "sliding_window_mla",
    "ChunkedLocalAttentionSpec": "chunked_local",
    "CrossAttentionSpec": "cross_attention",
    "CircularBufferSpec": "circular_buffer",
    "MambaSpec": "mamba",
    "UniformTypeKVCacheSpecs": "uniform",
}

_TORCH_DTYPES = {
    "float64": "float64",
    "double": "float64",
    "float32": "float32",
    "float": "float32",
    "float16": "float16",
    "half": "float16",
    "bfloat16": "bfloat16",
    "float8_e4m3fn": "fp8_e4m3",
    "float8_e4m3fnuz": "fp8_e4m3",
    "float8_e5m2": "fp8_e5m2",
    "float8_e5m2fnuz": "fp8_e5m2",
    "fp8": "fp8",
    "fp8_e4m3": "fp8_e4m3",
    "fp8_e5m2": "fp8_e5m2",
    "fp8_ds_mla": "fp8_ds_mla",
    "int64": "int64",
    "int32": "int32",
    "int16": "int16",
    "int8": "int8",
    "uint8": "uint8",
}



_P = ParamSpec("_P")
_R = TypeVar("_R")


def _reads_foreign_objects(fn: Callable[_P, _R]) -> Callable[_P, _R]:
    """Entry-point guard: the adapter reads duck-typed objects, so an argument without the shape of vLLM's
    (an int where a ``KVCacheConfig`` belongs, a group list that is not a list, a ``__str__`` that raises) is
    a :class:`ConfigError` ``not_a_vllm_object`` naming what was read, never a stray ``TypeError``."""

    @functools.wraps(fn)
    def guarded(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        try:
            return fn(*args, **kwargs)
        except KVGeomError:
            raise
        except (TypeError, AttributeError, ValueError, KeyError, IndexError, OverflowError, RecursionError) as e:
            raise ConfigError.single(
                "not_a_vllm_object",
                f"{fn.__name__}: the arguments do not have the shape of vLLM's objects ({type(e).__name__}: "
                f"{show(str(e), 120)}); pass vLLM's KVCacheConfig and VllmConfig (or objects with their attributes)",
                "",
            ) from None

    return guarded


@_reads_foreign_objects
def dtype_name(dtype: Any, field: str = "") -> str | None:
    """kvgeom's dtype name for a ``torch.dtype`` or a dtype string; ``None`` for ``None``/``"auto"``.

    Unknown dtypes raise :class:`kvgeom.ConfigError` ``unknown_dtype`` (never a
    silent guess).

    >>> class FakeDtype:
    ...     def __str__(self): return "torch.float8_e4m3fn"
    >>> dtype_name(FakeDtype()), dtype_name("bfloat16"), dtype_name("auto")
    ('fp8_e4m3', 'bfloat16', None)
    """
    if dtype is None:
        return None
    text = str(dtype)
    text = text.removeprefix("torch.")
    if text == "auto":
        return None
    if text in _TORCH_DTYPES:
        return _TORCH_DTYPES[text]
    raise ConfigError(
        Problem(
            "unknown_dtype",
            f"dtype {show(text, 60)} has no kvgeom name; kvgeom knows {sorted(set(_TORCH_DTYPES))}: "
            "pass include_pages=False to build the geometry without page bytes",
            field,
            {"dtype": show(text, 60)},
        )
    )


def _get(obj: Any, name: str, default: Any = None) -> Any:
    return getattr(obj, name, default)


def _int_or_none(value: Any) -> int | None:
    """Positive integers pass; vLLM's sentinels (-1, Fractions < 1, None) become None."""
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    return value if value > 0 else None


def _spec_kind(spec: Any, spec_kinds: Mapping[str, str], field: str) -> str:
    name = type(spec).__name__
    kinds = {**SPEC_KINDS, **spec_kinds}
    if name not in kinds:
        raise ConfigError(
            Problem(
                "unsupported_vllm_spec",
                f"vLLM spec class {show(name, 60)} has no kvgeom kind; known classes are {show(sorted(kinds))}: "
                f"pass spec_kinds={{{show(name, 60)}: '<kind>'}} if it behaves like one of them",
                field,
                {"spec_class": name},
            )
        )
    return kinds[name]


def _leaf(spec: Any, kind: str, include_pages: bool, field: str) -> dict[str, Any]:
    d: dict[str, Any] = {"kind": kind, "block_size": _get(spec, "block_size")}
    sharded = _get(spec, "dcp_sharded")
    if isinstance(sharded, bool):
        d["dcp_sharded"] = sharded
    if _get(spec, "prefix_cacheable") is False:
        d["prefix_cacheable"] = False
    if kind == "mamba":
        mode = _get(spec, "mamba_cache_mode")
        if mode is not None:
            d["mamba_cache_mode"] = mode
        spec_blocks = _get(spec, "num_speculative_blocks")
        if isinstance(spec_blocks, int) and not isinstance(spec_blocks, bool) and spec_blocks > 0:
            d["num_speculative_blocks"] = spec_blocks
        if include_pages:
            shapes = _get(spec, "shapes")
            dtypes = _get(spec, "dtypes")
            if shapes is not None:
                d["shapes"] = [list(shape) for shape in shapes]
            if dtypes is not None:
                d["dtypes"] = [dtype_name(dt, f"{field}.dtypes[{i}]") for i, dt in enumerate(dtypes)]
            padded = _int_or_none(_get(spec, "page_size_padded"))
            if padded is not None:
                d["page_size_padded"] = padded
        return d
    match kind:
        case "sliding_window" | "sliding_window_mla":
            d["sliding_window"] = _get(spec, "sliding_window")
            extra = _get(spec, "extra_retained_tokens")
            if extra:
                d["extra_retained_tokens"] = extra
            if kind == "sliding_window_mla" and _get(spec, "bounded_replay"):
                d["bounded_replay"] = True
        case "chunked_local":
            d["attention_chunk_size"] = _get(spec, "attention_chunk_size")
        case "sink_full_attention":
            d["sink_len"] = _get(spec, "sink_len", 0)
        case "mla":
            if _get(spec, "cache_role") == "indexer":
                d["cache_role"] = "indexer"
        case _:
            pass
    tps = _int_or_none(_get(spec, "tokens_per_state"))
    if tps is not None and tps > 1:
        d["tokens_per_state"] = tps
    if include_pages:
        latent = kind in LATENT_KINDS
        if not latent:
            heads = _int_or_none(_get(spec, "num_kv_heads"))
            if heads is not None:
                d["num_kv_heads"] = heads
        head_size = _int_or_none(_get(spec, "head_size"))
        if head_size is not None:
            d["head_size"] = head_size
        head_size_v = _int_or_none(_get(spec, "head_size_v"))
        if not latent and head_size_v is not None and head_size_v != head_size:
            d["head_size_v"] = head_size_v
        cache_dtype = _get(spec, "cache_dtype_str") if latent else None
        dt = dtype_name(cache_dtype, f"{field}.cache_dtype_str") if cache_dtype == "fp8_ds_mla" else None
        d["dtype"] = dt or dtype_name(_get(spec, "dtype"), f"{field}.dtype")
        if d["dtype"] is None:
            del d["dtype"]
        if latent:
            alignment = _int_or_none(_get(spec, "alignment"))
            if alignment is not None:
                d["alignment"] = alignment
        padded = _int_or_none(_get(spec, "page_size_padded"))
        if padded is not None:
            d["page_size_padded"] = padded
    return d


def _group(spec: Any, include_pages: bool, spec_kinds: Mapping[str, str], field: str) -> dict[str, Any]:
    kind = _spec_kind(spec, spec_kinds, field)
    if kind != "uniform":
        return _leaf(spec, kind, include_pages, field)
    layer_specs = _get(spec, "kv_cache_specs")
    if not isinstance(layer_specs, Mapping) or not layer_specs:
        raise ConfigError.single(
            "empty_uniform_container",
            "a UniformTypeKVCacheSpecs has no kv_cache_specs (a dict of layer name -> spec); pass the worker-side "
            "config as vLLM built it",
            f"{field}.kv_cache_specs",
        )
    layers = []
    for name, layer in layer_specs.items():
        where = f"{field}.kv_cache_specs[{name!r}]"
        layer_kind = _spec_kind(layer, spec_kinds, where)
        if layer_kind == "uniform":
            raise ConfigError.single(
                "nested_uniform_container", "a UniformTypeKVCacheSpecs inside another is not a vLLM layout", where
            )
        layers.append(_leaf(layer, layer_kind, include_pages, where))
    out: dict[str, Any] = {"kind": "uniform", "block_size": _get(spec, "block_size"), "layers": layers}
    sharded = _get(spec, "dcp_sharded")
    if isinstance(sharded, bool):
        out["dcp_sharded"] = sharded
    return out


def _offload_from_transfer(kv_transfer_config: Any) -> dict[str, Any] | None:
    """The offload section from ``kv_transfer_config`` when an ``OffloadingConnector`` is configured."""
    if kv_transfer_config is None:
        return None
    candidates = [kv_transfer_config]
    extra = _get(kv_transfer_config, "kv_connector_extra_config") or {}
    if _get(kv_transfer_config, "kv_connector") == "MultiConnector" and isinstance(extra, Mapping):
        candidates = list(extra.get("connectors", []))
    for c in candidates:
        name = c.get("kv_connector") if isinstance(c, Mapping) else _get(c, "kv_connector")
        if name != "OffloadingConnector":
            continue
        cfg = (c.get("kv_connector_extra_config") if isinstance(c, Mapping) else _get(c, "kv_connector_extra_config"))
        cfg = cfg or {}
        out: dict[str, Any] = {}
        for key in ("blocks_per_chunk", "block_size"):
            if cfg.get(key) is not None:
                out[key] = cfg[key]
        return out
    return None


@_reads_foreign_objects
def config_from_vllm(
    kv_cache_config: Any,
    vllm_config: Any = None,
    *,
    include_pages: bool = True,
    offload: Mapping[str, Any] | None = None,
    spec_kinds: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """A kvgeom config dict from vLLM's ``KVCacheConfig`` (worker- or scheduler-side) and ``VllmConfig``.

    Contract: reads only attributes; ``kvgeom.resolve`` of the result gives the
    same spans, L, H and offload chunks for a worker-side config and its
    scheduler-side flattening. Unknown spec classes or dtypes raise
    :class:`kvgeom.ConfigError` naming the group (``groups[i]``). ``offload``
    overrides the section read from ``kv_transfer_config`` (an
    ``OffloadingConnector``, also inside a ``MultiConnector``). With
    ``include_pages=False`` no shape field is copied. ``vllm_config=None``
    means vLLM's defaults (TP=DCP=1, prefix caching on).

    >>> from types import SimpleNamespace as NS
    >>> FullAttentionSpec = type("FullAttentionSpec", (NS,), {})
    >>> kv = NS(kv_cache_groups=[NS(kv_cache_spec=FullAttentionSpec(block_size=16, dcp_sharded=True))])
    >>> vc = NS(parallel_config=NS(tensor_parallel_size=2, decode_context_parallel_size=2))
    >>> config_from_vllm(kv, vc)["groups"], config_from_vllm(kv, vc)["parallel"]["dcp"]
    ([{'kind': 'full_attention', 'block_size': 16, 'dcp_sharded': True}], 2)
    """
    kinds = dict(spec_kinds or {})
    groups_in = _get(kv_cache_config, "kv_cache_groups")
    if groups_in is None:
        raise ConfigError.single(
            "not_a_kv_cache_config",
            f"{type(kv_cache_config).__name__} has no kv_cache_groups; pass vLLM's KVCacheConfig",
            "kv_cache_groups",
        )
    groups = []
    for i, group in enumerate(groups_in):
        spec = _get(group, "kv_cache_spec", group)
        groups.append(_group(spec, include_pages, kinds, f"groups[{i}]"))

    par = _get(vllm_config, "parallel_config")
    cache = _get(vllm_config, "cache_config")
    model = _get(vllm_config, "model_config")
    parallel: dict[str, Any] = {}
    for ours, theirs in (
        ("tp", "tensor_parallel_size"),
        ("pp", "pipeline_parallel_size"),
        ("dcp", "decode_context_parallel_size"),
        ("pcp", "prefill_context_parallel_size"),
        ("cp_interleave", "cp_kv_cache_interleave_size"),
    ):
        value = _get(par, theirs)
        if value is not None:
            parallel[ours] = value
    cache_out: dict[str, Any] = {}
    if cache is not None:
        for ours, theirs in (("prefix_caching", "enable_prefix_caching"), ("prefix_match_unit", "prefix_match_unit")):
            value = _get(cache, theirs)
            if value is not None:
                cache_out[ours] = value
        if hasattr(cache, "prefix_cache_retention_interval"):
            cache_out["retention_interval"] = cache.prefix_cache_retention_interval
    max_len = _get(model, "max_model_len")
    if max_len is not None:
        cache_out["max_model_len"] = max_len
    out: dict[str, Any] = {"groups": groups, "parallel": parallel, "cache": cache_out}
    off = dict(offload) if offload is not None else _offload_from_transfer(_get(vllm_config, "kv_transfer_config"))
    if off is not None:
        out["offload"] = off
    return out


def geometry_from_vllm(kv_cache_config: Any, vllm_config: Any = None, **kwargs: Any) -> Geometry:
    """``kvgeom.resolve(config_from_vllm(...))``: the resolved :class:`kvgeom.Geometry`.

    >>> from types import SimpleNamespace as NS
    >>> MambaSpec = type("MambaSpec", (NS,), {})
    >>> kv = NS(kv_cache_groups=[NS(kv_cache_spec=MambaSpec(block_size=16, mamba_cache_mode="align"))])
    >>> geometry_from_vllm(kv).groups[0].span
    16
    """
    return resolve(config_from_vllm(kv_cache_config, vllm_config, **kwargs))
