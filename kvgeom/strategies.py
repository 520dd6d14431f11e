"""Hypothesis strategies for kvgeom geometries (needs the ``strategies`` extra).

``import kvgeom`` never imports this module (nor Hypothesis); import it
explicitly in a test suite::

    from hypothesis import given
    from kvgeom.strategies import geometries

    @given(geometries(max_dcp=16))
    def test_my_connector_uses_the_span(g):
        ...

The strategies follow Hypothesis's own API conventions: plural names,
keyword-only arguments, ``min_value``/``max_value`` for bounds, and
:class:`hypothesis.errors.InvalidArgument` for arguments that make no sense.
Values are **valid by construction**: every dict :func:`configs` draws resolves
with :func:`kvgeom.resolve` without error (``tests/property`` checks it as a
law), so nothing is filtered away. Everything shrinks towards the simplest
geometry: a single ``full_attention`` group of block size ``min_block_size``
with every parallel size 1.

Construction never re-derives a geometry rule. Whether a group is sharded is
asked of :func:`kvgeom.specs.is_dcp_sharded`; the numbers that later choices
depend on (spans, L, H, offload chunks) are read from a first
:func:`kvgeom.resolve` of the config without those choices, then the dependent
fields (``sink_len``, ``prefix_match_unit``, ``tokens_per_state``, the offload
``block_size`` and ``retention_interval``) are picked as multiples or divisors
of what the geometry says.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from typing import Any

from hypothesis import Phase, find, settings
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument

from kvgeom._resolve import resolve
from kvgeom.geometry import Geometry
from kvgeom.parallel import ParallelConfig
from kvgeom.specs import (
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
    family,
    is_dcp_sharded,
    is_prefix_cacheable,
)

__all__ = [
    "ALL_KINDS",
    "block_sizes",
    "chunked_local_specs",
    "circular_buffer_specs",
    "encoder_only_specs",
    "hisparse_hot_specs",
    "hisparse_resident_specs",
    "rswa_specs",
    "configs",
    "cross_attention_specs",
    "dcp_sizes",
    "full_attention_specs",
    "geometries",
    "group_specs",
    "mamba_specs",
    "minimal",
    "mla_specs",
    "parallel_configs",
    "scenarios",
    "sink_full_attention_specs",
    "sliding_window_mla_specs",
    "sliding_window_specs",
    "uniform_specs",
]

#: Group kinds :func:`configs` can draw, simplest first (shrinking goes left).
ALL_KINDS: tuple[str, ...] = (
    "full_attention",
    "mla",
    "mamba",
    "uniform",
    "sliding_window",
    "sink_full_attention",
    "sliding_window_mla",
    "chunked_local",
    "cross_attention",
    "circular_buffer",
    "rswa",
    "hisparse_hot",
    "hisparse_resident",
    "encoder_only",
)

#: Block multipliers: group blocks are ``unit * m``, so L = lcm(spans) stays
#: bounded (at most ``unit * kv_shards * 24``) while spans still differ.
_MULTIPLIERS = (1, 2, 3, 4, 6, 8)

_MAX_DCP = 1024
_MAX_BLOCK = 1 << 16


# --------------------------------------------------------------------------- argument checks


def _check_int(name: str, value: Any, *, lo: int | None = None, hi: int | None = None) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise InvalidArgument(f"{name}={value!r} must be an integer, got {type(value).__name__}")
    if lo is not None and value < lo:
        raise InvalidArgument(f"{name}={value} must be >= {lo}")
    if hi is not None and value > hi:
        raise InvalidArgument(f"{name}={value} must be <= {hi}")
    return value


def _check_bounds(lo_name: str, lo: int, hi_name: str, hi: int) -> None:
    if lo > hi:
        raise InvalidArgument(f"{lo_name}={lo} must be <= {hi_name}={hi}")


def _check_bool(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise InvalidArgument(f"{name}={value!r} must be True or False")
    return value


def _as_strategy(name: str, value: Any, default: st.SearchStrategy[int]) -> st.SearchStrategy[int]:
    """A strategy argument as Hypothesis' own API takes it: a strategy, or None for the default.

    A plain int still works for now (deprecated since 0.3: pass ``st.just(value)``), with a
    :class:`DeprecationWarning` that names the argument and the replacement; anything else is refused with
    :class:`hypothesis.errors.InvalidArgument`.
    """
    if value is None:
        return default
    if isinstance(value, st.SearchStrategy):
        return value
    checked = _check_int(name, value, lo=1)
    warnings.warn(
        f"{name}={checked!r}: pass a strategy, e.g. {name}=st.just({checked}); plain values are deprecated "
        "since kvgeom 0.3 (Hypothesis' own API takes strategies)",
        DeprecationWarning,
        stacklevel=3,
    )
    return st.just(checked)


# --------------------------------------------------------------------------- exploring


def minimal(strategy: st.SearchStrategy[Any], condition: Any = None, *, max_examples: int = 2000) -> Any:
    """The simplest value of ``strategy`` satisfying ``condition`` (default: any value).

    :func:`hypothesis.find`, derandomized, without the example database and without the explain phase
    (which would run later, non-minimal values through ``condition``), so the answer is the
    shrunk value and does not depend on earlier runs. Handy to see what a strategy shrinks
    to, and to find the smallest geometry on which a rule of your own breaks.

    >>> minimal(configs())["groups"]
    [{'block_size': 1, 'kind': 'full_attention'}]
    """
    _check_int("max_examples", max_examples, lo=1)
    cond = (lambda _: True) if condition is None else condition
    return find(
        strategy,
        cond,
        settings=settings(
            database=None, max_examples=max_examples, derandomize=True, phases=[Phase.generate, Phase.shrink]
        ),
    )


# --------------------------------------------------------------------------- scalars


def block_sizes(*, min_value: int = 1, max_value: int = 4096) -> st.SearchStrategy[int]:
    """Per-rank block sizes in tokens, ``min_value <= b <= max_value``; shrinks to ``min_value``.

    >>> minimal(block_sizes(min_value=16, max_value=64), lambda b: b >= 20)
    20
    """
    _check_int("min_value", min_value, lo=1, hi=_MAX_BLOCK)
    _check_int("max_value", max_value, lo=1, hi=_MAX_BLOCK)
    _check_bounds("min_value", min_value, "max_value", max_value)
    return st.integers(min_value, max_value)


def dcp_sizes(*, min_value: int = 1, max_value: int = _MAX_DCP) -> st.SearchStrategy[int]:
    """Decode-context-parallel sizes: **any** integer in range (7 and 1000 as well as 2, 4, 8).

    Shrinks to ``min_value``.

    >>> minimal(dcp_sizes(), lambda d: d > 6)
    7
    """
    _check_int("min_value", min_value, lo=1, hi=_MAX_DCP)
    _check_int("max_value", max_value, lo=1, hi=_MAX_DCP)
    _check_bounds("min_value", min_value, "max_value", max_value)
    return st.integers(min_value, max_value)


def _divisors(n: int) -> list[int]:
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return small + [n // d for d in reversed(small) if d * d != n]


# --------------------------------------------------------------------------- parallel settings


def _sizes(draw: st.DrawFn, min_dcp: int, max_dcp: int, allow_pcp: bool) -> dict[str, Any]:
    """dcp, tp, pcp (and pp) combinations vLLM's ParallelConfig accepts (vLLM 0.33 `config/parallel.py`)."""
    if allow_pcp and draw(st.integers(0, 3)) == 3:
        pcp = draw(st.integers(2, 8))
        tp = draw(st.integers(1, 4))
        choices = sorted({x for x in (1, pcp, tp * pcp) if min_dcp <= x <= max_dcp})
        if choices:
            dcp = draw(st.sampled_from(choices))
            return {"dcp": dcp, "pcp": pcp, "tp": tp, "pcp_shards_kv": draw(st.booleans())}
    dcp = draw(dcp_sizes(min_value=min_dcp, max_value=max_dcp))
    out: dict[str, Any] = {"dcp": dcp, "tp": dcp * draw(st.integers(1, 4))}
    pp = draw(st.integers(1, 4))
    if pp > 1:
        out["pp"] = pp
    return out


