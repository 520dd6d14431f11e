"""Speculative decoding (EAGLE, EAGLE3, MTP) in the geometry: flags, margins, checkpoints, hazards.

A drafter changes vLLM 0.33's KV-cache geometry in a few precise ways; each is decided once, at
resolve time, in :mod:`kvgeom._resolve.speculative` from the ``speculative`` config section
(:class:`kvgeom.SpeculativeConfig`) and the per-group ``drafter`` flag; this module re-exports those
names (a face) beside the query-time helpers below. Every consumer reads the
results from the resolved :class:`kvgeom.Geometry` (``Geometry.speculative``,
``GroupGeometry.eagle_group`` / ``proof_margin``, ``OffloadGroupGeometry.eagle_group`` /
``proof_margin``). ``docs/speculative.md`` walks through a worked example.

Invariants (property-tested in ``tests/property/test_speculative_laws.py``):

* without a ``speculative`` section (or with ``eagle_block_drop: false``) no group is an eagle group,
  no group has a proof margin and every hit, load and store is exactly the no-drafter answer;
* ``block_drop`` = method in {eagle, eagle3, mtp} and not disabled
  (vLLM ``config/speculative.py::SpeculativeConfig.use_eagle_block_drop``);
* ``lookahead_hashes`` = ``block_drop``, not disabled, prefix caching on and no KV connector
  (vLLM ``config/vllm.py::VllmConfig.num_hash_lookahead_tokens``; an offload section is a connector);
* ``gpu_drop`` = ``block_drop`` and not ``lookahead_hashes`` and prefix caching on
  (vLLM ``v1/core/sched/scheduler.py::Scheduler.__init__``);
* a group's ``proof_margin`` is non-null iff its GPU lookup drops and it is not Mamba; its value is
  H when partial hash hits are on, the manager supports fine-grained lookups and ``S > H``, else S
  (vLLM ``v1/core/kv_cache_utils.py::eagle_proof_margin``);
* the Mamba prefill checkpoint is ``rdown(n, U) - U`` with the GPU drop, else
  ``rdown(n - max(1, lookahead), U)`` (vLLM ``v1/kv_cache_interface.py::get_mamba_prefill_checkpoint_position``);
  it is a multiple of U, at most ``n - 1``, and never negative.
"""

from __future__ import annotations

# The resolve-time decisions live in kvgeom._resolve.speculative; this module re-exports them (a face).
from kvgeom._resolve.speculative import (
    BLOCK_DROP_METHODS,
    HIDDEN_STATE_METHODS,
    apply_defaults,
    check_drafters,
    eagle_proof_margin,
    gpu_dropping_groups,
    is_drafter_group,
    prefill_lookahead_tokens,
    resolve_groups,
    resolve_offload,
    speculative_geometry,
    speculative_warnings,
)

# isort: split
from dataclasses import dataclass
from itertools import accumulate
from typing import TYPE_CHECKING

from kvgeom._check import nonneg, prompt_tokens
from kvgeom._math import rdown, rup
from kvgeom.errors import QueryError
from kvgeom.probes import Probe
from kvgeom.specs import is_prefix_cacheable

if TYPE_CHECKING:
    from kvgeom.geometry import Geometry, OffloadGroupGeometry

__all__ = [
    "BLOCK_DROP_METHODS",
    "HIDDEN_STATE_METHODS",
    "MambaCheckpoint",
    "apply_defaults",
    "check_drafters",
    "eagle_pair_held",
    "eagle_pops",
    "eagle_proof_margin",
    "eagle_query_end",
    "engine_block_size",
    "explain_lines",
    "gpu_dropping_groups",
    "is_drafter_group",
    "mamba_checkpoint",
    "mamba_checkpoint_position",
    "checkpoint_settings",
    "prefill_chunk_ends",
    "prefill_tail_stop",
    "prompt_hash_checkpoint",
    "partial_tail_key",
    "partial_tail_max_boundary",
    "prefill_lookahead_tokens",
    "resolve_groups",
    "resolve_offload",
    "speculative_geometry",
    "speculative_warnings",
    "store_holdback_chunks",
]

