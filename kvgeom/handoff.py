"""Which align-mode Mamba states reach the offload tier: the GPU manager's boundary-state hand-off.

An align Mamba group's offload keys are not chosen by the connector's chunk scan: vLLM 0.33's GPU Mamba
manager hashes a state block when the prefix cache caches it and hands that block to the connector
(``v1/core/single_type_kv_cache_manager.py::MambaManager.cache_blocks``, drained by
``KVCacheManager.take_boundary_state_offloads``); the connector stores each hand-off whose boundary is
a multiple of the group's offload chunk (``offloading/scheduler.py::_build_aligned_boundary_store_jobs``)
and, with partial tails on, the prompt's sub-block checkpoint as a partial-tail job for every group
(``_build_partial_tail_store_jobs``). So a Mamba key ending at ``e`` inside the prompt reaches the tier
iff all of:

* **a state exists at e**: a prefill chunk ended at ``e`` (:func:`kvgeom.prefill.prefill_chunk_ends`;
  align mode writes a state only at chunk ends) and ``e`` is a multiple of the Mamba block;
* **it is cacheable in time**: ``e <= mamba_cacheable_tokens(e')`` for the end ``e'`` of the step after the
  one ending at ``e`` (:func:`cached_state_ends`: the state's block is reused after that), and so
  ``e <= mamba_cacheable_tokens(computed)`` -- the coordinator caches a prefix
  rounded down to L unless partial hash hits are on, and an eagle Mamba manager (the coordinator's
  all-groups fallback) keeps the last ``P - 1`` tokens of multi-module MTP and more than one block past the
  aligned boundary out (``HybridKVCacheCoordinator.get_num_cacheable_tokens``);
* **it is retained**: the Mamba store mask keeps its block
  (:func:`kvgeom.masks.reachable_block_mask` at the replay boundaries of
  :func:`replay_boundaries`), or ``e`` is the prompt's H-grid checkpoint, which the manager keys whatever
  the mask says (``MambaManager._cache_partial_tail_block``).

All partial-tail helpers live here: the boundary a prompt's partial-tail store job keys
(:func:`partial_tail_boundary`), the key end of a group's tail at a boundary, ``b + proof_margin`` for an
eagle group (:func:`partial_tail_key`), and the highest boundary an offload lookup tries
(:func:`partial_tail_max_boundary`).

Invariants (property-tested in ``tests/property/test_store_plan_laws.py``):

* every key :func:`mamba_handoffs` returns is a chunk end and a multiple of the Mamba block, so the block
  ``e / B_m - 1`` holds the state after exactly ``e`` tokens -- never the state of an earlier chunk end
  that shares the block (vLLM 0.33 keys such a block at its end when the Mamba block is not
  ``cache_config.block_size``; ``docs/deviations.md``, ``mamba-state-keyed-past-chunk-end``);
* a partial-tail boundary is a multiple of H below the prompt, not a multiple of the span, and a chunk
  ended there.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Collection, Iterable, Sequence
from itertools import accumulate
from typing import Any

from kvgeom._check import bounded_ints, nonneg
from kvgeom._math import rdown
from kvgeom.errors import QueryError
from kvgeom.geometry import Geometry, OffloadGroupGeometry
from kvgeom.masks import MAX_STORE_BLOCKS, reachable_block_mask, reachable_points
from kvgeom.prefill import mamba_checkpoint, prompt_hash_checkpoint

__all__ = [
    "cached_state_ends",
    "checked_chunk_ends",
    "checked_prefill_split",
    "checkpoint_step",
    "default_chunk_ends",
    "handed_over_tokens",
    "mamba_cacheable_tokens",
    "mamba_handoffs",
    "partial_tail_boundary",
    "partial_tail_key",
    "partial_tail_max_boundary",
    "replay_boundaries",
    "state_ends",
]


def replay_boundaries(geom: Geometry, num_prompt_tokens: int) -> tuple[int, ...]:
    """Where a later request replaying the prompt can resume: the positions whose state the store masks
    keep (vLLM 0.33 ``v1/core/kv_cache_coordinator.py::replay_boundaries``).

    Without the GPU drop ``(num_prompt - 1,)``; with it, one scheduler block below the resend cap and below
    the extension boundary, ``{rdown(n - 1, L) - L, rdown(n, L) - L}`` (each at least 0). Empty for an
    empty prompt.

    >>> import kvgeom
    >>> replay_boundaries(kvgeom.resolve(kvgeom.DEFAULT_CONFIG), 100)
    (99,)
    """
    n = nonneg("num_prompt_tokens", num_prompt_tokens)
    if n == 0:
        return ()
    sg = geom.speculative
    if sg is None or not sg.gpu_drop:
        return (n - 1,)
    L = geom.scheduler_block_size
    return tuple(sorted({max(rdown(n - 1, L) - L, 0), max(rdown(n, L) - L, 0)}))


def _eagle_manager(geom: Geometry, group: int) -> bool:
    """Whether the GPU manager of ``group`` runs with the eagle bit (it caches differently): the group is in
    the coordinator's drop set, which holds every group -- Mamba too -- when none is flagged."""
    return group in geom.gpu_drop_groups