def _kv_shards(p: dict[str, Any]) -> int:
    return ParallelConfig.model_validate(p).kv_shards


def _add_interleave(draw: st.DrawFn, p: dict[str, Any], sharded_block_sizes: tuple[int, ...]) -> dict[str, Any]:
    if _kv_shards(p) > 1 and sharded_block_sizes:
        p = {**p, "cp_interleave": draw(st.sampled_from(_divisors(math.gcd(*sharded_block_sizes))))}
    return p


@st.composite
def _parallel(
    draw: st.DrawFn, sharded_block_sizes: tuple[int, ...], min_dcp: int, max_dcp: int, allow_pcp: bool
) -> dict[str, Any]:
    return _add_interleave(draw, _sizes(draw, min_dcp, max_dcp, allow_pcp), sharded_block_sizes)


def parallel_configs(
    *,
    sharded_block_sizes: Sequence[int] = (),
    min_dcp: int = 1,
    max_dcp: int = _MAX_DCP,
    allow_pcp: bool = True,
) -> st.SearchStrategy[dict[str, Any]]:
    """``parallel`` tables vLLM accepts: ``tp`` a multiple of ``dcp`` (or the PCP combinations
    ``dcp in {1, pcp, tp*pcp}``), and a ``cp_interleave`` dividing every per-rank block in
    ``sharded_block_sizes`` (the DCP-sharded groups' blocks). Shrinks to all sizes 1.

    >>> minimal(parallel_configs(sharded_block_sizes=(16, 48), min_dcp=3, max_dcp=3), lambda p: p["cp_interleave"] > 1)
    {'dcp': 3, 'tp': 3, 'cp_interleave': 2}
    """
    blocks = tuple(_check_int("sharded_block_sizes[]", b, lo=1) for b in sharded_block_sizes)
    _check_int("min_dcp", min_dcp, lo=1, hi=_MAX_DCP)
    _check_int("max_dcp", max_dcp, lo=1, hi=_MAX_DCP)
    _check_bounds("min_dcp", min_dcp, "max_dcp", max_dcp)
    _check_bool("allow_pcp", allow_pcp)
    return _parallel(blocks, min_dcp, max_dcp, allow_pcp)


