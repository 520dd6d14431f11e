"""vLLM adapter: kvgeom's geometry from what a vLLM 0.33 connector holds, never silently wrong.

Duck typing only: the adapter reads attributes (``getattr``) and the spec's
class *name* (``type(spec).__name__``); it never imports vllm or torch. A
``torch.dtype`` is read through ``str(dtype)`` (``"torch.bfloat16"``).

Inputs a connector holds, all accepted: the worker-side ``KVCacheConfig``
(``UniformTypeKVCacheSpecs`` containers, mapped to a ``uniform`` group), the
scheduler-side one (each container flattened to its first layer spec, mapped to
that leaf), the offloading connector's ``SchedulerOffloadConfig``, and the
``VllmConfig``. Spans, L, H, A and offload chunks agree between the views
because a container is sharded exactly when its layers are
(:func:`kvgeom.specs.is_dcp_sharded`); page bytes do not (a flattened config no
longer knows the other layers), which is why a fingerprint without page fields
covers only what both views know (``docs/fingerprint.md``).

No silent defaults: what the geometry depends on and the objects do not say
(the parallel layout, prefix caching, a connector's chunking, a drafter) is a
:class:`kvgeom.ConfigError` naming what is missing and how to pass it, and every
number vLLM has already resolved on the objects given is compared with kvgeom's
(``vllm_disagrees``). :class:`OffloadKeys` converts vLLM's offload key bytes to
kvgeom's ``(group, end_token)`` and back. ``docs/adapters.md`` lists the mapping field by field.
"""

from __future__ import annotations

import functools
import importlib.metadata
import warnings
from collections.abc import Callable, Mapping
from typing import Any, ParamSpec, TypeVar

from kvgeom._format import show
from kvgeom._resolve import resolve
from kvgeom.errors import ConfigError, KVGeomError, Problem, QueryError
from kvgeom.geometry import Geometry
from kvgeom.residency import make_offload_key, split_offload_key
from kvgeom.specs import LATENT_KINDS

__all__ = [
    "CACHE_FIELDS",
    "CHECKED_VLLM",
    "EngineVersionWarning",
    "OFFLOADING_CONNECTOR",
    "OffloadKeys",
    "PARALLEL_FIELDS",
    "SPECULATIVE_METHODS",
    "SPEC_KINDS",
    "coerce_extra_int",
    "config_from_vllm",
    "dtype_name",
    "engine_version_message",
    "geometry_from_vllm",
    "installed_vllm_version",
    "is_scheduler_offload_config",
    "offload_from_transfer",
    "speculative_from_vllm",
]

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
    "RSWASpec": "rswa",
    "HiSparseHotSpec": "hisparse_hot",
    "HiSparseResidentSpec": "hisparse_resident",
    "EncoderOnlyAttentionSpec": "encoder_only",
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


# -- engine version -------------------------------------------------------------------------------------

#: The vLLM release series this kvgeom release is checked against (docs/policies.md, engine support).
CHECKED_VLLM = "0.33"


class EngineVersionWarning(UserWarning):
    """The installed engine is not a version this kvgeom release was checked against (docs/policies.md)."""


def engine_version_message(name: str, version: str, checked: str) -> str | None:
    """None when ``version`` is in the ``checked`` release series of engine ``name``, else what to tell the user.

    >>> engine_version_message("vllm", "0.33.1", "0.33") is None
    True
    >>> print(engine_version_message("vllm", "0.34.0", "0.33"))  # doctest: +NORMALIZE_WHITESPACE
    vllm 0.34.0 is installed, but this kvgeom release was checked against vllm 0.33.x only: numbers that vllm
    0.34.0 resolves differently are not caught. Install vllm 0.33.x, or run `kvgeom conform` in this environment
    to see where it disagrees; docs/policies.md says which kvgeom release checks which engine version
    """
    if version == checked or version.startswith(checked + "."):
        return None
    return (
        f"{name} {version} is installed, but this kvgeom release was checked against {name} {checked}.x only: "
        f"numbers that {name} {version} resolves differently are not caught. Install {name} {checked}.x, or run "
        "`kvgeom conform` in this environment to see where it disagrees; docs/policies.md says which kvgeom "
        "release checks which engine version"
    )


@functools.cache
def installed_vllm_version() -> str | None:
    """The version of the vLLM distribution installed in this environment (None when there is none).

    Read from the package metadata, without importing vLLM; looked up once per process.
    """
    try:
        return importlib.metadata.version("vllm")
    except importlib.metadata.PackageNotFoundError:
        return None


def _warn_if_unchecked_vllm() -> None:
    """An :class:`EngineVersionWarning` when an installed vLLM is outside :data:`CHECKED_VLLM` (stack level: the
    caller of the public, guarded entry point)."""
    version = installed_vllm_version()
    message = None if version is None else engine_version_message("vllm", version, CHECKED_VLLM)
    if message is not None:
        warnings.warn(message, EngineVersionWarning, stacklevel=4)