def mamba_cacheable_tokens(geom: Geometry, group: int, num_computed_tokens: int) -> int:
    """The prefix of ``num_computed_tokens`` the prefix cache may hash in ``group`` (vLLM 0.33
    ``KVCacheCoordinator.get_num_cacheable_tokens`` and the hybrid coordinator's override).

    One group (the unitary coordinator): ``c - (P - 1)``. Several: ``c`` with partial hash hits, else
    ``rdown(c, L)``; a manager with the eagle bit (:func:`_eagle_manager`) then caches at most one block
    past the aligned boundary of its finalized tokens ``c - (P - 1)``. ``P`` is the prefill lookahead
    (``P - 1`` tokens of multi-module MTP may be re-prefilled). 0 with prefix caching off.

    Postcondition: ``0 <= result <= num_computed_tokens``.

    >>> import kvgeom
    >>> mamba_cacheable_tokens(kvgeom.resolve(kvgeom.DEFAULT_CONFIG), 1, 100)  # H = 16 < L, partial hits on
    100
    """
    geom.group(group)  # a list or dict index raises no_such_group, not a TypeError
    c = nonneg("num_computed_tokens", num_computed_tokens)
    if not geom.config.cache.prefix_caching:
        return 0
    sg = geom.speculative
    reprefill = max(0, (sg.prefill_lookahead_tokens if sg is not None else 0) - 1)
    if len(geom.groups) < 2:
        return max(0, c - reprefill)

    def align(x: int) -> int:
        return x if geom.partial_hash_hits else rdown(x, geom.scheduler_block_size)

    cached = align(c)
    if cached > 0 and _eagle_manager(geom, group):
        finalized = max(0, c - reprefill)
        return min(finalized, align(finalized) + geom.groups[group].span)
    return cached


def handed_over_tokens(geom: Geometry, group: int, num_prompt_tokens: int, num_computed_tokens: int) -> int | None:
    """How far align Mamba group ``group``'s GPU manager has offered its states to the connector by the end of the
    step that computed ``num_computed_tokens``: while the prompt is prefilled, :func:`mamba_cacheable_tokens` of the
    computed tokens (each state is offered once, in the step that made it cacheable, so a store plan starts its
    next step past it: ``GroupStore.next_stored_chunk``); None once the prompt is computed (keys past the prompt
    follow the store mask; decode-time hand-offs are not modelled).

    >>> import kvgeom
    >>> g = kvgeom.resolve({**kvgeom.DEFAULT_CONFIG, "offload": {}})   # partial hash hits: c tokens cacheable
    >>> handed_over_tokens(g, 1, 100, 50), handed_over_tokens(g, 1, 100, 100)
    (50, None)
    """
    prompt = nonneg("num_prompt_tokens", num_prompt_tokens)
    computed = nonneg("num_computed_tokens", num_computed_tokens)
    return mamba_cacheable_tokens(geom, group, computed) if computed < prompt else None


