"""Replay a recorded vLLM KV-event stream into per-replica residency and score one request on every replica.

Usage: ``python examples/replay_events.py [events.jsonl]`` (default: ``examples/data/events.jsonl``;
``--help`` prints this usage).

The stream is JSON lines, as a router that subscribed to each replica's ZMQ publisher and decoded the
msgpack batches might log them:

* ``{"request": {"num_tokens": N, "block_hashes": [...]}}``: the request to score and its hash chain
  at the hash unit H (one hash per H tokens, in the same encoding as the events: here JSON's base64);
* ``{"replica": name, "batch": [ts, [events...], data_parallel_rank]}``: one ``KVEventBatch`` of one
  replica, events as dicts tagged ``"type"`` (``BlockStored``, ``BlockRemoved``, ``AllBlocksCleared``).

The engines run kvgeom's default geometry (full attention, block 16 under DCP 2, so span 32; Mamba
align, block 16; H = 16). The recorded replicas hold the request's entries with holes in different
places per group; the scores show why a router must reconcile groups instead of counting hashes.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run against this checkout's kvgeom

import kvgeom
from kvgeom.events import KVEventReader
from kvgeom.router import score_replicas

DEFAULT_STREAM = Path(__file__).resolve().parent / "data" / "events.jsonl"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="replay_events.py",
        description="Replay a recorded vLLM KV-event stream (JSON lines) into per-replica residency and score "
        "its request on every replica.",
    )
    parser.add_argument("events", nargs="?", type=Path, default=DEFAULT_STREAM,
                        help="the recorded stream (default: examples/data/events.jsonl)")
    path = parser.parse_args(sys.argv[1:] if argv is None else argv).events
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        print(f"{path}: cannot read the event stream ({e.strerror})", file=sys.stderr)
        return 2
    geom = kvgeom.resolve(kvgeom.DEFAULT_CONFIG)
    reader = KVEventReader(geom)
    request = None
    for line in text.splitlines():
        if not line.strip():
            continue
        record = json.loads(line)
        if "request" in record:
            request = record["request"]
        else:
            reader.apply_batch(record["batch"], reader.replica(record["replica"]))
    if request is None:
        print(f"{path}: no request line to score", file=sys.stderr)
        return 2

    chain, n = request["block_hashes"], request["num_tokens"]
    names = reader.replica_names
    scores = score_replicas(geom, reader, [chain], n, num_replicas=len(names), tiers=["GPU", "CPU"])
    H = geom.hash_block_size
    print(f"replayed {reader.num_events} events from {len(names)} replicas; request of {n} tokens, "
          f"{len(chain)} hashes (H={H})")
    print(f"{'replica':<8} {'attention ends held':<22} {'Mamba states held':<30} {'GPU hit':>7} {'CPU hit':>7}")
    gpu = reader.residency("GPU")
    for r, name in enumerate(names):
        held = {g.index: [(i + 1) * H for i, h in enumerate(chain) if gpu.contains(g.index, h, r)]
                for g in geom.groups}
        print(f"{name!s:<8} {' '.join(map(str, held[0])) or '-':<22} {' '.join(map(str, held[1])) or '-':<30} "
              f"{scores.tier('GPU')[0, r]:>7} {scores.tier('CPU')[0, r]:>7}")
    best = int(scores.best("GPU")[0])
    print(f"route to {names[best]} (GPU prefix hit {scores.tier('GPU')[0, best]} tokens)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