def _reads_foreign_objects(fn: Callable[_P, _R]) -> Callable[_P, _R]:
    """Entry-point guard: the adapter reads duck-typed objects, so an argument without the shape of vLLM's
    (an int where a ``KVCacheConfig`` belongs, groups that are not a list) is the :class:`ConfigError`
    ``not_a_vllm_object`` naming the function and what failed, never a stray ``TypeError``."""

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
                f"{show(str(e), 120)}); pass vLLM's KVCacheConfig / SchedulerOffloadConfig and VllmConfig (or objects "
                "with their attributes)",
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
    if kind in ("hisparse_hot", "hisparse_resident"):
        # vLLM 0.33 HiSparse specs: no heads or dtype, the page bytes given directly
        if kind == "hisparse_hot":
            d["blocks_per_request"] = _get(spec, "blocks_per_request")
        page = _int_or_none(_get(spec, "page_size"))
        if include_pages and page is not None:
            d["page_size"] = page
        return d
    match kind:
        case "rswa":
            d["rswa_window"] = _get(spec, "rswa_window")
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


# -- what must be known ------------------------------------------------------------------------------

#: ``parallel_config`` attributes the geometry depends on (kvgeom name, vLLM name).
PARALLEL_FIELDS: tuple[tuple[str, str], ...] = (
    ("tp", "tensor_parallel_size"),
    ("pp", "pipeline_parallel_size"),
    ("dcp", "decode_context_parallel_size"),
    ("pcp", "prefill_context_parallel_size"),
    ("cp_interleave", "cp_kv_cache_interleave_size"),
)

#: ``cache_config`` attributes the geometry depends on (kvgeom name, vLLM name); ``None`` is a value.
CACHE_FIELDS: tuple[tuple[str, str], ...] = (
    ("prefix_caching", "enable_prefix_caching"),
    ("prefix_match_unit", "prefix_match_unit"),
    ("retention_interval", "prefix_cache_retention_interval"),
)

#: The connector whose chunking kvgeom's ``offload`` section models (vLLM 0.33 ``OffloadingConnector``).
OFFLOADING_CONNECTOR = "OffloadingConnector"


def _missing(obj: Any, names: tuple[str, ...]) -> list[str]:
    return [n for n in names if obj is None or not hasattr(obj, n)]


def _parallel_from(vllm_config: Any, parallel: Mapping[str, Any] | None) -> dict[str, Any]:
    """The ``parallel`` section: every field read from ``vllm_config.parallel_config`` (or the
    ``parallel=`` override); anything missing is the ``ConfigError`` ``parallel_layout_unknown``."""
    if parallel is not None:
        return dict(parallel)
    par = _get(vllm_config, "parallel_config")
    # a None value is as unknown as a missing attribute: vLLM's ParallelConfig never holds one
    missing = [theirs for _, theirs in PARALLEL_FIELDS if _get(par, theirs) is None]
    if vllm_config is None or par is None:
        what = "no vllm_config was given" if vllm_config is None else "vllm_config has no parallel_config"
        raise ConfigError.single(
            "parallel_layout_unknown",
            f"the parallel layout cannot be known: {what}. Spans of DCP-sharded groups depend on "
            "decode_context_parallel_size, so kvgeom will not assume 1: pass the VllmConfig the connector "
            "was built with, or parallel={'tp': ..., 'dcp': ...} explicitly",
            "vllm_config.parallel_config",
            missing=[theirs for _, theirs in PARALLEL_FIELDS],
        )
    if missing:
        raise ConfigError.single(
            "parallel_layout_unknown",
            f"vllm_config.parallel_config has no {', '.join(missing)}; kvgeom will not assume vLLM's defaults "
            "for the parallel layout: pass a VllmConfig with a complete ParallelConfig, or parallel={...} "
            "explicitly",
            "vllm_config.parallel_config",
            missing=missing,
        )
    return {ours: getattr(par, theirs) for ours, theirs in PARALLEL_FIELDS}


def _cache_from(vllm_config: Any, given: Mapping[str, Any] | None) -> dict[str, Any]:
    if given is not None:
        return dict(given)
    cache = _get(vllm_config, "cache_config")
    if cache is None:
        raise ConfigError.single(
            "cache_config_unknown",
            "no vllm_config.cache_config: whether prefix caching is on and its hash unit change H, A and the Mamba "
            "mode, so kvgeom will not assume them; pass the VllmConfig, or cache={...} (kvgeom's cache section; "
            "{} means vLLM's defaults) explicitly",
            "vllm_config.cache_config",
        )
    missing = _missing(cache, tuple(theirs for _, theirs in CACHE_FIELDS))
    if missing:
        raise ConfigError.single(
            "cache_config_unknown",
            f"vllm_config.cache_config has no {', '.join(missing)}: whether prefix caching is on and its hash "
            "unit change H, A and the Mamba mode, so kvgeom will not assume them; pass the VllmConfig the "
            "connector was built with",
            "vllm_config.cache_config",
            missing=missing,
        )
    out: dict[str, Any] = {}
    for ours, theirs in CACHE_FIELDS:
        value = getattr(cache, theirs)
        if value is not None or ours == "retention_interval":
            out[ours] = value
    max_len = _get(_get(vllm_config, "model_config"), "max_model_len")
    if max_len is not None:
        out["max_model_len"] = max_len
    return out


# -- connectors and their chunking --------------------------------------------------------------------


