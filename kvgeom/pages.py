"""Page bytes: how many bytes one physical block of a group takes on one rank.

The rules restate vLLM 0.33's ``real_page_size_bytes`` / ``page_size_bytes``
(vLLM 0.33 `v1/kv_cache_interface.py`) from the optional shape fields of :mod:`kvgeom.specs`:

* attention kinds: ``num_kv_heads * num_states * (head_size + head_size_v) *
  dtype_bytes``, where ``head_size_v`` defaults to ``head_size`` and
  ``num_states = block_size // tokens_per_state`` (``block_size`` when
  ``tokens_per_state`` is absent or 1);
* ``mla`` / ``sliding_window_mla``: the latent only (``head_size_v = 0``),
  ``num_kv_heads`` defaulting to 1, padded up to a multiple of ``alignment``;
  the ``fp8_ds_mla`` format packs a token into 656 bytes (512 fp8 latent values,
  four float32 scales and a 64-wide bfloat16 rope part), whatever ``head_size``;
* ``mamba``: ``sum(prod(shape) * dtype_bytes)`` over the state tensors, which
  does not depend on ``block_size``;
* ``uniform``: the sum of its layers' pages;
* ``page_size_padded``, when set, is the page (the engine padded it).

:func:`maybe_page_bytes` answers ``None`` when a spec lacks a field it needs;
:func:`page_bytes` raises a :class:`kvgeom.ConfigError` naming the fields.
"""

from __future__ import annotations

import math
from typing import assert_never

from kvgeom._math import rup
from kvgeom.errors import ConfigError, Problem
from kvgeom.specs import (
    DTYPE_BYTES,
    AnySpec,
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
    UniformSpec,
    is_latent,
    states_per_block,
)

__all__ = [
    "FP8_DS_MLA_TOKEN_BYTES",
    "attention_page_bytes",
    "mamba_state_bytes",
    "maybe_page_bytes",
    "missing_page_fields",
    "page_bytes",
]

#: Bytes one token takes in vLLM's packed ``fp8_ds_mla`` cache format:
#: 512 fp8 latent values + 4 float32 scales + 64 bfloat16 rope values.
FP8_DS_MLA_TOKEN_BYTES = 512 + 4 * 4 + 64 * 2


def attention_page_bytes(
    *,
    block_size: int,
    num_kv_heads: int,
    head_size: int,
    head_size_v: int,
    dtype: str,
    tokens_per_state: int | None = None,
    alignment: int | None = None,
) -> int:
    """Unpadded-then-aligned page bytes of an attention layer from plain integers.

    ``head_size_v`` is 0 for a latent (MLA) cache. ``alignment`` rounds the page
    up to a multiple of it. The page is linear in ``block_size`` before the
    alignment: ``attention_page_bytes(block_size=n*b, ...) == n *
    attention_page_bytes(block_size=b, ...)`` when ``alignment`` is None and
    ``tokens_per_state`` divides ``b``.

    >>> attention_page_bytes(block_size=16, num_kv_heads=8, head_size=128, head_size_v=128, dtype="bfloat16")
    65536
    >>> attention_page_bytes(block_size=64, num_kv_heads=1, head_size=576, head_size_v=0, dtype="bfloat16")
    73728
    """
    states = states_per_block(block_size, tokens_per_state)
    if dtype == "fp8_ds_mla":
        raw = num_kv_heads * states * FP8_DS_MLA_TOKEN_BYTES
    else:
        raw = num_kv_heads * states * (head_size + head_size_v) * DTYPE_BYTES[dtype]
    return rup(raw, alignment) if alignment else raw


def mamba_state_bytes(shapes: tuple[tuple[int, ...], ...], dtypes: tuple[str, ...]) -> int:
    """Bytes of one set of recurrent states: ``sum(prod(shape) * dtype_bytes)``.

    ``shapes`` and ``dtypes`` pair up one to one (the caller checks the lengths).

    >>> mamba_state_bytes(((36, 128, 128), (3, 9216)), ("float32", "bfloat16"))
    2414592
    """
    return sum(math.prod(shape) * DTYPE_BYTES[dt] for shape, dt in zip(shapes, dtypes, strict=True))


