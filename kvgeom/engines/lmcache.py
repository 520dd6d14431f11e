"""LMCache 0.5.6's copy of the KV-cache geometry, as kvgeom answers it for a resolved vLLM geometry.

LMCache runs beside vLLM (its multiprocess connector) and derives its own geometry from vLLM's group
specs instead of reading vLLM's resolved one. This module answers that derivation for a resolved
:class:`kvgeom.Geometry` plus LMCache's own settings (:class:`LMCacheSettings`: chunk size, servers,
model name, max batched tokens), and names every place where it parts from vLLM's geometry.

The rules (established by running LMCache 0.5.6's functions on vLLM 0.33's real spec objects:
``kvgeom conform --engine lmcache``, ``kvgeom/conformance/lmcache_engine.py``):

* **span** (:func:`lmcache_span`): tokens one block id of a group covers. 0 for a group vLLM does not
  prefix-cache ("scratch"); ``block_size * dcp`` for every group whose vLLM spec class derives from
  attention (full, MLA, sink, sliding window, chunked local, cross attention), *whether or not vLLM
  shards it over DCP*; ``block_size`` for Mamba. A uniform group counts as its first layer.
* **the groups it sees** (:func:`lmcache_spans`): vLLM builds LMCache's connectors (scheduler and worker) before
  its model runner appends the encoder-only group, so an ``encoder_only`` group never reaches LMCache (kvgeom
  gives it span 0, like a scratch group); with no other group LMCache falls back to one group of
  ``cache block_size * dcp`` tokens and its worker fails to register (:data:`FINDINGS` ``encoder-only-model``).
  ``rswa`` is an attention class and keeps every block of a chunk, as full attention; HiSparse hot and
  resident groups are scratch groups (span 0).
* **scheduler block** (:func:`scheduler_block`): the lcm of the non-zero spans, which LMCache's adapters
  use as vLLM's block size and to which it rounds vLLM's prefix-cache hits; LMCache warns when it is
  more than :data:`COARSE_FACTOR` times the largest span (:func:`is_coarse`).
* **chunk**: a stored object covers ``chunk_size`` tokens (256 by default), a multiple of every non-zero
  span, or the scheduler-side connector refuses to start; partial chunks are never stored.
* **identity** (:func:`cache_identity`): the model name, plus a DCP layout suffix naming the DCP size and
  the interleave when DCP > 1 and the interleave is not 1 (:data:`DCP_LAYOUT_TAG`).
* **block ids of a chunk** (:func:`slice_block_ids`): group g's ids for tokens ``[start, end)`` are
  ``ids[start // span : end // span]``; a scratch group gets none; a range off a group's span grid is
  refused.
* **hold-back**: with a Mamba group in ``align``/``all`` mode LMCache's lookup holds back a prompt's
  last token (:func:`lookup_end`).
* **refusals** (:func:`lmcache_geometry` raises :class:`LMCacheRefusal`, checked in the connector's
  order): Mamba step alignment (one Mamba block size; ``max_num_batched_tokens`` >= it), the groups it
  cannot serve (cross attention; Mamba outside ``align``/``all``), no cacheable group, then DCP support
  (no PCP with DCP; the interleave divides every attention block, replicated ones included; each server
  holds a whole set of DCP shards), the servers (they divide ``tp * pp * pcp``; one server under PP), the
  chunk-size rule, and then, on the workers, a span must be a multiple of the states one block holds
  (:func:`states_per_block`) and a window smaller than the chunk must be on its span grid.
* **staging** (:func:`stage_block_ids`): per chunk LMCache stores and loads only the last
  ``min(chunk_size, window) // span`` block ids of a windowed group (:func:`window_tokens`: a sliding
  window's ``sliding_window``, a Mamba group's block), all of them otherwise.
* **relocation window** (:func:`relocation_window`): with align-mode Mamba and speculative decoding LMCache
  nulls a tracked block slot vLLM moved within the last ``num_speculative_tokens`` slots (LMCache #5004).
* **chunk map** (:func:`chunk_map`, :func:`chunks_of_key`, :func:`lmcache_chunk_of_block`): LMCache's chunk
  hash chain in kvgeom's terms: chunk c fingerprints ``[0, (c+1)*C)`` like vLLM's request hash
  ``(c+1)*C // H - 1``, and holds each group's block ids of its tokens.

Where it parts from vLLM (:data:`FINDINGS`, :func:`partings`): LMCache does not read vLLM's per-group
``dcp_sharded``, so a replicated attention-class group under DCP (a sliding window, an explicitly
replicated group, a drafter) gets a span DCP times too wide; its scheduler block and hit alignment follow;
its interleave check counts replicated groups vLLM does not deal; its staging reads the spec's
``sliding_window``, not vLLM's window need widened by ``extra_retained_tokens``; its workers refuse a
sub-chunk window off the span grid, and compressed attention whose span is off its states-per-block
grid; its scheduler block leaves out scratch groups; with ``save_decode_cache`` it stores decode chunks
of a reference sliding-window group from blocks vLLM has freed (:func:`decode_stored_freed`); its
workers fail on an encoder-only model.

Invariants (``tests/test_engines_lmcache.py``, property tests):

* every span is 0 or a multiple of the group's block size; a span is 0 iff the group is not
  prefix-cacheable;
* the scheduler block is a multiple of every non-zero span, and the smallest such;
* at DCP 1 LMCache's spans equal vLLM's (:func:`partings` names no span finding);
* :func:`slice_block_ids` over consecutive ranges concatenates to the ids of the whole range;
* :func:`partings` names a registered :data:`FINDINGS` id for every difference it reports.

>>> import kvgeom
>>> geom = kvgeom.resolve({"groups": [{"kind": "full_attention", "block_size": 16},
...     {"kind": "sliding_window", "block_size": 16, "sliding_window": 64, "dcp_sharded": False}],
...     "parallel": {"tp": 2, "dcp": 2}})
>>> lm = lmcache_geometry(geom, LMCacheSettings(chunk_size=256))
>>> lm.spans, [g.span for g in geom.groups], lm.scheduler_block
((32, 32), [32, 16], 32)
>>> [p.finding for p in partings(geom)]
['replicated-attention-span']
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kvgeom import specs
from kvgeom._check import bounded_ints
from kvgeom._format import show
from kvgeom.errors import KVGeomError, Problem, QueryError
from kvgeom.geometry import Geometry, GroupGeometry
from kvgeom.hits import rswa_gap_blocks
from kvgeom.keys import OffloadKey, boundary_hash_index, chunk_for_end_token, offload_group
from kvgeom.masks import reachable_block_mask
from kvgeom.prefill import engine_block_size
from kvgeom.specs import iter_leaves, rswa_window_of, sliding_window_of, tokens_per_state_of

__all__ = [
    "COARSE_FACTOR",
    "ChunkCover",
    "DCP_LAYOUT_TAG",
    "DEFAULT_CHUNK_SIZE",
    "FINDINGS",
    "LMCACHE_VERSION",
    "LMCacheFinding",
    "LMCacheGeometry",
    "LMCacheRangeError",
    "LMCacheRefusal",
    "LMCacheSettings",
    "LMCacheSettingsError",
    "Parting",
    "cache_identity",
    "chunk_map",
    "chunks_of_key",
    "decode_store_partings",
    "decode_stored_freed",
    "identities_collide",
    "is_attention_class",
    "is_coarse",
    "lmcache_geometry",
    "lmcache_span",
    "lmcache_spans",
    "lmcache_chunk_of_block",
    "lookup_end",
    "partings",
    "partings_of",
    "reaches_lmcache",
    "relocation_window",
    "scheduler_block",
    "sheet",
    "slice_block_ids",
    "stage_block_ids",
    "staged_blocks_per_chunk",
    "states_per_block",
    "staging_partings",
    "window_tokens",
]

LMCACHE_VERSION = "0.5.6"
"""The LMCache release this model was checked against."""

DEFAULT_CHUNK_SIZE = 256
"""LMCache's default tokens per stored object."""

COARSE_FACTOR = 4
"""LMCache warns when its scheduler block exceeds this many times the largest span."""

DCP_LAYOUT_TAG = "##lmcache-dcp-layout-v1-"
"""The separator LMCache puts between the model name and the DCP layout in a cache identity (an observed
value: identities must match LMCache's byte for byte)."""

_NOT_ATTENTION = frozenset({"mamba"})


class LMCacheSettingsError(KVGeomError):
    """LMCache's own settings are malformed (a chunk size, server count or batch budget that is not a
    positive integer)."""


class LMCacheRefusal(KVGeomError):
    """LMCache 0.5.6 refuses to serve this deployment (its connector raises at start-up)."""