# --------------------------------------------------------------------------- specs, one kind at a time


def _spec_args(block_size: Any) -> st.SearchStrategy[int]:
    return _as_strategy("block_size", block_size, block_sizes(max_value=256))


def full_attention_specs(
    *, block_size: st.SearchStrategy[int] | None = None
) -> st.SearchStrategy[FullAttentionSpec]:
    """:class:`kvgeom.FullAttentionSpec` values (``block_size``: an int, a strategy, or default).

    >>> minimal(full_attention_specs()).block_size
    1
    """
    return st.builds(FullAttentionSpec, block_size=_spec_args(block_size))


def mla_specs(*, block_size: st.SearchStrategy[int] | None = None) -> st.SearchStrategy[MLASpec]:
    """:class:`kvgeom.MLASpec` values, main or indexer cache.

    >>> minimal(mla_specs(block_size=st.just(64)), lambda s: s.cache_role == "indexer").block_size
    64
    """
    return st.builds(MLASpec, block_size=_spec_args(block_size), cache_role=st.sampled_from([None, "indexer"]))


def sink_full_attention_specs(
    *, block_size: st.SearchStrategy[int] | None = None
) -> st.SearchStrategy[SinkFullAttentionSpec]:
    """:class:`kvgeom.SinkFullAttentionSpec` values whose ``sink_len`` is a whole number of
    per-rank blocks (:func:`configs` rescales it to whole spans).

    >>> minimal(sink_full_attention_specs(block_size=st.just(16)), lambda s: s.sink_len > 0).sink_len
    16
    """

    @st.composite
    def build(draw: st.DrawFn) -> SinkFullAttentionSpec:
        b = draw(_spec_args(block_size))
        return SinkFullAttentionSpec(block_size=b, sink_len=b * draw(st.integers(0, 4)))

    return build()


def sliding_window_specs(
    *, block_size: st.SearchStrategy[int] | None = None, max_window: int = 4096
) -> st.SearchStrategy[SlidingWindowSpec]:
    """:class:`kvgeom.SlidingWindowSpec` values, ``1 <= sliding_window <= max_window``.

    >>> wide = minimal(sliding_window_specs(block_size=st.just(16), max_window=8), lambda s: s.sliding_window > 4)
    >>> wide.sliding_window
    5
    """
    _check_int("max_window", max_window, lo=1)
    return st.builds(
        SlidingWindowSpec,
        block_size=_spec_args(block_size),
        sliding_window=st.integers(1, max_window),
        extra_retained_tokens=st.integers(0, 64),
    )


def sliding_window_mla_specs(
    *, block_size: st.SearchStrategy[int] | None = None, max_window: int = 4096
) -> st.SearchStrategy[SlidingWindowMLASpec]:
    """:class:`kvgeom.SlidingWindowMLASpec` values (``bounded_replay`` ones are not cacheable).

    >>> minimal(sliding_window_mla_specs(block_size=st.just(16)), lambda s: s.bounded_replay).kind
    'sliding_window_mla'
    """
    _check_int("max_window", max_window, lo=1)
    return st.builds(
        SlidingWindowMLASpec,
        block_size=_spec_args(block_size),
        sliding_window=st.integers(1, max_window),
        extra_retained_tokens=st.integers(0, 64),
        bounded_replay=st.booleans(),
    )


