"""Per-group resolve steps: the checks on each group, its sharding, Mamba mode, span, row width and
window need.

Invariants (property-tested in ``tests/property/test_geometry_laws.py``):

* span: ``S_g = block_size * kv_shards`` for a DCP-sharded group, ``block_size`` otherwise; PCP never
  scales a span unless ``pcp_shards_kv`` (vLLM #46570);
* row widths: sharded attention ``cdiv(max_model_len, S_g)``, Mamba
  ``cdiv(max_model_len, block_size) + num_speculative_blocks``, never divided by DCP (#50287);
* ``window_need`` / ``gpu_window_need`` are decided here, once, from the group's scheduler view
  (see :class:`kvgeom.geometry.GroupGeometry`).
"""

from __future__ import annotations

from kvgeom._math import INT64_MAX, cdiv
from kvgeom._resolve.problems import Collector, group_name, shard_words
from kvgeom.config import KVGeomConfig
from kvgeom.errors import GeometryError, KVGeomError, ParallelismError
from kvgeom.geometry import GroupGeometry, MambaMode
from kvgeom.specs import (
    AnySpec,
    CircularBufferSpec,
    Family,
    HiSparseHotSpec,
    MambaSpec,
    SinkFullAttentionSpec,
    UniformSpec,
    attention_chunk_size_of,
    family,
    is_dcp_sharded,
    is_prefix_cacheable,
    iter_leaves,
    scheduler_view,
    sliding_window_of,
    states_per_block,
    tokens_per_state_of,
)

__all__ = [
    "check_encoder_only",
    "check_group",
    "check_spans",
    "resolve_group_list",
    "resolve_mamba_mode",
    "row_width",
    "scheduler_groups",
    "window_needs",
]

#: What vLLM 0.33 does with a DCP-sharded group of each family kvgeom rejects (docs/deviations.md,
#: ``dcp-sharded-windowed-rejected``). The hybrid coordinator (prefix caching on, two or more groups)
#: asserts on all of them; elsewhere each family fares differently.
_VLLM_ON_SHARDED = {
    "sliding": "vLLM 0.33 rejects it in the hybrid coordinator (prefix caching on, two or more groups) and "
    "otherwise at memory planning (SlidingWindowSpec.max_memory_usage_bytes)",
    "chunked": "vLLM 0.33 rejects it in the hybrid coordinator (prefix caching on, two or more groups), "
    "otherwise at its first prefix-cache lookup, and not at all with prefix caching off",
    "cross": "vLLM 0.33 rejects it only in the hybrid coordinator (prefix caching on, two or more groups)",
    "circular": "vLLM 0.33 rejects it only in the hybrid coordinator (prefix caching on, two or more groups) "
    "and otherwise runs it",
    "hisparse": "vLLM 0.33's HiSparse specs are replicated (dcp_sharded=False) and its hybrid coordinator "
    "rejects a sharded one",
}


def resolve_mamba_mode(spec: AnySpec, prefix_caching: bool) -> MambaMode | None:
    """The Mamba mode of a group: its configured ``mamba_cache_mode``, else align with prefix caching and
    none without; None for a group that is not Mamba."""
    view = scheduler_view(spec)
    if not isinstance(view, MambaSpec):
        return None
    if view.mamba_cache_mode is not None:
        return view.mamba_cache_mode
    return "align" if prefix_caching else "none"


def _sharding(i: int, spec: AnySpec, out: Collector) -> bool | None:
    """Whether the group is DCP-sharded; None (and the problems collected) when its layers disagree."""
    try:
        return is_dcp_sharded(spec)
    except KVGeomError as e:
        for p in e.problems:
            out.add(GeometryError, p.code, f"group {i} ({spec.kind}): {p.message}", f"groups[{i}].layers", **p.values)
        return None