class LMCacheRangeError(KVGeomError):
    """A token range LMCache cannot map to block ids (off a group's span grid, or reversed)."""


def _positive(name: str, value: Any, fix: str) -> None:
    if type(value) is not int or value < 1:
        raise LMCacheSettingsError.single(
            f"bad_lmcache_{name}", f"LMCache {name} must be a positive integer, got {show(value, 60)}; {fix}",
            f"lmcache.{name}", **{name: value},
        )


@dataclass(frozen=True, slots=True)
class LMCacheSettings:
    """LMCache's own settings for one deployment.

    ``chunk_size``: tokens per stored object (LMCache's default 256). ``servers``: LMCache servers the
    deployment's ranks are split over. ``model``: the model name LMCache's identity starts from.
    ``max_num_batched_tokens``: vLLM's per-step token budget (LMCache checks it against the Mamba block).
    ``save_decode_cache``: store chunks of generated tokens too (LMCache's default: prompt chunks only).

    >>> LMCacheSettings(chunk_size=0)
    Traceback (most recent call last):
    ...
    kvgeom.engines.lmcache.LMCacheSettingsError: lmcache.chunk_size: LMCache chunk_size must be a positive ...
    """

    chunk_size: int = DEFAULT_CHUNK_SIZE
    servers: int = 1
    model: str = "model"
    max_num_batched_tokens: int = 8192
    save_decode_cache: bool = False
    """LMCache's ``lmcache.mp.save_decode_cache``: store chunks holding generated tokens too (default: only
    whole chunks of the prompt)."""

    def __post_init__(self) -> None:
        _positive("chunk_size", self.chunk_size, "use a multiple of every group's span (LMCache's default is 256)")
        _positive("servers", self.servers, "use 1 or the number of LMCache servers of the deployment")
        _positive("max_num_batched_tokens", self.max_num_batched_tokens, "use vLLM's --max-num-batched-tokens")
        if type(self.save_decode_cache) is not bool:
            raise LMCacheSettingsError.single(
                "bad_lmcache_save_decode_cache",
                f"LMCache save_decode_cache must be true or false, got {show(self.save_decode_cache, 60)}",
                "lmcache.save_decode_cache", save_decode_cache=self.save_decode_cache,
            )
        if not isinstance(self.model, str) or not self.model:
            raise LMCacheSettingsError.single(
                "bad_lmcache_model", f"LMCache model must be a non-empty string, got {show(self.model, 60)}",
                "lmcache.model", model=self.model,
            )


def _leaf_kind(g: GroupGeometry) -> str:
    layers = getattr(g.spec, "layers", None)
    return str(layers[0].kind) if layers else g.kind


def is_attention_class(g: GroupGeometry) -> bool:
    """Whether vLLM's spec class of ``g`` (its first layer's, for a uniform group) derives from attention:
    every kind but Mamba. LMCache decides the span by this class rule, not by ``dcp_sharded``."""
    return _leaf_kind(g) not in _NOT_ATTENTION


def lmcache_span(g: GroupGeometry, dcp: int) -> int:
    """Tokens one block id of ``g`` covers as LMCache 0.5.6 computes it.

    0 when vLLM does not prefix-cache the group; ``block_size * dcp`` for an attention-class group;
    ``block_size`` for Mamba. Invariant: 0 or a multiple of ``g.block_size``.

    >>> import kvgeom
    >>> geom = kvgeom.resolve(kvgeom.DEFAULT_CONFIG)
    >>> [lmcache_span(g, geom.parallel.dcp) for g in geom.groups]
    [32, 16]
    """
    if not g.prefix_cacheable:
        return 0
    if dcp > 1 and is_attention_class(g):
        return g.block_size * dcp
    return g.block_size


def reaches_lmcache(g: GroupGeometry) -> bool:
    """Whether LMCache's connectors see group ``g``: every group but an encoder-only one, which vLLM 0.33's
    model runner appends to its own copy of the KV-cache config after the connectors are built (the worker's
    connector is initialised first, and the scheduler's config never has the group)."""
    return g.family != "encoder"


def lmcache_spans(geom: Geometry) -> tuple[int, ...]:
    """LMCache 0.5.6's span of every vLLM group of ``geom`` (:func:`lmcache_span`; 0 for an encoder-only group,
    which LMCache never sees). When no group reaches LMCache (an encoder-only model), LMCache falls back to its
    single-group rule: one group of vLLM's cache block size times DCP
    (:func:`kvgeom.prefill.engine_block_size`), reported at the position of the encoder-only group.
    Invariant: one entry per vLLM group; every entry 0 or a multiple of the group's block size.

    >>> import kvgeom
    >>> lmcache_spans(kvgeom.resolve({"groups": [{"kind": "full_attention", "block_size": 16},
    ...     {"kind": "encoder_only", "block_size": 16}], "parallel": {"tp": 2, "dcp": 2}}))
    (32, 0)
    >>> lmcache_spans(kvgeom.resolve({"groups": [{"kind": "encoder_only", "block_size": 16}],
    ...     "parallel": {"tp": 2, "dcp": 2}}))
    (32,)
    """
    dcp = geom.parallel.dcp
    if not any(reaches_lmcache(g) for g in geom.groups):
        return tuple(engine_block_size(geom) * dcp for _ in geom.groups)
    return tuple(lmcache_span(g, dcp) if reaches_lmcache(g) else 0 for g in geom.groups)


#: Most spans :func:`scheduler_block` and :func:`is_coarse` read (one per group; a config has at most
#: :data:`kvgeom.config.MAX_ITEMS` groups).
MAX_SPANS = 10_000


def scheduler_block(spans: Sequence[int]) -> int:
    """LMCache's scheduler block: the lcm of the non-zero spans. :class:`LMCacheRefusal` when every span
    is 0 (no group LMCache can store).

    >>> scheduler_block([32, 0, 48])
    96
    """
    spans = bounded_ints("spans", spans, MAX_SPANS, "spans[]", "spans")
    live = [s for s in spans if s > 0]
    if not live:
        raise LMCacheRefusal.single(
            "lmcache_no_cacheable_group",
            f"LMCache needs at least one prefix-cacheable group, but every group's span is 0 ({show(spans)}); "
            "do not put LMCache in front of a deployment without a prefix-cacheable group",
            "groups", spans=list(spans),
        )
    return math.lcm(*live)


def is_coarse(spans: Sequence[int]) -> bool:
    """Whether LMCache warns that its scheduler block is too coarse (more than :data:`COARSE_FACTOR` times
    the largest non-zero span: near-coprime spans).

    >>> is_coarse([48, 64]), is_coarse([32, 16])
    (False, False)
    >>> is_coarse([112, 144])
    True
    """
    live = [s for s in bounded_ints("spans", spans, MAX_SPANS, "spans[]", "spans") if s > 0]
    return bool(live) and scheduler_block(live) > COARSE_FACTOR * max(live)


def cache_identity(model: str, dcp: int, interleave: int) -> str:
    """LMCache's cache identity: ``model`` alone at DCP 1 or interleave 1, else ``model`` plus a DCP layout
    suffix with the DCP size and the interleave.

    >>> cache_identity("m", 1, 16), cache_identity("m", 2, 1)
    ('m', 'm')
    >>> cache_identity("m", 2, 16)
    'm##lmcache-dcp-layout-v1-d2-interleave16'
    """
    if dcp <= 1 or interleave == 1:
        return model
    return f"{model}{DCP_LAYOUT_TAG}d{dcp}-interleave{interleave}"


def window_tokens(g: GroupGeometry) -> int | None:
    """LMCache's cross-chunk window of ``g`` in tokens (its ``sw_size_tokens``): the ``sliding_window`` of a
    sliding-window group (not widened by vLLM's ``extra_retained_tokens``), the block size of a Mamba group
    in ``align``/``all`` mode (a one-block window: a restore reads only the last state), None for every
    other group (LMCache keeps all of its blocks).

    >>> import kvgeom
    >>> geom = kvgeom.resolve({"groups": [{"kind": "full_attention", "block_size": 16},
    ...     {"kind": "sliding_window", "block_size": 16, "sliding_window": 64},
    ...     {"kind": "mamba", "block_size": 32, "mamba_cache_mode": "align"}]})
    >>> [window_tokens(g) for g in geom.groups]
    [None, 64, 32]
    """
    sw = sliding_window_of(g.spec)
    if sw is not None:
        return sw[0]
    if _leaf_kind(g) == "mamba" and g.mamba_mode in ("align", "all"):
        return g.block_size
    return None