def chunked_local_specs(
    *, block_size: st.SearchStrategy[int] | None = None, max_chunk: int = 8192
) -> st.SearchStrategy[ChunkedLocalSpec]:
    """:class:`kvgeom.ChunkedLocalSpec` values, ``1 <= attention_chunk_size <= max_chunk``.

    >>> big = minimal(chunked_local_specs(block_size=st.just(16)), lambda s: s.attention_chunk_size > 100)
    >>> big.attention_chunk_size
    101
    """
    _check_int("max_chunk", max_chunk, lo=1)
    return st.builds(
        ChunkedLocalSpec, block_size=_spec_args(block_size), attention_chunk_size=st.integers(1, max_chunk)
    )


def cross_attention_specs(
    *, block_size: st.SearchStrategy[int] | None = None
) -> st.SearchStrategy[CrossAttentionSpec]:
    """:class:`kvgeom.CrossAttentionSpec` values (:func:`configs` makes them non-cacheable when offloading).

    >>> minimal(cross_attention_specs(block_size=st.just(16))).kind
    'cross_attention'
    """
    return st.builds(CrossAttentionSpec, block_size=_spec_args(block_size))


def circular_buffer_specs(
    *, block_size: st.SearchStrategy[int] | None = None
) -> st.SearchStrategy[CircularBufferSpec]:
    """:class:`kvgeom.CircularBufferSpec` values (never prefix-cacheable).

    >>> minimal(circular_buffer_specs(block_size=st.just(16))).kind
    'circular_buffer'
    """
    return st.builds(CircularBufferSpec, block_size=_spec_args(block_size))


def rswa_specs(
    *, block_size: st.SearchStrategy[int] | None = None, max_window: int = 4096
) -> st.SearchStrategy[RSWASpec]:
    """:class:`kvgeom.RSWASpec` values, ``0 <= rswa_window <= max_window`` (full attention for every
    geometry rule; only a decoding request's GPU row differs).

    >>> minimal(rswa_specs(block_size=st.just(16)), lambda s: s.rswa_window > 40).rswa_window
    41
    """
    _check_int("max_window", max_window, lo=0)
    return st.builds(RSWASpec, block_size=_spec_args(block_size), rswa_window=st.integers(0, max_window))


def hisparse_hot_specs(
    *, block_size: st.SearchStrategy[int] | None = None, max_blocks_per_request: int = 64
) -> st.SearchStrategy[HiSparseHotSpec]:
    """:class:`kvgeom.HiSparseHotSpec` values (never prefix-cacheable, never dealt over DCP).

    >>> minimal(hisparse_hot_specs(block_size=st.just(16))).blocks_per_request
    1
    """
    _check_int("max_blocks_per_request", max_blocks_per_request, lo=1)
    return st.builds(
        HiSparseHotSpec,
        block_size=_spec_args(block_size),
        blocks_per_request=st.integers(1, max_blocks_per_request),
        page_size=st.none() | st.integers(1, 1 << 20),
    )


def hisparse_resident_specs(
    *, block_size: st.SearchStrategy[int] | None = None
) -> st.SearchStrategy[HiSparseResidentSpec]:
    """:class:`kvgeom.HiSparseResidentSpec` values (never prefix-cacheable, never dealt over DCP).

    >>> minimal(hisparse_resident_specs(block_size=st.just(16))).kind
    'hisparse_resident'
    """
    return st.builds(
        HiSparseResidentSpec, block_size=_spec_args(block_size), page_size=st.none() | st.integers(1, 1 << 20)
    )


def encoder_only_specs(
    *, block_size: st.SearchStrategy[int] | None = None
) -> st.SearchStrategy[EncoderOnlySpec]:
    """:class:`kvgeom.EncoderOnlySpec` values (no cache the scheduler holds).

    >>> minimal(encoder_only_specs(block_size=st.just(16))).kind
    'encoder_only'
    """
    return st.builds(EncoderOnlySpec, block_size=_spec_args(block_size))


def _check_modes(name: str, modes: Sequence[str | None]) -> tuple[str | None, ...]:
    if isinstance(modes, str):
        raise InvalidArgument(f"{name}={modes!r} must be a sequence of modes, not a string")
    out = tuple(modes)
    if not out:
        raise InvalidArgument(f"{name} must name at least one mamba_cache_mode")
    for m in out:
        if m not in {None, "align", "none", "all"}:
            raise InvalidArgument(f"{name} contains {m!r}; use None, 'align', 'none' or 'all'")
    return out


