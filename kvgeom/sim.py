"""A small token-accurate simulator of an engine with an offload tier.

It checks store, hit and load plans the way the bytes would move, one token
position at a time, so a plan that is off by a span, a rank or a Mamba boundary
shows up as a slot holding the wrong position or a state that consumed the
wrong number of tokens:

* **GPU**: per offloaded group a block-table row of block ids. A positional
  group's page is ``block_size`` slots per rank; each DCP rank's page holds the
  positions :func:`kvgeom.ranks.dcp_placement` deals to it (a replicated group:
  every rank holds every position, modelled as one copy). An align-mode Mamba
  state is the number of tokens it has consumed; block *i* holds the state after
  ``(i+1) * B_m`` tokens and the running block the state after every computed
  token (:mod:`kvgeom.boundaries`).
* **Tier**: a dict keyed by ``(request-hash index, group)``
  (:func:`kvgeom.keys.boundary_hash_index`), filled by :meth:`Simulator.store`
  from a store plan.
* :meth:`Simulator.reset` drops the GPU; :meth:`Simulator.load` follows a hit
  plan into fresh block ids; :meth:`Simulator.check_restored` then compares the
  GPU with a cold run of the hit's end token: every restored slot must hold the
  position it claims, every position the groups need must be back, and each
  restored Mamba state must have consumed exactly the hit's end token.

Plans are kvgeom's (:func:`kvgeom.hits.plan_store`, :func:`kvgeom.hits.plan_hit`)
or a connector's own, given as the same contract dicts (``StorePlan.to_dict()``,
``HitPlan.to_dict()``); ``docs/fuzzing.md`` shows how to check a connector's plans.

**GPU prefix cache**: :class:`GPUPrefixCache` keeps the prefix-cache entries of one hash chain per
group (with per-group eviction), and :func:`run_request` admits a second request by
:func:`kvgeom.request.plan_request`, checks the GPU entries it adopts and follows its load.

Scope: one request at a time; offloaded groups must be positional (attention,
MLA, sliding window, chunked local) or align-mode Mamba. Non-offloaded groups are
ignored. Meant for tests: it keeps every position as a Python int.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import islice
from typing import Any

from kvgeom import hits
from kvgeom._check import flag, nonneg
from kvgeom._math import cdiv
from kvgeom.boundaries import restore_read_block, running_state_block, state_block_for_boundary
from kvgeom.errors import QueryError
from kvgeom.geometry import Geometry
from kvgeom.keys import boundary_hash_index, offload_group
from kvgeom.ranks import Placement, dcp_placement

__all__ = [
    "MAX_SIM_TOKENS",
    "GPUPrefixCache",
    "RequestReport",
    "ScenarioReport",
    "Simulator",
    "run_request",
    "run_scenario",
]

_EMPTY = -1


def _as_dict(plan: Any) -> Mapping[str, Any]:
    to_dict = getattr(plan, "to_dict", None)
    out: Mapping[str, Any] = to_dict() if callable(to_dict) else plan
    return out


#: The longest request the simulator runs: it keeps every position as a Python int, so a longer one would
#: take seconds per call (issue 19); past it a run is refused (``result_too_large``) before any work.
MAX_SIM_TOKENS = 1 << 16


def _sim_tokens(name: str, value: Any) -> int:
    """``value`` checked by :func:`kvgeom._check.nonneg` and at most :data:`MAX_SIM_TOKENS`."""
    n = nonneg(name, value)
    if n > MAX_SIM_TOKENS:
        raise QueryError.single(
            "result_too_large",
            f"{name}={n}: the simulator runs requests of at most {MAX_SIM_TOKENS} tokens (it keeps every position "
            "as a Python int); use the rule functions (kvgeom.hits, kvgeom.batch) for longer requests",
            name,
            **{name: n, "limit": MAX_SIM_TOKENS},
        )
    return n


@dataclass
class _Group:
    index: int
    mamba: bool
    block_size: int
    span: int
    k: int
    chunk: int
    dealt: bool
    row: list[int] = field(default_factory=list)


class Simulator:
    """GPU block tables and pages for one request, plus an offload tier.

    >>> import kvgeom
    >>> g = kvgeom.resolve({**kvgeom.DEFAULT_CONFIG, "cache": {"retention_interval": None}})
    >>> sim = Simulator(g)
    >>> sim.prefill(64)
    >>> sim.store(kvgeom.hits.plan_store(g, num_tokens=64, num_computed_tokens=64))
    >>> sim.tier_end_tokens()   # vLLM 0.33 run: one prefill chunk to 48, then 64; Mamba states at both
    {'0': [32, 64], '1': [48, 64]}
    >>> sim.reset()
    >>> plan = kvgeom.hits.plan_hit(g, {"num_tokens": 64, "stored": sim.tier_end_tokens()})
    >>> sim.load(plan)
    >>> plan.hit.end_token, sim.check_restored(plan, num_tokens=64)
    (48, [])
    """

    def __init__(self, geom: Geometry, *, _placements: dict[int, list[Placement]] | None = None) -> None:
        if geom.offload is None:
            offload_group(geom, 0)  # raises no_offload
        assert geom.offload is not None
        self.geom = geom
        self.num_ranks = geom.kv_shards
        self.groups: dict[int, _Group] = {}
        for og in geom.offload.groups:
            g = geom.groups[og.index]
            if g.family == "mamba" and not g.is_align_mamba:
                raise QueryError.single(
                    "sim_unsupported_group",
                    f"group {g.index} is a Mamba group in {g.mamba_mode!r} mode; the simulator models align-mode "
                    "Mamba states only",
                    "group",
                    group=g.index,
                )
            self.groups[og.index] = _Group(
                index=og.index,
                mamba=g.is_align_mamba,
                block_size=g.block_size,
                span=og.tokens_per_block,
                k=geom.offload.blocks_per_chunk,
                chunk=og.tokens_per_chunk,
                dealt=g.dealt,
            )
        self._placements: dict[int, list[Placement]] = {} if _placements is None else _placements
        self.tier: dict[tuple[int, int], Any] = {}
        self.reset()

    # ------------------------------------------------------------------ GPU

    def reset(self) -> None:
        """Drop every GPU block (the tier survives): what a restart or an eviction leaves."""
        self._next_id = 1  # block id 0 is the null block
        self.pages: dict[tuple[int | None, int], list[int]] = {}
        self.states: dict[int, int] = {}
        self.computed = 0
        for gs in self.groups.values():
            gs.row = []

    def _placement(self, group: int, position: int) -> Placement:
        table = self._placements.setdefault(group, [])
        while len(table) <= position:
            table.append(dcp_placement(self.geom, group, len(table)))
        return table[position]

    def _entry(self, gs: _Group, column: int) -> int:
        while len(gs.row) <= column:
            gs.row.append(self._next_id)
            self._next_id += 1
        return gs.row[column]

    def _page(self, rank: int | None, block: int, size: int) -> list[int]:
        return self.pages.setdefault((rank, block), [_EMPTY] * size)

    def prefill(self, num_tokens: int) -> None:
        """Compute positions ``[computed, num_tokens)`` cold: write every position into its slot and
        advance every Mamba state (block *i* keeps the state after ``(i+1)*B_m`` tokens)."""
        n = _sim_tokens("num_tokens", num_tokens)
        for gs in self.groups.values():
            if gs.mamba:
                for b in range(gs.block_size, n + 1, gs.block_size):
                    self.states[self._entry(gs, state_block_for_boundary(self.geom, gs.index, b))] = b
                if n:
                    self.states[self._entry(gs, running_state_block(self.geom, gs.index, 0, n))] = n
                continue
            for p in range(self.computed, n):
                col, rank, offset = self._placement(gs.index, p)
                self._page(rank, self._entry(gs, col), gs.block_size)[offset] = p
        self.computed = max(self.computed, n)

    # ------------------------------------------------------------------ tier

    def store(self, plan: Any) -> None:
        """Copy what a store plan names from the GPU into the tier.

        ``plan``: a :class:`kvgeom.hits.StorePlan` or its ``to_dict()`` form. A
        positional chunk stores, per rank, the pages of its block entries; an
        align-mode Mamba key stores the state of its one block.
        """
        for item in _as_dict(plan)["groups"]:
            gs = self.groups[int(item["index"])]
            for end, entries in zip(item["end_tokens"], item["block_entries"], strict=True):
                key = (boundary_hash_index(self.geom, end), gs.index)
                if gs.mamba:
                    (block,) = entries
                    row_id = gs.row[block] if block < len(gs.row) else None
                    self.tier[key] = self.states.get(row_id) if row_id is not None else None
                else:
                    ranks = range(self.num_ranks) if gs.dealt else [None]
                    self.tier[key] = {
                        r: [
                            list(self.pages.get((r, gs.row[e]), [_EMPTY] * gs.block_size))
                            if e < len(gs.row)
                            else [_EMPTY] * gs.block_size
                            for e in entries
                        ]
                        for r in ranks
                    }

    def tier_end_tokens(self) -> dict[str, list[int]]:
        """What the tier holds, as a lookup's ``stored`` argument: ``{"<group>": [end tokens]}``."""
        H = self.geom.hash_block_size
        out: dict[str, list[int]] = {str(i): [] for i in self.groups}
        for h, group in sorted(self.tier):
            out[str(group)].append((h + 1) * H)
        return out

    def evict(self, keep: Callable[[int, int], bool]) -> None:
        """Keep only the tier keys ``(group, end_token)`` for which ``keep`` is true."""
        H = self.geom.hash_block_size
        self.tier = {key: v for key, v in self.tier.items() if keep(key[1], (key[0] + 1) * H)}

    def check_tier(self) -> list[str]:
        """Every key fingerprints exactly its prefix: a positional chunk key ending at *e* holds exactly
        the positions ``[e - C, e)``, each in the slot it is dealt to; a Mamba key ending at *e* holds
        the state after exactly *e* tokens. Returns the problems found (empty: all good)."""
        problems = []
        H = self.geom.hash_block_size
        for (h, group), value in sorted(self.tier.items(), key=lambda kv: kv[0]):
            gs = self.groups[group]
            end = (h + 1) * H
            if gs.mamba:
                if value != end:
                    problems.append(f"group {group}: Mamba key ending at {end} holds the state after {value} tokens")
                continue
            if end % gs.chunk:
                problems.append(f"group {group}: key ending at {end} is not on the chunk grid {gs.chunk}")
                continue
            j = end // gs.chunk - 1
            seen: list[int] = []
            for rank, pages in value.items():
                for i, page in enumerate(pages):
                    for offset, p in enumerate(page):
                        if p == _EMPTY:
                            continue
                        seen.append(p)
                        if self._placement(group, p) != (j * gs.k + i, rank, offset):
                            problems.append(
                                f"group {group}: key ending at {end} holds position {p} at (entry {j * gs.k + i}, "
                                f"rank {rank}, offset {offset}), but it is dealt to {self._placement(group, p)}"
                            )
            if sorted(seen) != list(range(end - gs.chunk, end)):
                problems.append(f"group {group}: key ending at {end} does not hold exactly [{end - gs.chunk}, {end})")
        return problems

    # ------------------------------------------------------------------ load and check

    def load(self, plan: Any) -> None:
        """Follow a hit plan (:class:`kvgeom.hits.HitPlan` or its ``to_dict()``): load each key into the
        block entries the plan names (fresh block ids), Mamba keys into their state block.

        A key the tier does not hold raises :class:`kvgeom.QueryError` ``sim_missing_key``.
        """
        d = _as_dict(plan)
        for item in d["groups"]:
            gs = self.groups[int(item["index"])]
            entries = set(item["block_entries"])
            for end in item["load_keys"]:
                key = (boundary_hash_index(self.geom, end), gs.index)
                if key not in self.tier:
                    raise QueryError.single(
                        "sim_missing_key",
                        f"the plan loads group {gs.index}'s key ending at {end}, which the tier does not hold",
                        "load_keys",
                        group=gs.index,
                        end_token=end,
                    )
                value = self.tier[key]
                if gs.mamba:
                    if item.get("state_block") is not None:
                        self.states[self._entry(gs, int(item["state_block"]))] = value
                    continue
                j = cdiv(end, gs.chunk) - 1
                for i in range(gs.k):
                    e = j * gs.k + i
                    if e not in entries:
                        continue
                    block = self._entry(gs, e)
                    for rank, pages in value.items():
                        self.pages[(rank, block)] = list(pages[i])

    def check_restored(self, plan: Any, *, num_tokens: int) -> list[str]:
        """Compare the GPU after :meth:`load` with a cold run of the hit's end token N.

        For each positional group: every position of ``[skipped(N), N)`` is in its slot (on its
        owner rank), and every non-empty slot of a written entry holds the position dealt to it.
        For each align-mode Mamba group with N > 0: the block a request resuming at N reads
        (:func:`kvgeom.boundaries.restore_read_block`) holds the state after exactly N tokens, and
        N < ``num_tokens`` (the last token is always recomputed). Returns the problems found.
        """
        d = _as_dict(plan)
        N = nonneg("end_token", d["end_token"])
        n = nonneg("num_tokens", num_tokens)
        problems: list[str] = []
        if N == 0 or d["hit_tokens"] == 0:
            return problems  # nothing was restored
        cold = Simulator(self.geom, _placements=self._placements)
        cold.prefill(N)
        for gs in self.groups.values():
            if gs.mamba:
                if n <= N:
                    problems.append(f"group {gs.index}: Mamba restored at {N}, not below num_tokens={n}")
                read = restore_read_block(self.geom, gs.index, N)
                got = self.states.get(gs.row[read]) if read < len(gs.row) else None
                want = cold.states.get(cold.groups[gs.index].row[read])
                assert want == N  # the cold run's running state (a simulator self-check)
                if got != want:
                    problems.append(
                        f"group {gs.index}: a request resuming at {N} reads Mamba block {read}, which holds the "
                        f"state after {got} tokens (a cold run holds {want})"
                    )
                continue
            cold_row = cold.groups[gs.index].row
            for p in range(hits.skipped_tokens(self.geom, gs.index, N), N):
                col, rank, offset = self._placement(gs.index, p)
                want = cold.pages[(rank, cold_row[col])][offset]
                page = self.pages.get((rank, gs.row[col])) if col < len(gs.row) else None
                if page is None or page[offset] != want:
                    problems.append(
                        f"group {gs.index}: position {p} is missing after the load (column {col}, rank {rank}, "
                        f"offset {offset} holds {None if page is None else page[offset]}; a cold run holds {want})"
                    )
                    break
            for col, block in enumerate(gs.row):
                for rank in range(self.num_ranks) if gs.dealt else [None]:
                    page = self.pages.get((rank, block))
                    if page is None:
                        continue
                    for offset, p in enumerate(page):
                        if p != _EMPTY and self._placement(gs.index, p) != (col, rank, offset):
                            problems.append(
                                f"group {gs.index}: slot (column {col}, rank {rank}, offset {offset}) holds position "
                                f"{p}, which is dealt to {self._placement(gs.index, p)}"
                            )
        return problems