# ------------------------------------------------------------------ Mamba checkpoint


def mamba_checkpoint_position(num_tokens: int, unit: int, drop: bool, lookahead_tokens: int = 0) -> int:
    """The Mamba state a prefill of ``num_tokens`` checkpoints for reuse, on a grid of ``unit`` tokens.

    With the drop: ``rdown(n, unit) - unit``; else ``rdown(n - max(1, lookahead), unit)``; never
    below 0 (vLLM 0.33 ``v1/kv_cache_interface.py::get_mamba_prefill_checkpoint_position``).
    Postcondition: a multiple of ``unit`` and ``<= max(n - 1, 0)``.

    >>> mamba_checkpoint_position(100, 16, False), mamba_checkpoint_position(100, 16, True)
    (96, 80)
    """
    if drop:
        return max(rdown(num_tokens, unit) - unit, 0)
    return max(rdown(num_tokens - max(1, lookahead_tokens), unit), 0)


def checkpoint_settings(geom: Geometry) -> tuple[bool, int]:
    """``(drop, lookahead)`` every Mamba checkpoint rule of a geometry uses: the GPU drop
    (``Geometry.speculative.gpu_drop``) and the lookahead hash tokens (P under lookahead hashes, else 0),
    as vLLM 0.33's scheduler and Mamba manager pass them to ``get_mamba_prefill_checkpoint_position``.

    >>> import kvgeom
    >>> checkpoint_settings(kvgeom.resolve(kvgeom.DEFAULT_CONFIG))
    (False, 0)
    """
    sg = geom.speculative
    return bool(sg and sg.gpu_drop), (sg.prefill_lookahead_tokens if sg and sg.lookahead_hashes else 0)


def prompt_hash_checkpoint(geom: Geometry, num_prompt_tokens: int) -> int:
    """The prompt's checkpoint on the H grid: :func:`mamba_checkpoint_position` of the prompt with
    ``unit = H`` and :func:`checkpoint_settings` (vLLM 0.33 ``MambaManager._cache_partial_tail_block``
    keys the state there; ``Scheduler._mamba_block_aligned_split`` stops a chunk there when
    :func:`prefill_tail_stop` says so). 0 for an empty prompt; a multiple of H below the prompt.

    >>> import kvgeom
    >>> prompt_hash_checkpoint(kvgeom.resolve(kvgeom.DEFAULT_CONFIG), 100)
    96
    """
    n = nonneg("num_prompt_tokens", num_prompt_tokens)
    if n == 0:
        return 0
    return mamba_checkpoint_position(n, geom.hash_block_size, *checkpoint_settings(geom))


def prefill_tail_stop(geom: Geometry, num_prompt_tokens: int) -> int:
    """Where the prefill also stops for the prompt's H-grid checkpoint: :func:`prompt_hash_checkpoint`
    when partial hash hits split the prefill there (vLLM 0.33 ``Scheduler.mamba_partial_cache_hit``:
    align Mamba, partial hash hits on, H below the scheduler block), else 0.

    >>> import kvgeom
    >>> prefill_tail_stop(kvgeom.resolve(kvgeom.DEFAULT_CONFIG), 100)
    96
    """
    if not (geom.partial_hash_hits and geom.hash_block_size < geom.scheduler_block_size):
        return 0
    return prompt_hash_checkpoint(geom, num_prompt_tokens)


@dataclass(frozen=True, slots=True)
class MambaCheckpoint:
    """Where a prompt's reusable Mamba state is checkpointed, and how the prefill is split to reach it."""

    position: int
    """The prompt checkpoint: the state after exactly this many tokens is cached (0: none)."""
    unit: int
    """Its grid: the hash unit H with partial hash hits, else the scheduler block L (= A)."""
    shift: int
    """Tokens the checkpoint moved down because of speculation (0 without a GPU drop or lookahead)."""
    last_cacheable: int
    """The last block boundary a prefill chunk may run to mid-prefill (grid: :func:`engine_block_size`,
    the Mamba block in vLLM's default align setup)."""
    prefill_chunks: tuple[int, ...]
    """Chunk lengths of a prefill from 0 with an unbounded token budget (no junction, no prior hit)."""
    state_block: int | None
    """The align Mamba block holding the checkpoint state, ``position // B_m - 1`` in the Mamba group's own
    block units; None when ``position`` is 0 or off the Mamba block grid (a copy-on-write partial tail)."""