def _check_uniform(i: int, spec: UniformSpec, out: Collector) -> None:
    """A uniform group holds layers of one family, one Mamba mode, all of them cacheable."""
    where = f"groups[{i}]"
    fams = [family(layer) for layer in spec.layers]
    if len(set(fams)) > 1:
        out.add(
            GeometryError,
            "uniform_mixed_kinds",
            f"group {i} (uniform) mixes layers of different manager families {fams}; a uniform group "
            "holds layers of one family (e.g. MLA and its indexer): split them into separate groups",
            f"{where}.layers",
            families=fams,
        )
    widths = [w for layer in spec.layers if (w := _local_width(layer)) is not None]
    if len(set(widths)) > 1:
        # vLLM 0.33 keeps layers in one group only when its uniform-type test holds: one sliding window, one
        # chunk (kv_cache_interface.py is_uniform_with_collection); a mixed container has no single window
        out.add(
            GeometryError,
            "uniform_mixed_windows",
            f"group {i} (uniform) mixes local-attention widths {widths}; vLLM keeps layers in one group only "
            "when they share one sliding_window (or attention_chunk_size): make one group per width",
            f"{where}.layers",
            widths=widths,
        )
    modes = {layer.mamba_cache_mode for layer in spec.layers if isinstance(layer, MambaSpec)}
    if len(modes) > 1:
        out.add(
            GeometryError,
            "uniform_mixed_mamba_modes",
            f"group {i} (uniform) has Mamba layers in different modes {sorted(map(str, modes))}; "
            "give every layer the same mamba_cache_mode",
            f"{where}.layers",
        )
    for j, layer in enumerate(spec.layers):
        if layer.prefix_cacheable is False:
            out.add(
                GeometryError,
                "uniform_layer_not_cacheable",
                f"group {i} (uniform) layer {j} sets prefix_cacheable=false; every layer of a uniform group "
                "must be cacheable: move the layer to its own group",
                f"{where}.layers[{j}].prefix_cacheable",
            )


def _local_width(layer: AnySpec) -> int | None:
    """A local-attention layer's width (its sliding window or attention chunk), None for other kinds."""
    window = sliding_window_of(layer)
    return window[0] if window is not None else attention_chunk_size_of(layer)


def _check_kind(i: int, spec: AnySpec, fam: Family, mode: MambaMode | None, cfg: KVGeomConfig, out: Collector) -> None:
    """Kind rules: a ring buffer is not cacheable, Mamba is never sharded nor in mode none with prefix caching."""
    where, kind = f"groups[{i}]", spec.kind
    if isinstance(spec, CircularBufferSpec) and spec.prefix_cacheable:
        out.add(
            GeometryError,
            "circular_buffer_cacheable",
            f"group {i} (circular_buffer) sets prefix_cacheable=true, but a ring buffer overwrites its slots "
            "and cannot serve prefix hits: remove the key",
            f"{where}.prefix_cacheable",
        )
    if fam == "hisparse" and spec.prefix_cacheable:
        out.add(
            GeometryError,
            "hisparse_cacheable",
            f"group {i} ({kind}) sets prefix_cacheable=true, but vLLM 0.33 never prefix-caches HiSparse hot or "
            "resident pages (their host source group owns prefix caching; the spec says prefix_cacheable=False): "
            "remove the key",
            f"{where}.prefix_cacheable",
        )
    if fam == "encoder" and spec.prefix_cacheable:
        out.add(
            GeometryError,
            "encoder_only_cacheable",
            f"group {i} ({kind}) sets prefix_cacheable=true, but vLLM 0.33's scheduler has no manager for "
            "encoder-only attention (building one raises 'No manager registered'); the model runner adds the "
            "group after the scheduler's config, so nothing of it is cached or offloaded: remove the key",
            f"{where}.prefix_cacheable",
        )
    if fam == "mamba" and spec.dcp_sharded:
        out.add(
            GeometryError,
            "mamba_cannot_shard",
            f"group {i} ({kind}) sets dcp_sharded=true, but recurrent state is one vector per sequence and is "
            "replicated on every DCP rank: remove dcp_sharded",
            f"{where}.dcp_sharded",
        )
    if mode == "none" and cfg.cache.prefix_caching:
        out.add(
            GeometryError,
            "mamba_none_with_prefix_caching",
            f"group {i} ({kind}) uses mamba_cache_mode='none' with prefix caching on; vLLM 0.33 rejects this "
            "(only align mode keeps per-block states): set mamba_cache_mode='align' or cache.prefix_caching=false",
            f"{where}.mamba_cache_mode",
        )