def missing_page_fields(spec: AnySpec) -> list[str]:
    """The shape fields a spec lacks for its page bytes (``[]`` when the page is known).

    A ``uniform`` container reports its layers' missing fields as
    ``layers[i].name``. A set ``page_size_padded`` makes every other field
    unnecessary.

    >>> missing_page_fields(FullAttentionSpec(block_size=16, num_kv_heads=8))
    ['head_size', 'dtype']
    """
    if spec.kind != "uniform" and getattr(spec, "page_size_padded", None) is not None:
        return []
    match spec:
        case UniformSpec():
            return [f"layers[{i}].{name}" for i, layer in enumerate(spec.layers) for name in missing_page_fields(layer)]
        case HiSparseHotSpec() | HiSparseResidentSpec():
            return [] if spec.page_size is not None else ["page_size"]
        case MambaSpec():
            missing = [name for name in ("shapes", "dtypes") if getattr(spec, name) is None]
            if spec.shapes is not None and spec.dtypes is not None and len(spec.shapes) != len(spec.dtypes):
                missing.append("dtypes")  # one dtype per state tensor: the pairing is incomplete
            return missing
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
            needed: tuple[str, ...] = ("head_size", "dtype")
            if not is_latent(spec):
                needed = ("num_kv_heads", *needed)
            if spec.dtype == "fp8_ds_mla":
                needed = ()
            return [name for name in needed if getattr(spec, name) is None]
        case _:
            assert_never(spec)


def maybe_page_bytes(spec: AnySpec) -> int | None:
    """Page bytes of one block of ``spec`` on one rank, or ``None`` if a shape field is missing.

    Contract: the result is ``page_size_padded`` when set; a ``uniform``
    container's page is the sum of its layers' pages (``None`` when any is
    unknown); otherwise the formula of the module docstring. Never raises on a
    valid spec.

    >>> maybe_page_bytes(MLASpec(block_size=64, head_size=576, dtype="bfloat16"))
    73728
    >>> maybe_page_bytes(MambaSpec(block_size=16)) is None
    True
    """
    if missing_page_fields(spec):
        return None
    match spec:
        case UniformSpec():
            pages = [maybe_page_bytes(layer) for layer in spec.layers]
            return None if any(p is None for p in pages) else sum(p for p in pages if p is not None)
        case HiSparseHotSpec() | HiSparseResidentSpec():
            return spec.page_size  # vLLM 0.33 gives the page bytes directly, whatever the block size
        case MambaSpec():
            if spec.page_size_padded is not None:
                return spec.page_size_padded
            assert spec.shapes is not None and spec.dtypes is not None  # checked by missing_page_fields
            return mamba_state_bytes(spec.shapes, spec.dtypes)
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
            if spec.page_size_padded is not None:
                return spec.page_size_padded
            latent = is_latent(spec)
            head_size = spec.head_size or 0
            head_size_v = 0 if latent else (getattr(spec, "head_size_v", None) or head_size)
            heads = (spec.num_kv_heads or 1) if latent else spec.num_kv_heads
            assert spec.dtype is not None and heads is not None  # checked by missing_page_fields
            return attention_page_bytes(
                block_size=spec.block_size,
                num_kv_heads=heads,
                head_size=head_size,
                head_size_v=head_size_v,
                dtype=spec.dtype,
                tokens_per_state=spec.tokens_per_state,
                alignment=getattr(spec, "alignment", None),
            )
        case _:
            assert_never(spec)


def page_bytes(spec: AnySpec, field: str = "") -> int:
    """Page bytes of one block of ``spec`` on one rank; :class:`kvgeom.ConfigError` when unknown.

    Same value as :func:`maybe_page_bytes`. ``field`` prefixes the error's field
    path (e.g. ``groups[1]``). The error has code ``missing_page_fields`` and
    lists every field to add.

    >>> page_bytes(FullAttentionSpec(block_size=16, num_kv_heads=2, head_size=64, dtype="float16"))
    8192
    >>> try:
    ...     page_bytes(FullAttentionSpec(block_size=16), "groups[0]")
    ... except ConfigError as e:
    ...     print(e.code, e.field, e.values["missing"])
    missing_page_fields groups[0] ['num_kv_heads', 'head_size', 'dtype']
    """
    missing = missing_page_fields(spec)
    if missing:
        raise ConfigError(
            Problem(
                "missing_page_fields",
                f"the page bytes of a {spec.kind} group need {', '.join(missing)}; add them (or page_size_padded)",
                field,
                {"missing": missing},
            )
        )
    result = maybe_page_bytes(spec)
    assert result is not None  # no field missing
    return result
