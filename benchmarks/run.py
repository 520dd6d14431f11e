"""kvgeom benchmarks: batch paths against kvgeom's own scalar loops and a memory-bound floor.

Usage: ``python benchmarks/run.py [--quick] [--json FILE]``

Every figure is a ratio against a baseline measured in the same run (absolute times drift on shared
machines): ``speedup`` = scalar-loop time / batch time, ``x floor`` = batch time / the time of one
numpy operation writing as many int64 values as the case's output. Each time is the median of
repeated runs after a warm-up run. The scalar loop is timed on a subsample and scaled per element.
See benchmarks/README.md for what each case models and the results on this machine.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # benchmark this checkout's kvgeom, not an installed one

import numpy as np  # noqa: E402

import kvgeom  # noqa: E402
from kvgeom import batch, boundaries, hits, keys, ranks  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import router as router_bench  # noqa: E402  (benchmarks/router.py)
import vs_vllm  # noqa: E402  (side-by-side with vLLM; skipped when vllm does not import)

RESULTS: list[dict[str, Any]] = []


def median_time(fn: Callable[[], Any], *, repeat: int, number: int = 1, warmup: int = 1) -> float:
    """Median seconds per call of ``fn`` over ``repeat`` runs of ``number`` calls, after ``warmup`` calls."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        for _ in range(number):
            fn()
        times.append((time.perf_counter() - t0) / number)
    return statistics.median(times)


def scalar_loop_time(loop: Callable[[int], Any], sample: int, total: int, repeat: int) -> float:
    """Time of the per-element scalar loop over ``total`` elements, from a loop over ``sample`` of them."""
    return median_time(lambda: loop(sample), repeat=repeat, warmup=0) * total / sample


def record(case: str, *, n: int, batch_s: float, scalar_s: float | None = None, floor_s: float | None = None,
           target: str = "", met: bool | None = None, **extra: Any) -> None:
    row = {
        "case": case,
        "n": n,
        "batch_ms": batch_s * 1e3,
        "scalar_loop_ms": None if scalar_s is None else scalar_s * 1e3,
        "speedup_vs_scalar": None if scalar_s is None else scalar_s / batch_s,
        "floor_ms": None if floor_s is None else floor_s * 1e3,
        "x_floor": None if floor_s is None else batch_s / floor_s,
        "target": target,
        "met": met,
        **extra,
    }
    RESULTS.append(row)
    parts = [f"{case:<44}", f"n={n:<9}", f"batch {batch_s * 1e3:9.3f} ms"]
    if scalar_s is not None:
        parts.append(f"{scalar_s / batch_s:8.1f}x scalar loop")
    if floor_s is not None:
        parts.append(f"{batch_s / floor_s:5.1f}x floor")
    for k, v in extra.items():
        parts.append(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}")
    parts.append(f"[{target}: {'met' if met else 'MISSED' if met is not None else '-'}]")
    print("  ".join(parts), flush=True)


def floor_time(n: int, repeat: int, *, into: np.ndarray | None = None) -> float:
    """One numpy op writing ``n`` int64 values (reads one int64 array; allocates the output, or writes
    ``into`` when given, as a caller reusing a buffer does)."""
    src = np.arange(n, dtype=np.int64)
    if into is not None:
        return median_time(lambda: np.add(src, 1, out=into), repeat=repeat)
    return median_time(lambda: np.add(src, 1), repeat=repeat)


# ---------------------------------------------------------------------------------------------
# Cases
# ---------------------------------------------------------------------------------------------