def staged_blocks_per_chunk(g: GroupGeometry, dcp: int, chunk_size: int) -> int:
    """Block ids of ``g`` LMCache stages (stores, and loads back) per chunk of ``chunk_size`` tokens: the
    chunk's last ``min(chunk_size, window) // span`` ids for a windowed group (:func:`window_tokens`), all
    ``chunk_size // span`` otherwise, 0 for a scratch group. Invariant: at most ``chunk_size // span``.

    >>> import kvgeom
    >>> geom = kvgeom.resolve({"groups": [{"kind": "full_attention", "block_size": 32},
    ...     {"kind": "sliding_window", "block_size": 32, "sliding_window": 64}]})
    >>> [staged_blocks_per_chunk(g, 1, 128) for g in geom.groups]  # LMCache's own docstring example
    [4, 2]
    """
    span = lmcache_span(g, dcp)
    if span == 0:
        return 0
    w = window_tokens(g)
    tokens = chunk_size if w is None or w >= chunk_size else w
    return tokens // span


@dataclass(frozen=True, slots=True)
class LMCacheGeometry:
    """LMCache's geometry of one deployment (:func:`lmcache_geometry`).

    ``spans``: per vLLM group, tokens per block id (0: scratch). ``scheduler_block``: lcm of the non-zero
    spans (also LMCache's hit alignment). ``coarse``: LMCache warns about it. ``chunk_blocks``: block ids
    of each group per chunk. ``identity``: the cache identity. ``holds_back_last_token``: a Mamba group in
    align/all mode. ``dcp``/``interleave``: the layout the identity should encode.
    """

    spans: tuple[int, ...]
    scheduler_block: int
    coarse: bool
    chunk_size: int
    chunk_blocks: tuple[int, ...]
    identity: str
    holds_back_last_token: bool
    dcp: int
    interleave: int
    windows: tuple[int | None, ...] = ()
    """Per group, LMCache's cross-chunk window in tokens (:func:`window_tokens`; None: no window)."""
    staged_blocks: tuple[int, ...] = ()
    """Per group, the block ids LMCache stages per chunk (:func:`staged_blocks_per_chunk`)."""
    relocation_window: int = 0
    """Tail block slots LMCache checks for a block vLLM moved (:func:`relocation_window`)."""

    @property
    def layout(self) -> tuple[int, int, tuple[int, ...]]:
        """What a stored object's bytes depend on here: DCP size, interleave, spans."""
        return (self.dcp, self.interleave, self.spans)


def _cache_mamba_mode(geom: Geometry) -> str:
    modes = {g.mamba_mode for g in geom.groups if g.mamba_mode is not None}
    return str(modes.pop()) if len(modes) == 1 else "none"


def _refuse(code: str, message: str, fld: str, **values: Any) -> LMCacheRefusal:
    return LMCacheRefusal(Problem(code, message, fld, values))


def _check_mamba_step(geom: Geometry, s: LMCacheSettings) -> None:
    if _cache_mamba_mode(geom) != "align":
        return
    sizes = sorted({g.block_size for g in geom.groups if _leaf_kind(g) == "mamba"})
    if len(sizes) > 1:
        raise _refuse("lmcache_mamba_block_sizes",
                      f"LMCache needs one block size for every Mamba group, got {sizes}; give the Mamba groups "
                      "one mamba_block_size", "groups", block_sizes=sizes)
    block = sizes[0] if sizes else 0
    if s.max_num_batched_tokens < block:
        raise _refuse("lmcache_mamba_step",
                      f"LMCache needs max_num_batched_tokens >= the Mamba block ({block}) so every prefill step "
                      f"advances a whole block, got {s.max_num_batched_tokens}; raise --max-num-batched-tokens "
                      f"to at least {block}", "lmcache.max_num_batched_tokens",
                      block_size=block, max_num_batched_tokens=s.max_num_batched_tokens)


def _check_groups(geom: Geometry) -> None:
    bad = []
    for g in geom.groups:
        kind = _leaf_kind(g)
        if kind == "cross_attention":
            bad.append(Problem("lmcache_unsupported_group",
                               f"LMCache does not serve group {g.index} (cross attention); run it without LMCache",
                               f"groups[{g.index}]", {"group": g.index}))
        elif kind == "mamba" and g.mamba_mode not in ("align", "all"):
            bad.append(Problem("lmcache_unsupported_group",
                               f"LMCache does not serve group {g.index} (Mamba, mamba_cache_mode={g.mamba_mode!r}): "
                               "it keeps no per-block state; set mamba_cache_mode='align'",
                               f"groups[{g.index}].mamba_cache_mode", {"group": g.index}))
    if bad:
        raise LMCacheRefusal(bad)


def _check_dcp(geom: Geometry, s: LMCacheSettings) -> None:
    p = geom.parallel
    if p.dcp <= 1:
        return
    if p.pcp > 1:
        raise _refuse("lmcache_dcp_with_pcp",
                      f"LMCache does not serve prefill context parallelism together with DCP (pcp={p.pcp}, "
                      f"dcp={p.dcp}); use pcp=1 or dcp=1", "parallel.pcp", pcp=p.pcp, dcp=p.dcp)
    interleave = p.cp_interleave
    blocks = sorted({g.block_size for g in geom.groups if is_attention_class(g) and g.prefix_cacheable})
    bad = [b for b in blocks if interleave > b or b % interleave]
    if bad:
        raise _refuse("lmcache_interleave",
                      f"LMCache needs cp_interleave ({interleave}) to divide every attention group's block, "
                      f"replicated groups included; these do not: {bad}; use an interleave dividing {blocks}",
                      "parallel.cp_interleave", interleave=interleave, block_sizes=bad)
    world = p.tp * p.pp
    if world // s.servers < p.dcp:
        raise _refuse("lmcache_servers",
                      f"each LMCache server must hold a whole set of DCP shards: {s.servers} server(s) over "
                      f"{world} rank(s) leave {world // s.servers} per server, fewer than dcp={p.dcp}; use at "
                      f"most {world // p.dcp} server(s)", "lmcache.servers",
                      servers=s.servers, ranks=world, dcp=p.dcp)


def _check_servers(geom: Geometry, s: LMCacheSettings) -> None:
    p = geom.parallel
    world = p.tp * p.pp * p.pcp
    if world % s.servers:
        # an ``assert`` in LMCache 0.5.6's connector: python -O skips it and the ranks are split unevenly
        raise _refuse("lmcache_servers_split",
                      f"LMCache splits the {world} rank(s) (tp*pp*pcp) evenly over its servers, but {s.servers} "
                      f"server(s) do not divide them; use a number of servers dividing {world}", "lmcache.servers",
                      servers=s.servers, ranks=world)
    if s.servers > 1 and p.pp > 1:
        raise _refuse("lmcache_servers_pp",
                      f"LMCache serves several servers ({s.servers}) with tensor parallelism only, not pipeline "
                      f"parallelism (pp={p.pp}); use one server or pp=1", "lmcache.servers",
                      servers=s.servers, pp=p.pp)


def _check_chunk(spans: Sequence[int], s: LMCacheSettings) -> None:
    for i, span in enumerate(spans):
        if span and s.chunk_size % span:
            raise _refuse("lmcache_chunk_size",
                          f"LMCache chunk_size {s.chunk_size} must be a multiple of group {i}'s span {span}; "
                          f"use a multiple of {scheduler_block(spans)}", "lmcache.chunk_size",
                          chunk_size=s.chunk_size, group=i, span=span)


def states_per_block(g: GroupGeometry) -> int:
    """Rows one vLLM block of ``g`` holds (its first layer's, for a uniform group): ``block_size //
    tokens_per_state`` for compressed attention, ``block_size`` otherwise. This is the per-block dimension of
    the cache tensor vLLM 0.33 hands its KV connectors (the manager-block view), which LMCache's workers read
    as the slots of a block. 0 when the layer compresses more tokens than its block holds (vLLM's page is then
    0 bytes and vLLM cannot plan the cache). Invariant: ``0 <= states_per_block(g) <= g.block_size``.

    >>> import kvgeom
    >>> geom = kvgeom.resolve({"groups": [{"kind": "full_attention", "block_size": 7, "tokens_per_state": 2}],
    ...     "parallel": {"tp": 2, "dcp": 2}})
    >>> states_per_block(geom.groups[0])
    3
    """
    return specs.states_per_block(g.block_size, tokens_per_state_of(next(iter(iter_leaves(g.spec)))))