@dataclass(frozen=True)
class ScenarioReport:
    """What :func:`run_scenario` did: the store and hit plans, and every problem the checks found."""

    store_plan: hits.StorePlan
    hit_plan: hits.HitPlan
    tier_problems: tuple[str, ...]
    restore_problems: tuple[str, ...]

    @property
    def ok(self) -> bool:
        return not self.tier_problems and not self.restore_problems


def run_scenario(
    geom: Geometry,
    num_tokens: int,
    *,
    local_computed_tokens: int = 0,
    evict: Callable[[int, int], bool] | Sequence[bool] | None = None,
    max_num_batched_tokens: int | None = None,
) -> ScenarioReport:
    """Cold run of a ``num_tokens`` prompt, store by kvgeom's store plan, evict some keys, reset the GPU,
    recompute a local prefix, look up and load by kvgeom's hit plan, then check the tier and the
    restored GPU against a cold run.

    ``evict``: a predicate ``evict(group, end_token)``, or booleans applied in order to the stored
    keys sorted by ``(group, end_token)`` (True evicts; keys past the list stay), as
    :func:`kvgeom.strategies.scenarios` draws them. ``max_num_batched_tokens``: the token budget whose
    prefill split (:func:`kvgeom.prefill.prefill_chunk_ends`) decides which Mamba states are stored
    (None: vLLM's unbounded split, :func:`kvgeom.hits.plan_store`'s default).

    >>> import kvgeom
    >>> r = run_scenario(kvgeom.resolve(kvgeom.DEFAULT_CONFIG), 65)
    >>> r.hit_plan.hit.end_token, r.ok
    (64, True)
    """
    n = _sim_tokens("num_tokens", num_tokens)
    local = nonneg("local_computed_tokens", local_computed_tokens)
    sim = Simulator(geom)
    sim.prefill(n)
    ends = None
    if max_num_batched_tokens is not None and n and any(g.is_align_mamba for g in geom.groups):
        from kvgeom.prefill import prefill_chunk_ends

        ends = prefill_chunk_ends(geom, n, max_num_batched_tokens=max_num_batched_tokens)
    store_plan = hits.plan_store(geom, num_tokens=n, num_computed_tokens=n, chunk_ends=ends)
    sim.store(store_plan)
    if evict is not None:
        if callable(evict):
            predicate = evict
        else:
            bits = _eviction_bits("evict", evict)
            order = sorted((g, (h + 1) * geom.hash_block_size) for h, g in sim.tier)
            gone = {key for key, bit in zip(order, bits, strict=False) if bit}

            def predicate(g: int, e: int) -> bool:
                return (g, e) in gone

        sim.evict(lambda g, e: not predicate(g, e))
    tier_problems = sim.check_tier()
    sim.reset()
    sim.prefill(min(local, n))
    hit_plan = hits.plan_hit(
        geom, {"num_tokens": n, "local_computed_tokens": min(local, n), "stored": sim.tier_end_tokens()}
    )
    sim.load(hit_plan)
    return ScenarioReport(store_plan, hit_plan, tuple(tier_problems), tuple(sim.check_restored(hit_plan, num_tokens=n)))


