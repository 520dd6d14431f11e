"""The Scheduler's prefill split: where the chunks of a prefill end and which Mamba state it checkpoints.

vLLM 0.33's scheduler splits the prefill of a request with an align-mode Mamba group on the engine
block grid (:func:`engine_block_size`, ``v1/core/sched/scheduler.py::Scheduler._mamba_block_aligned_split``):
a Mamba state exists only where a prefill chunk ends, so these chunk ends are the only states the
store side can hand to the connector (:mod:`kvgeom.handoff`, :func:`kvgeom.hits.plan_store`). The
split applies without a drafter too; a drafter only moves the checkpoint down (the GPU drop, lookahead
hashes: :func:`checkpoint_settings` reads them from ``Geometry.speculative``) and, for multi-module MTP,
keeps a chunk from ending within P tokens of the prompt's end (``Scheduler._reserve_prefill_lookahead``).
Every function here reads the resolved :class:`kvgeom.Geometry`; none decides a resolve-time rule.

Invariants (property-tested in ``tests/property/test_speculative_laws.py``):

* the Mamba prefill checkpoint is ``rdown(n, U) - U`` with the GPU drop, else
  ``rdown(n - max(1, lookahead), U)`` (vLLM ``v1/kv_cache_interface.py::get_mamba_prefill_checkpoint_position``);
  it is a multiple of U, at most ``n - 1``, and never negative;
* :class:`MambaCheckpoint`: ``shift`` is 0 without a ``speculative`` section, ``sum(prefill_chunks)`` is the
  prompt, and ``state_block`` counts the Mamba group's own blocks (never L, H or a DCP-scaled span, vLLM #55600);
* :func:`prefill_chunk_ends` is strictly increasing, ends at the prompt, every end before the last is a
  multiple of H or of :func:`engine_block_size` (with a budget of at least that block), and with a budget no
  chunk is longer than it; a prefill the multi-module MTP reserve trims to nothing raises ``prefill_stalls``
  under every budget, the unbounded one included, as vLLM 0.33 never finishes it;
* the engine block size has one home, :func:`engine_block_size_of`: the smallest block of the
  prefix-cacheable groups (of all groups when none is).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kvgeom._check import flag, nonneg, positive, prompt_tokens
from kvgeom._math import rdown, rup
from kvgeom.errors import QueryError
from kvgeom.specs import is_prefix_cacheable

if TYPE_CHECKING:
    from kvgeom.geometry import Geometry

__all__ = [
    "MambaCheckpoint",
    "checkpoint_settings",
    "engine_block_size",
    "engine_block_size_of",
    "mamba_checkpoint",
    "mamba_checkpoint_position",
    "prefill_chunk_ends",
    "prefill_tail_stop",
    "prompt_hash_checkpoint",
]


def mamba_checkpoint_position(num_tokens: int, unit: int, drop: bool, lookahead_tokens: int = 0) -> int:
    """The Mamba state a prefill of ``num_tokens`` checkpoints for reuse, on a grid of ``unit`` tokens.

    With the drop: ``rdown(n, unit) - unit``; else ``rdown(n - max(1, lookahead), unit)``; never
    below 0 (vLLM 0.33 ``v1/kv_cache_interface.py::get_mamba_prefill_checkpoint_position``).
    Postcondition: a multiple of ``unit`` and ``<= max(n - 1, 0)``.

    >>> mamba_checkpoint_position(100, 16, False), mamba_checkpoint_position(100, 16, True)
    (96, 80)
    """
    num_tokens, unit = nonneg("num_tokens", num_tokens), positive("unit", unit)
    drop, lookahead_tokens = flag("drop", drop), nonneg("lookahead_tokens", lookahead_tokens)
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
    return bool(sg and sg.gpu_drop), geom.hash_lookahead_tokens


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
    :func:`prefill_chunk_ends` with an unbounded budget; where that raises ``prefill_stalls`` (multi-module MTP
    without the drop, the ``speculative_mtp_prefill_stall`` warning) they are the split the prefill would take
    if the reserve let the stalled chunk through, so this answer stays total. Needs an align-mode Mamba group, else
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
    ends = _chunk_ends(geom, n, prompt, total=True)
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
    return engine_block_size_of((g.block_size, is_prefix_cacheable(g.spec)) for g in geom.groups)


def engine_block_size_of(groups: Iterable[tuple[int, bool]]) -> int:
    """vLLM's ``cache_config.block_size`` from each group's ``(block_size, prefix_cacheable)``: the smallest
    per-rank block of the prefix-cacheable groups, of all groups when none is (vLLM 0.33 ``v1/engine/core.py``
    lowers ``cache_config.block_size`` to it). The one home of the rule: :func:`engine_block_size` reads the
    groups of a resolved geometry, :func:`kvgeom.resolve_block_sizes` the layered groups it builds.

    >>> engine_block_size_of([(64, True), (16, False), (32, True)]), engine_block_size_of([(64, False), (16, False)])
    (32, 16)
    """
    pairs = list(groups)
    cacheable = [block for block, prefix_cacheable in pairs if prefix_cacheable]
    return min(cacheable or [block for block, _ in pairs])


def _chunk_ends(
    geom: Geometry,
    n: int,
    prompt: int,
    budget: int | Sequence[int] | None = None,
    *,
    total: bool = False,
    start: int = 0,
) -> tuple[int, ...]:
    """Where the prefill chunks of ``[start, prompt)`` end (see :func:`prefill_chunk_ends`) on the grid of
    :func:`engine_block_size`; ``budget`` the per-step token budget (None: unbounded; a sequence: one per
    step, the last one repeated). A chunk the multi-module MTP reserve trims to nothing raises
    ``prefill_stalls`` (vLLM 0.33 requeues the request forever, whatever the budget); ``total`` keeps that
    chunk instead (left to the ``speculative_mtp_prefill_stall`` warning), so :class:`MambaCheckpoint`
    stays total."""
    if prompt <= start:
        return ()
    budgets: tuple[int | None, ...] = (budget,) if budget is None or isinstance(budget, int) else tuple(budget)
    block = engine_block_size(geom)
    last = mamba_checkpoint_position(n, block, *checkpoint_settings(geom)) if n else 0
    tail = prefill_tail_stop(geom, prompt)
    sg = geom.speculative
    reserve = sg.prefill_lookahead_tokens if sg is not None else 0
    ends: list[int] = []
    while start < prompt:
        budget = budgets[min(len(ends), len(budgets) - 1)]
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
        if 0 < prompt - end < reserve and (not total or end - (reserve - (prompt - end)) > start):
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
    geom: Geometry,
    num_prompt_tokens: int,
    *,
    max_num_batched_tokens: int | Sequence[int] | None = None,
    num_computed_tokens: int = 0,
) -> tuple[int, ...]:
    """Where vLLM 0.33's scheduler ends the prefill chunks of a prompt in align Mamba mode.

    The prefill starts at ``num_computed_tokens`` (0: a fresh prompt; else where a GPU or connector hit, or
    a preemption's recomputed prefix, left the request -- on a block boundary or not) and runs to the
    prompt's end. Each step schedules up to ``max_num_batched_tokens`` tokens: one budget for every step,
    None (unbounded), or a sequence with the budget of each step of this request in order (the last one
    repeated past the end: what the other requests of a batch leave it). A chunk that does
    not reach the prompt's end is cut back to a block boundary (unless that leaves nothing because the
    budget is narrower than a block); it then stops at the first of: the
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

    Postconditions: strictly increasing, all above ``num_computed_tokens`` (empty when it is the prompt),
    the last one is the prompt, every one before the last is a multiple of H or of
    :func:`engine_block_size` (unless that step's budget is narrower than that block), and with a budget
    no chunk is longer than its step's budget. vLLM 0.33 runs (FA 64 + Mamba 64, H 16, a GPU hit of 224
    tokens, prompt 300, budgets ``[8, 100]``): ``(232, 256, 288, 300)``, a resumed chunk stopping at the
    next block boundary; from 0 with budgets ``[100, 30, 70, 1000]``: ``(64, 94, 128, 256, 288, 300)``.
    vLLM 0.33 run (FA 16 with the drafter + FA 16 + Mamba 16,
    multi-module MTP K 2 without the drop, no offload, prompt 65, budget 8192): the first chunk ends at
    63, the reserve's trim of the last cacheable boundary 64, and the request is never scheduled again;
    here that is ``prefill_stalls`` with or without a budget.

    >>> import kvgeom
    >>> cfg = {"groups": [{"kind": "full_attention", "block_size": 64}, {"kind": "mamba", "block_size": 64},
    ...                   {"kind": "full_attention", "block_size": 64, "num_kv_heads": 4, "drafter": True}],
    ...        "cache": {"prefix_match_unit": 16}, "offload": {},
    ...        "speculative": {"method": "eagle3", "num_speculative_tokens": 2}}
    >>> prefill_chunk_ends(kvgeom.resolve(cfg), 131)  # vLLM 0.33 run: chunks [64, 48, 16, 3]
    (64, 112, 128, 131)
    >>> h16 = kvgeom.resolve({"groups": [{"kind": "full_attention", "block_size": 64},
    ...     {"kind": "mamba", "block_size": 64}], "cache": {"prefix_match_unit": 16}})
    >>> prefill_chunk_ends(h16, 300, num_computed_tokens=224, max_num_batched_tokens=[8, 100])  # vLLM run
    (232, 256, 288, 300)
    """
    prompt = nonneg("num_prompt_tokens", num_prompt_tokens)
    computed = nonneg("num_computed_tokens", num_computed_tokens)
    if computed > prompt:
        raise QueryError.single(
            "out_of_range",
            f"num_computed_tokens={computed} is past the prompt of {prompt} tokens; a prefill resumes inside "
            "the prompt (give at most num_prompt_tokens)",
            "num_computed_tokens",
            num_computed_tokens=computed,
            num_prompt_tokens=prompt,
        )
    budget: int | tuple[int, ...] | None = None
    if isinstance(max_num_batched_tokens, (list, tuple)):
        budget = tuple(_budget(f"max_num_batched_tokens[{i}]", b) for i, b in enumerate(max_num_batched_tokens))
        if not budget:
            raise QueryError.single(
                "out_of_range",
                "max_num_batched_tokens=[] gives no step a budget; give at least one positive budget or None",
                "max_num_batched_tokens",
            )
    elif max_num_batched_tokens is not None:
        budget = _budget("max_num_batched_tokens", max_num_batched_tokens)
    mamba_checkpoint(geom, prompt)  # validates the geometry (align Mamba)
    return _chunk_ends(geom, prompt, prompt, budget, start=computed)


def _budget(field: str, value: object) -> int:
    """A positive token budget, else :class:`kvgeom.QueryError` naming ``field``."""
    b = nonneg(field, value)
    if b == 0:
        raise QueryError.single(
            "out_of_range",
            f"{field}=0 schedules nothing; give a positive token budget or None (unbounded)",
            field,
            **{field.split("[")[0]: 0},
        )
    return b