def _check_registration(geom: Geometry, spans: Sequence[int], s: LMCacheSettings) -> None:
    """The workers' registration, group by group in LMCache's order: the span on the slot grid, then the
    window on the span grid (the chunk rule is the connector's, checked before)."""
    for g, span in zip(geom.groups, spans, strict=True):
        slots = states_per_block(g)
        if span and slots and span % slots:  # slots 0: vLLM itself cannot plan the cache, no registration
            tps = tokens_per_state_of(next(iter(iter_leaves(g.spec))))
            raise _refuse("lmcache_compressed_grid",
                          f"LMCache's workers refuse group {g.index} ({g.kind}): its span {span} is not a multiple of "
                          f"the {slots} states vLLM keeps per {g.block_size}-token block (tokens_per_state {tps}); "
                          f"use a block_size that is a multiple of tokens_per_state ({tps})",
                          f"groups[{g.index}].block_size",
                          group=g.index, span=span, states_per_block=slots, block_size=g.block_size,
                          tokens_per_state=tps)
        w = window_tokens(g)
        if span and w is not None and 0 < w < s.chunk_size and w % span:
            raise _refuse("lmcache_window_grid",
                          f"LMCache's workers refuse group {g.index} ({g.kind}): its window {w} is smaller than the "
                          f"chunk ({s.chunk_size}) and not a multiple of its span {span}; use a chunk_size no larger "
                          f"than the window ({w}), or a window that is a multiple of {span}", f"groups[{g.index}]",
                          group=g.index, window=w, span=span, chunk_size=s.chunk_size)


def _check_worker_groups(geom: Geometry) -> None:
    if any(reaches_lmcache(g) for g in geom.groups):
        return
    raise _refuse("lmcache_worker_no_kv_cache",
                  "LMCache's workers cannot register an encoder-only model: vLLM hands its connectors no KV-cache "
                  "group and no KV cache (the model runner appends the encoder-only group afterwards), and "
                  "LMCache's registration fails on the empty set (StopIteration); run an encoder-only model "
                  "without LMCache (it keeps no KV cache to store)", "groups",
                  groups=[g.kind for g in geom.groups])


def relocation_window(geom: Geometry) -> int:
    """Tail block slots LMCache's request tracker checks for a block vLLM moved: the number of speculative
    tokens when the cache's Mamba mode is ``align`` and speculative decoding is on, else 0 (LMCache #5004:
    with MTP, vLLM keeps one speculative Mamba block per draft token at the tail of the block list and moves
    the state block; LMCache nulls the old slot so that chunk is not stored from an unwritten block).

    >>> import kvgeom
    >>> cfg = {"groups": [{"kind": "full_attention", "block_size": 16},
    ...     {"kind": "mamba", "block_size": 16, "mamba_cache_mode": "align"}],
    ...     "speculative": {"method": "mtp", "num_speculative_tokens": 2}}
    >>> relocation_window(kvgeom.resolve(cfg))
    2
    """
    spec = geom.config.speculative
    if spec is None or _cache_mamba_mode(geom) != "align":
        return 0
    return int(spec.num_speculative_tokens)