# ---------------------------------------------------------------------- GPU prefix cache


class GPUPrefixCache:
    """The GPU prefix cache of one hash chain: per group, the cached entries and what each holds.

    An attention entry ending at *e* holds the positions of block ``cdiv(e, S) - 1`` up to *e* (a
    partial entry when S does not divide *e*); an align-mode Mamba entry ending at *e* holds the state
    after *e* tokens. :meth:`cache_request` caches what a cold run leaves behind; :meth:`evict`
    drops entries per group; :meth:`check_adopted` checks a hit against what the entries hold.

    Which entries a cold run caches (modelled on vLLM 0.33's ``cache_blocks``; one copy per group,
    DCP dealing is the offload simulator's business): the full blocks of every group up to the
    group's cacheable prefix (:func:`kvgeom.handoff.mamba_cacheable_tokens`: ``n``, or ``rdown(n, L)``
    without partial hash hits; under the EAGLE drop one block more), thinned by the GPU side's
    retention mask for sliding-window and Mamba groups (:func:`kvgeom.masks.reachable_block_mask` with
    ``side="gpu"`` at :func:`kvgeom.handoff.replay_boundaries`, aligned to A: under the drop a
    sliding-window run is one block longer and ends one block later); with H < S the prompt's last H
    boundary below ``n`` (at or below ``n`` for a full-attention group under the EAGLE drop) as a partial
    entry of full-attention and Mamba groups. An align Mamba group holds a state only where a
    prefill chunk ended (vLLM 0.33 writes the state at chunk ends alone): ``chunk_ends`` of
    :meth:`cache_request`, by default the Scheduler's split of :func:`kvgeom.prefill.prefill_chunk_ends`
    for the token budget ``max_num_batched_tokens`` (None: unbounded). States written while decoding and
    the connector's hand-offs are not modelled here (the tier's side is :func:`kvgeom.hits.plan_store`).

    >>> import kvgeom
    >>> g = kvgeom.resolve({**kvgeom.DEFAULT_CONFIG, "cache": {"retention_interval": None}})
    >>> c = GPUPrefixCache(g); c.cache_request(70)   # vLLM 0.33 run: one chunk to 64, the state at 64 alone
    >>> c.resident()
    {'0': [32, 64], '1': [64]}
    >>> c.check_adopted(kvgeom.prefix_hit(g, 70, c.resident()))
    []
    >>> c = GPUPrefixCache(g); c.cache_request(70, max_num_batched_tokens=32)  # chunks end at 32, 64, 70
    >>> c.resident()["1"]
    [32, 64]
    """

    def __init__(self, geom: Geometry) -> None:
        self.geom = geom
        self.entries: dict[tuple[int, int], tuple[int, ...] | int] = {}
        self.chunk_ends: frozenset[int] = frozenset()
        """Where the last :meth:`cache_request`'s prefill chunks ended (empty without an align Mamba group)."""

    def _holds(self, group: int, end: int) -> tuple[int, ...] | int:
        g = self.geom.groups[group]
        if g.family == "mamba":
            return end
        return tuple(range((cdiv(end, g.span) - 1) * g.span, end))

    def cache_request(
        self,
        num_tokens: int,
        *,
        chunk_ends: Sequence[int] | None = None,
        max_num_batched_tokens: int | None = None,
    ) -> None:
        """Cache what a cold run of a ``num_tokens`` prompt of this chain leaves behind.

        ``chunk_ends``: where the prefill's chunks ended (strictly increasing, the last one ``num_tokens``);
        None: :func:`kvgeom.prefill.prefill_chunk_ends` with ``max_num_batched_tokens`` (None: unbounded;
        the split kept total where the multi-module MTP reserve stalls it, as
        :class:`kvgeom.prefill.MambaCheckpoint` does). Only an align Mamba group reads them: it keeps a
        state at a chunk end on its block grid that the next step made cacheable
        (:func:`kvgeom.handoff.cached_state_ends`), or at the prompt's H-grid checkpoint when a step cached
        exactly that many tokens, as :func:`kvgeom.handoff.mamba_handoffs` keys it), never at a boundary a
        chunk ran through. Giving both arguments is :class:`kvgeom.QueryError` ``conflicting_arguments``;
        chunk ends that are not strictly increasing up to ``num_tokens`` are ``bad_chunk_ends``.
        """
        from kvgeom.handoff import cached_state_ends, checkpoint_step, mamba_cacheable_tokens, replay_boundaries
        from kvgeom.masks import reachable_block_mask
        from kvgeom.prefill import prompt_hash_checkpoint

        geom = self.geom
        n = _sim_tokens("num_tokens", num_tokens)
        ends = self.chunk_ends = self._chunk_ends(n, chunk_ends, max_num_batched_tokens)
        if not geom.config.cache.prefix_caching or n == 0:
            return
        H, A = geom.hash_block_size, geom.hit_alignment_tokens
        points = replay_boundaries(geom, n)
        tail = (n - 1) // H * H
        for g in geom.groups:
            if not g.prefix_cacheable or g.family in {"cross", "circular"}:
                continue
            cacheable = mamba_cacheable_tokens(geom, g.index, n)  # the group's cacheable prefix (any family)
            blocks = cacheable // g.span
            mask = None
            if g.family in {"sliding", "mamba"}:
                mask = reachable_block_mask(geom, g.index, blocks, reachable=points, alignment=A, side="gpu")
            # a Mamba state is cached only at a chunk end, and only if the next step made it cacheable
            written = frozenset(cached_state_ends(geom, g.index, n, n, ends)) if g.family == "mamba" else None
            for j in range(blocks):
                if (mask is None or j in mask) and (written is None or (j + 1) * g.span in written):
                    self.entries[(g.index, (j + 1) * g.span)] = self._holds(g.index, (j + 1) * g.span)
            if g.family == "mamba":
                # the manager keys the state at the prompt's H-grid checkpoint, whatever the mask says, when
                # kvgeom.handoff.checkpoint_step says it is kept -- on the span grid too (FA 16 + Mamba 16 under
                # DCP 2 with an eagle drafter, retention 0, prompt 62, chunk ends 32, 62: vLLM 0.33 keeps 32)
                t = prompt_hash_checkpoint(geom, n)
                if checkpoint_step(geom, g.index, n, n, ends) is not None:
                    self.entries[(g.index, t)] = self._holds(g.index, t)
                continue
            end = tail
            if g.family == "full" and g.index in geom.gpu_drop_groups:
                end = n // H * H  # an EAGLE lookup reads the whole prompt before it drops (no n - 1 cap)
            if g.span != H and g.family == "full" and 0 < end <= cacheable and end % g.span:
                self.entries[(g.index, end)] = self._holds(g.index, end)

    def _chunk_ends(self, n: int, chunk_ends: Sequence[int] | None, budget: int | None) -> frozenset[int]:
        """The checked chunk ends of :meth:`cache_request` (empty without an align Mamba group: unused)."""
        from kvgeom.handoff import checked_prefill_split, default_chunk_ends
        from kvgeom.prefill import prefill_chunk_ends

        if chunk_ends is not None and budget is not None:
            raise QueryError.single(
                "conflicting_arguments",
                f"cache_request got both chunk_ends and max_num_batched_tokens={budget}; give the chunk ends "
                "the prefill took, or the token budget whose split kvgeom derives, not both",
                "chunk_ends",
            )
        if chunk_ends is not None:
            return frozenset(checked_prefill_split(chunk_ends, n))
        if not n or not any(g.is_align_mamba for g in self.geom.groups):
            return frozenset()
        if budget is None:
            return frozenset(default_chunk_ends(self.geom, n))
        return frozenset(prefill_chunk_ends(self.geom, n, max_num_batched_tokens=budget))

    def evict(self, keep: Callable[[int, int], bool]) -> None:
        """Keep only the entries ``(group, end_token)`` for which ``keep`` is true."""
        self.entries = {key: v for key, v in self.entries.items() if keep(*key)}

    def resident(self) -> dict[str, list[int]]:
        """The cached entries as :func:`kvgeom.prefix.prefix_hit`'s ``resident``: ``{"<group>": [end tokens]}``."""
        out: dict[str, list[int]] = {str(g.index): [] for g in self.geom.groups if g.prefix_cacheable}
        for group, end in sorted(self.entries):
            out[str(group)].append(end)
        return out

    def check_adopted(self, hit: Any, *, end_token: int | None = None, states: bool = True) -> list[str]:
        """Problems with adopting ``hit``'s entries (a :class:`kvgeom.prefix.PrefixHit`) to resume at
        ``end_token`` (default ``hit.hit_tokens``): every adopted entry must be cached; every position a
        group needs before N must be in an adopted entry (full attention ``[0, N)``, sliding window the
        last ``sliding_window - 1``, chunked local the current chunk); with ``states``, each align-mode
        Mamba group must adopt the state after exactly N tokens."""
        N = hit.hit_tokens if end_token is None else nonneg("end_token", end_token)
        problems: list[str] = []
        if N == 0:
            return problems
        for gh in hit.groups:
            g = self.geom.groups[gh.index]
            if not g.prefix_cacheable:
                continue
            held: set[int] = set()
            got_states = []
            for e in gh.end_tokens:
                value = self.entries.get((g.index, e))
                if value is None:
                    problems.append(f"group {g.index}: adopts the entry ending at {e}, which is not cached")
                elif isinstance(value, int):
                    got_states.append(value)
                else:
                    held.update(value)
            if g.family == "mamba":
                if states and got_states != [N]:
                    problems.append(f"group {g.index}: resuming at {N} adopts Mamba states {got_states}, not [{N}]")
                continue
            need = g.gpu_window_need
            first = 0
            if g.family == "sliding" and need is not None:
                first = max(N - need, 0)
            elif g.family == "chunked" and need is not None:
                first = N // (need + 1) * (need + 1)
            missing = [p for p in range(first, N) if p not in held]
            if missing:
                problems.append(
                    f"group {g.index}: resuming at {N} needs positions [{first}, {N}); {len(missing)} are in no "
                    f"adopted entry (first {missing[0]})"
                )
        return problems


