"""Regenerate ``tests/golden/api.jsonl``: the public API's and the CLI's answers on a fixed corpus of configs.

The corpus is the bundled presets, the case-study configs and configs drawn once by ``kvgeom.strategies``
(plain and with a ``speculative`` section). The file stores each config next to its answers, so the test
(``tests/test_golden_api.py``) does not depend on how Hypothesis draws; it re-computes every answer from the
stored config and compares byte for byte. Regenerate only after an intended change of an answer::

    python tests/golden/make_api_golden.py            # rewrites tests/golden/api.jsonl

With ``--keep-configs`` the configs already in the file are reused and only the answers recomputed.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
OUT = HERE / "api.jsonl"
ROOT = HERE.parents[1]


def draw_configs(count: int) -> list[dict[str, Any]]:
    """``count`` configs drawn by kvgeom.strategies (half with a drafter section); not reproducible, stored."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    sys.path.insert(0, str(ROOT / "tests" / "property"))
    from _spec_strategies import speculative_configs  # type: ignore[import-not-found]

    from kvgeom.strategies import configs

    out: list[dict[str, Any]] = []

    @settings(max_examples=count, database=None, deadline=None, suppress_health_check=list(HealthCheck))
    @given(st.one_of(configs(), speculative_configs()))
    def collect(cfg: dict[str, Any]) -> None:
        out.append(cfg)

    collect()
    seen: set[str] = set()
    unique = []
    for cfg in out:
        key = json.dumps(cfg, sort_keys=True)
        if key not in seen:
            seen.add(key)
            unique.append(cfg)
    return unique


def corpus_sources() -> list[tuple[str, Any]]:
    import kvgeom

    items: list[tuple[str, Any]] = [(f"preset:{name}", f"preset:{name}") for name in kvgeom.preset_names()]
    for path in sorted((ROOT / "docs" / "cases" / "configs").glob("*.json")):
        data = json.loads(path.read_text())
        if "groups" in data:
            items.append((f"case:{path.name}", data))
    return items


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT / "tests"))
    from _golden import answers  # type: ignore[import-not-found]

    if "--keep-configs" in sys.argv:
        rows = [json.loads(line) for line in OUT.read_text().splitlines()]
        sources = [(r["name"], r["config"]) for r in rows]
    else:
        sources = corpus_sources() + [(f"drawn:{i}", c) for i, c in enumerate(draw_configs(260))]
    with OUT.open("w") as f:
        for name, cfg in sources:
            f.write(json.dumps({"name": name, "config": cfg, "answers": answers(cfg)}, sort_keys=True) + "\n")
    print(f"wrote {len(sources)} rows to {OUT}")
