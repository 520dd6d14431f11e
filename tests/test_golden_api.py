"""The public API and the CLI answer exactly as recorded (``tests/golden/api.jsonl``).

A layout change (moving a rule to another module, splitting ``resolve()``) must not change a single
answer: every row holds a config and what kvgeom 0.2 answered for it (resolve, reports, CLI text,
key maps, hits, stores, the Mamba checkpoint, batch twins). After an intended change of an answer,
regenerate the answers for the same configs with ``python tests/golden/make_api_golden.py --keep-configs``
and say why in the commit.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from _golden import answers

ROWS = [json.loads(line) for line in (Path(__file__).parent / "golden" / "api.jsonl").read_text().splitlines()]


def test_corpus_covers_presets_cases_drafters_and_refusals():
    names = [r["name"] for r in ROWS]
    assert sum(n.startswith("preset:") for n in names) >= 10
    assert sum(n.startswith("case:") for n in names) >= 5
    assert sum(isinstance(r["config"], dict) and "speculative" in r["config"] for r in ROWS) >= 50
    assert any("resolve" in r["answers"] for r in ROWS)  # some configs are refused: the refusal is recorded


@pytest.mark.parametrize("row", ROWS, ids=[r["name"] for r in ROWS])
def test_answers_match_golden(row):
    got = json.loads(json.dumps(answers(row["config"]), sort_keys=True))
    want = row["answers"]
    if got != want:
        diff = sorted(k for k in set(got) | set(want) if got.get(k) != want.get(k))
        pytest.fail(f"{row['name']}: answers changed in {diff}")