@dataclass(frozen=True)
class RequestReport:
    """What :func:`run_request` did: the admission plan and every problem the checks found."""

    plan: Any
    """The :class:`kvgeom.request.RequestPlan`."""
    local_problems: tuple[str, ...]
    tier_problems: tuple[str, ...]
    restore_problems: tuple[str, ...]

    @property
    def ok(self) -> bool:
        return not self.local_problems and not self.tier_problems and not self.restore_problems


def _eviction_bits(name: str, bits: Any) -> list[bool]:
    """``bits`` (which entries to evict, in order) checked: an iterable, not a string, of at most
    :data:`MAX_SIM_TOKENS` bools (``bad_<name>``, ``result_too_large``, ``not_a_bool``)."""
    # a 0-d numpy array is Iterable by type but not by value (iterating it raises TypeError)
    if isinstance(bits, str | bytes | Mapping) or not isinstance(bits, Iterable) or getattr(bits, "ndim", None) == 0:
        raise QueryError.single(
            f"bad_{name}", f"{name} must be a predicate evict(group, end_token) or a list of bools, got "
            f"{type(bits).__name__}", name,
        )
    items = list(islice(bits, MAX_SIM_TOKENS + 1))
    if len(items) > MAX_SIM_TOKENS:
        raise QueryError.single(
            "result_too_large", f"{name} lists more than {MAX_SIM_TOKENS} bools, more entries than a run holds", name
        )
    return [flag(f"{name}[]", b) for b in items]