def mamba_specs(
    *,
    block_size: st.SearchStrategy[int] | None = None,
    modes: Sequence[str | None] = (None, "align"),
    max_speculative_blocks: int = 2,
) -> st.SearchStrategy[MambaSpec]:
    """:class:`kvgeom.MambaSpec` values; ``modes`` are the ``mamba_cache_mode`` values to draw
    (``None`` means the config default). Shrinks to the default mode, no speculative blocks.

    >>> s = minimal(mamba_specs(block_size=st.just(16)), lambda s: s.num_speculative_blocks > 0)
    >>> s.mamba_cache_mode, s.num_speculative_blocks
    (None, 1)
    """
    modes = _check_modes("modes", modes)
    _check_int("max_speculative_blocks", max_speculative_blocks, lo=0)
    return st.builds(
        MambaSpec,
        block_size=_spec_args(block_size),
        mamba_cache_mode=st.sampled_from(modes),
        num_speculative_blocks=st.integers(0, max_speculative_blocks),
    )


_UNIFORM_SHAPES = ("mla_indexer", "full", "mamba")


def _uniform(draw: st.DrawFn, block: int, mamba_block: int, modes: tuple[str | None, ...]) -> UniformSpec:
    shape = draw(st.sampled_from(_UNIFORM_SHAPES))
    n = draw(st.integers(2, 3))
    if shape == "mla_indexer":
        return UniformSpec(block_size=block, layers=[{"kind": "mla"}, {"kind": "mla", "cache_role": "indexer"}])
    if shape == "full":
        return UniformSpec(block_size=block, layers=[{"kind": "full_attention"}] * n)
    mode = draw(st.sampled_from(modes))
    return UniformSpec(block_size=mamba_block, layers=[{"kind": "mamba", "mamba_cache_mode": mode}] * n)


def uniform_specs(
    *,
    block_size: st.SearchStrategy[int] | None = None,
    mamba_modes: Sequence[str | None] = (None, "align"),
) -> st.SearchStrategy[UniformSpec]:
    """``uniform`` containers as engines build them: MLA + its indexer (DSA models), several
    full-attention layers, or several Mamba leaves (one mode). The container carries the block size.

    >>> u = minimal(uniform_specs(block_size=st.just(64)), lambda u: u.layers[-1].kind == "mamba")
    >>> [x.kind for x in u.layers], {x.block_size for x in u.layers}
    (['mamba', 'mamba'], {64})
    """
    bs = _spec_args(block_size)
    modes = _check_modes("mamba_modes", mamba_modes)

    @st.composite
    def build(draw: st.DrawFn) -> UniformSpec:
        b = draw(bs)
        return _uniform(draw, b, b, modes)

    return build()


_KIND_STRATEGIES: dict[str, Any] = {
    "full_attention": full_attention_specs,
    "mla": mla_specs,
    "sink_full_attention": sink_full_attention_specs,
    "sliding_window": sliding_window_specs,
    "sliding_window_mla": sliding_window_mla_specs,
    "chunked_local": chunked_local_specs,
    "cross_attention": cross_attention_specs,
    "circular_buffer": circular_buffer_specs,
    "rswa": rswa_specs,
    "hisparse_hot": hisparse_hot_specs,
    "hisparse_resident": hisparse_resident_specs,
    "encoder_only": encoder_only_specs,
    "mamba": mamba_specs,
    "uniform": uniform_specs,
}


def _check_kinds(kinds: Sequence[str]) -> tuple[str, ...]:
    if isinstance(kinds, str):
        raise InvalidArgument(f"kinds={kinds!r} must be a sequence of kind names, not a string")
    out = tuple(kinds)
    if not out:
        raise InvalidArgument("kinds must name at least one group kind")
    for k in out:
        if k not in _KIND_STRATEGIES:
            raise InvalidArgument(f"unknown kind {k!r}; choose among {list(ALL_KINDS)}")
    return out


def group_specs(
    *, kinds: Sequence[str] = ALL_KINDS, block_size: st.SearchStrategy[int] | None = None
) -> st.SearchStrategy[AnySpec]:
    """A spec of any of ``kinds`` (each valid on its own; :func:`configs` makes whole
    configs valid). Shrinks towards the first kind listed.

    >>> minimal(group_specs()).kind
    'full_attention'
    """
    ks = _check_kinds(kinds)
    return st.one_of(*(_KIND_STRATEGIES[k](block_size=block_size) for k in ks))


# --------------------------------------------------------------------------- whole configs


def _dump(spec: AnySpec) -> dict[str, Any]:
    return spec.model_dump(mode="json", exclude_none=True)


_REPLICATED_UNDER_DCP = frozenset({"sliding", "chunked", "cross", "circular"})
_NOT_OFFLOADABLE_KINDS = frozenset(
    {"circular_buffer", "cross_attention", "hisparse_hot", "hisparse_resident", "encoder_only"}
)