def coerce_extra_int(value: Any, field: str) -> int:
    """An integer from a ``kv_connector_extra_config`` value, exactly as vLLM reads it: ``int(value)``.

    vLLM 0.33 ``offloading/config.py::build_offloading_config`` calls ``int()`` on
    ``blocks_per_chunk`` and ``block_size``, so ``"4"``, ``" 4 "``, ``"1_0"``, ``4.9`` (truncated
    to 4) and ``True`` (1) are accepted there and here; what ``int()`` refuses is the
    :class:`kvgeom.ConfigError` ``bad_extra_config`` (vLLM raises ``ValueError``/``TypeError``).
    Range rules (> 0, a multiple of the block) are resolve()'s, with kvgeom's messages.

    >>> coerce_extra_int("4", "x"), coerce_extra_int(2.7, "x"), coerce_extra_int(True, "x")
    (4, 2, 1)
    """
    try:
        return int(value)
    except (TypeError, ValueError, OverflowError) as exc:
        raise ConfigError.single(
            "bad_extra_config",
            f"{field}={value!r} is not an integer as vLLM reads it (int() raised {type(exc).__name__}): "
            'give a whole number of blocks or tokens, e.g. 4 or "4"',
            field,
            value=repr(value),
        ) from None


def _connector_entries(kv_transfer_config: Any) -> list[tuple[str, Mapping[str, Any], str]]:
    """``(connector name, extra config, field)`` for the configured connector, or each child of a
    ``MultiConnector`` (vLLM 0.33 ``multi_connector.py``: children under ``extra["connectors"]``)."""
    name = _get(kv_transfer_config, "kv_connector")
    extra = _get(kv_transfer_config, "kv_connector_extra_config") or {}
    if not isinstance(extra, Mapping):
        raise ConfigError.single(
            "bad_extra_config",
            f"kv_connector_extra_config is a {type(extra).__name__}, not a dict",
            "vllm_config.kv_transfer_config.kv_connector_extra_config",
        )
    if name != "MultiConnector":
        return [(str(name), extra, "vllm_config.kv_transfer_config")]
    out = []
    for i, child in enumerate(extra.get("connectors", [])):
        where = f"vllm_config.kv_transfer_config.kv_connector_extra_config.connectors[{i}]"
        if isinstance(child, Mapping):
            cname, cextra = child.get("kv_connector"), child.get("kv_connector_extra_config") or {}
        else:
            cname, cextra = _get(child, "kv_connector"), _get(child, "kv_connector_extra_config") or {}
        if not isinstance(cextra, Mapping):
            raise ConfigError.single(
                "bad_extra_config", f"kv_connector_extra_config is a {type(cextra).__name__}, not a dict", where
            )
        out.append((str(cname), cextra, where))
    return out