def lmcache_geometry(geom: Geometry, settings: LMCacheSettings | None = None) -> LMCacheGeometry:
    """LMCache 0.5.6's geometry of the deployment ``geom`` under ``settings`` (defaults:
    :class:`LMCacheSettings`), or :class:`LMCacheRefusal` with the first check its connector fails, in
    its order: Mamba step, groups, spans and scheduler block, DCP support, chunk size, then the workers'
    registration (an encoder-only model; a span off the states-per-block grid; a window off the span grid).

    >>> import kvgeom
    >>> lm = lmcache_geometry(kvgeom.resolve(kvgeom.DEFAULT_CONFIG))
    >>> lm.spans, lm.scheduler_block, lm.chunk_blocks, lm.holds_back_last_token
    ((32, 16), 32, (8, 16), True)
    >>> lmcache_geometry(kvgeom.resolve(kvgeom.DEFAULT_CONFIG), LMCacheSettings(chunk_size=48)).spans
    Traceback (most recent call last):
    ...
    kvgeom.engines.lmcache.LMCacheRefusal: lmcache.chunk_size: LMCache chunk_size 48 must be a multiple of ...
    """
    if settings is not None and not isinstance(settings, LMCacheSettings):
        raise QueryError.single(
            "bad_settings", f"settings must be an LMCacheSettings or None, got {type(settings).__name__}", "settings"
        )
    s = settings if settings is not None else LMCacheSettings()
    p = geom.parallel
    _check_mamba_step(geom, s)
    _check_groups(geom)
    spans = lmcache_spans(geom)
    block = scheduler_block(spans)
    _check_dcp(geom, s)
    _check_servers(geom, s)
    _check_chunk(spans, s)
    _check_worker_groups(geom)
    _check_registration(geom, spans, s)
    return LMCacheGeometry(
        spans=spans,
        scheduler_block=block,
        coarse=is_coarse(spans),
        chunk_size=s.chunk_size,
        chunk_blocks=tuple(s.chunk_size // span if span else 0 for span in spans),
        identity=cache_identity(s.model, p.dcp, p.cp_interleave),
        holds_back_last_token=any(g.mamba_mode in ("align", "all") for g in geom.groups),
        dcp=p.dcp,
        interleave=p.cp_interleave,
        windows=tuple(window_tokens(g) for g in geom.groups),
        staged_blocks=tuple(staged_blocks_per_chunk(g, p.dcp, s.chunk_size) for g in geom.groups),
        relocation_window=relocation_window(geom),
    )


def identities_collide(a: LMCacheGeometry, b: LMCacheGeometry) -> bool:
    """Whether two deployments share LMCache's identity while their layouts (DCP size, interleave, spans)
    differ: objects one stores would be found by the other. Symmetric; False for equal layouts.

    >>> import kvgeom
    >>> one = lmcache_geometry(kvgeom.resolve({"groups": [{"kind": "full_attention", "block_size": 16}]}))
    >>> two = lmcache_geometry(kvgeom.resolve({"groups": [{"kind": "full_attention", "block_size": 16}],
    ...                                        "parallel": {"tp": 2, "dcp": 2}}))
    >>> one.identity == two.identity, identities_collide(one, two)
    (True, True)
    """
    return a.identity == b.identity and a.layout != b.layout


def slice_block_ids(
    block_ids: Mapping[int, Sequence[int]], spans: Sequence[int], start: int, end: int
) -> list[list[int]]:
    """Each group's block ids for tokens ``[start, end)`` as LMCache maps them: group g's
    ``ids[start // span : end // span]``; a span-0 group and a group missing from ``block_ids`` get none.
    :class:`LMCacheRangeError` when ``start`` or ``end`` is off a group's span grid, or ``end < start``.

    >>> slice_block_ids({0: [10, 11, 12, 13], 1: [20, 21]}, [16, 32], 32, 64)
    [[12, 13], [21]]
    """
    if end < start:
        raise LMCacheRangeError.single("lmcache_range_reversed", f"range end {end} is before its start {start}; "
                                       "pass start <= end", "end", start=start, end=end)
    out: list[list[int]] = []
    for g, span in enumerate(spans):
        if span == 0:
            out.append([])
            continue
        if start % span or end % span:
            raise LMCacheRangeError.single(
                "lmcache_range_unaligned",
                f"token range [{start}, {end}) is off group {g}'s span grid ({span}); use multiples of {span} "
                "(LMCache's chunks are)", "start", start=start, end=end, group=g, span=span,
            )
        out.append(list(block_ids.get(g, ())[start // span:end // span]))
    return out


def stage_block_ids(lm: LMCacheGeometry, block_ids: Mapping[int, Sequence[int]], num_chunks: int) -> list[list[int]]:
    """The block ids LMCache stages for ``num_chunks`` whole chunks from tokens 0: for each group, the ids
    LMCache slices for each chunk (:func:`slice_block_ids`), cut to the chunk's last ``lm.staged_blocks[g]``
    for a windowed group (a sliding window smaller than the chunk, a Mamba group). What is not staged is
    neither stored nor loaded back. Invariant: each group's list has ``num_chunks * lm.staged_blocks[g]`` ids,
    each one of that chunk's slice.

    >>> import kvgeom
    >>> lm = lmcache_geometry(kvgeom.resolve({"groups": [{"kind": "full_attention", "block_size": 32},
    ...     {"kind": "sliding_window", "block_size": 32, "sliding_window": 64}]}), LMCacheSettings(chunk_size=128))
    >>> stage_block_ids(lm, {0: [1, 2, 3, 4, 5, 6, 7, 8], 1: [11, 12, 13, 14, 15, 16, 17, 18]}, 2)
    [[1, 2, 3, 4, 5, 6, 7, 8], [13, 14, 17, 18]]
    """
    if type(num_chunks) is not int or num_chunks < 0:
        raise QueryError.single("bad_num_chunks", f"num_chunks must be a non-negative integer, got "
                                f"{show(num_chunks, 60)}", "num_chunks", num_chunks=num_chunks)
    out: list[list[int]] = [[] for _ in lm.spans]
    for c in range(num_chunks):
        sliced = slice_block_ids(block_ids, lm.spans, c * lm.chunk_size, (c + 1) * lm.chunk_size)
        for g, ids in enumerate(sliced):
            keep = lm.staged_blocks[g]
            out[g].extend(ids[len(ids) - keep:] if keep else [])
    return out


@dataclass(frozen=True, slots=True)
class ChunkCover:
    """What one LMCache chunk (one stored object, one link of its hash chain) covers in kvgeom's terms
    (:func:`chunk_map`).

    ``chunk``: its index; ``start``/``end``: its tokens ``[start, end)`` (its hash fingerprints ``[0, end)``).
    ``hash_index``: the vLLM request hash that fingerprints the same prefix (``end // H - 1``), None when
    ``end`` is off the hash grid. ``blocks``: per group, the block-table entries vLLM holds those tokens in
    (vLLM's span); ``lmcache_blocks``: the entries LMCache maps the chunk to (its span; they differ where a
    span finding applies); ``staged``: the entries LMCache stages (the tail of ``lmcache_blocks`` for a
    windowed group). ``keys``: kvgeom's offload keys (vLLM's offloading connector) whose token range lies
    inside the chunk, empty without an offload section.
    """

    chunk: int
    start: int
    end: int
    hash_index: int | None
    blocks: tuple[range, ...]
    lmcache_blocks: tuple[range, ...]
    staged: tuple[range, ...]
    keys: tuple[OffloadKey, ...]


def _offload_keys_in(geom: Geometry, start: int, end: int) -> tuple[OffloadKey, ...]:
    if geom.offload is None:
        return ()
    keys = []
    for og in geom.offload.groups:
        c = og.tokens_per_chunk
        for j in range(-(-start // c), end // c):
            keys.append(OffloadKey(boundary_hash_index(geom, (j + 1) * c), og.index))
    return tuple(keys)


def chunk_map(geom: Geometry, num_tokens: int, settings: LMCacheSettings | None = None) -> list[ChunkCover]:
    """LMCache's chunks of a ``num_tokens`` prompt mapped to kvgeom's keys and block ranges: one
    :class:`ChunkCover` per whole chunk (``num_tokens // chunk_size`` of them: a partial chunk is never
    hashed nor stored). :class:`LMCacheRefusal` when LMCache refuses the deployment.

    Invariants: chunk c covers ``[c*C, (c+1)*C)``; consecutive chunks tile ``[0, num_tokens // C * C)``;
    ``hash_index`` is ``(c+1)*C // H - 1`` when H divides ``(c+1)*C``; every offload key of a prompt whose range
    ends by the last whole chunk lies in exactly one chunk when its chunk size divides C. The reverse is
    :func:`chunks_of_key` and :func:`lmcache_chunk_of_block`.

    >>> import kvgeom
    >>> geom = kvgeom.resolve({**kvgeom.DEFAULT_CONFIG, "offload": {"blocks_per_chunk": 4}})
    >>> c = chunk_map(geom, 600)
    >>> len(c), (c[1].start, c[1].end, c[1].hash_index), c[1].blocks, c[1].staged
    (2, (256, 512, 31), (range(8, 16), range(16, 32)), (range(8, 16), range(31, 32)))
    >>> [k.hash_index for k in c[1].keys if k.group == 0]  # group 0's 128-token keys ending at 384 and 512
    [23, 31]
    """
    lm = lmcache_geometry(geom, settings)
    n = num_tokens
    if type(n) is not int or n < 0:
        raise QueryError.single("bad_num_tokens", f"num_tokens must be a non-negative integer, got {show(n, 60)}",
                                "num_tokens", num_tokens=n)
    C = lm.chunk_size
    h = geom.hash_block_size
    out = []
    for c in range(n // C):
        start, end = c * C, (c + 1) * C
        ours = tuple(range(start // g.span, end // g.span) if g.prefix_cacheable else range(0) for g in geom.groups)
        theirs = tuple(range(start // sp, end // sp) if sp else range(0) for sp in lm.spans)
        staged = tuple(range(r.stop - k, r.stop) for r, k in zip(theirs, lm.staged_blocks, strict=True))
        out.append(ChunkCover(c, start, end, end // h - 1 if end % h == 0 else None, ours, theirs, staged,
                              _offload_keys_in(geom, start, end)))
    return out


def chunks_of_key(geom: Geometry, key: OffloadKey, settings: LMCacheSettings | None = None) -> range:
    """The LMCache chunks that hold the tokens of kvgeom's offload key ``key`` (the reverse of
    :func:`chunk_map`): those meeting the key's range ``[j*C_g, (j+1)*C_g)``. One chunk when the key's
    chunk size divides LMCache's and both grids start at 0; :class:`kvgeom.QueryError` when ``key`` names no
    chunk end of its group.

    >>> import kvgeom
    >>> from kvgeom.keys import OffloadKey
    >>> geom = kvgeom.resolve({**kvgeom.DEFAULT_CONFIG, "offload": {"blocks_per_chunk": 4}})
    >>> chunks_of_key(geom, OffloadKey(31, 0)), chunks_of_key(geom, OffloadKey(15, 0))
    (range(1, 2), range(0, 1))
    """
    lm = lmcache_geometry(geom, settings)
    og = offload_group(geom, key.group)
    end = (key.hash_index + 1) * geom.hash_block_size
    j = chunk_for_end_token(geom, key.group, end) if key.hash_index >= 0 else None
    if j is None:
        raise QueryError.single(
            "not_a_chunk_key", f"hash index {key.hash_index} of group {key.group} ends at token {end}, not at a "
            f"multiple of the group's offload chunk ({og.tokens_per_chunk}); it names no offload key", "key",
            hash_index=key.hash_index, group=key.group)
    start = j * og.tokens_per_chunk
    C = lm.chunk_size
    return range(start // C, -(-end // C))


def lmcache_chunk_of_block(geom: Geometry, group: int, entry: int, settings: LMCacheSettings | None = None) -> int:
    """The LMCache chunk that stores block-table entry ``entry`` of ``group`` (LMCache's span: ``entry *
    span // C``). It is the chunk of vLLM's tokens for that entry only when LMCache's span equals vLLM's
    (:func:`partings` names the finding otherwise). :class:`kvgeom.QueryError` for a scratch group.

    >>> import kvgeom
    >>> lmcache_chunk_of_block(kvgeom.resolve(kvgeom.DEFAULT_CONFIG), 1, 20)
    1
    """
    lm = lmcache_geometry(geom, settings)
    g = geom.group(group)
    span = lm.spans[g.index]
    if type(entry) is not int or entry < 0:
        raise QueryError.single("bad_entry", f"entry must be a non-negative integer, got {show(entry, 60)}",
                                "entry", entry=entry)
    if span == 0:
        raise QueryError.single("lmcache_scratch_group", f"group {group} ({g.kind}) is not prefix-cacheable: "
                                "LMCache stores none of its blocks", "group", group=group)
    return entry * span // lm.chunk_size


def lookup_end(lm: LMCacheGeometry, num_tokens: int) -> int:
    """How far LMCache's lookup of a ``num_tokens`` prompt can reach: whole chunks only (partial chunks are
    never stored), after holding back the last token when a Mamba group snapshots (align/all).
    Invariant: a multiple of ``lm.chunk_size``, at most ``num_tokens``.

    >>> import kvgeom
    >>> lm = lmcache_geometry(kvgeom.resolve(kvgeom.DEFAULT_CONFIG))
    >>> lookup_end(lm, 512), lookup_end(lm, 513)
    (256, 512)
    """
    n = num_tokens - 1 if lm.holds_back_last_token and num_tokens > 0 else num_tokens
    return n // lm.chunk_size * lm.chunk_size


DECODE_PROBE_CHUNKS = 2
"""Chunks of generated tokens :func:`decode_stored_freed` follows after a one-chunk prompt."""


def decode_stored_freed(geom: Geometry, settings: LMCacheSettings | None = None) -> dict[int, list[int]]:
    """For each reference sliding-window (``rswa``) group, the block-table entries LMCache stores that vLLM has
    already freed, on a probe request: a prompt of one chunk ``C`` decoded one token per step for
    :data:`DECODE_PROBE_CHUNKS` more chunks. With ``save_decode_cache`` LMCache stores chunk c (tokens
    ``[c*C, (c+1)*C)``) in the step that computes its last token, from the block ids it tracked when they were
    allocated; vLLM has by then freed the generated tokens' blocks older than ``rswa_window``
    (:func:`kvgeom.hits.rswa_gap_blocks` after ``(c+1)*C - 1`` tokens). Empty lists without
    ``save_decode_cache`` (LMCache stores prompt chunks only, which vLLM never frees) and for a window of at
    least ``C - span`` tokens; no entry for a group whose span LMCache and vLLM disagree on (a span finding),
    ``{}`` without an ``rswa`` group or when LMCache refuses the deployment.

    >>> import kvgeom
    >>> geom = kvgeom.resolve({"groups": [{"kind": "full_attention", "block_size": 16},
    ...     {"kind": "rswa", "block_size": 16, "rswa_window": 40}]})
    >>> decode_stored_freed(geom, LMCacheSettings(save_decode_cache=True))[1][:3]
    [16, 17, 18]
    >>> decode_stored_freed(geom)
    {1: []}
    """
    try:
        lm = lmcache_geometry(geom, settings)
    except LMCacheRefusal:
        return {}
    s = settings if settings is not None else LMCacheSettings()
    C = lm.chunk_size
    out: dict[int, list[int]] = {}
    for g in geom.groups:
        if rswa_window_of(g.spec) is None or not lm.spans[g.index]:
            continue
        span = lm.spans[g.index]
        if span != g.span:
            continue  # LMCache and vLLM index the group's blocks differently: a span finding, not this one
        freed: list[int] = []
        if s.save_decode_cache:
            for c in range(1, 1 + DECODE_PROBE_CHUNKS):
                gap = rswa_gap_blocks(geom, g.index, C, (c + 1) * C - 1)
                freed += [b for b in range(c * C // span, (c + 1) * C // span) if b in gap]
        out[g.index] = freed
    return out


def decode_store_partings(
    geom: Geometry, settings: LMCacheSettings | None = None, stored_freed: Mapping[int, Sequence[int]] | None = None
) -> list[Parting]:
    """The ``rswa-decode-store`` partings: an ``rswa`` group some of whose freed blocks LMCache stores
    (:func:`decode_stored_freed`, or ``stored_freed`` as the installed LMCache and vLLM answered it).

    >>> import kvgeom
    >>> geom = kvgeom.resolve({"groups": [{"kind": "rswa", "block_size": 16, "rswa_window": 40}]})
    >>> [(p.finding, p.lmcache, p.vllm) for p in decode_store_partings(geom, LMCacheSettings(save_decode_cache=True))]
    [('rswa-decode-store', 26, 0)]
    """
    found = decode_stored_freed(geom, settings) if stored_freed is None else stored_freed
    s = settings if settings is not None else LMCacheSettings()
    out = []
    for gi, blocks in sorted(found.items()):
        if not blocks:
            continue
        g = geom.group(gi)
        base = (f"group {gi} ({g.kind}, rswa_window {rswa_window_of(g.spec)}): with "
                f"save_decode_cache LMCache stores {len(blocks)} block(s) vLLM has already freed over "
                f"{DECODE_PROBE_CHUNKS} decode chunks of {s.chunk_size} tokens (entries {show(list(blocks))})")
        out.append(Parting("rswa-decode-store", "decode_stored_freed", gi, len(blocks), 0,
                           _explain("rswa-decode-store", base)))
    return out


# --------------------------------------------------------------------------- where LMCache parts from vLLM


@dataclass(frozen=True, slots=True)
class LMCacheFinding:
    """One registered place where LMCache 0.5.6's geometry parts from vLLM 0.33's.

    ``rule``: LMCache's rule; ``vllm``: what vLLM does; ``consequence``: which blocks are stored or loaded
    wrongly; ``fix``: what to do; ``reproducer``: a minimal kvgeom config (plus ``lmcache`` settings under
    the key ``"lmcache"``) that hits it.
    """

    id: str
    title: str
    rule: str
    vllm: str
    consequence: str
    fix: str
    reproducer: dict[str, Any] = field(default_factory=dict)
    reports: str = ""
    harms: bool = True
    """Whether hitting it stores or loads wrong blocks, or stops the deployment (``kvgeom check --lmcache``
    warns); False for a cost only (extra transfers), which conformance and the docs still report."""


_SWA_DCP = {
    "groups": [
        {"kind": "full_attention", "block_size": 16},
        {"kind": "sliding_window", "block_size": 16, "sliding_window": 64, "dcp_sharded": False},
    ],
    "parallel": {"tp": 2, "dcp": 2},
}

_ALL_FINDINGS = (
    LMCacheFinding(
        "replicated-attention-span",
        "A replicated attention group under DCP gets a span DCP times too wide",
        "LMCache's span of a group is block_size * dcp for every spec class derived from attention; it does "
        "not read the spec's dcp_sharded.",
        "vLLM deals only DCP-sharded groups over the DCP ranks; a replicated group (a sliding window, a group "
        "with dcp_sharded false, a drafter's group) keeps span = block_size.",
        "LMCache maps chunk c (tokens [c*C, (c+1)*C)) to the group's block ids of tokens [c*C/dcp, "
        "(c+1)*C/dcp): each stored object holds that group's KV of other positions than its key says, and a "
        "load writes it back there.",
        "Until LMCache takes spans from vLLM's resolved groups (the LMCache #4809 -> #4834 line), run such a "
        "deployment with dcp=1 behind LMCache, or without LMCache.",
        _SWA_DCP,
        "LMCache #4809, #4821, #4834",
    ),
    LMCacheFinding(
        "pcp-sharded-span",
        "LMCache's span ignores PCP where PCP shards the KV cache",
        "LMCache's span of an attention group is block_size * dcp; it does not read PCP.",
        "Where PCP deals the KV cache too (pcp_shards_kv: the design before vLLM #46570), vLLM's span of a "
        "sharded group is block_size * dcp * pcp.",
        "LMCache maps a chunk to pcp times too many block ids of the group (ids past the ones a chunk owns), "
        "storing and loading the group's KV at the wrong positions.",
        "Run such a deployment with pcp=1 behind LMCache (vLLM 0.33's PCP does not shard the KV cache).",
        {"groups": [{"kind": "full_attention", "block_size": 16}],
         "parallel": {"pcp": 2, "pcp_shards_kv": True}},
        "vLLM #46570",
    ),
    LMCacheFinding(
        "scheduler-block",
        "LMCache's scheduler block differs from vLLM's",
        "LMCache's scheduler block is the lcm of its own spans, and its adapters use it as vLLM's block size.",
        "vLLM's scheduler block is the lcm of its resolved spans (Geometry.scheduler_block_size).",
        "LMCache aligns chunk boundaries and scheduler steps on a different grid from vLLM's.",
        "Follows from a span difference: fix that one (see replicated-attention-span, pcp-sharded-span).",
        {"groups": [{"kind": "full_attention", "block_size": 16},
                    {"kind": "sliding_window", "block_size": 32, "sliding_window": 64, "dcp_sharded": False}],
         "parallel": {"tp": 2, "dcp": 2}},
        "LMCache #4834",
    ),
    LMCacheFinding(
        "hit-alignment",
        "LMCache rounds vLLM's prefix-cache hits to a different unit",
        "LMCache rounds vLLM's prefix-cache hit count down to the lcm of its own spans before skipping that "
        "many tokens of a retrieve.",
        "vLLM's prefix-cache hits are multiples of Geometry.hit_alignment_tokens.",
        "A vLLM hit that is a multiple of vLLM's unit but not of LMCache's is cut: LMCache loads again up to "
        "(its unit - vLLM's unit) tokens vLLM already holds (extra transfers, same bytes when the keys agree).",
        "None needed for correctness; a finer LMCache unit needs LMCache to read vLLM's hit alignment.",
        {"groups": [{"kind": "full_attention", "block_size": 16},
                    {"kind": "mamba", "block_size": 16, "mamba_cache_mode": "align"}], "parallel": {"tp": 2, "dcp": 2}},
        harms=False,
    ),
    LMCacheFinding(
        "scheduler-block-scratch",
        "LMCache's scheduler block leaves out scratch groups, vLLM's counts them",
        "LMCache's scheduler block is the lcm of its non-zero spans: a group vLLM does not prefix-cache "
        "(span 0 for LMCache) takes no part.",
        "vLLM's scheduler block is the lcm of every group's span, ring-buffer scratch groups included "
        "(Geometry.scheduler_block_size).",
        "LMCache's chunk-size check and the block size its adapters take for vLLM's are finer than vLLM's "
        "scheduler block; no cached group is affected (a scratch group is never stored).",
        "None needed for correctness; pick a chunk_size that is a multiple of vLLM's scheduler block too.",
        {"groups": [{"kind": "full_attention", "block_size": 1}, {"kind": "circular_buffer", "block_size": 2}]},
        harms=False,
    ),
    LMCacheFinding(
        "interleave-replicated-group",
        "LMCache's interleave check counts replicated attention groups",
        "LMCache refuses a DCP deployment when cp_interleave does not divide every non-scratch attention "
        "group's block, replicated groups included.",
        "vLLM deals only DCP-sharded groups, so only their blocks must be multiples of the interleave "
        "(kvgeom's rule; docs/deviations.md interleave-per-sharded-group).",
        "LMCache refuses to start a deployment vLLM runs (no data is harmed).",
        "Give the replicated group a block that the interleave divides, or lower cp_interleave.",
        {
            "groups": [
                {"kind": "full_attention", "block_size": 16},
                {"kind": "sliding_window", "block_size": 8, "sliding_window": 64, "dcp_sharded": False},
            ],
            "parallel": {"tp": 2, "dcp": 2, "cp_interleave": 16},
        },
    ),
    LMCacheFinding(
        "window-staging-short",
        "LMCache stages fewer sliding-window blocks per chunk than vLLM needs before a hit",
        "LMCache keeps, per chunk, the last min(chunk_size, sliding_window) // span block ids of a "
        "sliding-window group (its sw_size_tokens is the spec's sliding_window) and stages only those: the "
        "others are neither stored nor loaded back.",
        "vLLM needs cdiv(sliding_window - 1 + extra_retained_tokens, span) blocks before a hit (the retained "
        "tokens of speculative decoding widen the window; its own offloading connector stores that many).",
        "With extra_retained_tokens >= 2 the oldest block(s) vLLM keeps for a restored prefix are not written by "
        "LMCache's load: the positions vLLM retains for speculative decoding hold whatever the GPU block held "
        "before.",
        "Use a chunk_size no larger than the sliding window (LMCache then stages every block of each chunk), or "
        "run speculative decoding on such a model without LMCache until LMCache reads vLLM's window need.",
        {"groups": [{"kind": "full_attention", "block_size": 16},
                    {"kind": "sliding_window", "block_size": 16, "sliding_window": 64, "extra_retained_tokens": 2}]},
    ),
    LMCacheFinding(
        "window-staging-extra",
        "LMCache stages sliding-window blocks vLLM would not keep",
        "LMCache keeps the last min(chunk_size, sliding_window) // span block ids of each chunk.",
        "vLLM keeps cdiv(sliding_window - 1 + extra_retained_tokens, span) blocks before a hit; with a window "
        "on the span grid that is one block fewer than sliding_window // span only when the span is 1 token.",
        "LMCache stores and loads one block per chunk more than vLLM needs (extra transfers, no wrong data).",
        "None needed for correctness.",
        {"groups": [{"kind": "full_attention", "block_size": 1},
                    {"kind": "sliding_window", "block_size": 1, "sliding_window": 8}], "lmcache": {"chunk_size": 8}},
        harms=False,
    ),
    LMCacheFinding(
        "window-grid",
        "LMCache's workers refuse a sliding window smaller than the chunk and off its span grid",
        "At registration LMCache refuses a group whose window (sw_size_tokens) is smaller than chunk_size and "
        "not a multiple of the group's span (block_size * dcp for an attention class).",
        "vLLM runs any window: a hit needs cdiv(sliding_window - 1, span) blocks before it.",
        "The workers raise when they register their KV caches; nothing is stored (the scheduler side started).",
        "Use a chunk_size no larger than the window, or a window that is a multiple of the span.",
        {"groups": [{"kind": "full_attention", "block_size": 16},
                    {"kind": "sliding_window", "block_size": 16, "sliding_window": 40}]},
    ),
    LMCacheFinding(
        "compressed-grid",
        "LMCache's workers refuse compressed attention whose span is off its states-per-block grid",
        "At registration LMCache refuses a group whose span (block_size * dcp for an attention class) is not a "
        "multiple of the rows one block of its cache tensor holds (block_size // tokens_per_state for "
        "compressed attention).",
        "vLLM plans the cache: a prefix-cache hit needs only its hit alignment to be a multiple of "
        "tokens_per_state, so under DCP a per-rank block that tokens_per_state does not divide is accepted.",
        "The workers raise when they register their KV caches; nothing is stored (the scheduler side started).",
        "Use a block_size that is a multiple of tokens_per_state.",
        {"groups": [{"kind": "full_attention", "block_size": 7, "tokens_per_state": 2}],
         "parallel": {"tp": 2, "dcp": 2}, "lmcache": {"chunk_size": 224}},
    ),
    LMCacheFinding(
        "rswa-decode-store",
        "With save_decode_cache LMCache stores reference sliding-window blocks vLLM has freed",
        "With lmcache.mp.save_decode_cache LMCache stores each chunk of generated tokens when its last token is "
        "computed, from the block ids it tracked at allocation; it treats an rswa group as full attention.",
        "vLLM frees the blocks of an rswa group's generated tokens older than rswa_window while the request "
        "decodes (its row holds the null block there; kvgeom.hits.rswa_gap_blocks).",
        "The stored chunk holds, for those entries, blocks vLLM has returned to its free pool (another request "
        "can be given them); a later request sharing the prefix loads that KV as its own.",
        "Leave save_decode_cache off (LMCache's default) on models with an rswa group, or use a chunk_size no "
        "larger than rswa_window + the group's span.",
        {"groups": [{"kind": "full_attention", "block_size": 16}, {"kind": "rswa", "block_size": 16,
                                                                    "rswa_window": 40}],
         "lmcache": {"save_decode_cache": True}},
    ),
    LMCacheFinding(
        "encoder-only-model",
        "LMCache's workers fail on an encoder-only model",
        "LMCache's connectors are built from vLLM's KV-cache config before vLLM's model runner appends the "
        "encoder-only group; given no group, its scheduler side falls back to one group of the cache block size "
        "times DCP, and its workers' registration raises StopIteration on the empty set of KV caches.",
        "vLLM keeps no KV cache of an encoder-only group (no scheduler manager, no cache tensor) and runs the "
        "model.",
        "The workers fail when they register their KV caches (an uncaught StopIteration, not a refusal message); "
        "nothing is stored. Beside any other group the encoder-only group is simply not seen, with no finding.",
        "Run an encoder-only model without LMCache: it keeps no KV cache LMCache could store.",
        {"groups": [{"kind": "encoder_only", "block_size": 16}]},
    ),
    LMCacheFinding(
        "refuses",
        "LMCache refuses a deployment vLLM runs",
        "LMCache's start-up checks: Mamba step alignment, the groups it serves (no cross attention; Mamba only "
        "in align/all mode), at least one cacheable group, DCP support (no PCP with DCP; servers hold whole "
        "shard sets), servers dividing the ranks (tp*pp*pcp; an assert) and no pipeline parallelism over several "
        "servers, chunk size a multiple of every span.",
        "vLLM runs the deployment.",
        "The connector raises at start-up; nothing is stored.",
        "The refusal's message names the setting to change.",
        {"groups": [{"kind": "full_attention", "block_size": 16}], "lmcache": {"chunk_size": 24}},
    ),
)

FINDINGS: dict[str, LMCacheFinding] = {f.id: f for f in _ALL_FINDINGS}
"""Every registered LMCache finding by id, in documentation order (docs/engines/lmcache.md states each)."""


@dataclass(frozen=True, slots=True)
class Parting:
    """One place where LMCache's answer for a deployment differs from vLLM's: the registered finding
    (``None`` when no registered rule explains it), the group (``None`` for a whole-deployment answer),
    the question, both numbers, and a message naming LMCache's rule, the consequence and the fix."""

    finding: str | None
    question: str
    group: int | None
    lmcache: Any
    vllm: Any
    message: str

    @property
    def code(self) -> str:
        return f"lmcache_{(self.finding or 'unregistered').replace('-', '_')}"


def _explain(fid: str, base: str) -> str:
    f = FINDINGS[fid]
    return f"{base}; LMCache rule: {f.rule} Consequence: {f.consequence} Fix: {f.fix}"


def partings_of(geom: Geometry, sheet: Mapping[str, Any]) -> list[Parting]:
    """The partings of an LMCache answer ``sheet`` (``spans``, ``scheduler_block``, or ``refused`` with a
    ``refused_code``; from :func:`lmcache_geometry` or from the installed LMCache) from vLLM's ``geom``.
    Each difference is attributed to a registered finding by that finding's own signature, or to None."""
    out: list[Parting] = []
    fid: str | None
    dcp = geom.parallel.dcp
    if sheet.get("refused"):
        code = sheet.get("refused_code")
        fid = ("interleave-replicated-group" if code == "lmcache_interleave" and _interleave_only_replicated(geom)
               else "window-grid" if code == "lmcache_window_grid"
               else "compressed-grid" if code == "lmcache_compressed_grid"
               else "encoder-only-model" if code == "lmcache_worker_no_kv_cache" else "refuses")
        msg = f"LMCache refuses this deployment: {sheet.get('refused_message', code)}"
        out.append(Parting(fid, "refused", None, code, None, _explain(fid, msg)))
        if "spans" not in sheet:
            return out
    spans = list(sheet["spans"])
    p = geom.parallel
    for g, lm_span in zip(geom.groups, spans, strict=True):
        if lm_span == g.span or (lm_span == 0 and not g.prefix_cacheable):
            continue  # a scratch group: neither vLLM nor LMCache caches a token range of it
        replicated = dcp > 1 and is_attention_class(g) and not g.dcp_sharded and g.prefix_cacheable
        pcp_sharded = p.pcp > 1 and p.pcp_shards_kv and g.dcp_sharded and g.span == lm_span * p.pcp
        fid = ("replicated-attention-span" if replicated and lm_span == g.block_size * dcp else
               "pcp-sharded-span" if pcp_sharded else None)
        base = (f"group {g.index} ({g.kind}): LMCache's span {lm_span} differs from vLLM's {g.span} "
                f"(block_size {g.block_size}, dcp {dcp}, dcp_sharded {g.dcp_sharded})")
        out.append(Parting(fid, "span", g.index, lm_span, g.span,
                           _explain(fid, base) if fid else base + "; no registered LMCache rule explains it"))
    span_parted = any(x.finding for x in out)
    theirs, ours = sheet["scheduler_block"], geom.scheduler_block_size
    if theirs != ours:
        cached = [g.span for g in geom.groups if g.prefix_cacheable]
        sfid = ("scheduler-block" if span_parted else
                "scheduler-block-scratch" if cached and theirs == math.lcm(*cached) else None)
        base = f"LMCache's scheduler block {theirs} differs from vLLM's {ours}"
        out.append(Parting(sfid, "scheduler_block", None, theirs, ours,
                           _explain(sfid, base) if sfid else base + "; no registered LMCache rule explains it"))
    if theirs != geom.hit_alignment_tokens:
        base = (f"LMCache rounds vLLM's prefix-cache hits down to {theirs} tokens, vLLM's hits are multiples of "
                f"{geom.hit_alignment_tokens}")
        out.append(Parting("hit-alignment", "hit_alignment", None, theirs, geom.hit_alignment_tokens,
                           _explain("hit-alignment", base)))
    return out


def _interleave_only_replicated(geom: Geometry) -> bool:
    i = geom.parallel.cp_interleave
    return all(not (i > g.block_size or g.block_size % i) for g in geom.groups if g.dcp_sharded)


def staging_partings(
    geom: Geometry, settings: LMCacheSettings | None = None, staged: Sequence[Sequence[int]] | None = None
) -> list[Parting]:
    """Where the blocks LMCache stages per chunk of a windowed group (:func:`stage_block_ids`) differ from
    vLLM's store mask for a hit at every chunk end (:func:`kvgeom.masks.reachable_block_mask` with
    LMCache's chunk ends as the reachable boundaries, ``retention=0``, ``alignment=chunk_size``), over two
    chunks, for every group whose span LMCache and vLLM agree on (a span difference is its own finding).
    ``window-staging-short``: vLLM needs a block LMCache does not stage; ``window-staging-extra``: LMCache
    stages a block vLLM would not keep (a cost). Empty when LMCache refuses the deployment. ``staged``: the
    ids LMCache staged for two chunks of a request whose block ids are 0, 1, ... in every group (the
    conformance harness passes the installed LMCache's), else kvgeom's model of them.

    >>> import kvgeom
    >>> geom = kvgeom.resolve({"groups": [{"kind": "full_attention", "block_size": 16},
    ...     {"kind": "sliding_window", "block_size": 16, "sliding_window": 64, "extra_retained_tokens": 2}]})
    >>> [(p.finding, p.lmcache, p.vllm) for p in staging_partings(geom)]
    [('window-staging-short', 4, 5)]
    """
    try:
        lm = lmcache_geometry(geom, settings)
    except LMCacheRefusal:
        return []
    C, chunks = lm.chunk_size, 2
    out: list[Parting] = []
    for g in geom.groups:
        span = lm.spans[g.index]
        if not span or span != g.span or lm.windows[g.index] is None:
            continue
        n = chunks * C // span
        if staged is None:
            kept = set(stage_block_ids(lm, {g.index: list(range(n))}, chunks)[g.index])
        else:
            kept = set(staged[g.index])
        mask = reachable_block_mask(geom, g.index, n, retention=0, alignment=C,
                                    reachable=[(c + 1) * C for c in range(chunks)], side="offload")
        needed = set(range(n)) if mask is None else set(mask)
        last = range(n - C // span, n)  # the last chunk: no clipping at token 0
        ours, theirs = len(needed.intersection(last)), len(kept.intersection(last))
        w, need = lm.windows[g.index], g.window_need
        base = (f"group {g.index} ({g.kind}, window {w} tokens, span {span}): LMCache stages {theirs} block(s) "
                f"per {C}-token chunk, vLLM keeps {ours} before a hit at the chunk's end"
                + (f" (window need {need} = sliding_window - 1 + extra_retained_tokens)" if need is not None else ""))
        if needed - kept:
            out.append(Parting("window-staging-short", "staged_blocks", g.index, theirs, ours,
                               _explain("window-staging-short", base)))
        elif kept - needed:
            out.append(Parting("window-staging-extra", "staged_blocks", g.index, theirs, ours,
                               _explain("window-staging-extra", base)))
    return out


_LATE_REFUSALS = frozenset({"lmcache_dcp_with_pcp", "lmcache_interleave", "lmcache_servers", "lmcache_chunk_size",
                            "lmcache_window_grid", "lmcache_servers_split", "lmcache_servers_pp",
                            "lmcache_compressed_grid",
                            "lmcache_worker_no_kv_cache"})


def sheet(geom: Geometry, settings: LMCacheSettings | None = None) -> dict[str, Any]:
    """kvgeom's answer sheet for LMCache on ``geom``: what :func:`partings_of` and the conformance
    harness compare (``refused``/``refused_code``, ``spans``, ``scheduler_block``, ``coarse``,
    ``identity``, ``holds_back_last_token``). A refusal from the DCP or chunk-size checks, which LMCache
    makes after deriving its spans, keeps ``spans``, ``scheduler_block`` and ``identity``."""
    try:
        lm = lmcache_geometry(geom, settings)
    except LMCacheRefusal as e:
        out: dict[str, Any] = {"refused": True, "refused_code": e.code, "refused_message": str(e)}
        if e.code in _LATE_REFUSALS:  # refused after the spans, the scheduler block and the identity
            s = settings if settings is not None else LMCacheSettings()
            p = geom.parallel
            out["spans"] = list(lmcache_spans(geom))
            out["scheduler_block"] = scheduler_block(out["spans"])
            out["identity"] = cache_identity(s.model, p.dcp, p.cp_interleave)
        return out
    return {
        "refused": False,
        "spans": list(lm.spans),
        "scheduler_block": lm.scheduler_block,
        "coarse": lm.coarse,
        "identity": lm.identity,
        "holds_back_last_token": lm.holds_back_last_token,
    }


def partings(geom: Geometry, settings: LMCacheSettings | None = None) -> list[Parting]:
    """Where LMCache 0.5.6 (as kvgeom models it) parts from vLLM's geometry ``geom`` under ``settings``:
    ``kvgeom check --lmcache`` warns about those whose finding ``harms``. Empty when LMCache and vLLM agree.

    >>> import kvgeom
    >>> [(p.finding, p.lmcache, p.vllm) for p in partings(kvgeom.resolve(kvgeom.DEFAULT_CONFIG))]
    [('hit-alignment', 32, 16)]
    >>> partings(kvgeom.resolve({"groups": [{"kind": "full_attention", "block_size": 16}]}))
    []
    """
    return (partings_of(geom, sheet(geom, settings)) + staging_partings(geom, settings)
            + decode_store_partings(geom, settings))
