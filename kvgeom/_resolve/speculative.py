"""Every resolve-time decision a drafter (EAGLE, EAGLE3, MTP) makes in the geometry.

:func:`kvgeom.resolve` calls the steps below once each, in order: :func:`apply_defaults` (the config vLLM
runs), :func:`check_drafters`, :func:`speculative_geometry` (``Geometry.speculative``), :func:`resolve_groups`
(``GroupGeometry.eagle_group`` / ``proof_margin``), :func:`gpu_dropping_groups` (``Geometry.gpu_drop_groups``),
:func:`resolve_offload` (``OffloadGroupGeometry.eagle_group`` / ``proof_margin``) and
:func:`speculative_warnings`. Query-time rules never call these: they read the resolved fields.
:mod:`kvgeom.speculative` re-exports the public names. ``docs/speculative.md`` walks through an example.

Invariants (property-tested in ``tests/property/test_speculative_laws.py``):

* without a ``speculative`` section (or with ``eagle_block_drop: false``) no group is an eagle group,
  no group has a proof margin and the GPU drop set is empty;
* ``block_drop`` = method in {eagle, eagle3, mtp} and not disabled
  (vLLM ``config/speculative.py::SpeculativeConfig.use_eagle_block_drop``);
* ``lookahead_hashes`` = ``block_drop``, not disabled, prefix caching on and no KV connector
  (vLLM ``config/vllm.py::VllmConfig.num_hash_lookahead_tokens``; an offload section is a connector);
* ``gpu_drop`` = ``block_drop`` and not ``lookahead_hashes`` and prefix caching on
  (vLLM ``v1/core/sched/scheduler.py::Scheduler.__init__``);
* a group's ``proof_margin`` is non-null iff its GPU lookup drops and it is not Mamba; its value is
  H when partial hash hits are on, the manager supports fine-grained lookups and ``S > H``, else S
  (vLLM ``v1/core/kv_cache_utils.py::eagle_proof_margin``).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from kvgeom.config import KVGeomConfig
from kvgeom.errors import Problem
from kvgeom.geometry import (
    GeometryWarning,
    GroupGeometry,
    OffloadGeometry,
    OffloadGroupGeometry,
    SpeculativeGeometry,
)
from kvgeom.specs import (
    AnySpec,
    MambaSpec,
    SlidingWindowMLASpec,
    SlidingWindowSpec,
    UniformSpec,
    is_drafter_group,
    iter_leaves,
    sliding_window_of,
)

__all__ = [
    "BLOCK_DROP_METHODS",
    "HIDDEN_STATE_METHODS",
    "apply_defaults",
    "check_drafters",
    "eagle_proof_margin",
    "gpu_dropping_groups",
    "is_drafter_group",
    "prefill_lookahead_tokens",
    "resolve_groups",
    "resolve_offload",
    "speculative_geometry",
    "speculative_warnings",
]

#: Methods whose draft KV at a position depends on the next token, so vLLM drops a proven unit
#: (``SpeculativeConfig.needs_eagle_block_drop``).
BLOCK_DROP_METHODS = frozenset({"eagle", "eagle3", "mtp"})
#: Methods that draft from the target's hidden states (``SpeculativeConfig.use_eagle``): they look
#: ahead one prefill token (K with multi-module MTP).
HIDDEN_STATE_METHODS = frozenset({"eagle", "eagle3", "mtp", "dflash"})

#: Manager families whose vLLM manager supports fine-grained (sub-block) hash lookups
#: (``FullAttentionManager.supports_fine_grained_hash_lookup``; circular buffers opt out).
_FINE_GRAINED_FAMILIES = frozenset({"full"})


def eagle_proof_margin(span: int, hash_block_size: int, fine_grained: bool) -> int:
    """Tokens an eagle group must match past a candidate hit before dropping them.

    H when ``fine_grained`` and ``span > H``, else the span (vLLM 0.33
    ``v1/core/kv_cache_utils.py::eagle_proof_margin``). Postcondition: the result divides ``span``
    whenever H does.

    >>> eagle_proof_margin(32, 16, True), eagle_proof_margin(32, 16, False), eagle_proof_margin(16, 16, True)
    (16, 32, 16)
    """
    return hash_block_size if fine_grained and span > hash_block_size else span


# ------------------------------------------------------------------ config defaults


def _leaf_defaults(leaf: Any, k: int, extra: int) -> Any:
    match leaf:
        case MambaSpec() if "num_speculative_blocks" not in leaf.model_fields_set:
            return leaf.model_copy(update={"num_speculative_blocks": k})
        case SlidingWindowSpec() | SlidingWindowMLASpec() if "extra_retained_tokens" not in leaf.model_fields_set:
            return leaf.model_copy(update={"extra_retained_tokens": extra})
        case _:
            return leaf


def _spec_defaults(spec: AnySpec, k: int, extra: int) -> AnySpec:
    if isinstance(spec, UniformSpec):
        layers = tuple(_leaf_defaults(layer, k, extra) for layer in spec.layers)
        return spec if layers == spec.layers else spec.model_copy(update={"layers": layers})
    out: AnySpec = _leaf_defaults(spec, k, extra)
    return out


def prefill_lookahead_tokens(cfg: KVGeomConfig) -> int:
    """P: KV positions a prefill writes past its chunk (vLLM ``VllmConfig.num_prefill_lookahead_tokens``).

    0 without a drafter or for a method that does not draft from hidden states; K for multi-module
    MTP (``min(mtp_modules, K) > 1``); else 1.

    >>> from kvgeom import load_config
    >>> prefill_lookahead_tokens(load_config({"groups": [{"kind": "mla", "block_size": 64}],
    ...     "speculative": {"method": "mtp", "num_speculative_tokens": 3, "mtp_modules": 3}}))
    3
    """
    s = cfg.speculative
    if s is None or s.method not in HIDDEN_STATE_METHODS:
        return 0
    if s.method == "mtp" and min(s.mtp_modules, s.num_speculative_tokens) > 1:
        return s.num_speculative_tokens
    return 1


def apply_defaults(cfg: KVGeomConfig) -> KVGeomConfig:
    """The config vLLM 0.33 actually runs: with a ``speculative`` section, every Mamba layer that does not
    set ``num_speculative_blocks`` gets K (``MambaBase.get_kv_cache_spec``) and every sliding-window layer
    that does not set ``extra_retained_tokens`` gets ``max(0, P - 1)`` (``get_global_kv_cache_groups``).
    Explicit values win. Without the section the config is returned unchanged.

    >>> from kvgeom import load_config
    >>> cfg = apply_defaults(load_config({"groups": [{"kind": "mamba", "block_size": 16}],
    ...     "speculative": {"method": "eagle", "num_speculative_tokens": 3}}))
    >>> cfg.groups[0].num_speculative_blocks
    3
    """
    s = cfg.speculative
    if s is None:
        return cfg
    extra = max(0, prefill_lookahead_tokens(cfg) - 1)
    groups = tuple(_spec_defaults(g, s.num_speculative_tokens, extra) for g in cfg.groups)
    return cfg if groups == cfg.groups else cfg.model_copy(update={"groups": groups})


def check_drafters(cfg: KVGeomConfig) -> list[Problem]:
    """``drafter`` flags that cannot be right: one without a ``speculative`` section, one on a Mamba group
    (vLLM's drafters add attention layers only).

    >>> from kvgeom import load_config
    >>> [p.code for p in check_drafters(load_config({"groups": [{"kind": "mla", "block_size": 64, "drafter": True}]}))]
    ['drafter_without_speculative']
    """
    problems = []
    for i, spec in enumerate(cfg.groups):
        if not is_drafter_group(spec):
            continue
        if cfg.speculative is None:
            problems.append(
                Problem(
                    "drafter_without_speculative",
                    f"group {i} ({spec.kind}) sets drafter=true but the config has no speculative section; add "
                    '"speculative": {"method": ..., "num_speculative_tokens": K} or remove the flag',
                    f"groups[{i}].drafter",
                    {},
                )
            )
        if any(isinstance(leaf, MambaSpec) for leaf in iter_leaves(spec)):
            problems.append(
                Problem(
                    "drafter_mamba_group",
                    f"group {i} ({spec.kind}) is a Mamba group marked drafter=true; vLLM's drafters (EAGLE heads, "
                    "MTP modules) add attention layers only, so put drafter=true on the attention group that holds "
                    "them",
                    f"groups[{i}].drafter",
                    {},
                )
            )
    return problems


# ------------------------------------------------------------------ resolve


def speculative_geometry(cfg: KVGeomConfig) -> SpeculativeGeometry | None:
    """The effective settings (see the module invariants); None without a ``speculative`` section.

    >>> from kvgeom import load_config
    >>> sg = speculative_geometry(load_config({"groups": [{"kind": "mla", "block_size": 64}],
    ...     "speculative": {"method": "eagle3", "num_speculative_tokens": 2}}))
    >>> sg.block_drop, sg.lookahead_hashes, sg.gpu_drop
    (True, True, False)
    """
    s = cfg.speculative
    if s is None:
        return None
    block_drop = s.method in BLOCK_DROP_METHODS and s.eagle_block_drop
    lookahead = block_drop and s.lookahead_hashes and cfg.cache.prefix_caching and cfg.offload is None
    return SpeculativeGeometry(
        method=s.method,
        num_speculative_tokens=s.num_speculative_tokens,
        block_drop=block_drop,
        lookahead_hashes=lookahead,
        gpu_drop=block_drop and not lookahead and cfg.cache.prefix_caching,
        prefill_lookahead_tokens=prefill_lookahead_tokens(cfg),
    )


def _drop_key(spec: AnySpec) -> Any:
    """A spec with its drafter flags cleared: vLLM's ``is_draft`` is ``compare=False``, so drafter and
    target layers with otherwise equal specs form one lookup group."""
    if isinstance(spec, UniformSpec):
        layers = tuple(layer.model_copy(update={"drafter": None}) for layer in spec.layers)
        return spec.model_copy(update={"drafter": None, "layers": layers})
    return spec.model_copy(update={"drafter": None})


def gpu_dropping_groups(groups: list[GroupGeometry], sg: SpeculativeGeometry | None) -> frozenset[int]:
    """Groups whose GPU prefix-cache lookup drops a proven unit.

    The flagged groups, or every group when none is flagged (vLLM 0.33
    ``v1/core/kv_cache_coordinator.py::KVCacheCoordinator.__init__``), and then every group whose spec
    equals a dropping group's (one lookup group, ``HybridKVCacheCoordinator.verify_and_split_kv_cache_groups``);
    empty unless ``gpu_drop``.

    >>> import kvgeom
    >>> cfg = {"groups": [{"kind": "full_attention", "block_size": 16}, {"kind": "mamba", "block_size": 16},
    ...                   {"kind": "full_attention", "block_size": 16, "num_kv_heads": 4, "drafter": True}],
    ...        "parallel": {"tp": 2, "dcp": 2}, "offload": {},
    ...        "speculative": {"method": "eagle", "num_speculative_tokens": 2}}
    >>> geom = kvgeom.resolve(cfg)
    >>> sorted(gpu_dropping_groups(list(geom.groups), geom.speculative))
    [2]
    """
    if sg is None or not sg.gpu_drop:
        return frozenset()
    flagged = {g.index for g in groups if g.eagle_group}
    drop = flagged or {g.index for g in groups}
    keys = {(groups[i].family, _drop_key(groups[i].spec)) for i in drop}
    return frozenset(g.index for g in groups if g.index in drop or (g.family, _drop_key(g.spec)) in keys)


def resolve_groups(
    cfg: KVGeomConfig,
    groups: list[GroupGeometry],
    sg: SpeculativeGeometry | None,
    L: int,
    H: int,
    partial: bool,
) -> tuple[list[GroupGeometry], list[Problem]]:
    """Each group's ``eagle_group`` and GPU ``proof_margin``, and the configurations vLLM 0.33 rejects.

    ``eagle_group``: ``block_drop`` and the group holds drafter layers (flags stay under lookahead
    hashes). ``proof_margin``: for the prefix-cacheable non-Mamba groups of :func:`gpu_dropping_groups`,
    :func:`eagle_proof_margin` of the span, H and ``partial and family supports fine-grained lookups``.

    >>> import kvgeom
    >>> cfg = {"groups": [{"kind": "full_attention", "block_size": 16}, {"kind": "mamba", "block_size": 16},
    ...                   {"kind": "full_attention", "block_size": 16, "num_kv_heads": 4, "drafter": True}],
    ...        "parallel": {"tp": 2, "dcp": 2}, "offload": {},
    ...        "speculative": {"method": "eagle", "num_speculative_tokens": 2}}
    >>> geom = kvgeom.resolve(cfg)
    >>> [(g.eagle_group, g.proof_margin) for g in geom.groups]
    [(False, None), (False, None), (True, 16)]
    """
    if sg is None:
        return groups, []
    flagged = [dataclasses.replace(g, eagle_group=sg.block_drop and is_drafter_group(g.spec)) for g in groups]
    dropping = gpu_dropping_groups(flagged, sg)
    out = []
    problems = []
    for g in flagged:
        margin = None
        if g.index in dropping and g.family != "mamba" and g.prefix_cacheable:
            margin = eagle_proof_margin(g.span, H, partial and g.family in _FINE_GRAINED_FAMILIES)
        if g.index in dropping and g.family == "chunked" and g.prefix_cacheable:
            problems.append(
                Problem(
                    "eagle_chunked_local",
                    f"group {g.index} (chunked_local) would drop its last proven unit on every prefix-cache lookup; "
                    "vLLM 0.33's chunked-local manager refuses this (an AssertionError at the first lookup: hybrid "
                    "KV cache is not supported for eagle + chunked local attention). Mark the drafter group with "
                    "drafter=true so only it drops, set speculative.eagle_block_drop=false, or disable prefix caching",
                    f"groups[{g.index}]",
                    {"group": g.index},
                )
            )
        out.append(dataclasses.replace(g, proof_margin=margin))
    P = sg.prefill_lookahead_tokens
    coordinator_eagle = any(g.eagle_group for g in out) or (sg.block_drop and not sg.lookahead_hashes)
    if cfg.cache.prefix_caching and coordinator_eagle and L < P:
        problems.append(
            Problem(
                "multi_module_mtp_scheduler_block",
                f"multi-module MTP with prefix caching requires the scheduler block L={L} to be at least "
                f"num_speculative_tokens={P} (vLLM 0.33 KVCacheCoordinator.__init__ raises ValueError): use block "
                f"sizes whose lcm is >= {P}, lower num_speculative_tokens or mtp_modules, or disable prefix caching",
                "speculative.num_speculative_tokens",
                {"scheduler_block_size": L, "num_speculative_tokens": P},
            )
        )
    return out, problems


def resolve_offload(
    off: OffloadGeometry, groups: list[GroupGeometry], H: int, A: int, partial: bool
) -> OffloadGeometry:
    """The connector's own eagle notion: ``OffloadGroupGeometry.eagle_group`` is exactly the flagged groups
    (no fallback, vLLM 0.33 ``offloading/scheduler.py::SchedulerOffloadConfig.from_spec``, issue #52735);
    with partial tails an eagle non-recurrent group keys its partial tail at ``b + proof_margin``
    (``OffloadingConnectorScheduler.__init__``: ``_eagle_proof_margins``; partial tails need DCP 1).
    >>> import kvgeom
    >>> cfg = {"groups": [{"kind": "full_attention", "block_size": 16}, {"kind": "mamba", "block_size": 16},
    ...                   {"kind": "full_attention", "block_size": 16, "num_kv_heads": 4, "drafter": True}],
    ...        "parallel": {"tp": 2, "dcp": 2}, "offload": {},
    ...        "speculative": {"method": "eagle", "num_speculative_tokens": 2}}
    >>> geom = kvgeom.resolve(cfg)
    >>> [(og.eagle_group, og.proof_margin) for og in geom.offload.groups]
    [(False, None), (False, None), (True, None)]
    """
    if not any(g.eagle_group for g in groups):
        return off
    tail_span = off.groups[0].tokens_per_block if off.groups else 0
    fine = partial and tail_span > A
    new = []
    for og in off.groups:
        g = groups[og.index]
        margin = None
        if off.supports_partial_tail and g.eagle_group and not g.is_align_mamba:
            margin = eagle_proof_margin(tail_span, H, fine and g.family in _FINE_GRAINED_FAMILIES)
        new.append(dataclasses.replace(og, eagle_group=g.eagle_group, proof_margin=margin))
    return dataclasses.replace(off, groups=tuple(new))



# ------------------------------------------------------------------ warnings


def speculative_warnings(cfg: KVGeomConfig, groups: list[GroupGeometry], A: int, off: OffloadGeometry | None,
                         sg: SpeculativeGeometry | None) -> list[GeometryWarning]:
    """The three hazards vLLM 0.33 ships with a drafter, each with numbers from the geometry.

    * ``speculative_pop_vs_mamba_shift``: with the GPU drop the Mamba checkpoint moves down one A
      while the connector pops one whole chunk C of each eagle group; when C != A or the Mamba chunk
      C_m does not divide A the popped boundary holds no stored state and offloaded hits fall to 0;
    * ``speculative_sliding_drafter_offload``: an offloaded sliding-window eagle group needs one
      chunk more than its window past the hit, which prompt-only stores under retention 0 hold only
      when the prompt reaches one chunk past its aligned replay boundary;
    * ``speculative_mtp_prefill_stall``: multi-module MTP (P = K > 1) with the drop disabled and an
      align Mamba group: a prompt whose Mamba checkpoint lies fewer than P tokens before its end is
      never scheduled again (vLLM ``Scheduler._reserve_prefill_lookahead``).

    >>> import kvgeom
    >>> cfg = {"groups": [{"kind": "full_attention", "block_size": 16}, {"kind": "mamba", "block_size": 16},
    ...                   {"kind": "full_attention", "block_size": 16, "num_kv_heads": 4, "drafter": True}],
    ...        "parallel": {"tp": 2, "dcp": 2}, "offload": {},
    ...        "speculative": {"method": "eagle", "num_speculative_tokens": 2}}
    >>> geom = kvgeom.resolve(cfg)
    >>> [w.code for w in speculative_warnings(geom.config, list(geom.groups), 16, geom.offload, geom.speculative)]
    ['speculative_pop_vs_mamba_shift']
    """
    if sg is None:
        return []
    return [
        *_pop_vs_mamba_shift(cfg, groups, A, off, sg),
        *_sliding_drafter_offload(cfg, groups, off),
        *_mtp_prefill_stall(groups, sg),
    ]


def _pop_vs_mamba_shift(
    cfg: KVGeomConfig, groups: list[GroupGeometry], A: int, off: OffloadGeometry | None, sg: SpeculativeGeometry
) -> list[GeometryWarning]:
    """``speculative_pop_vs_mamba_shift``: the connector pops a chunk of an eagle group that holds no Mamba state."""
    out = []
    mamba_chunks = sorted({og.tokens_per_chunk for og in off.groups if groups[og.index].is_align_mamba}) if off else []
    if off is not None and sg.gpu_drop and mamba_chunks:
        for og in off.groups:
            if not og.eagle_group:
                continue
            Cm = mamba_chunks[0]
            if og.tokens_per_chunk != A or A % Cm:
                out.append(_pop_warning(cfg, groups, A, off, og, Cm))
    return out


def _pop_warning(
    cfg: KVGeomConfig, groups: list[GroupGeometry], A: int, off: OffloadGeometry, og: OffloadGroupGeometry, Cm: int
) -> GeometryWarning:
    why = []
    if cfg.parallel.dcp > 1 and groups[og.index].dealt:
        why.append(f"dcp={cfg.parallel.dcp} scales the drafter's span to {og.tokens_per_block}")
    if off.blocks_per_chunk > 1:
        why.append(f"blocks_per_chunk={off.blocks_per_chunk}")
    if A % Cm:
        why.append(f"the Mamba chunk {Cm} does not divide A")
    return GeometryWarning(
        "speculative_pop_vs_mamba_shift",
        f"with the eagle block drop the Mamba prefill checkpoint moves down one A={A} tokens, but "
        f"the offloading connector pops one whole chunk C={og.tokens_per_chunk} of eagle group "
        f"{og.index} ({'; '.join(why) or 'C != A'}): the popped boundary has no stored Mamba state "
        f"(Mamba keys every {Cm} tokens), so an offloaded hit is 0 unless the popped boundary "
        "happens to be the checkpoint. Make the "
        f"drafter's chunk equal A and the Mamba chunk a divisor of A (dcp=1, blocks_per_chunk=1, "
        f"Mamba block dividing A) or set speculative.eagle_block_drop=false",
    )


def _sliding_drafter_offload(
    cfg: KVGeomConfig, groups: list[GroupGeometry], off: OffloadGeometry | None
) -> list[GeometryWarning]:
    """``speculative_sliding_drafter_offload``: a windowed eagle group needs a chunk past the proven boundary."""
    out: list[GeometryWarning] = []
    if off is None:
        return out
    for og in off.groups:
        g = groups[og.index]
        window = sliding_window_of(g.spec)
        # the store mask keeps only the window before the aligned replay boundary (retention 0, a
        # connector alignment on the group's block grid; otherwise every block is stored)
        align = off.alignment_tokens
        sparse = cfg.cache.retention_interval == 0 and align is not None and align % og.tokens_per_block == 0
        reach = window is not None and window[0] - 1 + window[1] > 0
        if og.eagle_group and window is not None and reach and og.window_chunks is not None and sparse:
            need = og.window_chunks + 1
            out.append(
                GeometryWarning(
                    "speculative_sliding_drafter_offload",
                    f"group {og.index} is a sliding-window eagle group (window {window[0]}, extra {window[1]}): "
                    f"an offload lookup needs {need} consecutive chunks of {og.tokens_per_chunk} tokens (its "
                    f"window of {og.window_chunks} plus the chunk it pops), the last one past the proven "
                    "boundary; with retention_interval 0 only the run at the prompt's aligned replay boundary "
                    f"b = rdown(n - 1, {align}) is kept, and a store of the prompt only (vLLM's default "
                    f"offload_prompt_only) holds its last chunk (ending at b + {og.tokens_per_chunk}) only when "
                    "the prompt reaches it, so once the kept window no longer reaches token 0 "
                    f"-- a stored prompt of {need * og.tokens_per_chunk + (align or 0)} tokens or more -- a "
                    f"prompt of n tokens with n - rdown(n - 1, {align}) < {og.tokens_per_chunk} never serves an "
                    "offload hit (this group zeroes the request's hit). Store decoded tokens too, use dense "
                    "retention, or do not mark the group drafter",
                )
            )
    return out


def _mtp_prefill_stall(groups: list[GroupGeometry], sg: SpeculativeGeometry) -> list[GeometryWarning]:
    """``speculative_mtp_prefill_stall``: multi-module MTP without the drop can trim a prefill to nothing."""
    P = sg.prefill_lookahead_tokens
    if not (P > 1 and not sg.block_drop and sg.method == "mtp" and any(g.is_align_mamba for g in groups)):
        return []
    U = next(g.block_size for g in groups if g.is_align_mamba)
    return [
        GeometryWarning(
            "speculative_mtp_prefill_stall",
            f"multi-module MTP reserves P={P} prefill tokens, and with eagle_block_drop=false the Mamba split "
            f"ends the first prefill chunk at rdown(n - 1, {U}); a prompt of n tokens with 1 <= n - "
            f"rdown(n - 1, {U}) < {P} (e.g. n = {U + 1}; {P - 1} of every {U} prompt lengths past {U}) is "
            "trimmed to nothing and never scheduled again (vLLM 0.33 stalls silently). Keep the block drop "
            "on, or use lookahead hashes",
        )
    ]