def default_chunk_ends(geom: Geometry, num_prompt_tokens: int) -> tuple[int, ...]:
    """Where vLLM 0.33 ends the prefill chunks of a prompt with an unbounded token budget: the running sums of
    ``MambaCheckpoint.prefill_chunks`` (:func:`kvgeom.prefill.mamba_checkpoint`, kept total where
    :func:`kvgeom.prefill.prefill_chunk_ends` raises ``prefill_stalls``) with an align Mamba group; one chunk
    without one. Empty for an empty prompt.

    >>> import kvgeom
    >>> default_chunk_ends(kvgeom.resolve(kvgeom.DEFAULT_CONFIG), 100)
    (96, 100)
    """
    n = nonneg("num_prompt_tokens", num_prompt_tokens)
    if not n:
        return ()
    if not any(g.is_align_mamba for g in geom.groups):
        return (n,)
    return tuple(accumulate(mamba_checkpoint(geom, n).prefill_chunks))


def state_ends(
    geom: Geometry,
    num_prompt_tokens: int,
    num_computed_tokens: int,
    chunk_ends: Collection[int] | None = None,
    *,
    above: int = 0,
    upto: int | None = None,
) -> tuple[int, ...]:
    """The chunk ends at or below ``min(computed, prompt)`` -- the only positions inside the prompt where an
    align Mamba state was written. Sorted, without 0; a ``num_computed_tokens`` below the prompt is itself a
    chunk end (the step that stores ended there).

    ``chunk_ends`` None: vLLM 0.33's split with an unbounded token budget (:func:`default_chunk_ends`). A
    deployment whose budget is below the prompt splits it more finely: pass
    ``prefill_chunk_ends(geom, n, max_num_batched_tokens=...)`` to get exactly the states vLLM 0.33 writes
    then (kvgeom 0.3 and earlier assumed a state at every Mamba block boundary without the GPU drop, which
    no vLLM split leaves behind for a prompt longer than two blocks; issue 19).

    >>> import kvgeom
    >>> state_ends(kvgeom.resolve(kvgeom.DEFAULT_CONFIG), 100, 100, chunk_ends=(96, 100))
    (96, 100)

    Only ends in ``(above, upto]`` are listed (``upto`` None: no upper bound), so a caller that stores a
    window of chunks never materialises the rest.
    """
    prompt = nonneg("num_prompt_tokens", num_prompt_tokens)
    computed = nonneg("num_computed_tokens", num_computed_tokens)
    above, upto = _window_bound("above", above), None if upto is None else _window_bound("upto", upto)
    top = min(computed, prompt) if upto is None else min(computed, prompt, upto)
    if chunk_ends is None:
        ends = set(default_chunk_ends(geom, prompt))
    else:
        ends = set(checked_chunk_ends(chunk_ends))
    if 0 < computed < prompt:
        ends.add(computed)
    return tuple(sorted(e for e in ends if max(above, 0) < e <= top))


def cached_state_ends(
    geom: Geometry,
    group: int,
    num_prompt_tokens: int,
    num_computed_tokens: int,
    chunk_ends: Collection[int] | None = None,
    *,
    above: int = 0,
    upto: int | None = None,
) -> tuple[int, ...]:
    """The chunk ends (:func:`state_ends`) whose align Mamba state group ``group``'s prefix cache has cached by
    the end of the step that computed ``num_computed_tokens``: the state written at ``e`` lives in its block
    until the step after the next one starts, so it is cached only if ``e <= mamba_cacheable_tokens(e')``,
    ``e'`` the end of the next step (the next chunk end; ``min(computed, prompt)`` past the last; ``e`` itself
    when the prefill has not gone past ``e``). With multi-module MTP (``P - 1`` re-prefilled tokens) a chunk
    shorter than ``P - 1`` tokens after ``e`` loses the state at ``e``: chunk ends 64, 65, 96 of an MTP K=3
    prefill cache no state at 64 (vLLM 0.33 runs, GPU prefix cache and connector hand-offs alike; issue 19).

    Postcondition: a subset of ``state_ends(..., above=above, upto=upto)``, each end ``e`` at most
    :func:`mamba_cacheable_tokens` of ``min(computed, prompt)``.

    >>> import kvgeom
    >>> g = kvgeom.resolve({"groups": [{"kind": "full_attention", "block_size": 32}, {"kind": "mamba",
    ...     "block_size": 32}], "cache": {"prefix_match_unit": 16}, "offload": {},
    ...     "speculative": {"method": "mtp", "num_speculative_tokens": 3, "mtp_modules": 3}})
    >>> cached_state_ends(g, 1, 150, 150, (64, 65, 96, 150)), cached_state_ends(g, 1, 150, 150, (64, 66, 96, 150))
    ((65, 96), (64, 66, 96))
    """
    geom.group(group)
    ends = state_ends(geom, num_prompt_tokens, num_computed_tokens, chunk_ends, above=above)
    top = None if upto is None else _window_bound("upto", upto)
    last = min(num_computed_tokens, num_prompt_tokens)
    listed = ends if top is None else ends[: bisect_right(ends, top)]
    return tuple(e for e in listed if e <= mamba_cacheable_tokens(geom, group, _step_after(ends, e, last)))


