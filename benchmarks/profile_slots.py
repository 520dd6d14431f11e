"""Per-step profile of the slot-mapping kernel (D = 2, I = 1, owner slots), as benchmarks/README.md reports it.

Usage: ``python benchmarks/profile_slots.py [--reuse]``

Replays the numpy calls of ``kvgeom.batch.ranks._slots_blocked`` block by block over the benchmark's
positions (requests of 4096 tokens, per-rank block 16) and times each call separately; each step's
figure is its best over the runs, in ns per position. ``--reuse`` writes into one preallocated output
(``slot_mapping(..., out=)``) instead of a fresh array per run. numpy ufunc calls are invisible to
cProfile (they are not Python functions), which is why the steps are timed one by one.
"""

from __future__ import annotations

import argparse
import time
from collections import defaultdict

import numpy as np

B, D = 16, 2
S = B * D
BLOCK = 1 << 15
i64, u64 = np.int64, np.uint64


def profile(e: int, runs: int, reuse: bool) -> None:
    n = 1 << e
    per_req = 4096
    reqs = max(n // per_req, 1)
    width = per_req // S
    pos = np.tile(np.arange(per_req, dtype=i64), reqs)[:n]
    req = np.repeat(np.arange(reqs, dtype=i64), per_req)[:n]
    table = np.random.default_rng(5).integers(1, 1 << 24, size=(reqs, width), dtype=i64)
    keep = np.zeros(n, dtype=i64) if reuse else None
    best: dict[str, float] = defaultdict(lambda: float("inf"))
    for _ in range(runs):
        acc: dict[str, float] = defaultdict(float)
        out = keep if keep is not None else np.empty(n, dtype=i64)
        t = time.perf_counter()
        scaled = table.ravel() * B
        acc["table * B"] += time.perf_counter() - t
        a, b = np.empty(BLOCK, i64), np.empty(BLOCK, i64)
        for lo in range(0, n, BLOCK):  # each step runs before the loop moves on: the lambdas read this round
            pb, rb, ob = pos[lo : lo + BLOCK], req[lo : lo + BLOCK], out[lo : lo + BLOCK]
            steps = [
                ("max check of positions", lambda pb=pb: pb.view(u64).max()),
                ("max check of request indices", lambda rb=rb: rb.view(u64).max()),
                ("p >> log2(S)", lambda pb=pb: np.right_shift(pb, i64(5), out=a)),
                ("req * width", lambda rb=rb: np.multiply(rb, i64(width), out=b)),
                ("+ (flat index)", lambda: np.add(a, b, out=a)),
                ("np.take, written into out", lambda ob=ob: np.take(scaled, a, out=ob, mode="clip")),
                ("p >> log2(D)", lambda pb=pb: np.right_shift(pb, i64(1), out=a)),
                ("& (B-1)", lambda: np.bitwise_and(a, i64(B - 1), out=a)),
                ("out += offset", lambda ob=ob: np.add(ob, a, out=ob)),
            ]
            for name, step in steps:
                t = time.perf_counter()
                step()
                acc[name] += time.perf_counter() - t
        for k, v in acc.items():
            best[k] = min(best[k], v)
    src = np.arange(n, dtype=i64)
    floor = float("inf")
    for _ in range(runs):
        t = time.perf_counter()
        np.add(src, 1)
        floor = min(floor, time.perf_counter() - t)
    total = sum(best.values())
    print(f"2^{e} positions ({'reused out=' if reuse else 'fresh output'}): total {total / n * 1e9:.2f} ns/position, "
          f"floor np.add(a, 1) {floor / n * 1e9:.2f}")
    for k, v in best.items():
        print(f"   {k:32s} {v / n * 1e9:6.2f} ns/position  ({v / total * 100:4.1f} %)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reuse", action="store_true", help="write into one preallocated output")
    args = ap.parse_args()
    profile(20, 9, args.reuse)
    profile(24, 3, args.reuse)


if __name__ == "__main__":
    main()
