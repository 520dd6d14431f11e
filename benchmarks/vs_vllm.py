"""kvgeom's offload hit lookup and index upkeep against vLLM 0.33's own, on the same real tier, in one process.

vLLM side: ``OffloadingConnectorScheduler._lookup_complete_chunks`` of a real scheduler-side
OffloadingConnector over vLLM's real ``CPUOffloadingManager`` (``benchmarks/vllm_tier.py``), with
real ``Request`` objects hashed by vLLM (sha256). The tier is filled through the manager's own
``prepare_store`` / ``complete_store``.

kvgeom side, on the same requests and the same tier contents:

* ``manager``: :func:`kvgeom.hits.lookup_hit` probing the vLLM manager itself with the request's own
  per-group offload keys (``offload_keys=[s.offload_keys for s in req_status.group_states]``, the
  lists vLLM's request state keeps; the outer list is made once per request, as a connector keeps
  it): no index at all;
* ``manager, hash chain``: the same over the hash chain (``block_hashes=``), which builds each key's
  bytes per probe (for reference);
* ``residency``: :func:`kvgeom.hits.lookup_hit` over a :class:`kvgeom.Residency` + ``request.block_hashes``;
* ``batch``: :func:`kvgeom.batch.lookup.lookup_resident` over the Residency and ``RequestChains``;
* ``upkeep``: per key, in a long-lived index with the batch arrays live, the store-complete event of
  every key a request stored (``Residency.add_keys``, one call per event) and the evict event of each
  later (``discard_keys``); beside it vLLM's own bookkeeping of the same keys, ``prepare_store`` +
  ``complete_store`` into a fresh CPU tier; and per request the hash chain tracked and dropped
  (``RequestChains.update`` / ``remove``). Every stored key is charged to one lookup (no reuse of a
  stored prefix by later requests: the worst case for the index).

Timing: the pool's requests are looked up in rounds (with the garbage collector off, as ``timeit``
does); each round runs vLLM and every kvgeom path once each, back to back, so every ratio is taken
between passes a few microseconds apart (the machine is shared; its load moves absolute times by 2-3x
between runs). Figures are medians over rounds, per
request (or per key); a ratio is the median over rounds of kvgeom's pass / vLLM's pass in that round.
Answers are checked request by request: every kvgeom path gives the same hit, and it equals vLLM's
except where vLLM's hit is off the Mamba chunk (counted in ``vllm_unaligned_hits``): there kvgeom's
registered deviation ``realign-after-clamp`` gives the lower, aligned hit.
vLLM has no batch lookup; its time per request at batch B is its time per request over a pool of
distinct requests, called one after another (the batch of 4096 cycles through the pool).
"""

from __future__ import annotations

import gc
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np

import kvgeom
from kvgeom.batch.lookup import RequestChains, lookup_resident
from kvgeom.hits import lookup_hit

SEED = {
    "groups": [{"kind": "full_attention", "block_size": 16}, {"kind": "mamba", "block_size": 16}],
    "parallel": {"tp": 2, "dcp": 2},
    "offload": {},
}
LARGE = {
    "groups": [{"kind": "full_attention", "block_size": 64}] * 3 + [{"kind": "mamba", "block_size": 2048}],
    "parallel": {"tp": 8, "dcp": 8},
    "offload": {},
}
GEOMETRIES = {"seed FA16+M16 DCP2": SEED, "large 3xFA64+M2048 DCP8": LARGE}


def vllm_available() -> str | None:
    """vLLM's version when it imports, else None."""
    try:
        import vllm
    except Exception:
        return None
    return str(vllm.__version__)


def _timed(fn: Callable[[], Any], times: list[float]) -> None:
    t0 = time.perf_counter()
    fn()
    times.append(time.perf_counter() - t0)