def _step_after(ends: Sequence[int], e: int, last: int) -> int:
    """Where the step after the one ending at chunk end ``e`` ends: the first of the sorted ``ends`` past ``e``,
    else the prefill's own end ``last`` (``min(computed, prompt)``), or ``e`` itself when the prefill has not gone
    past it. The one home of "the next step" for the states a chunk end leaves (:func:`cached_state_ends`), the
    step that caches exactly the checkpoint (:func:`_exact_end`) and the partial tail's hand-off step
    (:func:`_handoff_end`)."""
    i = bisect_right(ends, e)
    return ends[i] if i < len(ends) else max(e, last)


def _window_bound(name: str, value: Any) -> int:
    """An ``above``/``upto`` window bound: any int (negative is below everything), else ``not_an_integer``."""
    return value if type(value) is int else nonneg(name, value)


def checked_chunk_ends(chunk_ends: Any) -> tuple[int, ...]:
    """``chunk_ends`` (token counts at which prefill chunks ended) checked: an iterable of ints in
    ``[0, int64 max]``, not a string, at most :data:`kvgeom.masks.MAX_STORE_BLOCKS` of them (``bad_chunk_ends``,
    ``result_too_large``, ``not_an_integer``, ...; a million ends cost seconds, issue 19).

    >>> checked_chunk_ends([64, 100])
    (64, 100)
    """
    return tuple(bounded_ints("chunk_ends", chunk_ends, MAX_STORE_BLOCKS, "chunk_ends[]", "token counts"))


def checked_prefill_split(chunk_ends: Any, num_tokens: int) -> tuple[int, ...]:
    """``chunk_ends`` checked as the whole prefill split of a ``num_tokens`` prompt (:func:`checked_chunk_ends`,
    and strictly increasing positive counts ending at ``num_tokens``; empty for an empty prompt): else
    ``bad_chunk_ends`` naming ``num_tokens``.

    >>> checked_prefill_split([64, 100], 100)
    (64, 100)
    """
    n = nonneg("num_tokens", num_tokens)
    ends = checked_chunk_ends(chunk_ends)
    if n and (not ends or ends[-1] != n or any(b <= a for a, b in zip((0, *ends), ends, strict=False))):
        raise QueryError.single(
            "bad_chunk_ends",
            f"chunk_ends={list(ends)[:8]} must be strictly increasing positive token counts ending at "
            f"num_tokens={n} (where each prefill step stopped)",
            "chunk_ends",
            num_tokens=n,
        )
    return ends


def _exact_end(
    geom: Geometry, group: int, prompt: int, computed: int, chunk_ends: Collection[int] | None, t: int
) -> int | None:
    """The prefill step end with exactly ``t`` tokens cacheable in ``group`` while the state written at the chunk
    end ``t`` is still in its block, or None: the step ending at ``t`` or the next one (the state's block is
    reused after that, :func:`cached_state_ends`; FA 64 + Mamba 32 with MTP K=5, two modules, prompt 91, chunk
    ends 32, 36, 56, 64: 32 tokens are cacheable only at 64, and vLLM 0.33 keeps no state at 32). A step ending
    at ``e`` caches at least ``e - L - (P - 1)`` tokens, so only ends up to that far past ``t`` are read."""
    sg = geom.speculative
    reach = geom.scheduler_block_size + (sg.prefill_lookahead_tokens if sg is not None else 0)
    ends = state_ends(geom, prompt, computed, chunk_ends, above=t - 1, upto=t + reach)
    steps = (t, _step_after(ends, t, min(computed, prompt)))
    return next((e for e in steps if mamba_cacheable_tokens(geom, group, e) == t), None)