def _checkpoint_state_block(geom: Geometry, group: int, position: int) -> int | None:
    """The block of an align Mamba group that holds the state after ``position`` tokens, counted in the
    group's own ``block_size`` -- never the scheduler block, H or a DCP-scaled span (vLLM #55600 seeded the
    state index in the wrong block units). Module level so a teeth test can break it on purpose."""
    B = geom.groups[group].block_size
    return position // B - 1 if position > 0 and position % B == 0 else None


def mamba_checkpoint(geom: Geometry, num_tokens: int, *, num_prompt_tokens: int | None = None) -> MambaCheckpoint:
    """The Mamba prefill checkpoint of a request under the geometry's speculative settings.

    ``unit`` is A (H with partial hash hits, else L); the checkpoint is
    :func:`mamba_checkpoint_position` of the prefill end ``max(prompt, n - 1)`` with the GPU drop
    (``Geometry.speculative.gpu_drop``) and P lookahead tokens under lookahead hashes (vLLM 0.33
    ``v1/core/sched/scheduler.py::Scheduler._mamba_block_aligned_split``). ``last_cacheable`` is
    the same rule on :func:`engine_block_size`'s grid. ``prefill_chunks`` are the lengths of
    :func:`prefill_chunk_ends`. Needs an align-mode Mamba group, else
    :class:`kvgeom.QueryError` ``no_align_mamba``. ``state_block`` is the first align Mamba group's block
    holding the checkpoint state.

    Postconditions: ``position`` is a multiple of ``unit`` and ``< max(prompt, 1)``; ``shift`` is 0
    without a ``speculative`` section; ``sum(prefill_chunks) == prompt``.

    >>> import kvgeom
    >>> cfg = {"groups": [{"kind": "full_attention", "block_size": 16, "drafter": True},
    ...                   {"kind": "mamba", "block_size": 16}],
    ...        "speculative": {"method": "eagle", "num_speculative_tokens": 2}, "offload": {}}
    >>> c = mamba_checkpoint(kvgeom.resolve(cfg), 100)
    >>> c.position, c.shift, c.prefill_chunks
    (80, 16, (80, 20))
    """
    n = nonneg("num_tokens", num_tokens)
    prompt = prompt_tokens(num_prompt_tokens, n)
    mamba = [g for g in geom.groups if g.is_align_mamba]
    if not mamba:
        raise QueryError.single(
            "no_align_mamba",
            "this geometry has no align-mode Mamba group, so there is no Mamba checkpoint; add a mamba group "
            "with mamba_cache_mode='align' (the default with prefix caching)",
            "group",
        )
    drop, lookahead = checkpoint_settings(geom)
    unit = geom.hit_alignment_tokens
    end = max(prompt, n - 1)
    position = mamba_checkpoint_position(end, unit, drop, lookahead) if end else 0
    plain = mamba_checkpoint_position(end, unit, False) if end else 0
    block = engine_block_size(geom)
    last = mamba_checkpoint_position(n, block, drop, lookahead) if n else 0
    ends = _chunk_ends(geom, n, prompt)
    chunks = tuple(b - a for a, b in zip((0, *ends), ends, strict=False))
    return MambaCheckpoint(
        position, unit, plain - position, last, chunks, _checkpoint_state_block(geom, mamba[0].index, position)
    )