class Cell:
    """One geometry x token count x store pattern: a real vLLM tier and the same contents in kvgeom."""

    def __init__(self, vt: Any, cfg: dict[str, Any], tokens: int, pattern: str, pool: int, seed: int) -> None:
        self.vt = vt
        self.geom = kvgeom.resolve(cfg)
        H = self.geom.hash_block_size
        self.tokens = tokens
        self.sched, self.manager = vt.scheduler(self.geom, num_chunks=1 << 22)
        assert self.sched.config.tokens_per_hash == H
        rng = np.random.default_rng(seed)
        self.states = []
        self.stored: list[list[bytes]] = []
        for i in range(pool):
            req = vt.request(tokens, H, f"{pattern}-{i}", salt=seed * 100003 + i)
            self.sched.on_new_request(req)
            st = self.sched._req_status[req.request_id]
            st.update_offload_keys()
            st.num_locally_computed_tokens = 0
            keys: list[bytes] = []
            for gs in st.group_states:
                k = len(gs.offload_keys)
                if pattern == "contiguous":
                    keys += gs.offload_keys[: int(k * 0.75)]
                else:
                    keep = rng.random(k) < 0.75
                    keys += [key for key, y in zip(gs.offload_keys, keep, strict=True) if y]
            if keys:
                vt.store(self.manager, keys, req_id=req.request_id)
            self.states.append(st)
            self.stored.append([bytes(k) for k in keys])
        # what a connector keeps per request: vLLM's own per-group key lists (grown in place by
        # update_offload_keys), the request's context and hash chain
        self.items = [(st, st.req.block_hashes, st.req_context, [gs.offload_keys for gs in st.group_states])
                      for st in self.states]
        self.res = kvgeom.Residency()
        for keys in self.stored:
            self.res.add_keys(keys)
        self.chains = RequestChains(self.res)
        for st in self.states:
            self.chains.update(st.req.request_id, st.req.block_hashes)
        # a second, long-lived index for the upkeep timing, with the batch arrays already asked for (so
        # every event also pays the array store)
        self.upkeep_res = kvgeom.Residency()
        self.upkeep_chains = RequestChains(self.upkeep_res)
        for g in range(len(self.geom.groups)):
            self.upkeep_res.held_array(g)

    # -- the timed bodies --------------------------------------------------------------------------
    def vllm(self) -> list[int | None]:
        look = self.sched._lookup_complete_chunks
        return [look(st) for st in self.states]

    def lazy(self) -> list[int]:
        g, n, res = self.geom, self.tokens, self.res
        return [lookup_hit(g, n, stored=res, block_hashes=b).hit_tokens for _, b, _, _ in self.items]

    def on_tier(self) -> list[int]:
        g, n, m = self.geom, self.tokens, self.manager
        return [lookup_hit(g, n, stored=m, offload_keys=k, req_context=c).hit_tokens for _, _, c, k in self.items]

    def on_tier_chain(self) -> list[int]:
        g, n, m = self.geom, self.tokens, self.manager
        return [lookup_hit(g, n, stored=m, block_hashes=b, req_context=c).hit_tokens for _, b, c, _ in self.items]

    def fresh_tiers(self, count: int) -> None:
        """Empty CPU tiers for :meth:`vllm_store`, made before the timing."""
        size = 2 * sum(map(len, self.stored)) + 1024  # room for every key: no eviction, no oversized tier
        self._fresh = [self.vt.CPUOffloadingManager(num_chunks=size) for _ in range(count)]

    def vllm_store(self) -> None:
        """vLLM's own bookkeeping of the same keys: prepare_store + complete_store into a fresh CPU tier."""
        manager = self._fresh.pop()
        for keys, st in zip(self.stored, self.states, strict=True):
            if keys:
                self.vt.store(manager, keys, req_id=st.req.request_id)

    def store_events(self) -> None:
        """The store-complete event of every request's keys, one call per event (long-lived index)."""
        add = self.upkeep_res.add_keys
        for keys in self.stored:
            add(keys)

    def evict_events(self) -> None:
        """The evict event of the same keys later, one call per event."""
        discard = self.upkeep_res.discard_keys
        for keys in self.stored:
            discard(keys)

    def chain_upkeep(self) -> None:
        """Every request's hash chain tracked, then dropped."""
        chains = self.upkeep_chains
        for st in self.states:
            chains.update(st.req.request_id, st.req.block_hashes)
        for st in self.states:
            chains.remove(st.req.request_id)