def checkpoint_step(
    geom: Geometry, group: int, num_prompt_tokens: int, num_computed_tokens: int,
    chunk_ends: Collection[int] | None = None,
) -> int | None:
    """Where the prefill step that cached exactly the prompt's H-grid checkpoint ``t`` ended
    (:func:`kvgeom.prefill.prompt_hash_checkpoint`), when a chunk also ended at ``t`` and that step is the one
    ending at ``t`` or the next (the state's block is reused after that, :func:`cached_state_ends`); None
    otherwise. The one home of the rule that vLLM 0.33 keeps align Mamba group ``group``'s state at ``t`` only
    then (a step ending at ``e`` caches :func:`mamba_cacheable_tokens` of ``e``; ``chunk_ends`` as
    :func:`state_ends` reads them):
    :func:`mamba_handoffs` keys it, :func:`partial_tail_boundary` stores it as the partial tail (handed over
    after that step), the simulated GPU prefix cache keeps it.

    Postcondition: None, or an end ``e`` with ``t <= e <= min(computed, prompt)``, ``t`` a chunk end, ``e`` equal
    to ``t`` or the next chunk end, and ``mamba_cacheable_tokens(geom, group, e) == t``.

    >>> import kvgeom
    >>> g = kvgeom.resolve({**kvgeom.DEFAULT_CONFIG, "offload": {}})   # FA 16 + Mamba 16, DCP 2: t = 96
    >>> checkpoint_step(g, 1, 100, 100, (96, 100)), checkpoint_step(g, 1, 100, 100, (90, 100))
    (96, None)
    """
    geom.group(group)  # an unknown group index is refused
    prompt = nonneg("num_prompt_tokens", num_prompt_tokens)
    computed = nonneg("num_computed_tokens", num_computed_tokens)
    t = prompt_hash_checkpoint(geom, prompt)
    if t <= 0 or t not in state_ends(geom, prompt, computed, chunk_ends, above=t - 1, upto=t):
        return None
    return _exact_end(geom, group, prompt, computed, chunk_ends, t)


