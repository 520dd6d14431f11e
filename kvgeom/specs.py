"""What a KV-cache group is: immutable specs, a tagged union on ``kind``.

A *spec* describes one KV-cache group as the engine allocates it: its
``block_size`` (tokens held by one physical block **on one rank**) and the
fields that decide how the group behaves (window, chunk, Mamba mode, ...).
Page-size fields (``num_kv_heads``, ``head_size``, ``dtype``, Mamba ``shapes``
and ``dtypes``, ``page_size_padded``) are optional and only needed for page
bytes.

The kinds follow vLLM 0.33's spec classes (`v1/kv_cache_interface.py`):

=====================  ==================  ===========  ===================
kind                   manager family      DCP-sharded  prefix-cacheable
=====================  ==================  ===========  ===================
``full_attention``     full                yes          yes
``mla``                full                yes          yes
``sink_full_attention`` full               yes          yes
``sliding_window``     sliding             yes [1]_     yes
``sliding_window_mla`` sliding             yes [1]_     unless bounded_replay
``chunked_local``      chunked             yes [1]_     yes
``cross_attention``    cross               yes [1]_     yes (never offloaded)
``mamba``              mamba               **no**       yes
``circular_buffer``    circular            yes [1]_     **no**
``rswa``               full                yes          yes
``hisparse_hot``       hisparse            **no**       **no**
``hisparse_resident``  hisparse            **no**       **no**
``encoder_only``       encoder             yes          **no** [2]_
``uniform``            of its first layer  of its layers of its layers
=====================  ==================  ===========  ===================

.. [1] Under DCP these kinds must be replicated (``dcp_sharded=False``);
   :func:`kvgeom.resolve` rejects them otherwise.
.. [2] vLLM 0.33's spec says cacheable, but its scheduler has no manager for the kind: the model runner
   appends the group after the scheduler's config is built, so nothing of it is ever cached or offloaded,
   and L and H are decided without it. It must be the last group, and there is at most one.

``rswa`` (reference sliding-window attention) is full attention for every geometry rule: the same hit
rule, hash unit, store mask and offload keys (vLLM 0.33 serves it with ``RSWAManager``, a full-attention
manager). Only a running request's GPU row differs: once decoding moves past the window, the blocks between
the prompt and the last ``rswa_window`` generated tokens are freed (:func:`kvgeom.hits.rswa_gap_blocks`).

Whether a group is sharded across DCP ranks is decided in exactly one place,
:func:`is_dcp_sharded`. It never looks at Python classes: a ``uniform``
container (as DSA models merge MLA and indexer layers) is sharded exactly when
its layers are, which is the rule vLLM once missed (#50883).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated, Any, Literal, Self, TypeAlias, assert_never

from pydantic import Field, model_validator

from kvgeom._pydantic import FrozenModel, NonNegativeInt, PositiveInt, StrictBool
from kvgeom.errors import GeometryError

__all__ = [
    "DTYPE_BYTES",
    "ChunkedLocalSpec",
    "CircularBufferSpec",
    "CrossAttentionSpec",
    "DType",
    "EncoderOnlySpec",
    "HiSparseHotSpec",
    "HiSparseResidentSpec",
    "RSWASpec",
    "Family",
    "FullAttentionSpec",
    "GroupSpec",
    "LeafSpec",
    "MLASpec",
    "MambaSpec",
    "SinkFullAttentionSpec",
    "SlidingWindowMLASpec",
    "SlidingWindowSpec",
    "UniformSpec",
    "family",
    "dcp_sharded_by_default",
    "is_dcp_sharded",
    "is_prefix_cacheable",
    "iter_leaves",
    "is_drafter_group",
    "scheduler_view",
    "sliding_window_of",
    "attention_chunk_size_of",
    "rswa_window_of",
    "states_per_block",
    "tokens_per_state_of",
    "is_latent",
    "LATENT_KINDS",
    "KINDS",
]


#: Bytes per element of the dtype names kvgeom understands.
DTYPE_BYTES: dict[str, int] = {
    "float64": 8,
    "float32": 4,
    "float16": 2,
    "bfloat16": 2,
    "fp8": 1,
    "fp8_e4m3": 1,
    "fp8_e5m2": 1,
    "fp8_ds_mla": 1,
    "int64": 8,
    "int32": 4,
    "int16": 2,
    "int8": 1,
    "uint8": 1,
}

DType = Literal[
    "float64",
    "float32",
    "float16",
    "bfloat16",
    "fp8",
    "fp8_e4m3",
    "fp8_e5m2",
    "fp8_ds_mla",
    "int64",
    "int32",
    "int16",
    "int8",
    "uint8",
]

#: Which single-type manager serves a group; decides windows and hit finding.
Family: TypeAlias = Literal["full", "sliding", "chunked", "cross", "mamba", "circular", "hisparse", "encoder"]


class _Spec(FrozenModel):
    """Fields every spec has. Construction errors are :class:`kvgeom.ConfigError`."""

    block_size: PositiveInt = Field(
        description="Tokens held by one physical block on one rank (the resolved size, not the CLI value)."
    )
    dcp_sharded: StrictBool | None = Field(
        default=None,
        description="Override of whether DCP deals this group's positions across ranks "
        "(default: attention kinds yes, mamba no, uniform as its layers). Set false for a "
        "replicated group such as a DCP=1 draft model.",
    )
    prefix_cacheable: StrictBool | None = Field(
        default=None,
        description="Whether the group takes part in prefix caching and offloading (default by kind).",
    )
    drafter: bool | None = Field(
        default=None,
        description="true: the group holds drafter layers (vLLM is_draft); needs a speculative section. "
        "Absent or false: no drafter layers. Never changes grouping or layout (vLLM declares is_draft "
        "compare=False).",
    )


class _AttentionSpec(_Spec):
    num_kv_heads: PositiveInt | None = Field(default=None, description="KV heads per TP rank.")
    head_size: PositiveInt | None = None
    dtype: DType | None = Field(default=None, description="KV cache dtype name.")
    page_size_padded: PositiveInt | None = Field(
        default=None, description="Page bytes after padding, when the engine padded the page."
    )
    tokens_per_state: PositiveInt | None = Field(
        default=None,
        description="Tokens compressed into one cached state (> 1 for compressed attention).",
    )

    @model_validator(mode="after")
    def _packed_dtype_is_latent(self) -> Self:
        # fp8_ds_mla packs one latent vector per token (vLLM 0.33 `MLAAttentionSpec`); a KV-head layer has no
        # page in that format, so every report path would have no page bytes to show.
        kind = str(type(self).model_fields["kind"].default)
        if self.dtype == "fp8_ds_mla" and kind not in LATENT_KINDS:
            raise ValueError(
                f"dtype 'fp8_ds_mla' is the packed latent format of MLA caches, not of a {kind} group; use "
                "kind 'mla' (or 'sliding_window_mla'), or a per-element dtype such as 'fp8_e4m3'"
            )
        return self


class FullAttentionSpec(_AttentionSpec):
    """Causal full attention (vLLM ``FullAttentionSpec``)."""

    kind: Literal["full_attention"] = "full_attention"
    head_size_v: PositiveInt | None = None


class MLASpec(_AttentionSpec):
    """Multi-head latent attention; ``head_size`` is the latent width (vLLM ``MLAAttentionSpec``)."""

    kind: Literal["mla"] = "mla"
    alignment: PositiveInt | None = Field(default=None, description="Page bytes padded up to a multiple of this.")
    cache_role: Literal["main", "indexer"] | None = Field(
        default=None, description="'indexer' for the sparse-attention indexer cache of DSA models."
    )


class SinkFullAttentionSpec(_AttentionSpec):
    """Full attention with ``sink_len`` attention-sink tokens."""

    kind: Literal["sink_full_attention"] = "sink_full_attention"
    head_size_v: PositiveInt | None = None
    sink_len: NonNegativeInt = 0


class SlidingWindowSpec(_AttentionSpec):
    """Sliding-window attention; a query sees the last ``sliding_window`` positions."""

    kind: Literal["sliding_window"] = "sliding_window"
    head_size_v: PositiveInt | None = None
    sliding_window: PositiveInt
    extra_retained_tokens: NonNegativeInt = 0


class SlidingWindowMLASpec(_AttentionSpec):
    """Sliding-window MLA; not prefix-cacheable when ``bounded_replay`` is set."""

    kind: Literal["sliding_window_mla"] = "sliding_window_mla"
    sliding_window: PositiveInt
    extra_retained_tokens: NonNegativeInt = 0
    alignment: PositiveInt | None = None
    bounded_replay: StrictBool = False


class ChunkedLocalSpec(_AttentionSpec):
    """Chunked local attention: positions attend within ``attention_chunk_size`` chunks."""

    kind: Literal["chunked_local"] = "chunked_local"
    head_size_v: PositiveInt | None = None
    attention_chunk_size: PositiveInt


class CrossAttentionSpec(_AttentionSpec):
    """Encoder-decoder cross attention (no prefix cache lookups, never offloaded)."""

    kind: Literal["cross_attention"] = "cross_attention"
    head_size_v: PositiveInt | None = None


class CircularBufferSpec(_AttentionSpec):
    """A ring of ``block_size`` slots, one block per request; never prefix-cacheable."""

    kind: Literal["circular_buffer"] = "circular_buffer"
    head_size_v: PositiveInt | None = None


class RSWASpec(_AttentionSpec):
    """Reference sliding-window attention (vLLM ``RSWASpec``): full attention whose decode keeps only the
    last ``rswa_window`` generated tokens; the prompt stays visible."""

    kind: Literal["rswa"] = "rswa"
    head_size_v: PositiveInt | None = None
    rswa_window: NonNegativeInt = Field(description="Generated tokens a decode step still attends to.")


class HiSparseHotSpec(_Spec):
    """HiSparse's per-request hot region (vLLM ``HiSparseHotSpec``): ``blocks_per_request`` blocks, never
    prefix-cached (the host source group owns prefix caching)."""

    kind: Literal["hisparse_hot"] = "hisparse_hot"
    blocks_per_request: PositiveInt = Field(description="Blocks every request's hot region holds.")
    page_size: PositiveInt | None = Field(default=None, description="Bytes of one page (vLLM gives it directly).")


class HiSparseResidentSpec(_Spec):
    """HiSparse's GPU-resident pages of host-backed KV (vLLM ``HiSparseResidentSpec``); never prefix-cached."""

    kind: Literal["hisparse_resident"] = "hisparse_resident"
    page_size: PositiveInt | None = Field(default=None, description="Bytes of one page (vLLM gives it directly).")