def _rounds(fns: dict[str, Callable[[], Any]], rounds: int) -> dict[str, list[float]]:
    """Seconds per call of each function, over ``rounds`` rounds that run every function once, in turn."""
    times: dict[str, list[float]] = {k: [] for k in fns}
    pc = time.perf_counter
    gc.collect()
    gc.disable()  # as timeit does: a collection of the whole process's heap lands in one random pass
    try:
        for _ in range(rounds):
            for k, fn in fns.items():
                t0 = pc()
                fn()
                times[k].append(pc() - t0)
    finally:
        gc.enable()
    return times


def _paired(times: dict[str, list[float]], a: str, b: str) -> float:
    """Median over rounds of a's time / b's time in the same round."""
    return statistics.median(x / y for x, y in zip(times[a], times[b], strict=True))


def run(record: Callable[..., None], *, quick: bool) -> None:
    version = vllm_available()
    if version is None:
        print("vs vLLM: vllm is not importable in this interpreter: section skipped "
              "(install vLLM 0.33 for CPU with scripts/install-vllm-cpu.sh, then run with "
              "PYTHONPATH=<checkout> ${KVGEOM_VLLM_VENV:-.ci-vllm-venv}/bin/python)", flush=True)
        record("vs_vllm skipped", n=0, batch_s=0.0, target="vllm importable", met=None, skipped=True)
        return
    import vllm_tier as vt  # benchmarks/ is on sys.path when run.py runs

    print(f"vs vLLM {version}: OffloadingConnectorScheduler._lookup_complete_chunks on a CPUOffloadingManager, "
          f"load {os.getloadavg()}", flush=True)
    token_counts = (1024, 8192) if quick else (1024, 8192, 32768)
    batches = (1, 64) if quick else (1, 64, 4096)
    # rounds of the per-request comparison: many short ones, fewer where one pass of the pool is long
    rounds_by_tokens = {1024: 41, 8192: 41} if quick else {1024: 201, 8192: 101, 32768: 21}
    upkeep_rounds = 15
    pool = 16 if quick else 64
    for gname, cfg in GEOMETRIES.items():
        for tokens in token_counts:
            for pattern in ("contiguous", "gapped"):
                cell = Cell(vt, cfg, tokens, pattern, pool, seed=tokens + (pattern == "gapped"))
                want = cell.vllm()
                lazy_hits, tier_hits, chain_hits = cell.lazy(), cell.on_tier(), cell.on_tier_chain()
                Cm = cell.geom.offload.mamba_align_size if cell.geom.offload is not None else None
                # Requests where vLLM's hit is not on the Mamba chunk (its Mamba scan after an attention
                # clamp rounds up to the next state): kvgeom answers lower, by its registered deviation
                # "realign-after-clamp". Every other request must agree exactly.
                realigned = [i for i, w in enumerate(want) if Cm and w and w % Cm]
                same = lazy_hits == tier_hits == chain_hits and all(
                    lazy_hits[i] == want[i] for i in range(pool) if i not in realigned)
                same = same and all(lazy_hits[i] < want[i] and lazy_hits[i] % Cm == 0 for i in realigned)
                load = os.getloadavg()[0]
                rounds = rounds_by_tokens[tokens]
                t = _rounds({"vllm": cell.vllm, "manager": cell.on_tier, "residency": cell.lazy,
                             "manager_chain": cell.on_tier_chain}, rounds)
                cell.fresh_tiers(upkeep_rounds)
                u = _rounds({"vllm_store": cell.vllm_store, "store": cell.store_events, "evict": cell.evict_events,
                             "chains": cell.chain_upkeep}, upkeep_rounds)
                med = {k: statistics.median(v) / pool for k, v in t.items()}
                v = med["vllm"]
                keys_total = sum(map(len, cell.stored))
                per_key = {k: statistics.median(u[k]) / max(keys_total, 1) for k in ("vllm_store", "store", "evict")}
                upkeep_key = per_key["store"] + per_key["evict"]
                # the index's upkeep per key against vLLM's own store bookkeeping of the same key, round by round
                upkeep_ratio = statistics.median(
                    (a + b) / c for a, b, c in zip(u["store"], u["evict"], u["vllm_store"], strict=True))
                upkeep_req = (keys_total * upkeep_key + statistics.median(u["chains"])) / pool
                cell_fields = dict(
                    vllm_us=v * 1e6, manager_us=med["manager"] * 1e6, residency_us=med["residency"] * 1e6,
                    manager_over_vllm=_paired(t, "manager", "vllm"),
                    residency_over_vllm=_paired(t, "residency", "vllm"),
                    manager_chain_over_vllm=_paired(t, "manager_chain", "vllm"),
                    upkeep_us_per_key=upkeep_key * 1e6, store_us_per_key=per_key["store"] * 1e6,
                    evict_us_per_key=per_key["evict"] * 1e6, vllm_store_us_per_key=per_key["vllm_store"] * 1e6,
                    upkeep_over_vllm_store=upkeep_ratio, chains_us_per_req=statistics.median(u["chains"]) / pool * 1e6,
                    upkeep_us_per_req=upkeep_req * 1e6, keys_stored_per_request=keys_total / pool,
                    mean_hit=float(np.mean([w or 0 for w in want])), same_answers=same,
                    vllm_unaligned_hits=len(realigned), load=load,
                )
                per_request_met = cell_fields["manager_over_vllm"] <= 1.0 and cell_fields["residency_over_vllm"] <= 1.0
                record(f"vs_vllm {gname} {tokens} tok {pattern} per request", n=1, batch_s=med["manager"],
                       target="manager and residency <=1.0x vLLM", met=per_request_met, **cell_fields)
                record(f"vs_vllm {gname} {tokens} tok {pattern} upkeep", n=keys_total, batch_s=upkeep_key,
                       target="store+evict per key <= vLLM store per key", met=upkeep_ratio <= 1.0,
                       upkeep_us_per_key=upkeep_key * 1e6, vllm_store_us_per_key=per_key["vllm_store"] * 1e6,
                       upkeep_over_vllm_store=upkeep_ratio, load=load)
                for b in batches:
                    if b == 1:
                        continue
                    rows = cell.chains.rows([cell.states[i % pool].req.request_id for i in range(b)])
                    n = np.full(b, tokens, dtype=np.int64)
                    got = lookup_resident(cell.geom, cell.res, rows, n)
                    same_b = same and got.hit_tokens.tolist() == [lazy_hits[i % pool] for i in range(b)]
                    reps = max(3, min(rounds, 41) if b <= 64 else 5)
                    tb = _rounds({"vllm": cell.vllm,
                                  "batch": lambda c=cell, rows=rows, n=n: lookup_resident(c.geom, c.res, rows, n)},
                                 reps)
                    k = statistics.median(tb["batch"]) / b
                    vb = statistics.median(tb["vllm"]) / pool
                    with_upkeep = k + upkeep_req
                    record(f"vs_vllm {gname} {tokens} tok {pattern} batch {b}", n=b, batch_s=k * b,
                           target="<=1.0x vLLM", met=k / vb <= 1.0, vllm_us=vb * 1e6, kvgeom_us=k * 1e6,
                           ratio_kvgeom_over_vllm=k / vb, speedup_lookup_only=vb / k,
                           upkeep_us_per_req=upkeep_req * 1e6, ratio_incl_upkeep=with_upkeep / vb,
                           speedup_incl_upkeep=vb / with_upkeep, same_answers=same_b, load=load)
