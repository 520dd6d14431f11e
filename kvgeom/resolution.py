"""From layer shapes to block sizes: what vLLM 0.33 would run a hybrid model with.

Users rarely know their resolved block sizes: for a hybrid (attention + Mamba)
model vLLM raises the attention block so one attention page holds at least one
Mamba state, makes the Mamba block equal to the per-rank attention block in
align mode, pads the Mamba page, and unifies the page bytes of all layers
(vLLM 0.33 `platforms/interface.py::_align_hybrid_block_size`,
`v1/core/kv_cache_planning.py::unify_kv_cache_spec_page_size`, `v1/engine/core.py`).
A connector that used the CLI ``--block-size`` broke (LMCache #4809: CLI 256, resolved 2304).

:func:`resolve_block_sizes` takes a *layered config* -- per-layer shapes in a
top-level ``model`` section instead of ``groups`` -- and returns a
:class:`BlockSizeResolution` whose ``config`` is an ordinary kvgeom config dict
(so :func:`kvgeom.resolve` and everything else applies) plus the facts of the
resolution (raised block, padding percentages, grouping)::

    {"model": {"block_size": 256, "layers": [...]},
     "parallel": {...}, "cache": {...}, "offload": {...}}

The steps, in vLLM's order (``docs/resolution.md`` has the arithmetic):

1. Mamba mode: prefix caching on => ``align`` (``none`` is promoted); off =>
   ``none`` with the Mamba block set to ``max_model_len`` (`MambaModelConfig`).
2. Attention block raised (`_align_hybrid_block_size`): ``K = max(kernel_block_size, block_size)``,
   ``K = max(K, 128)`` for MLA hybrids, ``K = lcm(K, prefill checkpoint
   alignments)`` in align mode when every Mamba layer declares one; then
   ``K * cdiv(m, page(K))`` rounded up to the lcm of the attention kernel
   blocks, where ``m`` is the largest Mamba state and ``page(K)`` the page of
   the main attention layer at ``K`` tokens. Done **once for all pipeline
   stages** (the fix of #51764 for #51752, where a stage without attention kept
   the CLI block).
3. Align mode: Mamba block = per-rank attention block; the Mamba page is padded
   to the attention page (`_align_hybrid_block_size`).
4. Page unification (`unify_kv_cache_spec_page_size`): every layer ends with the largest page: attention
   layers whose page divides it scale their block, Mamba and non-MLA attention
   layers are padded, MLA that does not divide is an error (vLLM raises
   ``NotImplementedError``); sliding-window layers take the largest multiple of
   their kernel block that fits the page.
5. Grouping: one group when every layer has the same manager family and block
   (a ``uniform`` container when their specs differ); otherwise one bucket per
   distinct spec, split into groups of equal layer count.
5b. Packed grouping, instead of steps 4-5, when ``model.kv_cache_layout`` is
   block-outermost (``BLHNC``, ``BLNHC``, ``BHLNC``) and the layers' pages
   differ (`_get_packed_kv_cache_groups`): greedy uniform-type buckets, balanced
   buckets split by an approximate gcd of their pattern repeats, state buckets
   split to fit the block, and no page unified. Unset (the default) or
   layer-outermost, the answer is the one kvgeom gave before the field existed.
6. Engine-core minimum (`v1/engine/core.py`): ``cache_config.block_size`` becomes the smallest
   prefix-cacheable group block; reported as ``engine_block_size``.

The per-rank heads (``total_num_kv_heads // tp``) and Mamba shapes make the
result depend on TP (#41037): prefill and decode deployments with different TP
can end up with different block sizes (see :func:`kvgeom.compat`).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from functools import reduce
from pathlib import Path
from typing import Annotated, Any, Literal, assert_never

from pydantic import Field, model_validator

from kvgeom._math import cdiv, rup
from kvgeom._pydantic import FrozenModel, NonNegativeInt, PositiveInt, StrictBool
from kvgeom._resolve import resolve
from kvgeom.config import CacheConfig, OffloadConfig
from kvgeom.errors import ConfigError, GeometryError, Problem
from kvgeom.geometry import Geometry
from kvgeom.pages import attention_page_bytes, mamba_state_bytes
from kvgeom.parallel import ParallelConfig
from kvgeom.prefill import engine_block_size_of
from kvgeom.specs import KINDS, DType, dcp_sharded_by_default

__all__ = [
    "BLOCK_OUTERMOST_LAYOUTS",
    "MLA_MIN_HYBRID_BLOCK",
    "BlockSizeResolution",
    "KVCacheLayoutName",
    "LayerKind",
    "LayerSpec",
    "LayeredConfig",
    "ModelLayers",
    "PagePadding",
    "resolve_block_sizes",
]


#: vLLM raises the attention block of an MLA hybrid to at least this many tokens (`_align_hybrid_block_size`).
MLA_MIN_HYBRID_BLOCK = 128

LayerKind = Literal["full_attention", "mla", "sliding_window", "sliding_window_mla", "chunked_local", "mamba"]

#: vLLM 0.33's KV cache layout names (`v1/kv_cache_layout.py::KVCacheLayout`, with the legacy aliases ``NHD`` =
#: ``LBNHC`` and ``HND`` = ``LBHNC`` of `config/cache.py`).
KVCacheLayoutName = Literal["LBHNC", "LBNHC", "LHBNC", "BLHNC", "BLNHC", "BHLNC", "NHD", "HND"]
#: The layouts whose outermost physical axis is the block (`KVCacheLayout.is_block_outermost`).
BLOCK_OUTERMOST_LAYOUTS = frozenset({"BLHNC", "BLNHC", "BHLNC"})

_ATTENTION_ONLY = (
    "num_kv_heads",
    "total_num_kv_heads",
    "head_size",
    "head_size_v",
    "dtype",
    "tokens_per_state",
    "kernel_block_size",
)
_KIND_FIELDS: dict[str, tuple[str, ...]] = {
    "full_attention": _ATTENTION_ONLY,
    "mla": (*_ATTENTION_ONLY, "alignment", "cache_role"),
    "sliding_window": (*_ATTENTION_ONLY, "sliding_window", "extra_retained_tokens"),
    "sliding_window_mla": (*_ATTENTION_ONLY, "alignment", "sliding_window", "extra_retained_tokens"),
    "chunked_local": (*_ATTENTION_ONLY, "attention_chunk_size"),
    "mamba": ("shapes", "total_shapes", "tp_axes", "dtypes", "prefill_checkpoint_alignment", "num_speculative_blocks"),
}
_COMMON = ("kind", "name", "count", "pp_stage", "dcp_sharded")


class LayerSpec(FrozenModel):
    """One layer (or ``count`` identical layers) of a model, as shapes.

    Attention kinds give ``head_size``, ``dtype`` and either ``num_kv_heads``
    (per TP rank) or ``total_num_kv_heads`` (divided by TP: ``max(1, total //
    tp)``, heads replicated when TP exceeds them); latent kinds (``mla``,
    ``sliding_window_mla``) hold one latent "head" and need neither. ``mamba``
    layers give ``dtypes`` and either ``shapes`` (per rank) or ``total_shapes``
    with ``tp_axes`` (the axis of each shape that TP divides, ``None`` for a
    replicated tensor). Fields of another kind are rejected.

    >>> LayerSpec(kind="mla", head_size=576, dtype="bfloat16", count=61).count
    61
    """

    FIELD_PREFIX = "layer"

    kind: LayerKind
    name: str | None = Field(default=None, description="A label used in reports.")
    count: Annotated[int, Field(strict=True, gt=0, le=65536)] = Field(
        default=1, description="How many identical layers this entry stands for (at most 65536)."
    )
    pp_stage: NonNegativeInt = Field(default=0, description="Pipeline stage owning the layers.")
    dcp_sharded: StrictBool | None = Field(default=None, description="Passed through to the group spec.")
    num_kv_heads: PositiveInt | None = Field(default=None, description="KV heads per TP rank.")
    total_num_kv_heads: PositiveInt | None = Field(default=None, description="KV heads of the model (TP=1).")
    head_size: PositiveInt | None = None
    head_size_v: PositiveInt | None = None
    dtype: DType | None = None
    tokens_per_state: PositiveInt | None = None
    kernel_block_size: PositiveInt | None = Field(
        default=None, description="Smallest kernel block of this layer's backend (default: the model's)."
    )
    alignment: PositiveInt | None = None
    cache_role: Literal["main", "indexer"] | None = None
    sliding_window: PositiveInt | None = None
    extra_retained_tokens: NonNegativeInt | None = None
    attention_chunk_size: PositiveInt | None = None
    shapes: tuple[tuple[PositiveInt, ...], ...] | None = Field(default=None, description="Per-rank state shapes.")
    total_shapes: tuple[tuple[PositiveInt, ...], ...] | None = Field(
        default=None, description="State shapes at TP=1; TP divides axis tp_axes[i] of shape i."
    )
    tp_axes: tuple[NonNegativeInt | None, ...] | None = None
    dtypes: tuple[DType, ...] | None = None
    prefill_checkpoint_alignment: PositiveInt | None = None
    num_speculative_blocks: NonNegativeInt | None = None

    @model_validator(mode="after")
    def _fields_fit_kind(self) -> LayerSpec:
        allowed = set(_KIND_FIELDS[self.kind]) | set(_COMMON)
        stray = [name for name in type(self).model_fields if name not in allowed and getattr(self, name) is not None]
        if stray:
            raise ValueError(f"{stray} do not apply to a {self.kind} layer; remove them")
        missing: list[str] = []
        if self.kind == "mamba":
            if (self.shapes is None) == (self.total_shapes is None):
                raise ValueError("a mamba layer gives exactly one of shapes (per rank) or total_shapes (with tp_axes)")
            if self.total_shapes is not None and (self.tp_axes is None or len(self.tp_axes) != len(self.total_shapes)):
                raise ValueError("total_shapes needs tp_axes with one entry per shape (null for a replicated tensor)")
            if self.shapes is not None and self.tp_axes is not None:
                raise ValueError("tp_axes goes with total_shapes; per-rank shapes are not divided again")
            n = len(self.shapes if self.shapes is not None else self.total_shapes or ())
            if self.dtypes is None or len(self.dtypes) != n:
                raise ValueError(f"a mamba layer needs dtypes with one entry per state tensor ({n})")
            for i, axis in enumerate(self.tp_axes or ()):
                shape = (self.total_shapes or ())[i]
                if axis is not None and axis >= len(shape):
                    raise ValueError(f"tp_axes[{i}]={axis} is past the last axis of total_shapes[{i}]={shape}")
            return self
        latent = self.kind in {"mla", "sliding_window_mla"}
        if self.dtype is None:
            missing.append("dtype")
        if self.head_size is None and self.dtype != "fp8_ds_mla":
            missing.append("head_size")
        if not latent and (self.num_kv_heads is None) == (self.total_num_kv_heads is None):
            raise ValueError("give exactly one of num_kv_heads (per TP rank) or total_num_kv_heads")
        if self.kind in {"sliding_window", "sliding_window_mla"} and self.sliding_window is None:
            missing.append("sliding_window")
        if self.kind == "chunked_local" and self.attention_chunk_size is None:
            missing.append("attention_chunk_size")
        if missing:
            raise ValueError(f"a {self.kind} layer needs {missing}")
        return self


class ModelLayers(FrozenModel):
    """The ``model`` section of a layered config: the layers and the block-size inputs.

    >>> ModelLayers(layers=[{"kind": "full_attention", "num_kv_heads": 8, "head_size": 128,
    ...                      "dtype": "bfloat16"}]).block_size
    16
    """

    FIELD_PREFIX = "model"
    #: As every model before the tags came from the caller: a kind name after a list index is dropped from
    #: an error's field (so ``layers[0].sliding_window`` reads ``layers[0]``; kept byte for byte).
    UNION_TAGS = KINDS

    layers: tuple[LayerSpec, ...] = Field(min_length=1)
    block_size: PositiveInt = Field(default=16, description="--block-size: the user/preferred block size.")
    kernel_block_size: PositiveInt = Field(
        default=16, description="Smallest kernel block of the main attention backend (kmin)."
    )
    mamba_cache_mode: Literal["align", "none"] | None = Field(
        default=None, description="Requested Mamba mode; vLLM promotes none to align with prefix caching on."
    )
    kv_cache_layout: KVCacheLayoutName | None = Field(
        default=None,
        description="vLLM's resolved KV cache layout (VLLM_KV_CACHE_LAYOUT's values); default: a layer-outermost "
        "layout. A block-outermost one (BLHNC, BLNHC, BHLNC) packs layers of different pages (step 5b).",
    )


class LayeredConfig(FrozenModel):
    """A kvgeom config written as layer shapes: ``model`` replaces ``groups``."""

    UNION_TAGS = KINDS  # as ModelLayers

    schema_version: Literal[1] = 1
    model: ModelLayers
    parallel: ParallelConfig = Field(default_factory=ParallelConfig)
    cache: CacheConfig = Field(default_factory=CacheConfig)
    offload: OffloadConfig | None = None


@dataclass(frozen=True, slots=True)
class PagePadding:
    """A layer whose page the engine padded (vLLM logs "Padding mamba page size by X%").

    ``percent = 100 * (page_bytes - real_bytes) / real_bytes``.
    """

    layer: str
    """The layer entry (its ``name`` or ``layers[i]``)."""
    kind: str
    real_bytes: int
    page_bytes: int
    count: int
    """How many layers of the entry are padded so."""

    @property
    def percent(self) -> float:
        return 100.0 * (self.page_bytes - self.real_bytes) / self.real_bytes

    def to_dict(self) -> dict[str, Any]:
        return {
            "layer": self.layer,
            "kind": self.kind,
            "real_bytes": self.real_bytes,
            "page_bytes": self.page_bytes,
            "padding_percent": round(self.percent, 4),
            "count": self.count,
        }


@dataclass(frozen=True, slots=True)
class BlockSizeResolution:
    """What vLLM 0.33 would run a layered config with.

    ``config`` is a plain kvgeom config dict (``groups``, ``parallel``,
    ``cache``, ``offload``) that :func:`kvgeom.resolve` accepts.
    """

    config: dict[str, Any]
    cli_block_size: int
    attention_block_size: int | None
    """Per-rank block of the main attention layer after `_align_hybrid_block_size` (None without attention)."""
    mamba_block_size: int | None
    mamba_cache_mode: Literal["align", "none"] | None
    engine_block_size: int
    """``cache_config.block_size`` after the engine core's fix-up (`v1/engine/core.py`)."""
    page_bytes: int | None
    """The one page size every layer has after unification (None when the layers mix page sizes)."""
    padding: tuple[PagePadding, ...]
    group_layers: tuple[tuple[str, ...], ...]
    """Layer labels of each group, in group order."""
    group_stages: tuple[tuple[int, ...], ...]
    """Pipeline stages holding layers of each group."""
    notes: tuple[str, ...]
    layer_labels: tuple[str, ...] = ()
    """Every layer's label in model order (``count`` expanded); not part of :meth:`to_dict`."""
    kv_cache_layout: str | None = None
    """``model.kv_cache_layout`` as given (``None``: a layer-outermost layout); not part of :meth:`to_dict`."""
    packed: bool = False
    """Whether vLLM 0.33's packed grouping made the groups (step 5b: a block-outermost layout and layers of
    different pages); then the pages are not unified. Not part of :meth:`to_dict` (a note says it).

    Invariant: ``packed`` implies a block-outermost ``kv_cache_layout``, ``page_bytes is None``, every layer in
    exactly one group, and every layer's block (:meth:`layer_block_sizes`) is ``attention_block_size`` or
    ``mamba_block_size``; not ``packed``, the answer is the one the same config gets without a layout."""

    def resolve(self) -> Geometry:
        """``kvgeom.resolve(self.config)``: the full geometry of the resolved config."""
        return resolve(self.config)

    def layer_block_sizes(self) -> tuple[tuple[str, int], ...]:
        """``(label, block_size)`` of every layer, in model order: the per-rank block vLLM 0.33 runs it with.

        vLLM 0.33 takes one ``--block-size`` for the whole model (``cache_config.block_size``); a layer's
        own block is an *output*: the hybrid alignment raises the attention block, the Mamba block follows
        it, and page unification may scale a layer's block (step 4), so layers of one model can run with
        different blocks. Each layer's block is the ``block_size`` of the group it sits in (step 5).

        Invariant: one pair per layer of the model, in model order; a layer's block is its group's
        ``block_size`` in ``config["groups"]``; layers of one group share one block.

        >>> r = resolve_block_sizes({"model": {"block_size": 16, "layers": [
        ...     {"kind": "full_attention", "num_kv_heads": 2, "head_size": 128, "dtype": "bfloat16"},
        ...     {"kind": "mamba", "shapes": [[16, 64, 64]], "dtypes": ["float32"], "count": 2}]}})
        >>> r.layer_block_sizes()
        (('layers[0]', 256), ('layers[1]#0', 256), ('layers[1]#1', 256))
        """
        block_of = {
            label: int(group["block_size"])
            for group, labels in zip(self.config["groups"], self.group_layers, strict=True)
            for label in labels
        }
        return tuple((label, block_of[label]) for label in self.layer_labels)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable report (the key set is a stable contract).

        >>> r = resolve_block_sizes({"model": {"layers": [{"kind": "mla", "head_size": 576, "dtype": "fp8"}]}})
        >>> sorted(r.to_dict())[:4], r.to_dict()["config"]["groups"][0]["block_size"]
        (['attention_block_size', 'cli_block_size', 'config', 'engine_block_size'], 16)
        """
        return {
            "config": self.config,
            "cli_block_size": self.cli_block_size,
            "attention_block_size": self.attention_block_size,
            "mamba_block_size": self.mamba_block_size,
            "mamba_cache_mode": self.mamba_cache_mode,
            "engine_block_size": self.engine_block_size,
            "page_bytes": self.page_bytes,
            "padding": [p.to_dict() for p in self.padding],
            "groups": [
                {"layers": list(layers), "pp_stages": list(stages)}
                for layers, stages in zip(self.group_layers, self.group_stages, strict=True)
            ],
            "notes": list(self.notes),
        }


@dataclass
class _Layer:
    """One expanded layer during resolution (mutable scratch)."""

    index: int
    label: str
    src: LayerSpec
    heads: int | None = None
    shapes: tuple[tuple[int, ...], ...] | None = None
    block: int = 0
    padded: int | None = None

    @property
    def latent(self) -> bool:
        return self.src.kind in {"mla", "sliding_window_mla"}

    @property
    def is_mamba(self) -> bool:
        return self.src.kind == "mamba"

    def raw_page(self, block: int | None = None) -> int:
        """Page bytes before padding (and before MLA alignment) at ``block`` tokens."""
        s = self.src
        if s.kind == "mamba":
            assert self.shapes is not None and s.dtypes is not None  # validated
            return mamba_state_bytes(self.shapes, s.dtypes)
        assert s.dtype is not None and self.heads is not None  # validated
        return attention_page_bytes(
            block_size=self.block if block is None else block,
            num_kv_heads=self.heads,
            head_size=s.head_size or 0,
            head_size_v=0 if self.latent else (s.head_size_v or s.head_size or 0),
            dtype=s.dtype,
            tokens_per_state=s.tokens_per_state,
        )

    def page(self, block: int | None = None) -> int:
        """Page bytes as allocated: padded value, else the (aligned) raw page."""
        if self.padded is not None and block is None:
            return self.padded
        raw = self.raw_page(block)
        return rup(raw, self.src.alignment) if self.src.alignment and not self.is_mamba else raw


def _load(source: LayeredConfig | Mapping[str, Any] | str | os.PathLike[str]) -> LayeredConfig:
    if isinstance(source, LayeredConfig):
        return source
    data: Any = source
    if isinstance(source, str | os.PathLike):
        from kvgeom.config import read_file

        data = read_file(Path(source))
    if not isinstance(data, Mapping):
        raise ConfigError.single(
            "not_a_table", f"a layered config is a table/object with a 'model' key, got {type(data).__name__}"
        )
    if "groups" in data:
        raise ConfigError.single(
            "groups_and_model",
            "a layered config describes the model by its layers ('model'), not by 'groups'; "
            "pass a config with 'groups' to kvgeom.resolve instead",
            "groups",
        )
    return LayeredConfig.model_validate(dict(data))


def _expand(cfg: LayeredConfig) -> list[_Layer]:
    """One :class:`_Layer` per model layer (``count`` expanded), with per-rank heads and Mamba shapes.

    TP divides ``total_num_kv_heads`` (``max(1, total // tp)``, replicated when TP exceeds them) and the
    ``tp_axes`` of ``total_shapes``; every input problem (stage out of range, heads or a state axis not
    divisible by TP) is reported at once in one :class:`kvgeom.ConfigError`.
    """
    tp = cfg.parallel.tp
    problems: list[Problem] = []
    out: list[_Layer] = []
    for i, src in enumerate(cfg.model.layers):
        where = f"model.layers[{i}]"
        if src.pp_stage >= cfg.parallel.pp:
            problems.append(
                Problem(
                    "pp_stage_out_of_range",
                    f"pp_stage={src.pp_stage} but parallel.pp={cfg.parallel.pp}; stages are 0..{cfg.parallel.pp - 1}",
                    f"{where}.pp_stage",
                    {"pp_stage": src.pp_stage, "pp": cfg.parallel.pp},
                )
            )
        heads = src.num_kv_heads
        if src.total_num_kv_heads is not None:
            total = src.total_num_kv_heads
            if total >= tp and total % tp:
                problems.append(
                    Problem(
                        "heads_not_divisible_by_tp",
                        f"total_num_kv_heads={total} is not divisible by tp={tp}; TP splits KV heads evenly "
                        "(or replicates them when tp exceeds the heads): choose tp dividing the heads",
                        f"{where}.total_num_kv_heads",
                        {"total_num_kv_heads": total, "tp": tp},
                    )
                )
            heads = max(1, total // tp)
        elif src.kind in {"mla", "sliding_window_mla"}:
            heads = 1
        shapes = src.shapes
        if src.total_shapes is not None:
            new = []
            for j, (shape, axis) in enumerate(zip(src.total_shapes, src.tp_axes or (), strict=True)):
                if axis is None:
                    new.append(shape)
                    continue
                if shape[axis] % tp:
                    problems.append(
                        Problem(
                            "state_not_divisible_by_tp",
                            f"total_shapes[{j}]={shape} axis {axis} ({shape[axis]}) is not divisible by tp={tp}; "
                            "choose tp dividing it or mark the tensor replicated (tp_axes null)",
                            f"{where}.total_shapes[{j}]",
                            {"dim": shape[axis], "tp": tp},
                        )
                    )
                new.append(tuple(d // tp if a == axis else d for a, d in enumerate(shape)))
            shapes = tuple(new)
        for j in range(src.count):
            base = src.name or f"layers[{i}]"
            label = base if src.count == 1 else f"{base}#{j}"
            out.append(_Layer(index=i, label=label, src=src, heads=heads, shapes=shapes))
    if problems:
        raise ConfigError(problems)
    return out


def _kernel(layer: _Layer, model: ModelLayers) -> int:
    return layer.src.kernel_block_size or model.kernel_block_size


def _main_attention(layers: list[_Layer]) -> _Layer | None:
    """The layer whose bytes per token set ``a``: the first full-attention/MLA layer, else any attention."""
    for layer in layers:
        if layer.src.kind in {"full_attention", "mla"}:
            return layer
    for layer in layers:
        if not layer.is_mamba:
            return layer
    return None


def _leaf(layer: _Layer, mode: str | None) -> dict[str, Any]:
    """The kvgeom spec dict of one resolved layer."""
    s = layer.src
    d: dict[str, Any] = {"kind": s.kind, "block_size": layer.block}
    if s.dcp_sharded is not None:
        d["dcp_sharded"] = s.dcp_sharded
    match s.kind:
        case "mamba":
            d["mamba_cache_mode"] = mode
            d["shapes"] = [list(x) for x in layer.shapes or ()]
            d["dtypes"] = list(s.dtypes or ())
            if s.num_speculative_blocks:
                d["num_speculative_blocks"] = s.num_speculative_blocks
        case "full_attention" | "mla" | "sliding_window" | "sliding_window_mla" | "chunked_local":
            if not layer.latent:
                d["num_kv_heads"] = layer.heads
            for name in ("head_size", "dtype", "tokens_per_state"):
                if getattr(s, name) is not None:
                    d[name] = getattr(s, name)
            if s.head_size_v is not None and not layer.latent:
                d["head_size_v"] = s.head_size_v
            for name in ("alignment", "cache_role", "sliding_window", "extra_retained_tokens", "attention_chunk_size"):
                if getattr(s, name) is not None:
                    d[name] = getattr(s, name)
        case _:
            assert_never(s.kind)
    if layer.padded is not None:
        d["page_size_padded"] = layer.padded
    return d


def _family(kind: str) -> str:
    return {"full_attention": "full", "mla": "full", "mamba": "mamba"}.get(
        kind, "sliding" if kind.startswith("sliding") else "chunked"
    )


def resolve_block_sizes(
    source: LayeredConfig | Mapping[str, Any] | str | os.PathLike[str],
) -> BlockSizeResolution:
    """Resolve a layered config to the block sizes vLLM 0.33 would run with (``docs/resolution.md``).

    Contract: the returned ``config`` is a kvgeom config dict that
    :func:`kvgeom.resolve` accepts whenever the resolved layout is legal (the
    usual geometry rules still apply to it, e.g. the interleave). Postconditions:
    every layer's page bytes equal ``page_bytes`` (``None`` when one uniform group
    or packed groups keep the pages mixed; packed groups, step 5b, keep every
    layer's block of steps 2-3); in align mode the Mamba block
    equals the main attention layer's per-rank block; the attention page at the
    resolved block is at least the largest Mamba state; all pipeline stages get
    the same block sizes. Bad input raises :class:`kvgeom.ConfigError`; an MLA
    layer whose page does not divide the shared page raises
    :class:`kvgeom.GeometryError` ``mla_page_not_divisible``.

    >>> r = resolve_block_sizes({
    ...     "model": {"block_size": 16, "layers": [
    ...         {"kind": "full_attention", "num_kv_heads": 2, "head_size": 128, "dtype": "bfloat16", "count": 8},
    ...         {"kind": "mamba", "shapes": [[16, 64, 64], [3, 256]], "dtypes": ["float32", "bfloat16"],
    ...          "count": 24}]}})
    >>> r.attention_block_size, r.mamba_block_size, round(r.padding[0].percent, 2), r.padding[0].count
    (272, 272, 5.63, 24)
    >>> [g["kind"] for g in r.config["groups"]]
    ['full_attention', 'mamba', 'mamba', 'mamba']
    """
    cfg = _load(source)
    layers = _expand(cfg)
    mamba = [x for x in layers if x.is_mamba]
    attention = [x for x in layers if not x.is_mamba]
    main = _main_attention(layers)
    notes: list[str] = []  # each step appends its notes, so they keep vLLM's order
    mode = _mamba_mode(cfg, mamba, notes)  # step 1
    attention_block = _attention_block(cfg.model, main, attention, mamba, mode, notes)  # step 2
    mamba_block = _mamba_block(cfg, main, attention_block, mamba, mode)  # step 3
    one_group = _keeps_one_group(layers)
    packed = _packs(cfg.model, layers, one_group)
    if packed:  # a block-outermost layout with layers of different pages: no unification, packed groups
        padding = _padding_rows(cfg.model, layers, notes)
        groups, members = _pack_groups(cfg.model, layers, mode, notes)  # step 5b
    else:
        _unify_pages(cfg.model, layers, one_group)  # step 4
        padding = _padding_rows(cfg.model, layers, notes)
        groups, members = _group_layers(layers, mode, one_group, notes)  # step 5
    engine_block = _engine_block(groups, cfg.parallel, notes)  # step 6
    return _result(
        cfg,
        layers,
        groups,
        members,
        attention_block=attention_block,
        mamba_block=mamba_block,
        mode=mode,
        engine_block=engine_block,
        padding=padding,
        notes=notes,
        packed=packed,
    )


# The steps of resolve_block_sizes, in the order it calls them (the module docstring numbers them).


def _mamba_mode(cfg: LayeredConfig, mamba: list[_Layer], notes: list[str]) -> Literal["align", "none"] | None:
    """Step 1: the Mamba mode (vLLM 0.33 `model_executor/models/config.py::MambaModelConfig`).

    Prefix caching on gives ``align`` (a requested ``none`` is promoted), off gives ``none``, where the Mamba
    block becomes ``max_model_len`` (so it must be given: ``max_model_len_required``); a requested mode that
    changes is noted. ``None`` for a model without Mamba layers.
    """
    if not mamba:
        return None
    mode: Literal["align", "none"] = "align" if cfg.cache.prefix_caching else "none"
    requested = cfg.model.mamba_cache_mode
    if requested is not None and requested != mode:
        notes.append(
            f"mamba_cache_mode={requested!r} becomes {mode!r}: vLLM 0.33 uses 'align' with "
            "prefix caching on and 'none' with it off"
        )
    if mode == "none" and cfg.cache.max_model_len is None:
        raise ConfigError.single(
            "max_model_len_required",
            "with prefix caching off vLLM sets the Mamba block to max_model_len, which is not given: "
            "set cache.max_model_len",
            "cache.max_model_len",
        )
    return mode


def _attention_block(
    model: ModelLayers,
    main: _Layer | None,
    attention: list[_Layer],
    mamba: list[_Layer],
    mode: Literal["align", "none"] | None,
    notes: list[str],
) -> int | None:
    """Step 2: the attention block, raised once for every pipeline stage (#51764; `_align_hybrid_block_size`).

    With Mamba layers: ``K = max(kernel_block_size, block_size)``, at least :data:`MLA_MIN_HYBRID_BLOCK`
    for an MLA main layer, ``lcm``'d with the prefill checkpoint alignments in align mode when every Mamba
    layer declares one; the block is ``K * cdiv(m, page(K))`` rounded up to the lcm of the attention kernel
    blocks (never below the CLI block). Without Mamba the CLI block is only rounded up to that lcm. Every
    attention layer gets the block; ``None`` without attention layers.
    """
    if main is None:
        return None
    kb = reduce(math.lcm, (_kernel(x, model) for x in attention), 1)
    cli = model.block_size
    if mamba:
        m = max(x.raw_page() for x in mamba)
        k = max(model.kernel_block_size, cli)
        if main.latent:
            k = max(k, MLA_MIN_HYBRID_BLOCK)
        aligns = [x.src.prefill_checkpoint_alignment for x in mamba]
        if mode == "align" and all(a is not None for a in aligns):
            k = reduce(math.lcm, (a for a in aligns if a is not None), k)
        per_k = main.raw_page(k)
        if per_k == 0:
            raise ConfigError.single(
                "block_smaller_than_state",
                f"{main.label} compresses tokens_per_state={main.src.tokens_per_state} tokens per state, more "
                f"than the {k}-token block vLLM starts from, so a block holds no state: raise model.block_size "
                f"to a multiple of {main.src.tokens_per_state}",
                f"model.layers[{main.index}].tokens_per_state",
                tokens_per_state=main.src.tokens_per_state,
                block_size=k,
            )
        needed = rup(k * cdiv(m, per_k), kb)
        attention_block = max(cli, needed)
        if attention_block > cli:
            notes.append(
                f"attention block raised from {cli} to {attention_block} tokens so the attention page "
                f"({main.raw_page(attention_block)} bytes at {attention_block} tokens) holds the largest Mamba "
                f"state ({m} bytes): K={k}, {k}*cdiv({m}, {per_k}) rounded up to the kernel lcm {kb}"
            )
    else:
        attention_block = rup(cli, kb)
        if attention_block != cli:
            notes.append(f"block size {cli} rounded up to {attention_block}, a multiple of the kernel blocks {kb}")
    for x in attention:
        x.block = attention_block
    return attention_block


def _mamba_block(
    cfg: LayeredConfig,
    main: _Layer | None,
    attention_block: int | None,
    mamba: list[_Layer],
    mode: Literal["align", "none"] | None,
) -> int | None:
    """Step 3: the Mamba block and its padded page (vLLM 0.33 `_align_hybrid_block_size`).

    In align mode the Mamba block is the per-rank attention block (the CLI block without attention), and
    each Mamba page is padded to the main attention layer's page; in ``none`` mode it is ``max_model_len``.
    Every Mamba layer gets the block; ``None`` without Mamba layers.
    """
    if not mamba:
        return None
    if mode == "none":
        assert cfg.cache.max_model_len is not None  # checked by _mamba_mode
        mamba_block = cfg.cache.max_model_len
    else:
        mamba_block = attention_block if attention_block is not None else cfg.model.block_size
    for x in mamba:
        x.block = mamba_block
        if main is not None and attention_block is not None:
            target = main.raw_page(attention_block)
            if target != x.raw_page():
                x.padded = target
    return mamba_block


def _keeps_one_group(layers: list[_Layer]) -> bool:
    """Whether vLLM 0.33 keeps every layer in one group: its "uniform type" test, on the blocks of steps 2-3.

    The layers must share one block, one DCP sharding and one manager family, and, within the family, what
    that family's manager needs to be one (vLLM 0.33 ``is_uniform_with_collection``, asked of the *first*
    layer): sliding windows of one width (and, when the first layer is ``sliding_window_mla``, every layer of
    that kind), chunked-local layers of one chunk, Mamba layers with one page, one count of speculative
    blocks and one prefill checkpoint alignment. Two sliding layers with windows 64 and 512 are two groups
    (found by the grouping law under the ``dev`` profile; rows in tests/test_grouping_conformance.py).

    Then the group is one spec (or a ``uniform`` container whose page is the sum of its layers') and the
    layers' pages need not agree: :func:`_unify_pages` leaves them alone and :func:`_group_layers` makes
    the single group. Decided before unification changes any block.

    Invariant: true exactly when every layer has the first layer's value of :func:`_uniform_type_key`.
    """
    first = _uniform_type_key(layers[0], layers[0])
    return all(_uniform_type_key(x, layers[0]) == first for x in layers)


def _uniform_type_key(x: _Layer, first: _Layer) -> tuple[Any, ...]:
    """What must agree between ``x`` and the first layer for vLLM 0.33 to keep them in one group."""
    s = x.src
    family = _family(s.kind)
    sharded = s.dcp_sharded if s.dcp_sharded is not None else dcp_sharded_by_default(s.kind)
    key: tuple[Any, ...] = (family, x.block, sharded)
    if family == "sliding":
        # a plain sliding-window first layer admits its MLA subclass; an MLA first layer admits only MLA
        mla_only = first.src.kind == "sliding_window_mla"
        return (*key, s.sliding_window, s.kind == "sliding_window_mla" if mla_only else None)
    if family == "chunked":
        return (*key, s.attention_chunk_size)
    if family == "mamba":
        return (*key, x.page(), s.num_speculative_blocks or 0, s.prefill_checkpoint_alignment)
    return key


def _refuse_empty_page(x: _Layer, block: int | None) -> None:
    """A compressed attention layer whose ``tokens_per_state`` exceeds its block holds no state in a block:
    its page is 0 bytes, and no page size can be unified with it. Refused as ``block_smaller_than_state``
    (the main layer's case in step 2), naming the layer, the numbers and the fix."""
    if block is None or x.raw_page(block) > 0:
        return
    tps = x.src.tokens_per_state
    raise ConfigError.single(
        "block_smaller_than_state",
        f"{x.label} compresses tokens_per_state={tps} tokens per state, more than its {block}-token block, so "
        f"a block holds no state (a page of 0 bytes): give the layer a block_size that is a multiple of {tps}",
        f"model.layers[{x.index}].tokens_per_state",
        tokens_per_state=tps,
        block_size=block,
    )


def _unify_pages(model: ModelLayers, layers: list[_Layer], one_group: bool) -> None:
    """Step 4: page unification (vLLM 0.33 `v1/core/kv_cache_planning.py::unify_kv_cache_spec_page_size`).

    Unless the layers keep one group, every layer ends with the largest page: attention layers whose page
    divides it scale their block, sliding-window layers take the largest multiple of their kernel block
    that fits, Mamba and non-MLA attention layers are padded, and an MLA layer that still does not fit is
    ``mla_page_not_divisible`` (vLLM raises ``NotImplementedError``).
    """
    for x in layers:
        if not x.is_mamba:
            _refuse_empty_page(x, x.block)
    shared = max(x.page() for x in layers)
    for x in layers:
        page = x.page()
        if page == shared or one_group:
            continue
        if x.is_mamba:
            x.padded = shared
            continue
        if x.src.kind in {"sliding_window", "sliding_window_mla"}:
            # 0.33: a sliding-window layer takes the largest multiple of its kernel block that fits the page
            kern = _kernel(x, model)
            _refuse_empty_page(x, kern)
            fits = [n for n in range(1, shared // x.page(kern) + 1) if x.page(kern * n) <= shared]
            if fits:
                x.block = kern * fits[-1]
        elif shared % page == 0:
            x.block = x.block * (shared // page)
        if x.page(x.block) != shared:
            if x.latent:
                raise GeometryError.single(
                    "mla_page_not_divisible",
                    f"{x.label} ({x.src.kind}) has a page of {x.page(x.block)} bytes at block {x.block}, which "
                    f"does not divide the shared page of {shared} bytes; vLLM 0.33 pads only non-MLA attention "
                    "layers (NotImplementedError): change the layer's dtype or head size, or the other layers'",
                    f"model.layers[{x.index}]",
                    page_bytes=x.page(x.block),
                    shared_page_bytes=shared,
                )
            x.padded = shared


def _padding_rows(model: ModelLayers, layers: list[_Layer], notes: list[str]) -> list[PagePadding]:
    """One :class:`PagePadding` per layer entry the engine padded, in entry order (steps 3-4).

    vLLM 0.33 logs "Padding mamba page size by X%"; the distinct Mamba percentages are noted once.
    """
    padding: list[PagePadding] = []
    for i, src in enumerate(model.layers):
        padded = [x for x in layers if x.index == i and x.padded is not None]
        if padded:
            x = padded[0]
            padding.append(PagePadding(src.name or f"layers[{i}]", src.kind, x.raw_page(), x.page(), len(padded)))
    mamba_pads = {round(p.percent, 2) for p in padding if p.kind == "mamba"}
    if mamba_pads:
        notes.append(f"Mamba page padded by {', '.join(f'{v}%' for v in sorted(mamba_pads))} (vLLM logs it)")
    return padding


def _group_layers(
    layers: list[_Layer], mode: Literal["align", "none"] | None, one_group: bool, notes: list[str]
) -> tuple[list[dict[str, Any]], list[list[_Layer]]]:
    """Step 5: grouping, as vLLM 0.33 groups the unified layer specs; returns the groups and their layers.

    One group when the layers keep one group (a ``uniform`` container when their specs differ); otherwise
    one bucket per distinct spec (in order of first appearance), split into ``cdiv(len(bucket), size)``
    groups, ``size`` the smallest bucket's layer count, or one group per bucket when ``max < 1.5 * min``
    (vLLM pads instead). Membership: the bucket's layers in model order are dealt round-robin, group ``i`` of
    a bucket holding its layers ``i, i + n, i + 2n, ...`` (vLLM 0.33 assigns ``layers[i::num_groups]``).

    Invariant: every layer is in exactly one group; the groups of a bucket differ in size by at most one.
    """
    leaves = [_leaf(x, mode) for x in layers]
    groups: list[dict[str, Any]] = []
    members: list[list[_Layer]] = []
    if one_group:
        distinct = {json.dumps(leaf, sort_keys=True) for leaf in leaves}
        if len(distinct) == 1:
            groups.append(leaves[0])
        else:
            groups.append({"kind": "uniform", "block_size": layers[0].block, "layers": leaves})
        members.append(layers)
        return groups, members
    buckets: dict[str, list[int]] = {}
    for i, leaf in enumerate(leaves):
        buckets.setdefault(json.dumps(leaf, sort_keys=True), []).append(i)
    counts = [len(v) for v in buckets.values()]
    size = min(counts)
    if 2 * max(counts) < 3 * size:  # vLLM 0.33: max < 1.5 * min keeps one group per bucket (padding)
        size = max(counts)
    for idx in buckets.values():
        num_groups = cdiv(len(idx), size)
        for start in range(num_groups):
            groups.append(dict(leaves[idx[0]]))
            # vLLM 0.33 deals a bucket's layers round-robin (layers[i::num_groups]), so every group holds
            # layers of every pipeline stage; a contiguous cut would leave a stage's group empty
            members.append([layers[i] for i in idx[start::num_groups]])
    if len(groups) > len(buckets):
        notes.append(
            f"layers grouped by {size} (bucket sizes {counts}): {len(groups)} groups, each bucket's layers dealt "
            "round-robin over its groups"
        )
    return groups, members


def _packs(model: ModelLayers, layers: list[_Layer], one_group: bool) -> bool:
    """Whether vLLM 0.33 packs the groups (`v1/core/kv_cache_planning.py::get_kv_cache_groups`): the layers do
    not keep one group, ``model.kv_cache_layout`` is block-outermost (`KVCacheLayout.is_block_outermost`), and
    the layers' pages after steps 2-3 differ (`_get_packed_kv_cache_groups` returns ``None`` otherwise).

    Invariant: false whenever ``model.kv_cache_layout`` is unset or layer-outermost (today's answers)."""
    if one_group or model.kv_cache_layout not in BLOCK_OUTERMOST_LAYOUTS:
        return False
    for x in layers:
        if not x.is_mamba:
            _refuse_empty_page(x, x.block)
    return len({x.page() for x in layers}) > 1


def _approximate_gcd(values: list[int], lower_bound: int) -> int:
    """The repeats per packed group (vLLM 0.33 `v1/core/kv_cache_planning.py::_approximate_gcd`): the ``d`` in
    ``[lower_bound, max(values)]`` that rounds the values up to multiples of ``d`` with the least total padding,
    the larger ``d`` on a tie; ``lower_bound`` itself when it exceeds every value.

    >>> _approximate_gcd([4, 12], 4), _approximate_gcd([6, 9], 6), _approximate_gcd([2], 4)
    (4, 9, 4)
    """
    best, best_pad = lower_bound, None
    for d in range(lower_bound, max(values) + 1):
        pad = sum(-x % d for x in values)
        if best_pad is None or pad <= best_pad:
            best, best_pad = d, pad
    return best


@dataclass
class _Bucket:
    """One bucket of the packed grouping: its layers (model order) and their layers by page (first page first)."""

    layers: list[_Layer]
    by_page: dict[int, list[_Layer]]

    @property
    def balanced(self) -> bool:
        """One layer of every page per repeat of the pattern: every page has the same layer count."""
        return len({len(v) for v in self.by_page.values()}) == 1

    @property
    def repeats(self) -> int:
        """The most layers of one page (`UniformTypeKVCacheSpecs.get_max_layers_per_page_size`)."""
        return max(len(v) for v in self.by_page.values())

    def widest_group_bytes(self, num_groups: int) -> int:
        """Page bytes of the largest of ``num_groups`` groups the bucket splits into."""
        return sum(cdiv(len(v), num_groups) * page for page, v in self.by_page.items())


def _pack_groups(
    model: ModelLayers, layers: list[_Layer], mode: Literal["align", "none"] | None, notes: list[str]
) -> tuple[list[dict[str, Any]], list[list[_Layer]]]:
    """Step 5b: the packed grouping of a block-outermost layout (vLLM 0.33
    `v1/core/kv_cache_planning.py::_get_packed_kv_cache_groups`); pages keep their step 2-3 sizes.

    1. Buckets, greedily: each layer (model order) joins the first bucket it passes vLLM's uniform-type test
       with (:func:`_uniform_type_key` against the bucket's first layer), else opens one.
    2. A bucket is *balanced* when every page in it has the same layer count (a 1:1 pattern repeated ``r``
       times, ``r`` its largest per-page count). The largest ``r`` of a balanced bucket mixing pages is a
       floor; the repeats per group are :func:`_approximate_gcd` of every balanced bucket's ``r`` above that
       floor (none when no balanced bucket mixes pages, and then every bucket is one group). A balanced
       bucket makes ``cdiv(r, repeats per group)`` groups, any other one.
    3. State buckets (Mamba; sliding-window when no repeats per group were chosen) are split further so a
       group holds no more states than the widest group's bytes fit: ``cdiv(n, max(anchor // page, 1))``
       groups, ``anchor`` the largest bytes any bucket's widest group needs (a state bucket counted at one
       state per group).
    4. A bucket split into ``k`` groups deals its pattern repeats round-robin: group ``i`` holds repeats
       ``i, i + k, ...``, each repeat its layers in page order; a whole bucket keeps model order.

    vLLM forms the repeats with ``zip`` over the pages, so an unbalanced bucket split in more than one group
    loses the layers past the shortest page (0.33 leaves them in no group, or raises ``StopIteration`` on an
    empty one): refused as :class:`kvgeom.GeometryError` ``packed_bucket_unbalanced``.

    Invariant: every layer is in exactly one group; a group's layers pass the uniform-type test (one block,
    one sharding, one manager family); every layer keeps the block of steps 2-3 (nothing is unified).
    """
    buckets: list[_Bucket] = []
    for x in layers:
        for b in buckets:
            if _uniform_type_key(x, b.layers[0]) == _uniform_type_key(b.layers[0], b.layers[0]):
                b.layers.append(x)
                b.by_page.setdefault(x.page(), []).append(x)
                break
        else:
            buckets.append(_Bucket([x], {x.page(): [x]}))
    floor = max((b.repeats for b in buckets if b.balanced and len(b.by_page) > 1), default=0)
    per_group = _approximate_gcd([b.repeats for b in buckets if b.balanced], floor) if floor else None

    def num_groups_for(b: _Bucket) -> int:
        return cdiv(b.repeats, per_group) if b.balanced and per_group is not None else 1

    def is_state(b: _Bucket) -> bool:
        family = _family(b.layers[0].src.kind)
        return family == "mamba" or (per_group is None and family == "sliding")

    anchor = max(b.widest_group_bytes(len(b.layers) if is_state(b) else num_groups_for(b)) for b in buckets)
    groups: list[dict[str, Any]] = []
    members: list[list[_Layer]] = []
    for b in buckets:
        num_groups = num_groups_for(b)
        if anchor and is_state(b):
            num_groups = max(num_groups, cdiv(len(b.layers), max(anchor // b.layers[0].page(), 1)))
        if num_groups == 1:
            parts = [b.layers]
        else:
            if not b.balanced:
                _refuse_unbalanced(b, num_groups)
            repeats = list(zip(*b.by_page.values(), strict=True))
            parts = [[x for rep in repeats[i::num_groups] for x in rep] for i in range(num_groups)]
        for part in parts:
            leaves = [_leaf(x, mode) for x in part]
            if len({json.dumps(leaf, sort_keys=True) for leaf in leaves}) == 1:
                groups.append(leaves[0])
            else:
                groups.append({"kind": "uniform", "block_size": part[0].block, "layers": leaves})
            members.append(part)
    notes.append(
        f"kv_cache_layout={model.kv_cache_layout} is block-outermost and the layers' pages differ "
        f"({sorted({x.page() for x in layers})} bytes): vLLM 0.33 packs them into {len(groups)} groups "
        f"({len(buckets)} buckets, "
        + (f"{per_group} pattern repeats per group" if per_group is not None else "no repeating pattern")
        + ") and does not unify the pages"
    )
    return groups, members


def _refuse_unbalanced(b: _Bucket, num_groups: int) -> None:
    """An unbalanced bucket split in several groups: vLLM 0.33 drops layers (step 5b), so kvgeom refuses."""
    counts = {page: len(v) for page, v in b.by_page.items()}
    first = b.layers[0]
    dropped = len(b.layers) - min(counts.values()) * len(counts)
    raise GeometryError.single(
        "packed_bucket_unbalanced",
        f"with a block-outermost kv_cache_layout vLLM 0.33 splits the {first.src.kind} bucket of {len(b.layers)} "
        f"layers ({first.label}, ...) into {num_groups} groups by pattern repeats, but its pages have unequal layer "
        f"counts {counts} (bytes: layers); it pairs them with zip, so {dropped} "
        "layers end in no group (an empty group raises StopIteration): give those layers one page size "
        "(heads, head size, dtype) or use a layer-outermost layout",
        "model.kv_cache_layout",
        num_groups=num_groups,
        layers=len(b.layers),
    )


def _engine_block(groups: list[dict[str, Any]], par: ParallelConfig, notes: list[str]) -> int:
    """Step 6: the engine-core minimum (vLLM 0.33 `v1/engine/core.py`): ``cache_config.block_size``.

    The smallest prefix-cacheable group block (every layered group is prefix-cacheable). With DCP, vLLM
    checks ``cp_interleave`` against this block only (`VllmConfig.validate_block_size`); a layout it would
    reject is noted, since kvgeom checks every sharded group instead.
    """
    engine_block = engine_block_size_of((g["block_size"], True) for g in groups)
    if par.dcp > 1 and (par.cp_interleave > engine_block or engine_block % par.cp_interleave):
        notes.append(
            f"vLLM 0.33 checks cp_interleave={par.cp_interleave} against the engine block {engine_block} only "
            "and would reject this layout (`VllmConfig.validate_block_size`); kvgeom checks every sharded group instead"
        )
    return engine_block


def _result(
    cfg: LayeredConfig,
    layers: list[_Layer],
    groups: list[dict[str, Any]],
    members: list[list[_Layer]],
    *,
    attention_block: int | None,
    mamba_block: int | None,
    mode: Literal["align", "none"] | None,
    engine_block: int,
    padding: list[PagePadding],
    notes: list[str],
    packed: bool,
) -> BlockSizeResolution:
    """The :class:`BlockSizeResolution`: the resolved groups as a kvgeom config dict plus the facts.

    ``page_bytes`` is the one page every layer has after step 4 (``None`` when a kept single group mixes
    page sizes); each group reports its layers' labels and the pipeline stages holding them.
    """
    pages = {x.page() for x in layers}
    out_cfg: dict[str, Any] = {
        "groups": groups,
        "parallel": cfg.parallel.model_dump(mode="json"),
        "cache": cfg.cache.model_dump(mode="json"),
    }
    if cfg.offload is not None:
        out_cfg["offload"] = cfg.offload.model_dump(mode="json")
    return BlockSizeResolution(
        config=out_cfg,
        cli_block_size=cfg.model.block_size,
        attention_block_size=attention_block,
        mamba_block_size=mamba_block,
        mamba_cache_mode=mode,
        engine_block_size=engine_block,
        page_bytes=pages.pop() if len(pages) == 1 else None,
        padding=tuple(padding),
        group_layers=tuple(tuple(x.label for x in mem) for mem in members),
        group_stages=tuple(tuple(sorted({x.src.pp_stage for x in mem})) for mem in members),
        notes=tuple(notes),
        layer_labels=tuple(x.label for x in layers),
        kv_cache_layout=cfg.model.kv_cache_layout,
        packed=packed,
    )