def _check_states(i: int, spec: AnySpec, out: Collector) -> None:
    """A compressed attention layer needs ``block_size >= tokens_per_state``.

    vLLM 0.33 keeps ``block_size // tokens_per_state`` states in a block (``AttentionSpec.num_states``), per
    DCP rank when the group is sharded, so a block smaller than one state is a page of 0 bytes, and vLLM's
    KV-cache planning divides by it (``get_kv_cache_config_from_groups``: ZeroDivisionError, run on vLLM 0.33).
    At DCP 1 the hit-alignment rule already refuses it; under DCP the span (``block_size * dcp``) can be a
    multiple of the compression while the per-rank block is not, so it is checked here, per layer, on the
    per-rank block. Invariant: every resolved compressed layer's page holds at least one state."""
    for j, leaf in enumerate(iter_leaves(spec)):
        tps = tokens_per_state_of(leaf)
        block = leaf.block_size or spec.block_size
        if tps is not None and block is not None and states_per_block(block, tps) == 0:
            field = f"groups[{i}]" + (f".layers[{j}]" if isinstance(spec, UniformSpec) else "")
            out.add(
                GeometryError,
                "block_smaller_than_state",
                f"group {i} ({leaf.kind}) compresses tokens_per_state={tps} tokens per state, more than its "
                f"{block}-token block (per DCP rank), so a block holds no state (a page of 0 bytes) and vLLM 0.33 "
                f"cannot plan the KV cache: give the group a block_size that is a multiple of {tps}",
                f"{field}.tokens_per_state",
                tokens_per_state=tps,
                block_size=block,
            )


def _check_dealing(i: int, spec: AnySpec, fam: Family, sharded: bool | None, cfg: KVGeomConfig, out: Collector) -> None:
    """Rules of a group dealt over KV shards: its family, the interleave, and a sink of whole spans."""
    where, kind, shards = f"groups[{i}]", spec.kind, cfg.parallel.kv_shards
    if sharded and shards > 1 and fam in _VLLM_ON_SHARDED:
        out.add(
            ParallelismError,
            "sharded_kind_under_dcp",
            f"group {i} ({kind}) is dealt across {shards} KV shards ({shard_words(cfg)}), but kvgeom deals only "
            f"full-attention-family groups (full attention, MLA, sink) across ranks; {_VLLM_ON_SHARDED[fam]}: "
            "set dcp_sharded=false on it (a replicated group) or use dcp=1",
            f"{where}.dcp_sharded",
            dcp=cfg.parallel.dcp,
        )
    if sharded and shards > 1:
        interleave = cfg.parallel.cp_interleave
        if interleave > spec.block_size or spec.block_size % interleave:
            out.add(
                ParallelismError,
                "interleave_mismatch",
                f"cp_interleave={interleave} does not fit group {i} ({kind}) with per-rank block_size="
                f"{spec.block_size}; every DCP-sharded group's block must be >= the interleave and a multiple "
                f"of it (kvgeom checks each sharded group, not only the smallest block as vLLM does): choose "
                f"cp_interleave among the divisors of {spec.block_size}",
                "parallel.cp_interleave",
                cp_interleave=interleave,
                block_size=spec.block_size,
                group=i,
            )
    if isinstance(spec, SinkFullAttentionSpec) and sharded is not None:
        span = spec.block_size * (shards if sharded else 1)
        if spec.sink_len % span:
            out.add(
                GeometryError,
                "sink_len_not_multiple_of_span",
                f"sink_len={spec.sink_len} of group {i} ({kind}) is not a multiple of the group's span {span}; "
                f"the sink must cover whole blocks: use a multiple of {span}",
                f"{where}.sink_len",
                sink_len=spec.sink_len,
                span=span,
            )


def check_group(
    i: int, spec: AnySpec, cfg: KVGeomConfig, out: Collector
) -> tuple[bool | None, Family, MambaMode | None]:
    """Per-group rules; returns whether the group is sharded (None when undecidable), its family and
    its resolved Mamba mode."""
    sharded = _sharding(i, spec, out)
    if isinstance(spec, UniformSpec):
        _check_uniform(i, spec, out)
    fam = family(spec)
    mode = resolve_mamba_mode(spec, cfg.cache.prefix_caching)
    _check_kind(i, spec, fam, mode, cfg, out)
    _check_states(i, spec, out)
    if fam == "mamba" and spec.dcp_sharded:
        sharded = False
    _check_dealing(i, spec, fam, sharded, cfg, out)
    return sharded, fam, mode


def row_width(spec: AnySpec, span_factor: int, max_len: int, mode: MambaMode | None) -> int:
    """Block-table row width: the most block ids the scheduler can give one request.

    A module-level function so the property tests can swap in a broken rule and show a law catches it.
    """
    widths = []
    for leaf in iter_leaves(spec):
        if isinstance(leaf, MambaSpec):
            if mode == "none":
                widths.append(1 + leaf.num_speculative_blocks)
            else:  # align / all: one column per block of the whole sequence, never divided by DCP (#50287)
                widths.append(cdiv(max_len, leaf.block_size) + leaf.num_speculative_blocks)
        elif isinstance(leaf, CircularBufferSpec):
            widths.append(1)
        elif isinstance(leaf, HiSparseHotSpec):
            widths.append(leaf.blocks_per_request)  # vLLM 0.33 max_num_blocks_per_req: a fixed hot region
        else:
            widths.append(cdiv(max_len, leaf.block_size * span_factor))
    return max(widths)


