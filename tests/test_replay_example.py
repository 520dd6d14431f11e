"""examples/replay_events.py runs on its recorded stream and prints the scores the scalar reference gives."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import kvgeom
from kvgeom.events import KVEventReader
from kvgeom.prefix import prefix_hit

ROOT = Path(__file__).resolve().parents[1]
STREAM = ROOT / "examples" / "data" / "events.jsonl"


def test_replay_example_prints_the_scalar_scores_per_replica():
    proc = subprocess.run([sys.executable, str(ROOT / "examples" / "replay_events.py")], capture_output=True,
                          text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    # the reference: the same stream read here, each replica's GPU / CPU residency through prefix_hit
    geom = kvgeom.resolve(kvgeom.DEFAULT_CONFIG)
    reader = KVEventReader(geom)
    request = None
    for line in STREAM.read_text(encoding="utf-8").splitlines():
        record = json.loads(line)
        if "request" in record:
            request = record["request"]
        else:
            reader.apply_batch(record["batch"], reader.replica(record["replica"]))
    assert request is not None
    chain, n = request["block_hashes"], request["num_tokens"]
    expected = {}
    for r, name in enumerate(reader.replica_names):
        gpu = prefix_hit(geom, n, reader.residency("GPU").probe(geom, chain, holder=r)).hit_tokens
        cpu = prefix_hit(geom, n, reader.residency("CPU").probe(geom, chain, holder=r)).hit_tokens
        expected[name] = (gpu, cpu)
    printed = {line.split()[0]: tuple(int(x) for x in line.split()[-2:]) for line in lines[2:-1]}
    assert printed == expected
    # the stream has holes per group: the replicas' hits differ, and the route goes to the best GPU hit
    assert len({v[0] for v in expected.values()}) == len(expected)
    best = max(expected, key=lambda k: expected[k][0])
    assert lines[-1] == f"route to {best} (GPU prefix hit {expected[best][0]} tokens)"
    assert lines[0].startswith(f"replayed {reader.num_events} events from {len(expected)} replicas")


def test_routing_page_shows_what_the_example_prints():
    proc = subprocess.run([sys.executable, str(ROOT / "examples" / "replay_events.py")], capture_output=True,
                          text=True, timeout=120, cwd=ROOT)
    page = (ROOT / "docs" / "routing.md").read_text(encoding="utf-8")
    block = page.split("$ python examples/replay_events.py\n", 1)[1].split("```", 1)[0]
    assert block == proc.stdout


def test_replay_example_help_prints_usage_and_a_missing_file_is_a_message():
    # --help used to be read as the stream's path (FileNotFoundError: '--help')
    run = [sys.executable, str(ROOT / "examples" / "replay_events.py")]
    proc = subprocess.run([*run, "--help"], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("usage: replay_events.py [-h] [events]")
    proc = subprocess.run([*run, "no/such/events.jsonl"], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 2
    assert proc.stderr == "no/such/events.jsonl: cannot read the event stream (No such file or directory)\n"
