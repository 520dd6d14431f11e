"""Hit lengths, load plans and store plans of an offloading connector.

This is vLLM 0.33's OffloadingConnector algorithm (reference §3.5-§3.7, fine
print 9-11) with one deliberate difference: **kvgeom re-aligns the candidate
hit to the Mamba chunk after every clamp**, where vLLM aligns once and relies
on the Mamba group being looked up last (reference §8 item 10; a fork hit the
unaligned case, weicj/vLLM-2080Ti-Definitive #133).

The guarantee every plan here keeps (property-tested): a restored Mamba state
is the state after exactly the hit's end token N, and N < num_tokens (the last
token is always recomputed, #44599), so N is a multiple of the Mamba chunk or
an exact partial-tail boundary.

Not modelled: EAGLE groups (their extra look-ahead chunk), look-ahead hash
tokens, SimpleCPUOffloadConnector's lazy mode.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from kvgeom._check import group_key, nonneg
from kvgeom._format import show
from kvgeom._math import cdiv, rdown
from kvgeom.boundaries import restore_read_block, state_block_for_boundary
from kvgeom.errors import QueryError
from kvgeom.geometry import Geometry, GroupGeometry, OffloadGeometry, OffloadGroupGeometry
from kvgeom.keys import num_keys, offload_group
from kvgeom.masks import _fits, reachable_block_mask
from kvgeom.specs import attention_chunk_size_of, sliding_window_of

__all__ = [
    "GroupLoad",
    "GroupStore",
    "Hit",
    "HitPlan",
    "StorePlan",
    "lookup_hit",
    "plan_hit",
    "plan_load",
    "plan_store",
    "skipped_tokens",
]


@dataclass(frozen=True, slots=True)
class Hit:
    """Result of a lookup: ``end_token = local_computed_tokens + hit_tokens``."""

    hit_tokens: int
    end_token: int
    local_computed_tokens: int
    """The local prefix the lookup started from (rounded down to L, as the scheduler hands it)."""
    partial_tail: bool


@dataclass(frozen=True, slots=True)
class GroupLoad:
    """What one group loads for a hit ending at ``end_token``."""

    index: int
    load_keys: tuple[int, ...]
    """End tokens of the keys to load, in order."""
    block_entries: tuple[int, ...]
    """Block-table entries written (for align Mamba: the one state block)."""
    skip_in_first_chunk: int
    """Sub-blocks of the first loaded chunk that are skipped (``first_entry % k``)."""
    state_block: int | None
    """Align-mode Mamba: the block holding the restored state (``(N-1) // B_m``)."""


@dataclass(frozen=True, slots=True)
class HitPlan:
    hit: Hit
    groups: tuple[GroupLoad, ...]

    def to_dict(self) -> dict[str, Any]:
        """The stable ``plan_hit`` contract."""
        return {
            "hit_tokens": self.hit.hit_tokens,
            "end_token": self.hit.end_token,
            "groups": [
                {
                    "index": g.index,
                    "load_keys": list(g.load_keys),
                    "block_entries": list(g.block_entries),
                    "state_block": g.state_block,
                }
                for g in self.groups
            ],
        }


def _offload(geom: Geometry) -> OffloadGeometry:
    if geom.offload is None:
        offload_group(geom, 0)  # raises the no_offload QueryError
    assert geom.offload is not None
    return geom.offload


def stored_group_index(key: Any, offloaded: Collection[int]) -> int:
    """The group index a ``stored`` key names (an int or its canonical decimal string, as in JSON; see
    :func:`kvgeom._check.group_key`), checked to be offloaded."""
    index = group_key("stored", key)
    if index not in offloaded:
        raise QueryError.single(
            "group_not_offloaded",
            f"stored names group {index}, which is not offloaded; offloaded groups are {show(sorted(offloaded))}",
            f"stored.{index}",
            group=index,
        )
    return index


def _stored_sets(
    geom: Geometry, off: OffloadGeometry, stored: Mapping[Any, Collection[int]]
) -> dict[int, frozenset[int]]:
    if not isinstance(stored, Mapping):
        raise QueryError.single(
            "bad_stored", f"stored must map a group index to end tokens, got {type(stored).__name__}", "stored"
        )
    out: dict[int, frozenset[int]] = {og.index: frozenset() for og in off.groups}
    H = geom.hash_block_size
    for key, ends in stored.items():
        index = stored_group_index(key, out)
        if (
            isinstance(ends, str | bytes | Mapping)
            or not isinstance(ends, Collection)
            or (isinstance(ends, np.ndarray) and ends.ndim != 1)
        ):
            raise QueryError.single(
                "bad_stored", f"stored[{index}] must be a list of end tokens, got {show(ends)}", f"stored.{index}"
            )
        checked = set()
        for e in ends:
            e = nonneg(f"stored.{index} end token", e)
            if e == 0 or e % H:
                raise QueryError.single(
                    "not_on_hash_grid",
                    f"stored[{index}] holds end token {e}; keys end on positive multiples of the hash unit H={H}",
                    f"stored.{index}",
                    end_token=e,
                    hash_block_size=H,
                )
            checked.add(e)
        out[index] = frozenset(checked)
    return out


def _need_tokens(g: GroupGeometry) -> int | None:
    """Positions before a hit end that a windowed group must hold (None: Mamba, one key)."""
    window = sliding_window_of(g.spec)
    if window is not None:
        return window[0] - 1 + window[1]
    size = attention_chunk_size_of(g.spec)
    if size is not None:
        return size - 1
    return None


def _scan_window(
    g: GroupGeometry, og: OffloadGroupGeometry, held: frozenset[int], end: int, start_chunk: int
) -> int | None:
    """Right-to-left scan for a run of stored chunks that serves a hit ending at ``end``.

    Returns the new candidate end (the right edge of the run found), or None.
    The first run may end inside a chunk; later runs end on chunk boundaries.
    A run that reaches the start of the scan counts even when short (fine print 9).
    """
    C = og.tokens_per_chunk
    w = _need_tokens(g)
    window = og.window_chunks or 1

    def need(at: int) -> int:
        if w is None:  # Mamba: the single key ending at the candidate
            return 1
        n = cdiv(w + (-at) % C, C)
        return max(n, window) if g.family == "chunked" else n

    held_chunks = sorted(e // C - 1 for e in held if e % C == 0)
    run_end = end
    cur = need(run_end)
    run = 0
    j = cdiv(end, C) - 1
    while j >= start_chunk:
        if cur <= run:
            return run_end
        if (j + 1) * C in held:
            run += 1
            j -= 1
            continue
        run = 0
        run_end = j * C
        cur = need(run_end)
        if cur <= 0:
            return run_end
        # Every chunk down to the next held one is a miss too, and a miss on the chunk grid always needs
        # the same run: jump there instead of stepping (a long request with few keys stays cheap).
        below = bisect_right(held_chunks, j - 1) - 1
        nxt = max(held_chunks[below] if below >= 0 else start_chunk - 1, start_chunk - 1)
        if nxt < j - 1:
            run_end = (nxt + 1) * C
            cur = need(run_end)
        j = nxt
    if run >= cur or run > 0:
        return run_end
    return None


def _align_to_mamba_chunk(m: int, mamba_chunk: int | None) -> int:
    """A candidate hit rounded down to the Mamba chunk (#44599); module level so the property tests
    can break it on purpose and show the hit laws catch it."""
    return rdown(m, mamba_chunk) if mamba_chunk else m


def lookup_hit(
    geom: Geometry,
    num_tokens: int,
    *,
    stored: Mapping[Any, Collection[int]],
    num_prompt_tokens: int | None = None,
    local_computed_tokens: int = 0,
    max_load_tokens: int | None = None,
    max_num_new_tokens: int | None = None,
) -> Hit:
    """How many tokens past the local prefix an offload tier can supply (reference §3.6).

    ``stored`` maps a group index to the end tokens of the keys the tier holds
    for this request. The local prefix is rounded down to the scheduler block L
    first, as the scheduler hands it to the connector.

    Postconditions: ``end_token < num_tokens`` whenever a windowed (sliding,
    chunked or Mamba) group exists; with an align Mamba group ``end_token`` is
    a multiple of the Mamba chunk, or an exact partial-tail boundary whose
    boundary key every group holds; every full-attention chunk covering
    ``[local, end_token)`` is stored; the Mamba key ending at ``end_token`` is
    stored.

    >>> import kvgeom
    >>> g = kvgeom.resolve(kvgeom.DEFAULT_CONFIG)
    >>> lookup_hit(g, 64, stored={0: [32, 64], 1: [16, 32, 48, 64]}).end_token
    48
    """
    off = _offload(geom)
    n = nonneg("num_tokens", num_tokens)
    prompt = n if num_prompt_tokens is None else nonneg("num_prompt_tokens", num_prompt_tokens)
    if prompt > n:
        raise QueryError.single(
            "prompt_longer_than_request",
            f"num_prompt_tokens={prompt} exceeds num_tokens={n}; a request holds its whole prompt",
            "num_prompt_tokens",
            num_prompt_tokens=prompt,
            num_tokens=n,
        )
    local = nonneg("local_computed_tokens", local_computed_tokens)
    if local > n:
        raise QueryError.single(
            "local_past_request",
            f"local_computed_tokens={local} exceeds num_tokens={n}",
            "local_computed_tokens",
            local_computed_tokens=local,
            num_tokens=n,
        )
    held = _stored_sets(geom, off, stored)
    c = rdown(local, geom.scheduler_block_size)
    H = geom.hash_block_size

    M = n
    if max_num_new_tokens is not None:
        M = min(M, c + nonneg("max_num_new_tokens", max_num_new_tokens))
    if max_load_tokens is not None:
        M = min(M, c + nonneg("max_load_tokens", max_load_tokens))
    limit = M
    Cm = off.mamba_align_size

    def realign(m: int) -> int:
        return _align_to_mamba_chunk(m, Cm)

    groups = geom.groups
    windowed = [og for og in off.groups if og.window_chunks is not None]
    full = [og for og in off.groups if og.window_chunks is None]
    if windowed:
        M = realign(max(M - 1, 0))

    def clamp(og: OffloadGroupGeometry, m: int) -> int:
        m = min(m, num_keys(geom, og.index, n) * og.tokens_per_chunk)
        if max_load_tokens is not None:
            m = rdown(m, og.tokens_per_chunk)
        return realign(m)

    def complete() -> int:
        m = M
        for og in full:
            C = og.tokens_per_chunk
            m = clamp(og, m)
            if m - c < C:
                return c
            first = c // C
            hits = 0
            while (first + hits + 1) * C in held[og.index] and (first + hits) * C < m:
                hits += 1
            m = realign(min(m, C * (first + hits)))
            if m - c < C:
                return c
        ordered = sorted(windowed, key=lambda og: -(og.window_chunks or 0))
        while True:
            changed = False
            for og in ordered:
                C = og.tokens_per_chunk
                before = m
                m = clamp(og, m)
                if m - c < C:
                    return c
                found = _scan_window(groups[og.index], og, held[og.index], m, c // C)
                if found is None:
                    return c
                m = realign(min(m, found))
                if m - c < C:
                    return c
                changed = changed or m < before
            if not changed:
                return m

    done = complete()
    if off.supports_partial_tail:
        span = off.groups[0].tokens_per_block
        b = rdown(min(prompt - 1, done + span - 1, limit), H) if prompt else 0
        while b > done:
            if all(b in held[og.index] for og in off.groups):
                return Hit(b - c, b, c, True)
            b -= H
    return Hit(done - c, done, c, False)


def skipped_tokens(geom: Geometry, group: int, end_token: int) -> int:
    """Leading tokens a group does not need for a request resuming at ``end_token`` (fine print 10).

    Full attention 0; sliding window ``N - sliding_window + 1 - extra``; chunked
    local ``rdown(N, attention_chunk_size)``; Mamba ``N - 1`` (only the last
    state matters).

    >>> import kvgeom
    >>> skipped_tokens(kvgeom.resolve(kvgeom.DEFAULT_CONFIG), 1, 64)
    63
    """
    g = geom.group(group)
    N = nonneg("end_token", end_token)
    window = sliding_window_of(g.spec)
    if window is not None:
        return max(N - (window[0] - 1 + window[1]), 0)
    size = attention_chunk_size_of(g.spec)
    if size is not None:
        return rdown(N, size)
    return max(N - 1, 0) if g.family == "mamba" else 0


def plan_load(geom: Geometry, hit: Hit) -> tuple[GroupLoad, ...]:
    """Per offloaded group, the keys to load and the block entries they fill (reference §3.7).

    First entry ``max(cdiv(c, S), skipped(N) // S)``; entries up to
    ``cdiv(N, S)``; keys are chunks ``[first // k, cdiv(N, C))``, the last one
    replaced by the boundary key N for a partial tail. An align Mamba group
    loads exactly the one key ending at N into block ``(N - 1) // B_m``.
    """
    off = _offload(geom)
    c, N = hit.local_computed_tokens, hit.end_token
    out = []
    for og in off.groups:
        g = geom.groups[og.index]
        S, C = og.tokens_per_block, og.tokens_per_chunk
        k = off.blocks_per_chunk
        stop = cdiv(N, S)
        first = max(cdiv(c, S), skipped_tokens(geom, og.index, N) // S)
        if hit.hit_tokens == 0 or first >= stop:
            out.append(GroupLoad(og.index, (), (), 0, None))
            continue
        last = cdiv(N, C) - (1 if hit.partial_tail else 0)
        keys = tuple((j + 1) * C for j in range(first // k, last))
        if hit.partial_tail:
            keys += (N,)
        state = restore_read_block(geom, og.index, N) if g.is_align_mamba else None
        out.append(GroupLoad(og.index, keys, tuple(range(first, stop)), first % k, state))
    return tuple(out)


def plan_hit(geom: Geometry, scenario: Mapping[str, Any]) -> HitPlan:
    """Lookup and load plan for a scenario dict (the CLI's ``hit`` input).

    ``scenario``: ``num_tokens``, optional ``num_prompt_tokens``,
    ``local_computed_tokens``, ``stored`` (``{"<group>": [end tokens]}``),
    ``max_load_tokens``, ``max_num_new_tokens``; unknown keys are an error.

    >>> import kvgeom
    >>> g = kvgeom.resolve(kvgeom.DEFAULT_CONFIG)
    >>> plan_hit(g, {"num_tokens": 65, "stored": {"0": [32, 64], "1": [16, 32, 48, 64]}}).to_dict()["groups"][1]
    {'index': 1, 'load_keys': [64], 'block_entries': [3], 'state_block': 3}
    """
    if not isinstance(scenario, Mapping):
        raise QueryError.single("bad_scenario", f"a scenario is an object, got {type(scenario).__name__}", "")
    allowed = {"num_tokens", "num_prompt_tokens", "local_computed_tokens", "stored", "max_load_tokens",
               "max_num_new_tokens"}
    unknown = [k for k in scenario if not (isinstance(k, str) and k in allowed)]  # keys of any type, in order
    if unknown:
        raise QueryError.single(
            "unknown_key", f"unknown scenario key(s) {show(unknown)}; allowed: {sorted(allowed)}", show(unknown[0], 60)
        )
    if "num_tokens" not in scenario:
        raise QueryError.single("missing_field", "a scenario needs num_tokens", "num_tokens")
    hit = lookup_hit(
        geom,
        scenario["num_tokens"],
        stored=scenario.get("stored", {}),
        num_prompt_tokens=scenario.get("num_prompt_tokens"),
        local_computed_tokens=scenario.get("local_computed_tokens", 0),
        max_load_tokens=scenario.get("max_load_tokens"),
        max_num_new_tokens=scenario.get("max_num_new_tokens"),
    )
    return HitPlan(hit, plan_load(geom, hit))


@dataclass(frozen=True, slots=True)
class GroupStore:
    """What one group stores this step: chunk indices and their key end tokens."""

    index: int
    chunks: tuple[int, ...]
    end_tokens: tuple[int, ...]
    block_entries: tuple[tuple[int, ...], ...]
    """Positional groups: the entries of each chunk. Align Mamba: the one state block per key."""


@dataclass(frozen=True, slots=True)
class StorePlan:
    offloadable_tokens: int
    groups: tuple[GroupStore, ...]

    def to_dict(self) -> dict[str, Any]:
        return {
            "offloadable_tokens": self.offloadable_tokens,
            "groups": [
                {
                    "index": g.index,
                    "chunks": list(g.chunks),
                    "end_tokens": list(g.end_tokens),
                    "block_entries": [list(e) for e in g.block_entries],
                }
                for g in self.groups
            ],
        }


def plan_store(
    geom: Geometry,
    *,
    num_tokens: int,
    num_computed_tokens: int,
    num_prompt_tokens: int | None = None,
    stored_chunks: Mapping[int, int] | None = None,
    allocated_blocks: Mapping[int, int] | None = None,
    reachable: Collection[int] | None = None,
    offload_prompt_only: bool = True,
    max_offload_tokens: int | None = None,
    finished: bool = False,
) -> StorePlan:
    """Chunks each offloaded group stores after a step (reference §3.5).

    Offloadable tokens = min(computed, num_tokens, max_offload_tokens, and the
    prompt when ``offload_prompt_only``); a finished request stops at
    ``max(num_prompt, num_tokens - 1)``. Per group the storable chunks are
    ``min(offloadable // C, allocated // k, keyed chunks)``, from
    ``stored_chunks[g]`` (default 0) on, thinned by
    :func:`kvgeom.masks.reachable_block_mask` (a chunk survives if any of its
    blocks is kept). ``reachable`` defaults to the replay boundary
    ``num_prompt - 1``.

    Postcondition: an align Mamba group stores only keys ending on multiples of
    its chunk ``C_m = B_m * k``, each from state block ``end / B_m - 1`` --
    never ``end / (B_m * dcp) - 1`` (#49962).

    >>> import kvgeom
    >>> g = kvgeom.resolve({**kvgeom.DEFAULT_CONFIG, "cache": {"retention_interval": None}})
    >>> [s.chunks for s in plan_store(g, num_tokens=64, num_computed_tokens=64).groups]
    [(0, 1), (0, 1, 2, 3)]
    """
    off = _offload(geom)
    n = nonneg("num_tokens", num_tokens)
    computed = nonneg("num_computed_tokens", num_computed_tokens)
    prompt = n if num_prompt_tokens is None else nonneg("num_prompt_tokens", num_prompt_tokens)
    offloadable = min(computed, n)
    if max_offload_tokens is not None:
        offloadable = min(offloadable, nonneg("max_offload_tokens", max_offload_tokens))
    if offload_prompt_only:
        offloadable = min(offloadable, prompt)
    if finished:
        offloadable = min(offloadable, max(prompt, n - 1))
    points = tuple(reachable) if reachable is not None else ((prompt - 1,) if prompt > 0 else ())
    out = []
    for og in off.groups:
        g = geom.groups[og.index]
        C = og.tokens_per_chunk
        k = off.blocks_per_chunk
        keyed = num_keys(geom, og.index, n)
        storable = min(offloadable // C, keyed)
        if allocated_blocks is not None and og.index in allocated_blocks:
            storable = min(storable, nonneg(f"allocated_blocks[{og.index}]", allocated_blocks[og.index]) // k)
        start = nonneg(f"stored_chunks[{og.index}]", (stored_chunks or {}).get(og.index, 0))
        _fits(storable - start)
        mask = reachable_block_mask(geom, og.index, storable * k, first_block=start * k, reachable=points)
        entries: tuple[tuple[int, ...], ...]
        if g.is_align_mamba:
            # Boundary hand-off: the state after exactly (j+1)*C tokens lives in block (j+1)*C/B_m - 1.
            states = {j: state_block_for_boundary(geom, og.index, (j + 1) * C) for j in range(start, storable)}
            chunks = tuple(j for j, b in states.items() if mask is None or b in mask)
            entries = tuple((states[j],) for j in chunks)
        else:
            chunks = tuple(
                j for j in range(start, storable) if mask is None or any(b in mask for b in range(j * k, (j + 1) * k))
            )
            entries = tuple(tuple(range(j * k, (j + 1) * k)) for j in chunks)
        out.append(GroupStore(og.index, chunks, tuple((j + 1) * C for j in chunks), entries))
    return StorePlan(offloadable, tuple(out))