@st.composite
def _configs(
    draw: st.DrawFn,
    *,
    kinds: tuple[str, ...],
    min_groups: int,
    max_groups: int,
    min_dcp: int,
    max_dcp: int,
    min_block_size: int,
    max_block_size: int,
    offload: bool | None,
    allow_pcp: bool,
    max_model_len: bool,
    prefix_caching: bool | None,
) -> dict[str, Any]:
    if prefix_caching is None:
        prefix_caching = not draw(st.booleans())  # shrinks to True, vLLM's default
    use_offload = draw(st.booleans()) if offload is None else offload
    sizes = _sizes(draw, min_dcp, max_dcp, allow_pcp)
    shards = _kv_shards(sizes)
    unit = draw(st.integers(min_block_size, max_block_size))
    blocks = st.sampled_from([m for m in _MULTIPLIERS if unit * m <= max_block_size]).map(lambda m: unit * m)
    # Every Mamba group shares one block: vLLM asserts one Mamba offload chunk, and in align mode
    # B_m equals the per-rank attention block (vLLM 0.33 `_align_hybrid_block_size`).
    mamba_block = draw(blocks)
    modes: tuple[str | None, ...] = (None, "align")
    if not prefix_caching:
        # None then means 'none'; a non-align Mamba group forces H = L, which forced offloading
        # over mixed spans cannot take, so offload=True keeps align mode.
        modes = ("align",) if use_offload else (None, "none", "align")

    @st.composite
    def group(draw: st.DrawFn, first: bool) -> AnySpec:
        # With forced offloading the first group is an offloadable kind, so there is something to offload.
        pool = [k for k in kinds if k not in _NOT_OFFLOADABLE_KINDS] if (first and offload) else kinds
        kind = draw(st.sampled_from(pool))
        # Drawn for every group, whatever its kind, so a shrink that changes the kind stays aligned.
        replicated_draft = draw(st.integers(0, 7)) == 7
        spec: AnySpec
        match kind:
            case "mamba":
                spec = draw(mamba_specs(block_size=st.just(mamba_block), modes=modes))
            case "uniform":
                spec = _uniform(draw, draw(blocks), mamba_block, modes)
            case "sink_full_attention":
                spec = SinkFullAttentionSpec(block_size=draw(blocks))  # sink_len once the span is known
            case "sliding_window_mla" if first and offload:
                spec = draw(sliding_window_mla_specs(block_size=blocks)).model_copy(update={"bounded_replay": False})
            case _:
                spec = draw(_KIND_STRATEGIES[kind](block_size=blocks))
        fam = family(spec)
        # Under DCP only full attention, MLA and Mamba may be dealt; the rest is replicated. Any
        # full-attention group may also be a replicated draft (vLLM MRV2 runs drafts at DCP 1).
        if (shards > 1 and fam in _REPLICATED_UNDER_DCP) or (fam == "full" and replicated_draft):
            spec = spec.model_copy(update={"dcp_sharded": False})
        if fam == "cross" and use_offload:
            spec = spec.model_copy(update={"prefix_cacheable": False})
        return spec

    # The groups after the first are a list, so the shrinker can delete any of them.
    specs: list[AnySpec] = [draw(group(True))]
    specs += draw(st.lists(group(False), min_size=min_groups - 1, max_size=max_groups - 1))
    # vLLM 0.33's model runner appends one encoder-only group after the groups the scheduler manages.
    encoder = [x for x in specs if family(x) == "encoder"]
    if encoder and len(specs) > 1:
        rest = [x for x in specs if family(x) != "encoder"]
        specs = [*rest, encoder[0]] if rest else [encoder[0]]
    sharded = tuple(s.block_size for s in specs if is_dcp_sharded(s))
    parallel = _add_interleave(draw, sizes, sharded)
    dumped = [_dump(s) for s in specs]
    cache: dict[str, Any] = {"prefix_caching": prefix_caching}
    cfg: dict[str, Any] = {"groups": dumped, "parallel": parallel, "cache": cache}
    if max_model_len:
        # In units of the block unit, so a failure that needs max_model_len > block shrinks both together.
        # (The remainder's range does not depend on unit, so lowering unit never misaligns it.)
        cache["max_model_len"] = unit * draw(st.integers(1, 4096)) + min(draw(st.integers(0, 4096)), unit - 1)

    # Second stage: read spans, L and H from kvgeom itself (with the connector on, which changes H
    # when prefix caching is off), then choose the fields that depend on them.
    use_offload = use_offload and any(is_prefix_cacheable(s) for s in specs)
    if use_offload:
        cfg["offload"] = {}
    geo = resolve(cfg)
    for g, d in zip(geo.groups, dumped, strict=True):
        if d["kind"] == "sink_full_attention":
            d["sink_len"] = g.span * draw(st.integers(0, 3))
    H = geo.hash_block_size
    cacheable = [g for g in geo.groups if g.prefix_cacheable]
    # Offloading needs tokens_per_block % tokens_per_hash == 0 for every offloaded group; that fails
    # only when a non-align Mamba group forces H = L over mixed spans, and with offloading every
    # Mamba group drawn above is in align mode.
    if use_offload:
        spans = {g.span for g in cacheable}
        k = draw(st.integers(1, 4))
        if len(spans) == 1 and draw(st.booleans()):
            cfg["offload"] = {"block_size": spans.pop() * k}
        else:
            cfg["offload"] = {"blocks_per_chunk": k} if k > 1 or draw(st.booleans()) else {}
    # a unit only where vLLM's scheduler sees two or more groups (not the encoder-only group it never sees)
    if len([s for s in specs if family(s) != "encoder"]) > 1 and draw(st.integers(0, 3)) == 3:
        H = draw(st.sampled_from(_divisors(H)))
        cache["prefix_match_unit"] = H
    for d in dumped:
        if d["kind"] in {"full_attention", "mla"} and draw(st.integers(0, 7)) == 7:
            # A (H or L) must be a multiple of tokens_per_state (H divides both), and a per-rank block must
            # hold a state (block_smaller_than_state: vLLM 0.33 cannot plan a 0-byte page).
            tps = [x for x in _divisors(H) if 1 < x <= d["block_size"]]
            if tps:
                d["tokens_per_state"] = draw(st.sampled_from(tps))
    retention = draw(st.sampled_from(["default", "zero", "dense", "interval"]))
    if retention == "zero":
        cache["retention_interval"] = 0
    elif retention == "dense":
        cache["retention_interval"] = None
    elif retention == "interval" and any(g.family in {"sliding", "mamba"} for g in geo.groups):
        # A multiple of L and of every windowed offloaded group's chunk (vLLM 0.33 `SchedulerOffloadConfig.from_spec`).
        r_unit = geo.scheduler_block_size
        if "offload" in cfg:
            off = resolve(cfg).offload
            if off is not None:
                fams = {g.index: g.family for g in geo.groups}
                for og in off.groups:
                    if fams[og.index] in {"sliding", "chunked", "mamba"}:
                        r_unit = math.lcm(r_unit, og.tokens_per_chunk)
        cache["retention_interval"] = r_unit * draw(st.integers(1, 4))
    return cfg