def engine_block_size(geom: Geometry) -> int:
    """vLLM's ``cache_config.block_size`` for the geometry: the smallest per-rank block of the
    prefix-cacheable groups (of all groups when none is). vLLM 0.33's scheduler splits Mamba prefills
    on this grid (``Scheduler._mamba_block_aligned_split``); in align mode vLLM sets the Mamba block to
    it unless ``mamba_block_size`` is given (``HybridAttentionMambaModelConfig``).

    >>> import kvgeom
    >>> engine_block_size(kvgeom.resolve(kvgeom.DEFAULT_CONFIG))
    16
    """
    cacheable = [g.block_size for g in geom.groups if is_prefix_cacheable(g.spec)]
    return min(cacheable or [g.block_size for g in geom.groups])


def _chunk_ends(geom: Geometry, n: int, prompt: int, budget: int | None = None) -> tuple[int, ...]:
    """Where the prefill chunks of ``[0, prompt)`` end (see :func:`prefill_chunk_ends`) on the grid of
    :func:`engine_block_size`; ``budget`` the per-step token budget (None: unbounded; a stall that
    the multi-module MTP reserve would cause is then left to the ``speculative_mtp_prefill_stall``
    warning and the chunk kept, so :class:`MambaCheckpoint` stays total)."""
    if prompt <= 0:
        return ()
    block = engine_block_size(geom)
    last = mamba_checkpoint_position(n, block, *checkpoint_settings(geom)) if n else 0
    tail = prefill_tail_stop(geom, prompt)
    sg = geom.speculative
    reserve = sg.prefill_lookahead_tokens if sg is not None else 0
    ends: list[int] = []
    start = 0
    while start < prompt:
        end = prompt if budget is None else min(prompt, start + budget)
        if end < prompt:
            assert budget is not None
            aligned = rdown(end, block)
            if aligned > start or block <= budget:
                end = aligned  # a mid-prefill chunk ends on a block boundary
        stops = (
            rup(start, block) if start % block else 0,  # a chunk that starts mid-block stops at the boundary
            last,  # never run past the last cacheable block boundary
            tail if last < tail < prompt else 0,  # the prompt's H-grid checkpoint
        )
        end = min((s for s in stops if start < s < end), default=end)
        if 0 < prompt - end < reserve and (budget is not None or end - (reserve - (prompt - end)) > start):
            end -= reserve - (prompt - end)  # multi-module MTP: never end within P of the prefill end
        if end <= start:
            raise QueryError.single(
                "prefill_stalls",
                f"the prefill of {prompt} tokens cannot be scheduled past token {start}: the Mamba split and "
                f"the multi-module MTP lookahead reserve of {reserve} tokens leave no tokens to schedule (vLLM "
                "requeues the request forever); enable speculative.eagle_block_drop or change the prompt length",
                "num_prompt_tokens",
                num_prompt_tokens=prompt,
                stalled_at=start,
            )
        ends.append(end)
        start = end
    return tuple(ends)