class EncoderOnlySpec(_AttentionSpec):
    """Encoder-only (bidirectional) attention (vLLM ``EncoderOnlyAttentionSpec``): no KV cache the scheduler
    holds; vLLM's model runner adds the group after the scheduler's config is built."""

    kind: Literal["encoder_only"] = "encoder_only"
    head_size_v: PositiveInt | None = None


class MambaSpec(_Spec):
    """Recurrent state (Mamba, GDN, KDA, conv state): replicated on every DCP rank.

    In ``align`` mode block *i* holds the state after exactly ``(i+1)*block_size``
    tokens. ``mamba_cache_mode`` defaults to ``align`` with prefix caching on and
    ``none`` with it off.
    """

    kind: Literal["mamba"] = "mamba"
    mamba_cache_mode: Literal["align", "none", "all"] | None = None
    num_speculative_blocks: NonNegativeInt = 0
    shapes: tuple[tuple[PositiveInt, ...], ...] | None = Field(
        default=None, description="Per-rank state shapes, one per state tensor."
    )
    dtypes: tuple[DType, ...] | None = Field(default=None, description="One dtype name per state tensor.")
    page_size_padded: PositiveInt | None = None


LeafSpec = Annotated[
    FullAttentionSpec
    | MLASpec
    | SinkFullAttentionSpec
    | SlidingWindowSpec
    | SlidingWindowMLASpec
    | ChunkedLocalSpec
    | CrossAttentionSpec
    | RSWASpec
    | MambaSpec,
    Field(discriminator="kind"),
]