def configs(
    *,
    kinds: Sequence[str] = ALL_KINDS,
    min_groups: int = 1,
    max_groups: int = 4,
    min_dcp: int = 1,
    max_dcp: int = _MAX_DCP,
    min_block_size: int = 1,
    max_block_size: int = 1024,
    offload: bool | None = None,
    allow_pcp: bool = True,
    max_model_len: bool = True,
    prefix_caching: bool | None = None,
) -> st.SearchStrategy[dict[str, Any]]:
    """Whole config dicts that :func:`kvgeom.resolve` accepts, built valid by construction.

    Covers hybrids with one or more Mamba groups (all align-mode Mamba groups share one block,
    as vLLM requires), ``uniform`` containers (MLA + indexer, full-attention layers, Mamba
    leaves), sliding-window and other windowed groups replicated under DCP, replicated
    full-attention drafts, any DCP size in ``[min_dcp, max_dcp]`` (not only powers of two),
    PCP combinations vLLM accepts (when ``allow_pcp``), an interleave that divides every
    sharded block, offloading with ``blocks_per_chunk`` or ``block_size`` (``offload=None``:
    either way; ``True``/``False``: always/never), prefix caching on or off (``prefix_caching``
    likewise; off makes Mamba groups default to ``none`` mode), retention ``0``, dense (``None``) or a
    multiple of L and of every windowed offload chunk, ``prefix_match_unit`` dividing H and
    ``tokens_per_state`` dividing H.

    ``kinds`` restricts the group kinds; group blocks are ``unit * m`` with ``unit`` in
    ``[min_block_size, max_block_size]`` and ``m`` in ``{1, 2, 3, 4, 6, 8}`` (capped at
    ``max_block_size``). Shrinks to ``{"groups": [{"kind": "full_attention", "block_size":
    min_block_size}], ...}`` with every parallel size 1.

    >>> import kvgeom
    >>> cfg = minimal(configs(), lambda c: kvgeom.resolve(c).groups[-1].kind == "mamba" and c["parallel"]["dcp"] > 1)
    >>> [(g.kind, g.span) for g in kvgeom.resolve(cfg).groups]
    [('mamba', 1)]
    """
    ks = _check_kinds(kinds)
    _check_int("min_groups", min_groups, lo=1, hi=16)
    _check_int("max_groups", max_groups, lo=1, hi=16)
    _check_bounds("min_groups", min_groups, "max_groups", max_groups)
    _check_int("min_dcp", min_dcp, lo=1, hi=_MAX_DCP)
    _check_int("max_dcp", max_dcp, lo=1, hi=_MAX_DCP)
    _check_bounds("min_dcp", min_dcp, "max_dcp", max_dcp)
    _check_int("min_block_size", min_block_size, lo=1, hi=_MAX_BLOCK)
    _check_int("max_block_size", max_block_size, lo=1, hi=_MAX_BLOCK)
    _check_bounds("min_block_size", min_block_size, "max_block_size", max_block_size)
    if offload is not None:
        _check_bool("offload", offload)
    _check_bool("allow_pcp", allow_pcp)
    _check_bool("max_model_len", max_model_len)
    if prefix_caching is not None:
        _check_bool("prefix_caching", prefix_caching)
    if offload and set(ks) <= _NOT_OFFLOADABLE_KINDS:
        raise InvalidArgument(f"offload=True needs an offloadable kind, but kinds={list(ks)} has none")
    return _configs(
        kinds=ks,
        min_groups=min_groups,
        max_groups=max_groups,
        min_dcp=min_dcp,
        max_dcp=max_dcp,
        min_block_size=min_block_size,
        max_block_size=max_block_size,
        offload=offload,
        allow_pcp=allow_pcp,
        max_model_len=max_model_len,
        prefix_caching=prefix_caching,
    )


