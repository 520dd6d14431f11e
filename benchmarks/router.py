"""Router benchmark cases (called from benchmarks/run.py, which passes its timing and recording helpers).

* ``router score``: R replicas x Q requests x N tokens on a full-attention + Mamba geometry; every replica
  holds the prefixes of a few requests (1 % of attention blocks evicted, Mamba checkpoints kept with
  probability 1/4), 8 system prompts of N/4 tokens shared across requests. Batch: one
  ``kvgeom.router.score_replicas`` call for all requests and replicas. Baseline: the scalar reference
  ``kvgeom.prefix.prefix_hit`` once per (request, replica) on ``Residency.probe``, timed on a subsample
  and scaled; the subsample's answers are checked equal to the batch's.
* ``kv events ingest``: BlockStored / BlockRemoved events through ``KVEventReader.apply`` against the
  same blocks added with ``Residency.add`` directly (the floor: one dict + bit operation per block).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np

import kvgeom
from kvgeom.events import KVEventReader
from kvgeom.prefix import prefix_hit
from kvgeom.router import score_replicas

GEOMETRIES = {
    # the seed hybrid (kvgeom.DEFAULT_CONFIG): attention span 32 under DCP 2, Mamba 16, H = A = 16
    "seed hybrid": kvgeom.DEFAULT_CONFIG,
    # Mamba block 64 > H = 16: partial hash hits, the Mamba lookup reads every H boundary
    "mamba 64, partial hits": {"groups": [{"kind": "full_attention", "block_size": 16},
                                          {"kind": "mamba", "block_size": 64}]},
}


def _population(geom: kvgeom.Geometry, replicas: int, requests: int, tokens: int, per_replica: int,
                seed: int) -> tuple[list[list[bytes]], kvgeom.Residency]:
    rng = np.random.default_rng(seed)
    H = geom.hash_block_size
    n_h = tokens // H
    shared = n_h // 4
    systems = [[rng.bytes(32) for _ in range(shared)] for _ in range(8)]
    chains = [systems[q % 8] + [rng.bytes(32) for _ in range(n_h - shared)] for q in range(requests)]
    res = kvgeom.Residency()
    fa, mamba = geom.groups[0], geom.groups[1]
    s_fa, s_m = fa.span // H, mamba.span // H
    for r in range(replicas):
        for q in rng.choice(requests, size=per_replica, replace=False):
            held = int(rng.integers(0, n_h + 1))
            chain = chains[q]
            keep = rng.random(n_h)
            for i in range(s_fa - 1, held, s_fa):
                if keep[i] >= 0.01:
                    res.add(0, chain[i], r)
            for i in range(s_m - 1, held, s_m):
                if keep[i] < 0.25:
                    res.add(1, chain[i], r)
    return chains, res


def router_cases(record: Callable[..., None], median_time: Callable[..., float], *, replicas: int, requests: int,
                 tokens: int, repeat: int, sample_replicas: int, sample_requests: int) -> None:
    for name, cfg in GEOMETRIES.items():
        geom = kvgeom.resolve(cfg)
        chains, res = _population(geom, replicas, requests, tokens, per_replica=4, seed=5)
        n = tokens + 1  # a request one token past the chain: the whole chain may hit

        def run_batch(chains: list[list[bytes]] = chains, res: kvgeom.Residency = res,
                      geom: kvgeom.Geometry = geom, n: int = n) -> Any:
            return score_replicas(geom, res, chains, n, num_replicas=replicas)

        b = median_time(run_batch, repeat=repeat)
        cpu = []
        for _ in range(repeat):  # CPU seconds of this process: what the call costs on a core it has alone
            c0 = time.process_time()
            run_batch()
            cpu.append(time.process_time() - c0)
        cpu_per_request = statistics.median(cpu) / requests
        scores = run_batch().hit_tokens[:, 0, :]
        sample = [(q, r) for q in range(sample_requests) for r in range(sample_replicas)]

        def loop(geom: kvgeom.Geometry = geom, chains: list[list[bytes]] = chains, res: kvgeom.Residency = res,
                 n: int = n, sample: list[tuple[int, int]] = sample) -> list[int]:
            return [prefix_hit(geom, n, res.probe(geom, chains[q], holder=r)).hit_tokens for q, r in sample]

        got = loop()
        want = [int(scores[q, r]) for q, r in sample]
        if got != want:
            raise AssertionError(f"router batch disagrees with scalar prefix_hit on {name}: {got} != {want}")
        s = median_time(loop, repeat=3, warmup=0) * (replicas * requests) / len(sample)
        per_request = b / requests
        record(f"router score {name}", n=replicas * requests, batch_s=b, scalar_s=s,
               target="< 1 ms per request (1000 replicas)", met=per_request < 1e-3 if replicas >= 1000 else None,
               ms_per_request=per_request * 1e3, cpu_ms_per_request=cpu_per_request * 1e3, replicas=replicas,
               requests=requests, tokens=tokens,
               replicas_with_a_hit=float((scores > 0).mean()), mean_hit=float(scores.mean()))


def ingest_case(record: Callable[..., None], median_time: Callable[..., float], *, events: int, repeat: int) -> None:
    geom = kvgeom.resolve(kvgeom.DEFAULT_CONFIG)
    rng = np.random.default_rng(9)
    hashes = [rng.bytes(32) for _ in range(4096)]
    stream = []
    for k in range(events):
        replica = int(rng.integers(0, 64))
        start = int(rng.integers(0, 4096 - 8))
        block = hashes[start : start + 8]
        if k % 3 == 2:
            stream.append((replica, {"type": "BlockRemoved", "block_hashes": block, "medium": "GPU",
                                     "group_idx": 1}))
        else:
            stream.append((replica, {"type": "BlockStored", "block_hashes": block, "parent_block_hash": None,
                                     "token_ids": [], "block_size": 16, "lora_id": None, "medium": "GPU",
                                     "group_idx": 1}))

    def run_reader() -> None:
        reader = KVEventReader(geom)
        for replica, event in stream:
            reader.apply(event, replica)

    def run_floor() -> None:
        res = kvgeom.Residency()
        for replica, event in stream:
            if event["type"] == "BlockStored":
                for h in event["block_hashes"]:
                    res.add(1, h, replica)
            else:
                for h in event["block_hashes"]:
                    res.discard(1, h, replica)

    b = median_time(run_reader, repeat=repeat)
    f = median_time(run_floor, repeat=repeat)
    blocks = events * 8
    record(f"kv events ingest {events} events", n=blocks, batch_s=b, floor_s=f, target="O(1) per block",
           met=None, us_per_block=b / blocks * 1e6, floor_us_per_block=f / blocks * 1e6)