def mamba_handoffs(
    geom: Geometry,
    group: int,
    num_prompt_tokens: int,
    num_computed_tokens: int,
    chunk_ends: Collection[int] | None = None,
    *,
    reachable: Iterable[int] | None = None,
    above: int = 0,
    upto: int | None = None,
) -> tuple[int, ...]:
    """End tokens of the states align Mamba group ``group`` hands the connector for a prompt prefilled
    from 0 up to ``num_computed_tokens`` (see the module docstring for the three conditions).

    ``chunk_ends``: where the prefill chunks ended (default: see :func:`state_ends`);
    ``reachable``: the boundaries the store mask keeps (default: :func:`replay_boundaries`). Needs an
    align Mamba group (:class:`kvgeom.QueryError` ``no_align_mamba`` from the default split otherwise).
    Only keys in ``(above, upto]`` are listed.

    Postcondition: sorted, each a chunk end, a multiple of the group's block and at most
    :func:`mamba_cacheable_tokens` of ``min(computed, prompt)``.

    >>> import kvgeom
    >>> g = kvgeom.resolve({**kvgeom.DEFAULT_CONFIG, "offload": {}})   # FA 16 + Mamba 16, DCP 2, retention 0
    >>> mamba_handoffs(g, 1, 100, 100, (96, 100))   # the replay boundary 99 keeps the chunk end 96
    (96,)
    """
    g = geom.group(group)
    B = g.block_size
    prompt = nonneg("num_prompt_tokens", num_prompt_tokens)
    computed = nonneg("num_computed_tokens", num_computed_tokens)
    above, upto = _window_bound("above", above), None if upto is None else _window_bound("upto", upto)
    cap = mamba_cacheable_tokens(geom, group, min(computed, prompt))
    top = cap if upto is None else min(cap, upto)
    candidates = [e for e in cached_state_ends(geom, group, prompt, computed, chunk_ends, above=above, upto=top)
                  if e % B == 0]
    if not candidates:
        return ()
    points = replay_boundaries(geom, prompt) if reachable is None else tuple(reachable_points(reachable))
    mask = reachable_block_mask(
        geom, group, candidates[-1] // B, first_block=candidates[0] // B - 1, reachable=points
    )
    checkpoint = prompt_hash_checkpoint(geom, prompt)
    keyed = checkpoint in candidates and checkpoint_step(geom, group, prompt, computed, chunk_ends) is not None
    return tuple(e for e in candidates if mask is None or e // B - 1 in mask or (e == checkpoint and keyed))


def partial_tail_boundary(
    geom: Geometry,
    num_prompt_tokens: int,
    num_computed_tokens: int,
    chunk_ends: Collection[int] | None = None,
    *,
    loaded_from_offload: bool = False,
    max_offload_tokens: int | None = None,
) -> int | None:
    """The boundary of the partial-tail store job a prompt produces, or None (vLLM 0.33
    ``_build_partial_tail_store_jobs``; partial tails need DCP 1, see ``OffloadGeometry.supports_partial_tail``).

    The prompt's H-grid checkpoint ``t`` (:func:`kvgeom.prefill.prompt_hash_checkpoint`) when it is off
    the span grid, a chunk ended there, a step ending at ``e`` (:func:`checkpoint_step`) had exactly ``t``
    tokens cacheable, and ``num_computed_tokens`` is past ``e``: the Mamba manager copies the state out of
    the block the next chunk overwrites and hands the copy over in the step after ``e``, never in ``e``
    itself (an MTP split ending 64, 80, 82, 100 caches exactly 80 at 82 and hands 80 over at 100; vLLM 0.33
    run, issue 19); ``t <= min(prompt, max_offload_tokens)``. With an eagle proof margin ``m`` on some
    offloaded group the job runs only for a request that itself loaded from the tier, and only if ``t + m``
    prompt tokens are computed by the end of the hand-off step (:func:`_handoff_end`): vLLM 0.33 offers the
    hand-off once. Every offloaded group then stores its key at :func:`partial_tail_key` of ``t``.

    >>> import kvgeom
    >>> g = kvgeom.resolve({"groups": [{"kind": "full_attention", "block_size": 64},
    ...     {"kind": "mamba", "block_size": 64}], "cache": {"prefix_match_unit": 16}, "offload": {}})
    >>> partial_tail_boundary(g, 228, 228)   # vLLM 0.33 run: FA and Mamba both store a key at 224
    224
    """
    prompt = nonneg("num_prompt_tokens", num_prompt_tokens)
    computed = nonneg("num_computed_tokens", num_computed_tokens)
    off = geom.offload
    if off is None or not off.supports_partial_tail or not prompt:
        return None
    mamba = [g.index for g in geom.groups if g.is_align_mamba]
    if not mamba:
        return None
    t = prompt_hash_checkpoint(geom, prompt)
    span = off.groups[0].tokens_per_block
    if t <= 0 or t % span == 0 or computed <= t:
        return None
    if max_offload_tokens is not None and t > nonneg("max_offload_tokens", max_offload_tokens):
        return None
    exact = checkpoint_step(geom, mamba[0], prompt, computed, chunk_ends)
    if exact is None or exact >= computed:
        return None
    margin = max((og.proof_margin or 0 for og in off.groups), default=0)
    if margin and (not loaded_from_offload or _handoff_end(geom, prompt, computed, chunk_ends, exact) < t + margin):
        return None
    return t


def _handoff_end(geom: Geometry, prompt: int, computed: int, chunk_ends: Collection[int] | None, exact: int) -> int:
    """The prompt tokens computed by the end of the step that hands a partial-tail checkpoint over, for
    ``exact < computed`` (``exact``: the step that cached exactly the checkpoint; the next chunk overwrites its
    block): the first chunk end after ``exact``, or the whole prompt when the prompt has none (the hand-off step
    is then a decode step). vLLM 0.33 offers the hand-off once: an eagle proof margin not reached by then drops
    the tail for good."""
    return _step_after(state_ends(geom, prompt, computed, chunk_ends, above=exact), exact, min(computed, prompt))


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