def _bits_predicate(
    order: list[tuple[int, int]], bits: Sequence[bool], name: str = "evict"
) -> Callable[[int, int], bool]:
    gone = {key for key, bit in zip(order, _eviction_bits(name, bits), strict=False) if bit}
    return lambda g, e: (g, e) in gone


def run_request(
    geom: Geometry,
    num_tokens: int,
    *,
    first_tokens: int | None = None,
    evict_gpu: Callable[[int, int], bool] | Sequence[bool] | None = None,
    evict_tier: Callable[[int, int], bool] | Sequence[bool] | None = None,
    max_num_batched_tokens: int | None = None,
) -> RequestReport:
    """A cold run of a ``first_tokens`` prompt (default ``num_tokens``) fills the GPU prefix cache
    and, with an offload section, the tier; entries are evicted per group from each; then a request
    of ``num_tokens`` tokens on the same chain is admitted by :func:`kvgeom.request.plan_request`
    and executed: the GPU entries it adopts are checked (:meth:`GPUPrefixCache.check_adopted`) up to the
    local hit it resumes at (``plan.local_hit_tokens``, which a load may put below the GPU hit: positions
    past it are loaded, not adopted), and the load is followed on a fresh GPU and compared with a cold run
    (:meth:`Simulator.check_restored`).

    ``evict_gpu`` / ``evict_tier``: a predicate ``evict(group, end_token)`` or booleans applied in
    order to the entries sorted by ``(group, end_token)`` (True evicts). ``max_num_batched_tokens``: the
    first request's token budget, whose prefill split (:func:`kvgeom.prefill.prefill_chunk_ends`; None:
    unbounded) decides where its Mamba states exist, on the GPU and in the tier.

    >>> import kvgeom
    >>> g = kvgeom.resolve({**kvgeom.DEFAULT_CONFIG, "cache": {"retention_interval": None}})
    >>> r = run_request(g, 100, max_num_batched_tokens=16, evict_gpu=lambda g, e: g == 1 and e > 48)
    >>> r.plan.local_hit_tokens, r.plan.external_hit_tokens, r.ok   # GPU hit 48, not on L = 32 (vLLM run)
    (32, 64, True)
    >>> r = run_request(g, 100, evict_gpu=lambda g, e: g == 1 and e > 48)   # unbounded: Mamba 96 alone (vLLM run)
    >>> r.plan.local_hit_tokens, r.plan.external_hit_tokens, r.ok
    (0, 96, True)
    """
    from kvgeom.request import plan_request

    n = _sim_tokens("num_tokens", num_tokens)
    n0 = n if first_tokens is None else _sim_tokens("first_tokens", first_tokens)
    cache = GPUPrefixCache(geom)
    cache.cache_request(n0, max_num_batched_tokens=max_num_batched_tokens)
    if evict_gpu is not None:
        pred = evict_gpu if callable(evict_gpu) else _bits_predicate(sorted(cache.entries), evict_gpu, "evict_gpu")
        cache.evict(lambda g, e: not pred(g, e))
    scenario: dict[str, Any] = {"num_tokens": n, "resident": cache.resident()}
    sim = None
    tier_problems: list[str] = []
    if geom.offload is not None:
        sim = Simulator(geom)
        sim.prefill(n0)
        ends = sorted(cache.chunk_ends) if max_num_batched_tokens is not None and cache.chunk_ends else None
        sim.store(hits.plan_store(geom, num_tokens=n0, num_computed_tokens=n0, chunk_ends=ends))
        if evict_tier is not None:
            H = geom.hash_block_size
            order = sorted((g, (h + 1) * H) for h, g in sim.tier)
            tpred = evict_tier if callable(evict_tier) else _bits_predicate(order, evict_tier, "evict_tier")
            sim.evict(lambda g, e: not tpred(g, e))
        tier_problems = sim.check_tier()
        scenario["stored"] = sim.tier_end_tokens()
    plan = plan_request(geom, scenario)
    external = plan.external_hit_tokens
    local_problems = cache.check_adopted(plan.local, end_token=plan.local_hit_tokens, states=external == 0)
    restore: list[str] = []
    if external and sim is not None and plan.hit is not None:
        sim.reset()
        sim.prefill(plan.local_hit_tokens)
        hit_plan = hits.HitPlan(plan.hit, plan.groups)
        sim.load(hit_plan)
        restore = sim.check_restored(hit_plan, num_tokens=n)
        if plan.local_hit_tokens + external != plan.hit.end_token:
            restore.append(
                f"local {plan.local_hit_tokens} + external {external} != the load's end token {plan.hit.end_token}"
            )
    return RequestReport(plan, tuple(local_problems), tuple(tier_problems), tuple(restore))