class UniformSpec(_Spec):
    """Several layer specs merged into one group with one ``block_size``.

    DSA models merge their MLA and indexer layers this way. A layer that omits
    ``block_size`` takes the container's; a container that omits it takes the
    layers'. The layers must share the block size, the manager family and
    whether they are DCP-sharded. The scheduler sees the first layer.
    """

    kind: Literal["uniform"] = "uniform"
    layers: tuple[LeafSpec, ...] = Field(min_length=1)

    @model_validator(mode="before")
    @classmethod
    def _share_block_size(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        layers = data.get("layers")
        if not isinstance(layers, list | tuple):
            return data
        data = dict(data)
        if "block_size" not in data:
            for layer in layers:
                size = layer.get("block_size") if isinstance(layer, dict) else getattr(layer, "block_size", None)
                if size is not None:
                    data["block_size"] = size
                    break
        if "block_size" in data:
            data["layers"] = [
                {**layer, "block_size": data["block_size"]}
                if isinstance(layer, dict) and "block_size" not in layer
                else layer
                for layer in layers
            ]
        return data

    @model_validator(mode="after")
    def _layers_agree(self) -> UniformSpec:
        for i, layer in enumerate(self.layers):
            if layer.block_size != self.block_size:
                raise ValueError(
                    f"layers[{i}].block_size={layer.block_size} differs from the container's "
                    f"block_size={self.block_size}; the layers of a uniform group share one block size"
                )
        return self


GroupSpec = Annotated[
    FullAttentionSpec
    | MLASpec
    | SinkFullAttentionSpec
    | SlidingWindowSpec
    | SlidingWindowMLASpec
    | ChunkedLocalSpec
    | CrossAttentionSpec
    | MambaSpec
    | CircularBufferSpec
    | RSWASpec
    | HiSparseHotSpec
    | HiSparseResidentSpec
    | EncoderOnlySpec
    | UniformSpec,
    Field(discriminator="kind"),
]

AnyLeaf: TypeAlias = (
    FullAttentionSpec
    | MLASpec
    | SinkFullAttentionSpec
    | SlidingWindowSpec
    | SlidingWindowMLASpec
    | ChunkedLocalSpec
    | CrossAttentionSpec
    | RSWASpec
    | MambaSpec
)
#: Kinds that stand alone: never a layer of a ``uniform`` group (vLLM merges neither into another spec).
Standalone: TypeAlias = CircularBufferSpec | HiSparseHotSpec | HiSparseResidentSpec | EncoderOnlySpec
AnySpec: TypeAlias = AnyLeaf | Standalone | UniformSpec


def iter_leaves(spec: AnySpec) -> Iterator[AnyLeaf | Standalone]:
    """The layer specs of a group: the layers of a ``uniform`` container, else the spec itself."""
    if isinstance(spec, UniformSpec):
        yield from spec.layers
    else:
        yield spec


def scheduler_view(spec: AnySpec) -> AnyLeaf | Standalone:
    """The spec the scheduler sees: a ``uniform`` container counts as its first layer.

    vLLM's scheduler-side config flattens the container to its first layer
    (vLLM 0.33 `generate_scheduler_kv_cache_config`), so window sizes, the Mamba mode test and partial hash hits
    are decided on that layer.
    """
    return spec.layers[0] if isinstance(spec, UniformSpec) else spec


def family(spec: AnySpec) -> Family:
    """The manager family of a group (a ``uniform`` group: of its first layer)."""
    match spec:
        case FullAttentionSpec() | MLASpec() | SinkFullAttentionSpec() | RSWASpec():
            return "full"
        case SlidingWindowSpec() | SlidingWindowMLASpec():
            return "sliding"
        case ChunkedLocalSpec():
            return "chunked"
        case CrossAttentionSpec():
            return "cross"
        case MambaSpec():
            return "mamba"
        case CircularBufferSpec():
            return "circular"
        case HiSparseHotSpec() | HiSparseResidentSpec():
            return "hisparse"
        case EncoderOnlySpec():
            return "encoder"
        case UniformSpec():
            return family(spec.layers[0])
        case _:
            assert_never(spec)


_REPLICATED_KINDS = frozenset({"mamba", "hisparse_hot", "hisparse_resident"})


def dcp_sharded_by_default(kind: str) -> bool:
    """Whether a group of ``kind`` is dealt across DCP ranks when its spec sets no ``dcp_sharded``: attention
    kinds are, state kinds (``mamba``, the HiSparse pools) are replicated. The one home of the default that
    :func:`is_dcp_sharded` and the layered resolver (:mod:`kvgeom.resolution`) read.

    >>> dcp_sharded_by_default("mla"), dcp_sharded_by_default("mamba")
    (True, False)
    """
    return kind not in _REPLICATED_KINDS


def _sharded_by_kind(spec: AnySpec) -> bool:
    if isinstance(spec, UniformSpec):
        values = {is_dcp_sharded(layer) for layer in spec.layers}
        if len(values) != 1:
            flags = [is_dcp_sharded(layer) for layer in spec.layers]
            raise GeometryError.single(
                "uniform_mixed_sharding",
                f"the layers of a uniform group disagree on dcp_sharded ({flags}); a group is "
                "either dealt across DCP ranks or replicated: split the layers into separate "
                "groups or set dcp_sharded on the container",
                flags=flags,
            )
        return values.pop()
    return dcp_sharded_by_default(spec.kind)


def is_dcp_sharded(spec: AnySpec) -> bool:
    """Whether DCP deals this group's token positions across ranks.

    This is the only place kvgeom decides it. The explicit ``dcp_sharded``
    field wins; otherwise attention kinds are sharded, ``mamba`` is replicated
    and a ``uniform`` container is sharded exactly when its layers are (layers
    that disagree raise :class:`GeometryError` ``uniform_mixed_sharding``).

    Invariant: a group's span is ``block_size * kv_shards`` when this is true
    and ``block_size`` otherwise (see :mod:`kvgeom.geometry`).

    >>> is_dcp_sharded(UniformSpec(block_size=64, layers=[{"kind": "mla"}, {"kind": "mla", "cache_role": "indexer"}]))
    True
    >>> is_dcp_sharded(MambaSpec(block_size=16))
    False
    """
    if spec.dcp_sharded is not None:
        return spec.dcp_sharded
    return _sharded_by_kind(spec)


def is_prefix_cacheable(spec: AnySpec) -> bool:
    """Whether a group takes part in prefix caching (and hence in H and offloading).

    The explicit ``prefix_cacheable`` field wins; circular buffers, the HiSparse hot and resident groups,
    encoder-only attention and bounded-replay sliding-window MLA are not cacheable; everything else is.
    """
    if spec.prefix_cacheable is not None:
        return spec.prefix_cacheable
    match spec:
        case CircularBufferSpec() | HiSparseHotSpec() | HiSparseResidentSpec() | EncoderOnlySpec():
            return False
        case SlidingWindowMLASpec():
            return not spec.bounded_replay
        case (
            FullAttentionSpec()
            | MLASpec()
            | SinkFullAttentionSpec()
            | SlidingWindowSpec()
            | ChunkedLocalSpec()
            | CrossAttentionSpec()
            | RSWASpec()
            | MambaSpec()
            | UniformSpec()
        ):
            return True
        case _:
            assert_never(spec)


def sliding_window_of(spec: AnySpec) -> tuple[int, int] | None:
    """``(sliding_window, extra_retained_tokens)`` of the group's scheduler view, or None.

    A query at position p of a sliding-window group still needs the
    ``sliding_window - 1 + extra_retained_tokens`` positions before it.
    """
    match scheduler_view(spec):
        case SlidingWindowSpec() | SlidingWindowMLASpec() as view:
            return view.sliding_window, view.extra_retained_tokens
        case _:
            return None


def rswa_window_of(spec: AnySpec) -> int | None:
    """``rswa_window`` of a reference sliding-window group's scheduler view, or None for every other kind.

    >>> rswa_window_of(RSWASpec(block_size=16, rswa_window=40)), rswa_window_of(FullAttentionSpec(block_size=16))
    (40, None)
    """
    match scheduler_view(spec):
        case RSWASpec() as view:
            return view.rswa_window
        case _:
            return None


def attention_chunk_size_of(spec: AnySpec) -> int | None:
    """``attention_chunk_size`` of a chunked-local group's scheduler view, or None."""
    match scheduler_view(spec):
        case ChunkedLocalSpec() as view:
            return view.attention_chunk_size
        case _:
            return None


def is_drafter_group(spec: AnySpec) -> bool:
    """Whether a group holds drafter layers: its own ``drafter`` flag or any layer's (a ``uniform`` group).

    vLLM flags a group when any of its layers ``is_draft``
    (``v1/core/kv_cache_planning.py::get_global_kv_cache_groups``).

    >>> is_drafter_group(FullAttentionSpec(block_size=16, drafter=True))
    True
    """
    return bool(spec.drafter) or any(bool(leaf.drafter) for leaf in iter_leaves(spec))


def states_per_block(block_size: int, tokens_per_state: int | None) -> int:
    """States one block of an attention layer holds: ``block_size // tokens_per_state`` for compressed
    attention (``tokens_per_state > 1``), ``block_size`` otherwise (vLLM 0.33 ``AttentionSpec.num_states``).
    0 when the layer compresses more tokens than its block holds: a page of 0 bytes, which vLLM cannot plan
    and :func:`kvgeom.resolve` refuses (``block_smaller_than_state``). The one home of that count: page bytes
    (:mod:`kvgeom.pages`), the resolver's refusal and the LMCache model read it.
    Invariant: ``0 <= states <= block_size``.

    >>> states_per_block(16, None), states_per_block(7, 2), states_per_block(1, 2)
    (16, 3, 0)
    """
    return block_size // tokens_per_state if tokens_per_state is not None and tokens_per_state > 1 else block_size


def tokens_per_state_of(spec: AnyLeaf | Standalone) -> int | None:
    """``tokens_per_state`` of an attention layer (compressed attention when > 1); None for Mamba and HiSparse."""
    match spec:
        case MambaSpec() | HiSparseHotSpec() | HiSparseResidentSpec():
            return None
        case _:
            return spec.tokens_per_state


def is_latent(spec: AnySpec) -> bool:
    """Whether a layer caches one latent vector per token (``mla``, ``sliding_window_mla``).

    A latent cache has no KV heads: its page is ``head_size`` (the latent width) wide and every
    TP rank keeps it whole. A ``uniform`` container is not itself a layer (ask its layers).

    >>> is_latent(MLASpec(block_size=64)), is_latent(MambaSpec(block_size=16))
    (True, False)
    """
    match spec:
        case MLASpec() | SlidingWindowMLASpec():
            return True
        case (
            FullAttentionSpec()
            | SinkFullAttentionSpec()
            | SlidingWindowSpec()
            | ChunkedLocalSpec()
            | CrossAttentionSpec()
            | CircularBufferSpec()
            | RSWASpec()
            | HiSparseHotSpec()
            | HiSparseResidentSpec()
            | EncoderOnlySpec()
            | MambaSpec()
            | UniformSpec()
        ):
            return False
        case _:
            assert_never(spec)


#: The ``kind`` names :func:`is_latent` is true for, for code that sees kinds before specs exist
#: (the vLLM adapter).
LATENT_KINDS: frozenset[str] = frozenset(
    str(cls.model_fields["kind"].default) for cls in (MLASpec, SlidingWindowMLASpec)
)


#: Every ``kind`` name of a group spec, read off the spec classes.
KINDS: frozenset[str] = frozenset(
    str(cls.model_fields["kind"].default)
    for cls in (
        FullAttentionSpec,
        MLASpec,
        SinkFullAttentionSpec,
        SlidingWindowSpec,
        SlidingWindowMLASpec,
        ChunkedLocalSpec,
        CrossAttentionSpec,
        MambaSpec,
        CircularBufferSpec,
        RSWASpec,
        HiSparseHotSpec,
        HiSparseResidentSpec,
        EncoderOnlySpec,
        UniformSpec,
    )
)
#: Error locations of a spec (a uniform group's layers are a tagged union) name these tags; ``_pydantic``
#: gets them from here instead of importing this module.
_Spec.UNION_TAGS = KINDS