def geometries(**kwargs: Any) -> st.SearchStrategy[Geometry]:
    """Resolved :class:`kvgeom.Geometry` values: ``configs(**kwargs).map(kvgeom.resolve)``.

    >>> g = minimal(geometries(kinds=["mla"], max_groups=1, min_dcp=8, max_dcp=8))
    >>> g.groups[0].span, g.groups[0].block_size, g.kv_shards
    (8, 1, 8)
    """
    return configs(**kwargs).map(resolve)


# --------------------------------------------------------------------------- scenarios


def scenarios(geometry: Geometry, *, max_tokens: int = 2048) -> st.SearchStrategy[dict[str, Any]]:
    """Request scenarios for a resolved geometry: ``{"num_tokens", "local_computed_tokens", "evict"}``.

    ``num_tokens`` (at most ``max_tokens``) lands on, just before or just after a multiple of one of
    the geometry's units (L, H, each offload chunk), where boundary bugs live (#44599 is a prompt
    ending exactly on a chunk); ``local_computed_tokens`` is a local prefix (usually 0); ``evict`` is
    a list of booleans saying which stored keys the tier has lost, in ``(group, end_token)`` order,
    as :func:`kvgeom.sim.run_scenario` takes it. Shrinks to an empty request, nothing evicted.

    >>> import kvgeom
    >>> g = kvgeom.resolve(kvgeom.DEFAULT_CONFIG)
    >>> minimal(scenarios(g), lambda s: s["num_tokens"] > 40)
    {'num_tokens': 48, 'local_computed_tokens': 0, 'evict': []}
    """
    if not isinstance(geometry, Geometry):
        raise InvalidArgument(f"geometry must be a resolved kvgeom.Geometry, got {type(geometry).__name__}")
    _check_int("max_tokens", max_tokens, lo=0)
    units = {geometry.scheduler_block_size, geometry.hash_block_size}
    if geometry.offload is not None:
        units.update(og.tokens_per_chunk for og in geometry.offload.groups)
    units_sorted = sorted(units)

    @st.composite
    def build(draw: st.DrawFn) -> dict[str, Any]:
        unit = draw(st.sampled_from(units_sorted))
        q = draw(st.integers(0, max(max_tokens // unit, 0)))
        delta = draw(st.sampled_from([0, -1, 1]) | st.integers(-unit, unit))
        n = min(max(q * unit + delta, 0), max_tokens)
        local = draw(st.integers(0, n)) if draw(st.integers(0, 3)) == 3 else 0
        evict = draw(st.lists(st.booleans(), max_size=32)) if draw(st.integers(0, 2)) == 2 else []
        return {"num_tokens": n, "local_computed_tokens": local, "evict": evict}

    return build()
