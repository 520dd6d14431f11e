"""kvgeom's router beside NVIDIA Dynamo 1.6.1's KV indexer (``dynamo.llm.RadixTree``), in one process.

Usage: ``python benchmarks/router_vs_dynamo.py [--quick] [--workers 100 1000] [--rounds 3] [--json FILE]``

Dynamo's indexer runs on CPU from Python with ``pip install ai-dynamo-runtime==1.6.1`` (no GPU, no
runtime services). When it does not import, the script says so, runs kvgeom's side alone and exits 0.

1. **Attention only** (what both can score): W workers, 64 requests of 512 blocks of 16 tokens, 8 system
   prompts of 128 blocks shared by the requests; every worker holds the prefixes of 4 requests, each of a
   random length (~984 blocks per worker, ~984k at 1,000 workers). vLLM-shaped events: one ``BlockStored``
   per prefill chunk of up to 128 blocks (2,048 tokens) with its parent hash, then one ``BlockRemoved`` per
   evicted block (vLLM's ``BlockPool`` evicts one block per event), leaf first, 64 per worker. Integer block
   hashes (vLLM's ``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES``): kvgeom reads the chained hash, Dynamo the chained
   hash plus the block's local hash. kvgeom reads decoded event dicts through ``KVEventReader.apply``,
   Dynamo serialized JSON through ``RadixTree.apply_event`` (each side's own input; encoding is not timed).
   kvgeom's reader keeps its packed holder rows as its only index here (nothing asks it for a ``Residency``):
   each event updates them directly. Reported: ingest time per stored and per removed block; query latency
   p50 / p99 for one request (``score_replicas`` with one chain; ``find_matches``) and for 64 (one
   ``score_replicas`` call; 64 ``find_matches`` calls: Dynamo has no batch call), over ``--rounds`` rounds with
   the two sides alternating per request; memory (RSS growth while ingesting, both sides; kvgeom's retained Python
   allocations by tracemalloc in a separate build). Every (request, worker) score is checked equal
   (kvgeom's hit tokens / 16 = Dynamo's matched blocks) after the stores and again after the removals:
   the script fails loudly on the first difference.
2. **Growth**: the single-group and hybrid scoring paths (bit-parallel, packed, three lookup groups) timed
   on one request whose replicas' hits take D = R/4, R/2, R distinct values (R and the chain fixed): CPU
   time, least of a few runs. Linear work takes at most 4x from R/4 to R, a quadratic step 16x; above 8x
   the script fails.
3. **Hybrid workloads Dynamo cannot score** (attention + Mamba, attention + sliding window, attention under
   DCP 2 + Mamba): per group events, kvgeom's scores against a count of leading attention blocks (what an
   attention-only indexer computes once it drops the other groups' events): how many requests' top replica
   changes, and the tokens the attention count promises but vLLM would not reuse.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
import tracemalloc
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # benchmark this checkout's kvgeom, not an installed one

import numpy as np  # noqa: E402

import kvgeom  # noqa: E402
from kvgeom.events import KVEventReader  # noqa: E402
from kvgeom.router import chain_matrix, score_replicas  # noqa: E402

try:
    from dynamo.llm import RadixTree
except ImportError as e:  # pragma: no cover - depends on the venv
    RadixTree = None
    DYNAMO_ERROR = str(e)
else:
    DYNAMO_ERROR = ""

BLOCK = 16
ATTENTION = {"groups": [{"kind": "full_attention", "block_size": BLOCK}]}
GPU = ("GPU",)  # the tier Dynamo indexes (the reader also keeps CPU and STORAGE, empty here)


def rss_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0  # pragma: no cover


def load() -> tuple[float, float, float]:
    return os.getloadavg()


# -- the attention-only workload --------------------------------------------------------------------------
class Workload:
    """Chains (chained and local int hashes) and what each worker holds, as (worker, request, length)."""

    def __init__(self, workers: int, requests: int, blocks: int, per_worker: int, seed: int) -> None:
        rng = np.random.default_rng(seed)
        self.workers, self.requests, self.blocks = workers, requests, blocks
        shared = blocks // 4
        top = 2**63
        systems = [rng.integers(1, top, size=(shared, 2)).tolist() for _ in range(8)]
        pairs = [systems[q % 8] + rng.integers(1, top, size=(blocks - shared, 2)).tolist() for q in range(requests)]
        self.chains = [[p[0] for p in c] for c in pairs]  # the chained hash: what vLLM's events carry
        self.local = [[p[1] for p in c] for c in pairs]  # the block's own token hash: what Dynamo queries with
        self.held = [(w, int(q), int(rng.integers(0, blocks + 1)))
                     for w in range(workers) for q in rng.choice(requests, size=per_worker, replace=False)]

    def events(self, chunk: int, evict: int) -> tuple[list[tuple[int, list[int], int | None, list[int]]],
                                                     list[tuple[int, int, int]]]:
        """Stores ``(worker, chained hashes, parent, local hashes)`` and removals ``(worker, chained, local)``:
        a worker's new blocks of each held prefix in chunks; then its ``evict`` most recent blocks, leaf first."""
        stores = []
        removals = []
        for w in range(self.workers):
            have: set[int] = set()
            order: list[tuple[int, int]] = []
            for ww, q, k in self.held[w * (len(self.held) // self.workers): (w + 1) * (len(self.held) // self.workers)]:
                assert ww == w
                chain, local = self.chains[q], self.local[q]
                i = 0
                while i < k and chain[i] in have:
                    i += 1
                for j in range(i, k, chunk):
                    end = min(j + chunk, k)
                    stores.append((w, chain[j:end], chain[j - 1] if j else None, local[j:end]))
                    order.extend((chain[x], local[x]) for x in range(j, end))
                have.update(chain[i:k])
            removals.extend((w, h, lh) for h, lh in reversed(order[-evict:] if evict else []))
        return stores, removals


def kv_event(hashes: list[int], parent: int | None) -> dict[str, Any]:
    """A decoded vLLM 0.33 BlockStored (the dict a msgpack decoder gives), full blocks of 16 tokens."""
    return {"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": parent,
            "token_ids": _tokens(len(hashes) * BLOCK), "block_size": BLOCK, "lora_id": None, "medium": "GPU",
            "group_idx": 0, "kv_cache_spec_kind": "full_attention"}


_TOKEN_LISTS: dict[int, list[int]] = {}


def _tokens(n: int) -> list[int]:
    if n not in _TOKEN_LISTS:
        _TOKEN_LISTS[n] = list(range(n))
    return _TOKEN_LISTS[n]


def dynamo_store(event_id: int, hashes: list[int], parent: int | None, local: list[int]) -> bytes:
    return json.dumps({"event_id": event_id, "data": {"stored": {
        "parent_hash": parent,
        "blocks": [{"block_hash": h, "tokens_hash": t} for h, t in zip(hashes, local, strict=True)]}}}
    ).encode()


def dynamo_remove(event_id: int, hashes: list[int]) -> bytes:
    return json.dumps({"event_id": event_id, "data": {"removed": {"block_hashes": hashes}}}).encode()


def pct(xs: Sequence[float], p: float) -> float:
    return float(np.percentile(np.asarray(xs), p))


CPU_SPENT: list[float] = []  # CPU seconds of the last timed() call, read by the single-request loop


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    c0 = time.process_time()
    t0 = time.perf_counter()
    out = fn()
    wall = time.perf_counter() - t0
    CPU_SPENT[:] = [time.process_time() - c0]
    return wall, out


def check_scores(kv: np.ndarray, dyn: list[dict[tuple[int, int], int]], when: str) -> int:
    """kvgeom's (requests, workers) hit tokens against Dynamo's matched-block dicts; raise on a difference."""
    pairs = 0
    for q, scores in enumerate(dyn):
        want = np.zeros(kv.shape[1], dtype=np.int64)
        for (w, _dp), blocks in scores.items():
            want[w] = blocks * BLOCK
        bad = np.flatnonzero(kv[q] != want)
        if bad.size:
            w = int(bad[0])
            raise SystemExit(f"FAIL ({when}): request {q} worker {w}: kvgeom {kv[q, w]} tokens, Dynamo "
                             f"{want[w] // BLOCK} blocks ({bad.size} workers differ on this request)")
        pairs += kv.shape[1]
    return pairs


def _ingest(reader: KVEventReader, tree: Any, kv_events: list[tuple[int, Any]], dyn_events: list[tuple[int, bytes]],
            cpu: dict[str, float], slices: int = 16) -> tuple[float, float, int, int, float]:
    """Apply the events to both sides in ``slices`` alternating slices; seconds and RSS growth per side, and the
    part of kvgeom's seconds spent bringing its packed rows current (``reader.packed()``, after each slice, as a
    router's next query would). ``cpu`` gets each side's CPU seconds (this process, Dynamo's threads included)."""
    kv_s = dyn_s = refresh_s = 0.0
    rss_kv = rss_dyn = 0
    cpu["kv"] = cpu["dyn"] = 0.0
    apply = reader.apply
    step = -(-len(kv_events) // slices) if kv_events else 1
    for i in range(0, len(kv_events), step):
        r0 = rss_bytes()
        c0 = time.process_time()
        t0 = time.perf_counter()
        for w, ev in kv_events[i : i + step]:
            apply(ev, w)
        t1 = time.perf_counter()
        reader.packed()
        kv_s += time.perf_counter() - t0
        cpu["kv"] += time.process_time() - c0
        refresh_s += time.perf_counter() - t1
        rss_kv += rss_bytes() - r0
        if tree is not None:
            r0 = rss_bytes()
            c0 = time.process_time()
            t0 = time.perf_counter()
            for w, b in dyn_events[i : i + step]:
                tree.apply_event(w, b)
            dyn_s += time.perf_counter() - t0
            cpu["dyn"] += time.process_time() - c0
            rss_dyn += rss_bytes() - r0
    return kv_s, dyn_s, rss_kv, rss_dyn, refresh_s


def attention_only(workers: int, requests: int, blocks: int, rounds: int, chunk: int, evict: int,
                   seed: int) -> dict[str, Any]:
    wl = Workload(workers, requests, blocks, per_worker=4, seed=seed)
    stores, removals = wl.events(chunk, evict)
    n_stored = sum(len(s[1]) for s in stores)
    kv_stores = [(w, kv_event(h, p)) for w, h, p, _ in stores]
    kv_removes = [(w, {"type": "BlockRemoved", "block_hashes": [h], "medium": "GPU", "group_idx": 0})
                  for w, h, _ in removals]
    geom = kvgeom.resolve(ATTENTION)
    n_tokens = blocks * BLOCK + 1  # one token past the chain: every block may hit
    row: dict[str, Any] = {"workers": workers, "requests": requests, "blocks_per_request": blocks,
                           "stored_blocks": n_stored, "store_events": len(stores), "removed_blocks": len(removals),
                           "load_before": load()}
    gc.collect()
    gc.disable()  # a collection inside a timed loop is noise, for both sides
    try:
        # -- ingest, the two sides alternating slice by slice (the shared machine's load falls on both alike)
        reader = KVEventReader(geom)
        reader.packed()  # a router scores: the packed rows are brought current inside the timed ingest
        tree = RadixTree() if RadixTree is not None else None
        dyn_stores = [(w, dynamo_store(i, h, p, lh)) for i, (w, h, p, lh) in enumerate(stores)]
        dyn_removes = [(w, dynamo_remove(len(stores) + i, [h])) for i, (w, h, _lh) in enumerate(removals)]
        cpu: dict[str, float] = {}
        kv_store_s, dyn_store_s, rss_kv, rss_dyn, refresh_s = _ingest(reader, tree, kv_stores, dyn_stores, cpu)
        row.update(kv_us_per_stored_block=kv_store_s / n_stored * 1e6, kv_rss_mb=rss_kv / 2**20,
                   kv_refresh_us_per_stored_block=refresh_s / n_stored * 1e6,
                   kv_cpu_us_per_stored_block=cpu["kv"] / n_stored * 1e6)
        if tree is not None:
            row.update(dyn_us_per_stored_block=dyn_store_s / n_stored * 1e6, dyn_rss_mb=rss_dyn / 2**20,
                       dyn_cpu_us_per_stored_block=cpu["dyn"] / n_stored * 1e6)

        # -- queries, both sides alternating per request
        def query_round(check: str) -> None:
            for q in range(requests):
                dt, s = timed(lambda q=q: score_replicas(geom, reader, [wl.chains[q]], n_tokens, tiers=GPU,
                                                         num_replicas=workers))
                lat["kv1"].append(dt)
                lat["kvcpu"].append(CPU_SPENT[0])
                kv_scores[q] = s.hit_tokens[0, 0]
                if tree is not None:
                    dt, d = timed(lambda q=q: tree.find_matches(wl.local[q], early_exit=False).scores)
                    lat["dyn1"].append(dt)
                    lat["dyncpu"].append(CPU_SPENT[0])
                    dyn_scores[q] = d
            dt, s = timed(lambda: score_replicas(geom, reader, wl.chains, n_tokens, num_replicas=workers, tiers=GPU))
            lat["kv64"].append(dt)
            if not np.array_equal(s.hit_tokens[:, 0, :], kv_scores):
                raise SystemExit(f"FAIL ({check}): kvgeom's batch of {requests} differs from its one-request calls")
            if tree is not None:
                dt, _ = timed(lambda: [tree.find_matches(c, early_exit=False).scores for c in wl.local])
                lat["dyn64"].append(dt)
                row[f"pairs_checked_{check}"] = check_scores(kv_scores, dyn_scores, check)

        lat: dict[str, list[float]] = {"kv1": [], "dyn1": [], "kv64": [], "dyn64": [], "kvcpu": [], "dyncpu": []}
        kv_scores = np.zeros((requests, workers), dtype=np.int64)
        dyn_scores: list[dict[tuple[int, int], int]] = [{} for _ in range(requests)]
        for _ in range(rounds):
            query_round("after stores")
        row["workers_with_a_hit"] = float((kv_scores > 0).mean())

        # -- removals: one block per event, leaf first
        kv_remove_s, dyn_remove_s, _, _, refresh_s = _ingest(reader, tree, kv_removes, dyn_removes, cpu)
        n_removed = max(len(removals), 1)
        row["kv_us_per_removed_block"] = kv_remove_s / n_removed * 1e6
        row["kv_refresh_us_per_removed_block"] = refresh_s / n_removed * 1e6
        row["kv_cpu_us_per_removed_block"] = cpu["kv"] / n_removed * 1e6
        if tree is not None:
            row["dyn_us_per_removed_block"] = dyn_remove_s / n_removed * 1e6
            row["dyn_cpu_us_per_removed_block"] = cpu["dyn"] / n_removed * 1e6
        query_round("after removals")
    finally:
        gc.enable()
    for side in ("kv", "dyn"):
        if lat[f"{side}1"]:
            row[f"{side}_p50_us"] = pct(lat[f"{side}1"], 50) * 1e6
            row[f"{side}_p99_us"] = pct(lat[f"{side}1"], 99) * 1e6
            row[f"{side}_batch64_p50_us"] = pct(lat[f"{side}64"], 50) * 1e6
            row[f"{side}_batch64_p99_us"] = pct(lat[f"{side}64"], 99) * 1e6
            row[f"{side}_cpu_p50_us"] = pct(lat[f"{side}cpu"], 50) * 1e6
    row["load_after"] = load()
    # kvgeom's retained memory, by tracemalloc in a separate (untimed) build: the reader after every store
    reader = tree = None  # let them go before the memory build
    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    mem_reader = KVEventReader(geom)
    for w, ev in kv_stores:
        mem_reader.apply(ev, w)
    mem_reader.packed()
    row["kv_traced_mb"] = (tracemalloc.get_traced_memory()[0] - base) / 2**20
    row["kv_packed_mb"] = mem_reader.packed().nbytes / 2**20
    tracemalloc.stop()
    return row


# -- growth: no quadratic step -----------------------------------------------------------------------------
def growth(repeat: int, replicas: int) -> list[dict[str, Any]]:
    """Score one request on ``replicas`` replicas whose hits take D distinct values, D = R/4, R/2 and R (the
    chain and the replicas fixed): the CPU time at D = R over the CPU time at D = R/4 (least of ``repeat``)."""
    cases = {
        "attention only, Residency (bit path)": (ATTENTION, False),
        "attention only, KVEventReader (packed path)": (ATTENTION, True),
        "attention + Mamba (bit path)": ({"groups": [{"kind": "full_attention", "block_size": BLOCK},
                                                     {"kind": "mamba", "block_size": BLOCK}]}, False),
        "attention 16 + attention 32 + Mamba (three lookup groups)": (
            {"groups": [{"kind": "full_attention", "block_size": BLOCK},
                        {"kind": "full_attention", "block_size": 2 * BLOCK, "num_kv_heads": 4},
                        {"kind": "mamba", "block_size": BLOCK}]}, False),
    }
    R = replicas
    out = []
    for name, (cfg, via_reader) in cases.items():
        geom = kvgeom.resolve(cfg)
        H = geom.hash_block_size
        n_h = 2 * R + 8
        chain = list(range(1, n_h + 1))
        n = n_h * H + 1
        times = {}
        for D in (R // 4, R // 2, R):
            reader = KVEventReader(geom)
            for r in range(R):  # replica r holds a prefix of 2 * (r % D) + 2 hashes in every group: D hits
                for g in geom.groups:
                    s = g.span // H
                    held = chain[s - 1 : 2 * (r % D) + 2 : s]
                    if held:
                        reader.apply({"type": "BlockStored", "block_hashes": held, "block_size": g.span,
                                      "group_idx": g.index}, r)
            source: Any = reader if via_reader else reader.residency()
            distinct = len(set(score_replicas(geom, source, [chain], n, num_replicas=R).hit_tokens[0, 0].tolist()))
            best = float("inf")
            gc.collect()
            gc.disable()
            for _ in range(repeat):  # CPU time of this process, the least of a few: the shared machine's noise out
                t0 = time.process_time()
                score_replicas(geom, source, [chain], n, num_replicas=R)
                best = min(best, time.process_time() - t0)
            gc.enable()
            times[D] = (best, distinct)
        lo, mid, hi = (times[D] for D in (R // 4, R // 2, R))
        ratio = hi[0] / lo[0]
        out.append({"case": name, "replicas": R, "hashes": n_h, "ms": [lo[0] * 1e3, mid[0] * 1e3, hi[0] * 1e3],
                    "distinct_hits": [lo[1], mid[1], hi[1]], "ratio": ratio})
        if ratio > 8.0:  # linear: at most 4x (the runs are longer too); quadratic: 16x
            raise SystemExit(f"FAIL growth: {name}: 4x the distinct hits ({lo[1]} -> {hi[1]}) took "
                             f"{ratio:.2f}x the time (> 8x: a quadratic step)")
    return out


# -- hybrid workloads --------------------------------------------------------------------------------------
HYBRIDS = {
    "attention + Mamba": {"groups": [{"kind": "full_attention", "block_size": BLOCK},
                                     {"kind": "mamba", "block_size": BLOCK}]},
    "attention + sliding window 256": {"groups": [{"kind": "full_attention", "block_size": BLOCK},
                                                  {"kind": "sliding_window", "block_size": BLOCK,
                                                   "sliding_window": 256}]},
    "attention (DCP 2, span 32) + Mamba": kvgeom.DEFAULT_CONFIG,
}


def hybrid(name: str, cfg: Any, workers: int, requests: int, tokens: int, seed: int) -> dict[str, Any]:
    """Per group events for every worker; kvgeom's scores against a count of leading attention blocks."""
    geom = kvgeom.resolve(cfg)
    rng = np.random.default_rng(seed)
    H = geom.hash_block_size
    n_h = tokens // H
    shared = n_h // 4
    systems = [rng.integers(1, 2**63, size=shared).tolist() for _ in range(8)]
    chains = [systems[q % 8] + rng.integers(1, 2**63, size=n_h - shared).tolist() for q in range(requests)]
    reader = KVEventReader(geom)
    attn = geom.groups[0]
    for w in range(workers):
        for q in rng.choice(requests, size=4, replace=False):
            held = int(rng.integers(0, n_h + 1))
            chain = chains[q]
            keep = rng.random(n_h)
            for g in geom.groups:
                s = g.span // H
                ends = range(s - 1, held, s)
                if g.family == "mamba":  # checkpoints kept with probability 1/4
                    blocks = [chain[i] for i in ends if keep[i] < 0.25]
                elif g.family == "sliding":  # blocks far behind the cached end freed, a few kept
                    need = (256 + g.span - 1) // g.span + 1
                    blocks = [chain[i] for i in ends if i >= held - need * s or keep[i] < 0.1]
                else:  # attention: 1 % evicted
                    blocks = [chain[i] for i in ends if keep[i] >= 0.01]
                if blocks:
                    reader.apply({"type": "BlockStored", "block_hashes": blocks, "block_size": g.span,
                                  "group_idx": g.index, "medium": "GPU"}, w)
    n = n_h * H + 1
    reader.residencies()  # hybrid rules score from the residency: built once from the rows, untimed like the ingest
    t0 = time.perf_counter()
    real = score_replicas(geom, reader, chains, n, num_replicas=workers).hit_tokens[:, 0, :]
    score_ms = (time.perf_counter() - t0) / requests * 1e3
    # the attention-only score: the count of leading attention blocks held (the other groups' events dropped)
    S = attn.span
    counted = np.zeros_like(real)
    for q, chain in enumerate(chains):
        held = chain_matrix(reader.residency(), attn.index, chain[S // H - 1 : (n - 1) // S * (S // H) : S // H],
                            workers)
        counted[q] = np.cumprod(held, axis=0).sum(axis=0) * S
    pick_real = real.argmax(axis=1)
    pick_count = counted.argmax(axis=1)
    rows = np.arange(requests)
    changed = pick_real != pick_count
    lost = real[rows, pick_real] - real[rows, pick_count]
    promised = counted[rows, pick_count] - real[rows, pick_count]
    return {"case": name, "workers": workers, "requests": requests, "tokens": tokens,
            "top_replica_changes": int(changed.sum()),
            "tokens_lost_when_routed_by_count_mean": float(lost.mean()),
            "tokens_promised_not_reused_mean": float(promised.mean()),
            "pairs_scored_differently": float((real != counted).mean()),
            "kv_ms_per_request": score_ms}


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a small run in seconds (a smoke test)")
    ap.add_argument("--workers", type=int, nargs="*", default=None)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    quick = args.quick
    workers = args.workers or ([50] if quick else [100, 1000])
    requests, blocks = (8, 64) if quick else (64, 512)
    print(f"kvgeom router vs Dynamo, numpy {np.__version__}, load {load()}, "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    if RadixTree is None:
        print(f"Dynamo's RadixTree is not importable ({DYNAMO_ERROR}): pip install ai-dynamo-runtime==1.6.1 "
              "to run it side by side. kvgeom's side only.")
    results: dict[str, Any] = {"dynamo": RadixTree is not None, "attention_only": [], "growth": [], "hybrid": []}
    for w in workers:
        r = attention_only(w, requests, blocks, rounds=1 if quick else args.rounds, chunk=128,
                           evict=8 if quick else 64, seed=5)
        results["attention_only"].append(r)
        line = (f"attention only, {w} workers, {r['stored_blocks']} stored blocks in {r['store_events']} events, "
                f"{r['removed_blocks']} removed; load {tuple(round(x, 2) for x in r['load_before'])}")
        print(line)
        for key, label in (("us_per_stored_block", "ingest us / stored block"),
                           ("us_per_removed_block", "ingest us / removed block"),
                           ("p50_us", "query p50 us (1 request)"), ("p99_us", "query p99 us (1 request)"),
                           ("batch64_p50_us", "query p50 us (64 requests)"),
                           ("batch64_p99_us", "query p99 us (64 requests)"), ("rss_mb", "RSS growth MB"),
                           ("cpu_us_per_stored_block", "CPU us / stored block"),
                           ("cpu_us_per_removed_block", "CPU us / removed block"),
                           ("cpu_p50_us", "CPU us p50 (1 request)")):
            kv = r[f"kv_{key}"]
            if RadixTree is not None:
                dyn = r[f"dyn_{key}"]
                print(f"  {label:30s} kvgeom {kv:10.2f}   Dynamo {dyn:10.2f}   ratio {kv / dyn:6.2f}")
            else:
                print(f"  {label:30s} kvgeom {kv:10.2f}")
        print(f"  kvgeom's ingest includes reader.packed() 16 times (the reader's one index while no Residency is "
              f"asked for, so nothing to bring current): {r['kv_refresh_us_per_stored_block']:.2f} us / stored "
              f"block, {r['kv_refresh_us_per_removed_block']:.2f} us / removed block of it")
        print(f"  kvgeom retained (tracemalloc) {r['kv_traced_mb']:.1f} MB, of which packed rows "
              f"{r['kv_packed_mb']:.1f} MB; workers with a hit {r['workers_with_a_hit']:.2f}")
        if RadixTree is not None:
            print(f"  scores identical on {r['pairs_checked_after stores']} (request, worker) pairs after the "
                  f"stores and {r['pairs_checked_after removals']} after the removals")
    results["growth"] = growth(repeat=5 if quick else 25, replicas=400 if quick else 2000)
    print("growth (one request; the replicas and the chain fixed, their hits D distinct values; 4x D: linear "
          "<= 4x the time, a quadratic step 16x; fails above 8x):")
    for g in results["growth"]:
        shown = "  ".join(f"{ms:7.2f} ms at D={d}" for ms, d in zip(g["ms"], g["distinct_hits"], strict=True))
        print(f"  {g['case']:58s} {shown}   4x D: x{g['ratio']:.2f}")
    print("hybrid workloads (Dynamo cannot score them): kvgeom against a count of leading attention blocks")
    hw = 100 if quick else 1000
    for name, cfg in HYBRIDS.items():
        h = hybrid(name, cfg, hw, requests, 1024 if quick else 8192, seed=7)
        results["hybrid"].append(h)
        print(f"  {name:36s} top replica changes on {h['top_replica_changes']}/{requests} requests; routed by "
              f"the count, {h['tokens_lost_when_routed_by_count_mean']:.0f} tokens of reuse lost and "
              f"{h['tokens_promised_not_reused_mean']:.0f} promised but not reused per request; "
              f"{h['pairs_scored_differently']:.0%} of pairs scored differently; "
              f"{h['kv_ms_per_request']:.2f} ms per request ({hw} workers)")
    print(f"load after {load()}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1, default=float))
    return 0


if __name__ == "__main__":
    sys.exit(main())