def window_needs(spec: AnySpec) -> tuple[int | None, int | None]:
    """``(window_need, gpu_window_need)`` of a group (see :class:`kvgeom.geometry.GroupGeometry`).

    Sliding window ``(sw - 1 + extra_retained_tokens, sw - 1)``, chunked local
    ``(attention_chunk_size - 1,) * 2``, every other family ``(None, None)``.

    >>> from kvgeom.specs import SlidingWindowSpec
    >>> window_needs(SlidingWindowSpec(block_size=16, sliding_window=128, extra_retained_tokens=2))
    (129, 127)
    """
    window = sliding_window_of(spec)
    if window is not None:
        sw, extra = window
        return sw - 1 + extra, sw - 1
    size = attention_chunk_size_of(spec)
    if size is not None:
        return size - 1, size - 1
    return None, None


def resolve_group_list(cfg: KVGeomConfig, out: Collector) -> list[GroupGeometry]:
    """Every group checked and resolved (span, row width, Mamba mode, window needs), in config order."""
    shards = cfg.parallel.kv_shards
    max_len = cfg.cache.max_model_len
    groups: list[GroupGeometry] = []
    check_encoder_only(cfg, out)
    for i, spec in enumerate(cfg.groups):
        sharded, fam, mode = check_group(i, spec, cfg, out)
        factor = shards if sharded else 1
        need, gpu_need = window_needs(spec)
        groups.append(
            GroupGeometry(
                index=i,
                kind=spec.kind,
                spec=spec,
                family=fam,
                block_size=spec.block_size,
                dcp_sharded=bool(sharded),
                prefix_cacheable=is_prefix_cacheable(spec),
                span=spec.block_size * factor,
                row_width=None if max_len is None else row_width(spec, factor, max_len, mode),
                mamba_mode=mode,
                dealt=bool(sharded) and shards > 1,
                window_need=need,
                gpu_window_need=gpu_need,
            )
        )
    return groups


def check_encoder_only(cfg: KVGeomConfig, out: Collector) -> None:
    """At most one ``encoder_only`` group, and it is the last group.

    vLLM 0.33 builds the scheduler's KV cache config without encoder-only layers; the model runner then
    appends one group holding all of them, and asserts there is only one encoder-only spec
    (``may_add_encoder_only_layers_to_kv_cache_config``). Any other place would renumber the groups the
    scheduler sees.
    """
    where = [i for i, spec in enumerate(cfg.groups) if family(spec) == "encoder"]
    n = len(cfg.groups)
    if len(where) > 1:
        out.add(
            GeometryError,
            "encoder_only_twice",
            f"groups {where} are encoder_only; vLLM 0.33 puts every encoder-only layer in one group (it asserts "
            "one encoder-only spec): merge them into one group",
            f"groups[{where[1]}].kind",
            groups=where,
        )
    elif where and where[0] != n - 1:
        out.add(
            GeometryError,
            "encoder_only_not_last",
            f"group {where[0]} is encoder_only but not the last of the {n} groups; vLLM 0.33's model runner appends "
            "the encoder-only group after the groups the scheduler manages: move it to the end",
            f"groups[{where[0]}].kind",
            group=where[0],
        )


def scheduler_groups(groups: list[GroupGeometry]) -> list[GroupGeometry]:
    """The groups vLLM 0.33's scheduler manages: all but the encoder-only group (which the model runner adds
    after the scheduler's config is built), or all of them when nothing else is left.

    L, H and the hybrid-coordinator questions are decided on these groups.
    """
    managed = [g for g in groups if g.family != "encoder"]
    return managed or groups


def check_spans(groups: list[GroupGeometry], out: Collector) -> None:
    """A span past int64 would break every batch path: refuse it here."""
    for g in groups:
        if g.span > INT64_MAX:
            out.add(
                GeometryError,
                "span_too_large",
                f"{group_name(g)} has span {g.span}, past int64: use realistic block and DCP sizes",
                f"groups[{g.index}].block_size",
                span=g.span,
            )