def slot_mapping_case(n_pos: int, dcp: int, interleave: int, *, repeat: int, sample: int, rank: int | None) -> None:
    """Slot mapping of n_pos positions for a DCP-sharded MLA group (B = 16): requests of 4096 tokens."""
    geom = kvgeom.resolve({"groups": [{"kind": "mla", "block_size": 16}],
                           "parallel": {"tp": dcp, "dcp": dcp, "cp_interleave": interleave}})
    span = geom.groups[0].span
    per_req = 4096
    reqs = max(n_pos // per_req, 1)
    pos = np.tile(np.arange(per_req, dtype=np.int64), reqs)[:n_pos]
    req = np.repeat(np.arange(reqs, dtype=np.int64), per_req)[:n_pos]
    rng = np.random.default_rng(7)
    table = rng.integers(1, 1 << 24, size=(reqs, -(-per_req // span)), dtype=np.int64)
    rows = [r.tolist() for r in table]
    pos_l, req_l = pos.tolist(), req.tolist()
    b = median_time(lambda: batch.slot_mapping(geom, 0, pos, table, req, rank=rank), repeat=repeat)

    def loop(m: int) -> None:
        out = []
        for i in range(m):
            owner, slot = ranks.dcp_slot(geom, 0, pos_l[i], rows[req_l[i]])
            out.append(slot if rank is None or owner == rank else -1)

    s = scalar_loop_time(loop, min(sample, n_pos), n_pos, repeat=3)
    f = floor_time(n_pos, repeat)
    # the same with a reused output buffer (out=), against the floor writing into a buffer too
    buf, fbuf = np.empty(n_pos, dtype=np.int64), np.empty(n_pos, dtype=np.int64)
    b_out = median_time(lambda: batch.slot_mapping(geom, 0, pos, table, req, rank=rank, out=buf), repeat=repeat)
    f_out = floor_time(n_pos, repeat, into=fbuf)
    view = "owner slots" if rank is None else f"rank {rank} view"
    record(f"slot_mapping D={dcp} I={interleave} ({view})", n=n_pos, batch_s=b, scalar_s=s, floor_s=f,
           target=">=100x scalar, <=5x floor", met=s / b >= 100 and b / f <= 5,
           out_buffer_ms=b_out * 1e3, x_floor_out_buffer=b_out / f_out)


HYBRID3 = {
    "groups": [
        {"kind": "full_attention", "block_size": 16},
        {"kind": "sliding_window", "block_size": 16, "sliding_window": 128},
        {"kind": "mamba", "block_size": 16, "mamba_cache_mode": "align"},
    ],
    "offload": {},
}


def key_map_and_store_cases(n_req: int, tokens: int, *, repeat: int, sample: int) -> None:
    """Key maps and store plans for n_req requests x 3 offloaded groups x ``tokens`` tokens."""
    geom = kvgeom.resolve(HYBRID3)
    n = np.full(n_req, tokens, dtype=np.int64)
    b = median_time(lambda: batch.key_maps(geom, n), repeat=repeat)
    s = scalar_loop_time(lambda m: [keys.key_map(geom, tokens) for _ in range(m)], sample, n_req, repeat=3)
    total = sum(int(g.chunk.size) for g in batch.key_maps(geom, n).groups)
    f = floor_time(total * 4, repeat)  # four int64 arrays per key: chunk, hash index, end token, block
    record(f"key_maps {n_req} req x 3 groups x {tokens} tok", n=n_req, batch_s=b, scalar_s=s, floor_s=f,
           target=">=30x scalar", met=s / b >= 30, keys=total)

    rng = np.random.default_rng(3)
    computed = rng.integers(tokens // 2, tokens + 1, size=n_req)
    stored = {og.index: computed // og.tokens_per_chunk // 2 for og in geom.offload.groups}
    comp_l = computed.tolist()
    stored_l = {g: v.tolist() for g, v in stored.items()}
    b = median_time(lambda: batch.plan_stores(geom, num_tokens=n, num_computed_tokens=computed,
                                              stored_chunks=stored), repeat=repeat)

    def loop(m: int) -> None:
        for i in range(m):
            hits.plan_store(geom, num_tokens=tokens, num_computed_tokens=comp_l[i],
                            stored_chunks={g: v[i] for g, v in stored_l.items()})

    s = scalar_loop_time(loop, sample, n_req, repeat=3)
    sp = batch.plan_stores(geom, num_tokens=n, num_computed_tokens=computed, stored_chunks=stored)
    total = sum(int(g.chunk.size) for g in sp.groups)
    record(f"plan_stores {n_req} req x 3 groups x {tokens} tok", n=n_req, batch_s=b, scalar_s=s,
           floor_s=floor_time(max(total * 4, 1), repeat), target=">=30x scalar", met=s / b >= 30, chunks=total)


def hit_cases(n_req: int, max_tokens: int, *, repeat: int, sample: int) -> None:
    """Hit lengths and load plans for n_req requests with random stored-key sets."""
    geom = kvgeom.resolve(HYBRID3)
    H = geom.hash_block_size
    rng = np.random.default_rng(11)
    n = rng.integers(1024, max_tokens + 1, size=n_req)
    width = max_tokens // H
    cols = np.arange(width)[None, :]
    stored = {}
    for og in geom.offload.groups:
        prefix = (rng.random((n_req, 1)) * (n[:, None] // H + 1)).astype(np.int64)  # a stored prefix ...
        held = (cols < prefix) & (rng.random((n_req, width)) >= 0.01)  # ... with 1% of its keys evicted
        if geom.groups[og.index].family == "mamba":
            held &= rng.random((n_req, width)) < 0.25  # sparse Mamba checkpoints
        stored[og.index] = held
    n_l = n.tolist()
    stored_l = [{g: ((np.flatnonzero(m[i]) + 1) * H).tolist() for g, m in stored.items()} for i in range(n_req)]

    def run_batch() -> Any:
        return batch.plan_loads(geom, batch.lookup_hits(geom, n, stored=stored))

    b = median_time(run_batch, repeat=repeat)

    def loop(m: int) -> None:
        for i in range(m):
            hits.plan_load(geom, hits.lookup_hit(geom, n_l[i], stored=stored_l[i]))

    s = scalar_loop_time(loop, sample, n_req, repeat=3)
    lp = run_batch()
    record(f"lookup_hits + plan_loads {n_req} req", n=n_req, batch_s=b, scalar_s=s,
           floor_s=floor_time(n_req * 4 * 8, repeat), target=">=20x scalar", met=s / b >= 20,
           mean_hit=float(lp.hits.hit_tokens.mean()))


def scalar_query_cases(*, repeat: int, number: int) -> None:
    """Per-call time of the scalar reference queries (timeit statements: no wrapper call is counted)."""
    import timeit

    geom = kvgeom.resolve(kvgeom.DEFAULT_CONFIG)
    env = {"geom": geom, "keys": keys, "boundaries": boundaries}
    queries = {
        "span (geom.group(0).span)": "geom.group(0).span",
        "key -> blocks (chunk_block_entries)": "keys.chunk_block_entries(geom, 0, 5)",
        "Mamba state block (state_block_for_boundary)": "boundaries.state_block_for_boundary(geom, 1, 64)",
        "restore block (restore_read_block)": "boundaries.restore_read_block(geom, 1, 65)",
    }
    for name, stmt in queries.items():
        timer = timeit.Timer(stmt, globals=env)
        timer.timeit(number)  # warm-up
        t = statistics.median(timer.repeat(repeat=repeat, number=number)) / number
        record(f"scalar query: {name}", n=1, batch_s=t, target="<=1 us/call", met=t <= 1e-6, us_per_call=t * 1e6)


def resolve_case(*, repeat: int) -> None:
    groups = []
    for i in range(64):
        match i % 4:
            case 0 | 1:
                groups.append({"kind": "full_attention", "block_size": 16})
            case 2:
                groups.append({"kind": "sliding_window", "block_size": 16, "sliding_window": 128})
            case _:
                groups.append({"kind": "mamba", "block_size": 16, "mamba_cache_mode": "align"})
    cfg = {"groups": groups, "offload": {}}
    t = median_time(lambda: kvgeom.resolve(cfg), repeat=repeat, number=5)
    record("resolve() of a 64-group config (dict)", n=64, batch_s=t, target="<1 ms", met=t < 1e-3)
    model = kvgeom.KVGeomConfig.model_validate(cfg)
    t2 = median_time(lambda: kvgeom.resolve(model), repeat=repeat, number=5)
    record("resolve() of a 64-group config (validated model)", n=64, batch_s=t2, target="<1 ms", met=t2 < 1e-3)


def import_case(*, runs: int) -> None:
    """`import kvgeom` in fresh interpreters (median of ``runs``), bytecode cached as after a pip install.

    Two baselines: the literal one of issue 7 (after ``import numpy, pydantic``; pydantic v2 imports
    lazily, so its model machinery is then paid by kvgeom's first model class), and after
    ``from pydantic import BaseModel`` (what any pydantic-based library pays), which isolates kvgeom's
    own cost. The machine sets PYTHONDONTWRITEBYTECODE; the subprocesses get a private pycache prefix
    and one warm-up run instead, since an installed wheel ships compiled bytecode.
    """
    import shutil
    import tempfile

    cache = tempfile.mkdtemp(prefix="kvgeom-pycache-")
    try:
        _import_case(runs=runs, cache=cache)
    finally:  # the bytecode cache is scratch: leave nothing behind in the temp folder
        shutil.rmtree(cache, ignore_errors=True)


def _import_case(*, runs: int, cache: str) -> None:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")
    env["PYTHONPYCACHEPREFIX"] = cache

    def timed(pre: str) -> tuple[float, float]:
        code = (
            f"import time\n{pre}\nt0 = time.perf_counter()\nimport kvgeom\nt1 = time.perf_counter()\n"
            "kvgeom.resolve(kvgeom.DEFAULT_CONFIG)\nprint(t1 - t0, time.perf_counter() - t1)\n"
        )
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env)
        a, b = out.stdout.split()
        return float(a), float(b)

    literal_pre = "import numpy, pydantic, typing_extensions"
    # the pydantic names kvgeom's modules import: pydantic's own machinery, loaded lazily by pydantic
    model_pre = (
        "import numpy, pydantic, typing_extensions\n"
        "from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator"
    )
    timed(model_pre)  # warm-up: writes the bytecode cache
    literal = [timed(literal_pre) for _ in range(runs)]
    own = [timed(model_pre) for _ in range(runs)]
    lit_import = statistics.median(t for t, _ in literal)
    own_import = statistics.median(t for t, _ in own)
    first = statistics.median(r for _, r in own)
    record("import kvgeom (after import numpy, pydantic)", n=runs, batch_s=lit_import, target="<=60 ms",
           met=lit_import <= 0.060)
    record("import kvgeom (after pydantic's public API is loaded)", n=runs, batch_s=own_import,
           target="<=60 ms", met=own_import <= 0.060)
    # models are built on first use (defer_build): say what that first use costs
    record("first resolve() in a fresh process (builds the validators)", n=runs, batch_s=first, target="(info)",
           met=True)


def scaling_case(max_exp: int, *, repeat: int) -> None:
    """Batch slot-mapping cost from 2**10 to 2**max_exp positions; log-log fit of time against size.

    Measured twice, with a fresh output (the default) and into a reused ``out=`` buffer, and so is the
    floor, whose own exponent shows what the memory hierarchy alone does to a one-pass operation."""
    geom = kvgeom.resolve({"groups": [{"kind": "mla", "block_size": 16}], "parallel": {"tp": 2, "dcp": 2}})
    rng = np.random.default_rng(5)
    sizes: list[int] = []
    times: dict[str, list[float]] = {"fresh": [], "out": [], "floor": [], "floor_out": []}
    for e in range(10, max_exp + 1, 2):
        n = 1 << e
        per_req = 4096
        reqs = max(n // per_req, 1)
        pos = np.tile(np.arange(min(per_req, n), dtype=np.int64), reqs)[:n]
        req = np.repeat(np.arange(reqs, dtype=np.int64), per_req)[:n]
        table = rng.integers(1, 1 << 24, size=(reqs, per_req // geom.groups[0].span), dtype=np.int64)
        buf = np.empty(n, dtype=np.int64)
        rep = repeat if e < 22 else max(3, repeat // 3)
        t = median_time(lambda pos=pos, req=req, table=table: batch.slot_mapping(geom, 0, pos, table, req),
                        repeat=rep)
        t_out = median_time(lambda pos=pos, req=req, table=table, buf=buf:
                            batch.slot_mapping(geom, 0, pos, table, req, out=buf), repeat=rep)
        sizes.append(n)
        times["fresh"].append(t)
        times["out"].append(t_out)
        times["floor"].append(floor_time(n, rep))
        times["floor_out"].append(floor_time(n, rep, into=np.empty(n, dtype=np.int64)))
        print(f"    scaling: 2^{e:<2} positions  {t * 1e3:10.3f} ms  {t / n * 1e9:7.2f} ns/position  "
              f"out= {t_out / n * 1e9:6.2f} ns/position  floor {times['floor'][-1] / n * 1e9:5.2f} / "
              f"{times['floor_out'][-1] / n * 1e9:5.2f} ns", flush=True)
    x = np.log2(sizes)
    big = x >= 16

    def slope(ts: list[float], mask: Any = None) -> float:
        xs, ys = (x, np.log2(ts)) if mask is None else (x[mask], np.log2(ts)[mask])
        return float(np.polyfit(xs, ys, 1)[0]) if len(xs) >= 2 else math.nan

    for name, key, floor_key in (("fresh output", "fresh", "floor"), ("out= buffer", "out", "floor_out")):
        ts = times[key]
        slope_big = slope(ts, big)
        # the issue-10 criterion: exponent 0.9..1.1 from 2**16 on (past the fixed per-call overhead)
        record(f"scaling slot_mapping 2^10..2^{max_exp} ({name})", n=sizes[-1], batch_s=ts[-1],
               target="exponent 0.9..1.1 from 2^16", met=abs(slope_big - 1) <= 0.1, exponent_all=slope(ts),
               exponent_from_2_16=slope_big, floor_exponent_from_2_16=slope(times[floor_key], big),
               ns_per_position=[round(t / n * 1e9, 2) for t, n in zip(ts, sizes, strict=True)],
               x_floor=[round(t / f, 1) for t, f in zip(ts, times[floor_key], strict=True)])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="smaller sizes and fewer repeats (under a minute)")
    ap.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    ap.add_argument("--only", metavar="NAME", action="append",
                    help="run only these cases: slots, keys, hits, queries, resolve, import, scaling, vllm, router")
    args = ap.parse_args(argv)
    q = args.quick
    print(f"kvgeom benchmarks ({'quick' if q else 'full'}), numpy {np.__version__}, load {os.getloadavg()}")
    repeat = 5 if q else 11
    n_pos = 1 << (18 if q else 20)

    def slots() -> None:
        for dcp in (2, 8):
            for interleave in (1, 16):
                for rank in (None, 1):
                    slot_mapping_case(n_pos, dcp, interleave, repeat=repeat, sample=1 << (10 if q else 12), rank=rank)

    cases: dict[str, Callable[[], None]] = {
        "slots": slots,
        "keys": lambda: key_map_and_store_cases(128 if q else 1024, 8192 if q else 32768, repeat=3 if q else 5,
                                                sample=2 if q else 8),
        "hits": lambda: hit_cases(512 if q else 4096, 8192 if q else 32768, repeat=3 if q else 5,
                                  sample=64 if q else 256),
        "queries": lambda: scalar_query_cases(repeat=repeat, number=2000 if q else 20000),
        "resolve": lambda: resolve_case(repeat=repeat),
        "import": lambda: import_case(runs=3 if q else 9),
        "scaling": lambda: scaling_case(18 if q else 24, repeat=repeat),
        "vllm": lambda: vs_vllm.run(record, quick=q),
        "router": lambda: (
            router_bench.router_cases(record, median_time, replicas=1000, requests=8 if q else 64, tokens=8192,
                                      repeat=3 if q else 7, sample_replicas=4 if q else 16,
                                      sample_requests=2 if q else 4),
            router_bench.ingest_case(record, median_time, events=2000 if q else 20000, repeat=3 if q else 5),
        ),
    }
    unknown = set(args.only or ()) - set(cases)
    if unknown:
        ap.error(f"unknown case(s) {sorted(unknown)}; choose from {sorted(cases)}")
    for name, run_case in cases.items():
        if not args.only or name in args.only:
            run_case()
    print(f"load after: {os.getloadavg()}")
    if args.json:
        Path(args.json).write_text(json.dumps({"quick": q, "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
                                               "numpy": np.__version__, "results": RESULTS}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