def _offloading_section(extra: Mapping[str, Any], where: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key in ("blocks_per_chunk", "block_size"):
        if extra.get(key) is not None:
            out[key] = coerce_extra_int(extra[key], f"{where}.kv_connector_extra_config.{key}")
    return out


@_reads_foreign_objects
def offload_from_transfer(
    kv_transfer_config: Any, connector_chunking: Mapping[str, Mapping[str, Any] | None] | None = None
) -> dict[str, Any] | None:
    """kvgeom's ``offload`` section for vLLM's ``kv_transfer_config`` (``None``: no tier to model).

    Contract: an ``OffloadingConnector`` (alone or inside a ``MultiConnector``) gives its
    ``blocks_per_chunk`` / ``block_size`` read as vLLM reads them (:func:`coerce_extra_int`). Any
    other connector (``SimpleCPUOffloadConnector``, P/D connectors, your own) must be named in
    ``connector_chunking``: ``{"Name": {"blocks_per_chunk": k}}`` models it with chunks of k blocks,
    ``{"Name": None}`` states that it keeps no hash-addressed chunks to model. An unnamed one is the
    :class:`kvgeom.ConfigError` ``connector_chunking_unknown``, never skipped; two connectors whose
    sections differ are ``several_offload_tiers``.

    >>> from types import SimpleNamespace as NS
    >>> offload_from_transfer(NS(kv_connector="OffloadingConnector",
    ...                          kv_connector_extra_config={"blocks_per_chunk": "4"}))
    {'blocks_per_chunk': 4}
    >>> offload_from_transfer(NS(kv_connector="SimpleCPUOffloadConnector", kv_connector_extra_config={}),
    ...                       {"SimpleCPUOffloadConnector": {"blocks_per_chunk": 1}})
    {'blocks_per_chunk': 1}
    """
    if kv_transfer_config is None:
        return None
    chunking = dict(connector_chunking or {})
    sections: list[tuple[str, dict[str, Any]]] = []
    for name, extra, where in _connector_entries(kv_transfer_config):
        if name in chunking:
            given = chunking[name]
            if given is not None:
                sections.append((name, _offloading_section(given, f"connector_chunking[{name!r}]")))
        elif name == OFFLOADING_CONNECTOR:
            sections.append((name, _offloading_section(extra, where)))
        else:
            raise ConfigError.single(
                "connector_chunking_unknown",
                f"kv connector {name!r} is configured but kvgeom models only {OFFLOADING_CONNECTOR}'s chunking: "
                f"pass connector_chunking={{{name!r}: {{'blocks_per_chunk': k}}}} to model its tier with chunks of "
                f"k blocks, or connector_chunking={{{name!r}: None}} if it keeps no hash-addressed chunks",
                f"{where}.kv_connector",
                connector=name,
            )
    if not sections:
        return None
    first = sections[0][1]
    for name, section in sections[1:]:
        if section != first:
            raise ConfigError.single(
                "several_offload_tiers",
                f"connectors {sections[0][0]!r} and {name!r} chunk differently ({first} vs {section}); kvgeom models "
                "one tier: pick the one to model with connector_chunking={name: None} for the other",
                "vllm_config.kv_transfer_config",
            )
    return first


# -- speculative decoding ---------------------------------------------------------------------------------

#: vLLM 0.33 ``SpeculativeConfig.method`` -> kvgeom's ``speculative.method`` (MTP model types map to "mtp").
SPECULATIVE_METHODS: dict[str, str] = {
    "eagle": "eagle",
    "eagle3": "eagle3",
    "mtp": "mtp",
    "draft_model": "draft_model",
    "ngram": "ngram",
    "ngram_gpu": "ngram",
    "dflash": "dflash",
}


@_reads_foreign_objects
def speculative_from_vllm(vllm_config: Any) -> dict[str, Any] | None:
    """kvgeom's ``speculative`` config section from ``vllm_config.speculative_config`` (``None`` without one).

    Keys: ``method`` (:data:`SPECULATIVE_METHODS`; vLLM's MTP model types such as ``deepseek_mtp``
    map to ``"mtp"``), ``num_speculative_tokens``, ``eagle_block_drop`` = not
    ``disable_eagle_block_drop``, ``lookahead_hashes`` = not ``disable_lookahead_block_hashes``,
    and for MTP ``mtp_modules`` = the draft model's ``num_nextn_predict_layers`` when known. Any
    other method (``suffix``, ``custom_class``, ``dspark``, ``extract_hidden_states``) is the
    :class:`kvgeom.ConfigError` ``unsupported_speculative_method``.

    >>> from types import SimpleNamespace as NS
    >>> sc = NS(method="eagle3", num_speculative_tokens=3, disable_eagle_block_drop=False,
    ...         disable_lookahead_block_hashes=True, draft_model_config=None)
    >>> speculative_from_vllm(NS(speculative_config=sc))
    {'method': 'eagle3', 'num_speculative_tokens': 3, 'eagle_block_drop': True, 'lookahead_hashes': False}
    """
    sc = _get(vllm_config, "speculative_config")
    if sc is None:
        return None
    raw = _get(sc, "method")
    method = SPECULATIVE_METHODS.get(str(raw))
    if method is None and isinstance(raw, str) and raw.endswith("_mtp"):
        method = "mtp"
    if method is None:
        raise ConfigError.single(
            "unsupported_speculative_method",
            f"speculative method {raw!r} has no kvgeom model; kvgeom knows {sorted(SPECULATIVE_METHODS)} and "
            "vLLM's *_mtp model types: its effect on cache hits is unknown, so the geometry is refused",
            "vllm_config.speculative_config.method",
            method=repr(raw),
        )
    out: dict[str, Any] = {
        "method": method,
        "num_speculative_tokens": _get(sc, "num_speculative_tokens"),
        "eagle_block_drop": not bool(_get(sc, "disable_eagle_block_drop", False)),
        "lookahead_hashes": not bool(_get(sc, "disable_lookahead_block_hashes", False)),
    }
    if method == "mtp":
        hf = _get(_get(sc, "draft_model_config"), "hf_config")
        modules = _get(hf, "num_nextn_predict_layers")
        if isinstance(modules, int) and not isinstance(modules, bool):
            out["mtp_modules"] = modules
    return out


def _drafter_groups(groups_in: Any) -> list[int]:
    """Indices of groups vLLM marks as drafter groups: ``is_eagle_group`` on the group, or ``is_draft``
    on its spec (on any layer of a container)."""
    out = []
    for i, group in enumerate(groups_in):
        spec = _get(group, "kv_cache_spec", group)
        layers = _get(spec, "kv_cache_specs")
        leaves = list(layers.values()) if isinstance(layers, Mapping) else [spec]
        if _get(group, "is_eagle_group") is True or any(_get(leaf, "is_draft") is True for leaf in leaves):
            out.append(i)
    return out


def _speculative_into(out: dict[str, Any], vllm_config: Any, groups_in: Any) -> None:
    section = speculative_from_vllm(vllm_config)
    drafters = _drafter_groups(groups_in)
    if section is None and not drafters:
        return
    if section is not None:
        out["speculative"] = section
    for i in drafters:
        out["groups"][i]["drafter"] = True


# -- configs ----------------------------------------------------------------------------------------------


def is_scheduler_offload_config(obj: Any) -> bool:
    """Whether ``obj`` looks like vLLM 0.33's ``SchedulerOffloadConfig`` (the offloading connector's
    scheduler-side config: ``kv_group_configs``, ``blocks_per_chunk``, ``tokens_per_hash``).

    >>> from types import SimpleNamespace as NS
    >>> is_scheduler_offload_config(NS(kv_group_configs=(), blocks_per_chunk=1, tokens_per_hash=16))
    True
    """
    return all(hasattr(obj, n) for n in ("kv_group_configs", "blocks_per_chunk", "tokens_per_hash"))


def _groups_in(source: Any, kv_cache_config: Any) -> tuple[Any, bool]:
    """The list of vLLM groups to map, and whether it came from a ``SchedulerOffloadConfig`` alone."""
    if kv_cache_config is not None:
        groups_in = _get(kv_cache_config, "kv_cache_groups")
        if groups_in is None:
            raise ConfigError.single(
                "not_a_kv_cache_config",
                f"{type(kv_cache_config).__name__} has no kv_cache_groups; pass vLLM's KVCacheConfig",
                "kv_cache_config.kv_cache_groups",
            )
        return groups_in, False
    if is_scheduler_offload_config(source):
        configs = list(source.kv_group_configs)
        ids = [_get(c, "group_idx") for c in configs]
        if ids != list(range(len(configs))):
            raise ConfigError.single(
                "groups_not_offloaded",
                f"the SchedulerOffloadConfig holds groups {ids}, not 0..{len(configs) - 1}: vLLM does not offload "
                "the others (not prefix-cacheable or not transferable), so their specs are unknown here; pass "
                "kv_cache_config= (the connector's KVCacheConfig) as well",
                "kv_group_configs",
                group_ids=ids,
            )
        groups = [NamedGroup(_get(c, "kv_cache_spec"), _get(c, "is_eagle_group") is True) for c in configs]
        return groups, True
    raise ConfigError.single(
        "not_a_kv_cache_config",
        f"{type(source).__name__} is neither a KVCacheConfig (kv_cache_groups) nor a SchedulerOffloadConfig "
        "(kv_group_configs, blocks_per_chunk, tokens_per_hash)",
        "kv_cache_groups",
    )


class NamedGroup:
    """A vLLM group rebuilt from a ``GroupOffloadConfig`` (its spec and its drafter flag)."""

    __slots__ = ("is_eagle_group", "kv_cache_spec")

    def __init__(self, kv_cache_spec: Any, is_eagle_group: bool) -> None:
        self.kv_cache_spec = kv_cache_spec
        self.is_eagle_group = is_eagle_group


@_reads_foreign_objects
def config_from_vllm(
    kv_cache_config: Any,
    vllm_config: Any = None,
    *,
    include_pages: bool = True,
    offload: Mapping[str, Any] | None = None,
    parallel: Mapping[str, Any] | None = None,
    cache: Mapping[str, Any] | None = None,
    connector_chunking: Mapping[str, Mapping[str, Any] | None] | None = None,
    spec_kinds: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """A kvgeom config dict from what a vLLM connector holds.

    ``kv_cache_config`` is vLLM's ``KVCacheConfig`` (worker-side, with ``UniformTypeKVCacheSpecs``
    containers, or scheduler-side, flattened) or the offloading connector's
    ``SchedulerOffloadConfig``; ``vllm_config`` is the ``VllmConfig``. Contract: reads only
    attributes; nothing the geometry depends on is assumed:

    * no ``parallel_config`` with TP, PP, DCP, PCP and the interleave (and no ``parallel=``): the
      :class:`kvgeom.ConfigError` ``parallel_layout_unknown``;
    * no ``cache_config`` prefix-caching fields (and no ``cache=``, kvgeom's cache section):
      ``cache_config_unknown``;
    * a connector other than ``OffloadingConnector`` not named in ``connector_chunking``:
      ``connector_chunking_unknown`` (:func:`offload_from_transfer`);
    * a drafter (``speculative_config``, ``is_eagle_group``, ``is_draft``) is emitted as the
      ``speculative`` section and per-group ``drafter`` flags; what the config schema refuses
      (a drafter group without a ``speculative_config``, a Mamba drafter) is a ``ConfigError``.

    A ``SchedulerOffloadConfig`` gives the groups (when they are 0..n-1; otherwise pass the
    ``KVCacheConfig`` to :func:`geometry_from_vllm` as well) and ``blocks_per_chunk``. Worker- and
    scheduler-side configs give the same spans, L, H, A and offload chunks. ``offload`` overrides
    the offload section; with ``include_pages=False`` no page field is copied.

    >>> from types import SimpleNamespace as NS
    >>> FullAttentionSpec = type("FullAttentionSpec", (NS,), {})
    >>> kv = NS(kv_cache_groups=[NS(kv_cache_spec=FullAttentionSpec(block_size=16, dcp_sharded=True))])
    >>> vc = NS(parallel_config=NS(tensor_parallel_size=2, pipeline_parallel_size=1, decode_context_parallel_size=2,
    ...                            prefill_context_parallel_size=1, cp_kv_cache_interleave_size=1),
    ...         cache_config=NS(enable_prefix_caching=True, prefix_match_unit=None, prefix_cache_retention_interval=0))
    >>> cfg = config_from_vllm(kv, vc)
    >>> cfg["groups"], cfg["parallel"]["dcp"]
    ([{'kind': 'full_attention', 'block_size': 16, 'dcp_sharded': True}], 2)
    """
    _warn_if_unchecked_vllm()
    return _config(
        kv_cache_config, vllm_config, None, include_pages, offload, parallel, cache, connector_chunking, spec_kinds
    )


def _config(
    source: Any,
    vllm_config: Any,
    kv_cache_config: Any,
    include_pages: bool,
    offload: Mapping[str, Any] | None,
    parallel: Mapping[str, Any] | None,
    cache: Mapping[str, Any] | None,
    connector_chunking: Mapping[str, Mapping[str, Any] | None] | None,
    spec_kinds: Mapping[str, str] | None,
) -> dict[str, Any]:
    kinds = dict(spec_kinds or {})
    if kv_cache_config is None and not is_scheduler_offload_config(source):
        kv_cache_config = source
    groups_in, _ = _groups_in(source, kv_cache_config)
    groups = []
    for i, group in enumerate(groups_in):
        spec = _get(group, "kv_cache_spec", group)
        groups.append(_group(spec, include_pages, kinds, f"groups[{i}]"))
    out: dict[str, Any] = {
        "groups": groups,
        "parallel": _parallel_from(vllm_config, parallel),
        "cache": _cache_from(vllm_config, cache),
    }
    transfer = _get(vllm_config, "kv_transfer_config")
    if offload is not None:
        off: dict[str, Any] | None = dict(offload)
    elif is_scheduler_offload_config(source):
        off = {"blocks_per_chunk": coerce_extra_int(source.blocks_per_chunk, "blocks_per_chunk")}
    else:
        off = offload_from_transfer(transfer, connector_chunking)
    if off is None and transfer is not None and out["cache"].get("prefix_caching") is False:
        raise ConfigError.single(
            "connector_hashes_unmodelled",
            "prefix caching is off but a kv connector is configured, so vLLM still chains request hashes at the "
            "groups' gcd (kv_cache_utils.py::resolve_kv_cache_block_sizes); kvgeom derives that H only with an "
            "offload section: give the connector's chunking in connector_chunking, or offload={...}",
            "vllm_config.kv_transfer_config",
        )
    if off is not None:
        out["offload"] = off
    _speculative_into(out, vllm_config, groups_in)
    return out


# -- cross-checks against the values vLLM resolved -----------------------------------------------------


def _disagree(what: str, vllm_value: Any, ours: Any, field: str) -> KVGeomError:
    return ConfigError.single(
        "vllm_disagrees",
        f"vLLM resolved {what} = {vllm_value!r} but kvgeom derives {ours!r} from the same objects; the geometry "
        "would differ from the engine's, so it is refused. Check that vllm_config, kv_cache_config and the "
        "offload config belong to one deployment, and report the case if they do",
        field,
        vllm=vllm_value,
        kvgeom=ours,
    )


def _check_resolved(geometry: Geometry, kv_cache_config: Any, vllm_config: Any) -> None:
    """vLLM 0.33 ``KVCacheConfig.hash_block_size`` / ``cache_hit_alignment_tokens`` (set by the engine
    core) must equal kvgeom's H and A; with a single group, vLLM derives L = H from
    ``cache_config.block_size`` (``kv_cache_utils.py::resolve_kv_cache_block_sizes``), which must then
    be the group's own per-rank block."""
    block = _int_or_none(_get(_get(vllm_config, "cache_config"), "block_size"))
    if len(geometry.groups) == 1 and block is not None and block != geometry.groups[0].block_size:
        raise _disagree("cache_config.block_size", block, geometry.groups[0].block_size, "cache_config.block_size")
    if kv_cache_config is None:
        return
    for ours, theirs in (
        (geometry.hash_block_size, "hash_block_size"),
        (geometry.hit_alignment_tokens, "cache_hit_alignment_tokens"),
    ):
        value = _int_or_none(_get(kv_cache_config, theirs))
        if value is not None and value != ours:
            raise _disagree(theirs, value, ours, f"kv_cache_config.{theirs}")


def _check_scheduler_offload(geometry: Geometry, sched: Any) -> None:
    """Every number of vLLM's ``SchedulerOffloadConfig`` must be kvgeom's (glossary: ``docs/glossary.md``)."""
    off = geometry.offload
    if off is None:
        raise _disagree("an offload config", "present", None, "kv_group_configs")
    top = (
        ("blocks_per_chunk", off.blocks_per_chunk),
        ("tokens_per_hash", off.tokens_per_hash),
        ("alignment_tokens", off.alignment_tokens),
        ("retention_interval", off.retention_interval),
        ("dcp_world_size", geometry.parallel.dcp),
        ("supports_partial_tail", off.supports_partial_tail),
    )
    for name, ours in top:
        if hasattr(sched, name) and getattr(sched, name) != ours:
            raise _disagree(name, getattr(sched, name), ours, name)
    theirs_ids = [_get(c, "group_idx") for c in sched.kv_group_configs]
    ours_ids = [og.index for og in off.groups]
    if theirs_ids != ours_ids:
        raise _disagree("the offloaded groups", theirs_ids, ours_ids, "kv_group_configs")
    for i, (c, og) in enumerate(zip(sched.kv_group_configs, off.groups, strict=True)):
        for name, ours in (
            ("tokens_per_block", og.tokens_per_block),
            ("tokens_per_chunk", og.tokens_per_chunk),
            ("hashes_per_chunk", og.hashes_per_chunk),
            ("sliding_window_size_in_chunks", og.window_chunks),
        ):
            if hasattr(c, name) and getattr(c, name) != ours:
                raise _disagree(f"group {og.index}'s {name}", getattr(c, name), ours, f"kv_group_configs[{i}].{name}")


def _check_offloading_config(geometry: Geometry, oc: Any) -> None:
    """vLLM 0.33's ``OffloadingConfig`` (``v1/kv_offload/config.py``; an ``OffloadingSpec``'s ``config``,
    what the connector's worker side holds) must agree with kvgeom on k, H, the offloaded groups, their
    spans and windows, and the parallel sizes."""
    off = geometry.offload
    if off is None:
        raise _disagree("an offloading config", "present", None, "offloading_config")
    par = geometry.parallel
    cache, parallel = _get(oc, "cache"), _get(oc, "parallel")
    for name, theirs, ours in (
        ("cache.blocks_per_chunk", _get(cache, "blocks_per_chunk"), off.blocks_per_chunk),
        ("cache.tokens_per_hash", _get(cache, "tokens_per_hash"), off.tokens_per_hash),
        ("parallel.tp_size", _get(parallel, "tp_size"), par.tp),
        ("parallel.pp_size", _get(parallel, "pp_size"), par.pp),
        ("parallel.dcp_size", _get(parallel, "dcp_size"), par.dcp),
        ("parallel.pcp_size", _get(parallel, "pcp_size"), par.pcp),
    ):
        if theirs is not None and theirs != ours:
            raise _disagree(name, theirs, ours, f"offloading_config.{name}")
    groups = list(_get(oc, "groups") or ())
    theirs_ids = [_get(c, "group_id") for c in groups]
    ours_ids = [og.index for og in off.groups]
    if theirs_ids != ours_ids:
        raise _disagree("the offloaded groups", theirs_ids, ours_ids, "offloading_config.groups")
    for i, (c, og) in enumerate(zip(groups, off.groups, strict=True)):
        for name, ours_value in (
            ("tokens_per_block", og.tokens_per_block),
            ("sliding_window_size_in_chunks", og.window_chunks),
        ):
            if hasattr(c, name) and getattr(c, name) != ours_value:
                raise _disagree(
                    f"group {og.index}'s {name}", getattr(c, name), ours_value, f"offloading_config.groups[{i}].{name}"
                )


@_reads_foreign_objects
def geometry_from_vllm(
    kv_cache_config: Any,
    vllm_config: Any = None,
    *,
    scheduler_offload_config: Any = None,
    offloading_config: Any = None,
    include_pages: bool = True,
    offload: Mapping[str, Any] | None = None,
    parallel: Mapping[str, Any] | None = None,
    cache: Mapping[str, Any] | None = None,
    connector_chunking: Mapping[str, Mapping[str, Any] | None] | None = None,
    spec_kinds: Mapping[str, str] | None = None,
) -> Geometry:
    """The resolved :class:`kvgeom.Geometry` of what a vLLM connector holds, checked against vLLM's own numbers.

    ``kv_cache_config`` may be a ``KVCacheConfig`` (worker- or scheduler-side) or a
    ``SchedulerOffloadConfig``; give the latter as ``scheduler_offload_config=`` when the connector
    holds both. The other keyword arguments are :func:`config_from_vllm`'s. Contract: the result's
    numbers equal vLLM's wherever vLLM has resolved them on the objects given -- ``hash_block_size``
    and ``cache_hit_alignment_tokens`` of the ``KVCacheConfig``; ``cache_config.block_size`` with a
    single group (vLLM's L = H then comes from it); ``blocks_per_chunk``,
    ``tokens_per_hash``, ``alignment_tokens``, ``retention_interval``, ``dcp_world_size``, partial
    tails, the offloaded group ids and each group's ``tokens_per_block``, ``tokens_per_chunk``,
    ``hashes_per_chunk`` and ``sliding_window_size_in_chunks`` of a ``SchedulerOffloadConfig``; k,
    H, TP, PP, DCP, PCP, the offloaded groups' ids, spans and windows of an ``OffloadingConfig``
    (``offloading_config=``, the ``OffloadingSpec.config`` the worker side holds) -- or it is the
    :class:`kvgeom.ConfigError` ``vllm_disagrees``. A geometry built from a
    ``SchedulerOffloadConfig`` alone carries the warning ``groups_from_offload_config`` (a group
    vLLM does not offload, after the last offloaded one, would change L unseen).

    >>> from types import SimpleNamespace as NS
    >>> MambaSpec = type("MambaSpec", (NS,), {})
    >>> kv = NS(kv_cache_groups=[NS(kv_cache_spec=MambaSpec(block_size=16, mamba_cache_mode="align"))])
    >>> geometry_from_vllm(kv, parallel={"tp": 1, "dcp": 1}, cache={}).groups[0].span
    16
    """
    from dataclasses import replace

    from kvgeom.geometry import GeometryWarning

    _warn_if_unchecked_vllm()
    source = kv_cache_config
    sched = scheduler_offload_config
    kv = None
    if is_scheduler_offload_config(source):
        if sched is not None:
            raise ConfigError.single(
                "two_offload_configs", "give one SchedulerOffloadConfig, not two", "scheduler_offload_config"
            )
        sched, source = source, None
    else:
        kv = source
    primary = sched if kv is None else kv
    cfg = _config(primary, vllm_config, kv, include_pages, offload, parallel, cache, connector_chunking, spec_kinds)
    if sched is not None and kv is not None and "offload" not in cfg:
        cfg["offload"] = {"blocks_per_chunk": coerce_extra_int(sched.blocks_per_chunk, "blocks_per_chunk")}
    geometry = resolve(cfg)
    _check_resolved(geometry, kv, vllm_config)
    if sched is not None:
        _check_scheduler_offload(geometry, sched)
    if offloading_config is not None:
        _check_offloading_config(geometry, offloading_config)
    if sched is not None and kv is None:
        warning = GeometryWarning(
            "groups_from_offload_config",
            "built from the SchedulerOffloadConfig's groups only: a group vLLM does not offload (prefix_cacheable "
            "False or enable_kv_transfer False) after the last offloaded one would change L without kvgeom "
            "seeing it; pass kv_cache_config= as well to be sure",
        )
        geometry = replace(geometry, warnings=(*geometry.warnings, warning))
    return geometry


# -- offload keys ---------------------------------------------------------------------------------------


class OffloadKeys:
    """vLLM offload key bytes <-> kvgeom's ``(group, end_token)``, for one request.

    vLLM 0.33 keys the chunk of group g that ends at token e by the request's block hash number
    ``e // H - 1`` followed by g as 4 big-endian bytes (``offloading/scheduler.py``,
    ``update_offload_keys`` and ``_make_boundary_key``; :func:`kvgeom.residency.make_offload_key`).
    Given the request's ``block_hashes`` (``request.block_hashes``, hash i covering tokens
    ``[0, (i+1)*H)``) and the hash unit H of the geometry, :meth:`to_kvgeom` and :meth:`to_vllm`
    are inverse bijections between the keys of this request and the pairs ``(g, e)`` with g a
    group of the geometry and e a positive multiple of H within the chain.

    Contract: a key whose hash is not in the chain, whose group the geometry does not have, or a
    pair off the H grid or past the chain is the :class:`kvgeom.QueryError` (``unknown_block_hash``,
    ``no_such_group``, ``end_token_off_grid``, ``end_token_past_chain``), never a wrong answer. The
    hash -> position index is built on the first :meth:`to_kvgeom` (O(len(chain)) once, O(1) per key).

    >>> import kvgeom
    >>> geom = kvgeom.resolve(kvgeom.DEFAULT_CONFIG)          # H = 16, groups 0 and 1
    >>> chain = [b"h%015d" % i for i in range(4)]              # 16-byte hashes, as vLLM's xxhash gives them
    >>> keys = OffloadKeys(geom, chain)
    >>> keys.to_vllm(1, 32)[-6:]                               # chain[1] and group 1 as 4 big-endian bytes
    b'01\\x00\\x00\\x00\\x01'
    >>> keys.to_kvgeom(chain[1] + bytes([0, 0, 0, 1]))
    (1, 32)
    """

    __slots__ = ("_chain", "_index", "_num_groups", "hash_block_size")

    def __init__(self, geometry: Geometry, block_hashes: Any) -> None:
        if not (hasattr(block_hashes, "__len__") and hasattr(block_hashes, "__getitem__")) or isinstance(
            block_hashes, bytes | bytearray | str
        ):
            raise QueryError.single(
                "bad_block_hashes",
                f"block_hashes must be the request's list of block hashes (request.block_hashes), got "
                f"{type(block_hashes).__name__}",
                "block_hashes",
            )
        self.hash_block_size = geometry.hash_block_size
        self._num_groups = len(geometry.groups)
        self._chain = block_hashes
        self._index: dict[bytes, int] | None = None

    def _group(self, group: Any) -> int:
        if type(group) is not int or not 0 <= group < self._num_groups:
            raise QueryError.single(
                "no_such_group",
                f"group {group!r} is not a group of this geometry (0..{self._num_groups - 1}); was the key made for "
                "another deployment?",
                "group",
                group=group,
            )
        return group

    def to_vllm(self, group: int, end_token: int) -> bytes:
        """vLLM's key bytes for the entry of ``group`` whose prefix ends at ``end_token``."""
        self._group(group)
        H = self.hash_block_size
        if type(end_token) is not int or end_token <= 0 or end_token % H:
            raise QueryError.single(
                "end_token_off_grid",
                f"end_token {end_token!r} is not a positive multiple of the hash unit H={H}: no key ends there",
                "end_token",
                end_token=end_token,
            )
        i = end_token // H - 1
        if i >= len(self._chain):
            raise QueryError.single(
                "end_token_past_chain",
                f"end_token {end_token} needs block hash {i}, but the request has {len(self._chain)} "
                f"(covering {len(self._chain) * H} tokens)",
                "end_token",
                end_token=end_token,
            )
        return make_offload_key(self._chain[i], group)

    def to_kvgeom(self, key: bytes) -> tuple[int, int]:
        """``(group, end_token)`` of vLLM's key bytes for this request."""
        block_hash, group = split_offload_key(key)
        self._group(group)
        if self._index is None:
            index: dict[bytes, int] = {}
            for j, h in enumerate(self._chain):
                if not isinstance(h, bytes | bytearray | memoryview):
                    raise QueryError.single(
                        "bad_block_hash",
                        f"block_hashes[{j}] is a {type(h).__name__}; vLLM's block hashes are bytes",
                        f"block_hashes[{j}]",
                    )
                index.setdefault(bytes(h), j)
            self._index = index
        i = self._index.get(block_hash)
        if i is None:
            raise QueryError.single(
                "unknown_block_hash",
                f"the key's block hash {block_hash.hex()[:16]}... is not in this request's chain of "
                f"{len(self._chain)} hashes: it belongs to another request or prefix",
                "key",
            )
        return group, (i + 1) * self.hash_block_size