def prefill_chunk_ends(
    geom: Geometry, num_prompt_tokens: int, *, max_num_batched_tokens: int | None = None
) -> tuple[int, ...]:
    """Where vLLM 0.33's scheduler ends the prefill chunks of a fresh prompt in align Mamba mode.

    Each step schedules up to ``max_num_batched_tokens`` (None: unbounded) and a chunk that does
    not reach the prompt's end is cut back to a block boundary; it then stops at the first of: the
    last cacheable block boundary (``MambaCheckpoint.last_cacheable``, on the grid of
    :func:`engine_block_size`), the prompt's H-grid checkpoint when partial hash hits split the
    prefill (H below the scheduler block), and the next block boundary when the chunk starts
    mid-block; multi-module MTP never ends a chunk within P tokens of the prompt's end (vLLM 0.33
    ``v1/core/sched/scheduler.py::Scheduler._mamba_block_aligned_split`` and
    ``_reserve_prefill_lookahead``; no earlier hit, no shared-prefix junction, one request). A
    Mamba state exists only where a chunk ends, so these are the only states the store side can
    hand to the connector (:func:`kvgeom.hits.plan_store` ``chunk_ends``). Needs an align-mode
    Mamba group (:class:`kvgeom.QueryError` ``no_align_mamba``); a prefill that cannot advance
    raises ``prefill_stalls``.

    Postconditions: strictly increasing, the last one is the prompt, every one before the last is a
    multiple of H or of :func:`engine_block_size`, and with a budget no chunk is longer than it.

    >>> import kvgeom
    >>> cfg = {"groups": [{"kind": "full_attention", "block_size": 64}, {"kind": "mamba", "block_size": 64},
    ...                   {"kind": "full_attention", "block_size": 64, "num_kv_heads": 4, "drafter": True}],
    ...        "cache": {"prefix_match_unit": 16}, "offload": {},
    ...        "speculative": {"method": "eagle3", "num_speculative_tokens": 2}}
    >>> prefill_chunk_ends(kvgeom.resolve(cfg), 131)  # vLLM 0.33 run: chunks [64, 48, 16, 3]
    (64, 112, 128, 131)
    """
    prompt = nonneg("num_prompt_tokens", num_prompt_tokens)
    budget = None
    if max_num_batched_tokens is not None:
        budget = nonneg("max_num_batched_tokens", max_num_batched_tokens)
        if budget == 0:
            raise QueryError.single(
                "out_of_range",
                "max_num_batched_tokens=0 schedules nothing; give a positive token budget or None (unbounded)",
                "max_num_batched_tokens",
                max_num_batched_tokens=0,
            )
    cp = mamba_checkpoint(geom, prompt)  # validates the geometry (align Mamba)
    if budget is None:
        return tuple(accumulate(cp.prefill_chunks))
    return _chunk_ends(geom, prompt, prompt, budget)


def store_holdback_chunks(
    geom: Geometry, group: int, storable: int, offloadable_tokens: int, num_prompt_tokens: int, finished: bool
) -> int:
    """Storable chunks of a group after the eagle hold-back: an eagle group's last offloadable chunk is
    volatile while the request decodes and is not stored until it finishes (vLLM 0.33
    ``offloading/scheduler.py::RequestOffloadState.storable_chunks``, issue #52735). Other groups, prefill
    steps and finished requests keep ``storable``.

    Postcondition: ``storable - 1 <= result <= storable`` and ``result >= 0``.

    >>> import kvgeom
    >>> cfg = {"groups": [{"kind": "full_attention", "block_size": 16}, {"kind": "mamba", "block_size": 16},
    ...                   {"kind": "full_attention", "block_size": 16, "num_kv_heads": 4, "drafter": True}],
    ...        "parallel": {"tp": 2, "dcp": 2}, "offload": {},
    ...        "speculative": {"method": "eagle", "num_speculative_tokens": 2}}
    >>> geom = kvgeom.resolve(cfg)
    >>> store_holdback_chunks(geom, 2, 3, 100, 90, False), store_holdback_chunks(geom, 2, 3, 100, 90, True)
    (2, 3)
    """
    off = geom.offload
    if off is None or not off.group(group).eagle_group:
        return storable
    C = off.group(group).tokens_per_chunk
    decoding = offloadable_tokens > num_prompt_tokens
    if decoding and not finished:
        return min(storable, max(0, offloadable_tokens // C - 1))
    return storable


# ------------------------------------------------------------------ offload lookup helpers
# vLLM 0.33 offloading/scheduler.py::OffloadingConnectorScheduler._lookup_complete_chunks and _lookup.


def eagle_pops(og: OffloadGroupGeometry, verified: set[int]) -> int:
    """1 when an offload lookup of ``og`` must query one extra chunk and then pop it (an eagle group not yet
    verified at the current candidate), else 0; marks the group verified. A non-eagle group that lowers the
    candidate clears ``verified`` (the caller does that), so the eagle group pops again.
    >>> import kvgeom
    >>> cfg = {"groups": [{"kind": "full_attention", "block_size": 16}, {"kind": "mamba", "block_size": 16},
    ...                   {"kind": "full_attention", "block_size": 16, "num_kv_heads": 4, "drafter": True}],
    ...        "parallel": {"tp": 2, "dcp": 2}, "offload": {},
    ...        "speculative": {"method": "eagle", "num_speculative_tokens": 2}}
    >>> geom = kvgeom.resolve(cfg)
    >>> verified = set()
    >>> eagle_pops(geom.offload.group(2), verified), eagle_pops(geom.offload.group(2), verified)
    (1, 0)
    """
    if og.eagle_group and og.index not in verified:
        verified.add(og.index)
        return 1
    return 0


def eagle_query_end(og: OffloadGroupGeometry, m: int, keyed_end: int, pop: int) -> int:
    """How far a lookup of ``og`` queries for candidate ``m``: one chunk further when it pops, capped at the
    group's keyed end; ``m`` otherwise.
    >>> import kvgeom
    >>> cfg = {"groups": [{"kind": "full_attention", "block_size": 16}, {"kind": "mamba", "block_size": 16},
    ...                   {"kind": "full_attention", "block_size": 16, "num_kv_heads": 4, "drafter": True}],
    ...        "parallel": {"tp": 2, "dcp": 2}, "offload": {},
    ...        "speculative": {"method": "eagle", "num_speculative_tokens": 2}}
    >>> geom = kvgeom.resolve(cfg)
    >>> eagle_query_end(geom.offload.group(2), 64, 96, 1), eagle_query_end(geom.offload.group(2), 64, 96, 0)
    (96, 64)
    """
    return min(m + og.tokens_per_chunk, keyed_end) if pop else m


def eagle_pair_held(probe: Probe, chunk: int, stop: int) -> Probe:
    """A probe in which chunk end ``e`` is held iff the chunk ending at ``e`` and the next one are both held,
    the next one ending at or before ``stop``. A windowed eagle group needs its window plus one more chunk
    and pops that one: a run of ``w + 1`` held chunks ending at ``e + C`` is a run of ``w`` such pairs ending
    at ``e``, so the ordinary window scan over this probe gives the popped answer directly.

    >>> from kvgeom.probes import as_probe
    >>> import kvgeom
    >>> geom = kvgeom.resolve({"groups": [{"kind": "full_attention", "block_size": 16}], "offload": {}})
    >>> pairs = eagle_pair_held(as_probe(geom, {0: [16, 32, 64]}), 16, 64)
    >>> [e for e in (16, 32, 48, 64) if pairs.contains(0, e)]
    [16]
    """
    return _PairProbe(probe, chunk, stop)


class _PairProbe(Probe):
    """:func:`eagle_pair_held`'s probe over an inner one."""

    __slots__ = ("_chunk", "_inner", "_stop")

    def __init__(self, inner: Probe, chunk: int, stop: int) -> None:
        super().__init__(inner.bound)
        self._inner, self._chunk, self._stop = inner, chunk, stop

    def contains(self, group: int, end_token: int) -> bool:
        C, inner = self._chunk, self._inner
        return (
            end_token % C == 0
            and end_token + C <= self._stop
            and inner.contains(group, end_token)
            and inner.contains(group, end_token + C)
        )

    def below(self, group: int, tokens_per_chunk: int, j: int) -> int:
        # every pair-held chunk is held, so the inner probe's next possibly held chunk is a safe bound
        return self._inner.below(group, tokens_per_chunk, j)


def partial_tail_key(og: OffloadGroupGeometry, boundary: int) -> int:
    """End token of the key holding a group's partial tail at ``boundary``: ``boundary + proof_margin`` for an
    eagle group (``_partial_tail_key_tokens``), ``boundary`` otherwise.
    >>> import kvgeom
    >>> cfg = {"groups": [{"kind": "full_attention", "block_size": 16}, {"kind": "mamba", "block_size": 16},
    ...                   {"kind": "full_attention", "block_size": 16, "num_kv_heads": 4, "drafter": True}],
    ...        "parallel": {"tp": 2, "dcp": 2}, "offload": {},
    ...        "speculative": {"method": "eagle", "num_speculative_tokens": 2}}
    >>> geom = kvgeom.resolve(cfg)
    >>> partial_tail_key(geom.offload.group(2), 80)
    80
    """
    return boundary + (og.proof_margin or 0)


def partial_tail_max_boundary(geom: Geometry, num_tokens: int, prompt: int, done: int, limit: int) -> int:
    """The highest partial-tail boundary an offload lookup tries (``_lookup``).

    ``rdown(min(prompt - 1, done + blocks * S - 1, limit, hashes * H - margin), H)`` where ``blocks`` is 2 when
    some group has an eagle proof margin (a tail may lie in the block after the popped chunk), else 1, and the
    last term (the proof key needs a hash past the boundary) applies only with a margin. 0 for an empty prompt.

    >>> import kvgeom
    >>> geom = kvgeom.resolve({"groups": [{"kind": "full_attention", "block_size": 32, "drafter": True},
    ...     {"kind": "mamba", "block_size": 32}], "cache": {"prefix_match_unit": 8}, "offload": {},
    ...     "speculative": {"method": "eagle", "num_speculative_tokens": 2}})
    >>> partial_tail_max_boundary(geom, 100, 100, 32, 100)
    88
    """
    off = geom.offload
    assert off is not None
    if not prompt:
        return 0
    H = geom.hash_block_size
    span = off.groups[0].tokens_per_block
    margin = max((og.proof_margin or 0 for og in off.groups), default=0)
    top = min(prompt - 1, done + (2 if margin else 1) * span - 1, limit)
    if margin:
        top = min(top, (num_tokens // H) * H - margin)
    return rdown(max(top, 0), H)


# ------------------------------------------------------------------ explain


def explain_lines(geom: Geometry) -> list[str]:
    """The ``kvgeom explain`` section of a drafter: effective settings, each group's lane (target or drafter,
    eagle or not), the GPU proof margins, the connector's pop and tail margins, and the Mamba checkpoint shift.
    Empty without a ``speculative`` section.

    >>> import kvgeom
    >>> cfg = {"groups": [{"kind": "full_attention", "block_size": 16, "drafter": True}], "offload": {},
    ...        "speculative": {"method": "eagle", "num_speculative_tokens": 2}}
    >>> explain_lines(kvgeom.resolve(cfg))[0]
    'speculative: method=eagle K=2 block_drop=on lookahead_hashes=off gpu_drop=on P=1'
    """
    sg = geom.speculative
    if sg is None:
        return []

    def onoff(flag: bool) -> str:
        return "on" if flag else "off"

    lines = [
        f"speculative: method={sg.method} K={sg.num_speculative_tokens} block_drop={onoff(sg.block_drop)} "
        f"lookahead_hashes={onoff(sg.lookahead_hashes)} gpu_drop={onoff(sg.gpu_drop)} P={sg.prefill_lookahead_tokens}"
    ]
    off = geom.offload
    for g in geom.groups:
        lane = "drafter" if is_drafter_group(g.spec) else "target"
        notes = [f"{lane} lane"]
        if g.eagle_group:
            notes.append("eagle group")
        if g.proof_margin is not None:
            notes.append(f"GPU lookup matches {g.proof_margin} tokens past a hit and drops them")
        elif g.is_align_mamba and sg.gpu_drop:
            notes.append(f"no drop; its prefill checkpoint moves down one A={geom.hit_alignment_tokens}")
        if off is not None and g.index in {og.index for og in off.groups}:
            og = off.group(g.index)
            if og.eagle_group:
                notes.append(f"offload: queries one extra chunk of {og.tokens_per_chunk} and pops it")
            if og.proof_margin is not None:
                notes.append(f"offload tail key at boundary + {og.proof_margin}")
        lines.append(f"  group {g.index} ({g.kind}): " + "; ".join(notes))
    if sg.block_drop and not any(g.eagle_group for g in geom.groups):
        lines.append(
            "  no group is marked drafter: the GPU prefix cache drops for every group, the offload connector for none"
            if sg.gpu_drop
            else "  no group is marked drafter"
        )
    return lines
