"""Laws of the layout fingerprint (kvgeom.fingerprint; docs/fingerprint.md)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from _layout_strategies import irrelevant_mutations, layouts, mutate, relevant_mutations
from hypothesis import example, given
from hypothesis import strategies as st

import kvgeom
from kvgeom.fingerprint import fingerprint, layout_fields

INTERLEAVE_ONLY = {
    "groups": [{"kind": "full_attention", "block_size": 16}, {"kind": "mamba", "block_size": 16}],
    "parallel": {"tp": 2, "dcp": 2, "cp_interleave": 1, "pp": 1},
    "offload": {"blocks_per_chunk": 1},
}


@example(cfg=INTERLEAVE_ONLY, choice=0)  # docs/fingerprint.md: I alone must change it (vLLM's file tier misses I)
@given(cfg=layouts(), choice=st.integers(0, 100))
def test_fingerprint_changes_whenever_a_byte_relevant_field_changes(cfg, choice):
    options = relevant_mutations(cfg)
    name = options[choice % len(options)]
    if cfg is INTERLEAVE_ONLY:
        name = "interleave"
    changed = mutate(cfg, name)
    assert fingerprint(changed) != fingerprint(cfg), name


@given(cfg=layouts(), choice=st.integers(0, 100))
def test_fingerprint_never_changes_otherwise(cfg, choice):
    options = irrelevant_mutations(cfg)
    name = options[choice % len(options)]
    assert fingerprint(mutate(cfg, name)) == fingerprint(cfg), name


DSA_NO_PAGES = {
    "groups": [
        {"kind": "uniform", "block_size": 64, "layers": [{"kind": "mla"}, {"kind": "mla", "cache_role": "indexer"}]}
    ],
    "parallel": {"tp": 2, "dcp": 2, "cp_interleave": 1, "pp": 1},
    "offload": {"blocks_per_chunk": 1},
}


# issue 10: kvg1 differed between the worker-side container and the scheduler-side flattened MLA layer
@example(cfg=DSA_NO_PAGES)
@given(cfg=layouts())
def test_fingerprint_of_scheduler_view_equals_worker_view_without_pages(cfg):
    if "flatten" not in irrelevant_mutations(cfg):
        return
    assert fingerprint(mutate(cfg, "flatten")) == fingerprint(cfg)


@given(cfg=layouts())
def test_fingerprint_is_a_function_of_the_layout_fields(cfg):
    g = kvgeom.resolve(cfg)
    assert g.fingerprint() == fingerprint(cfg) == g.to_report()["fingerprint"]
    # the fields are plain JSON and survive a round trip unchanged
    assert json.loads(json.dumps(layout_fields(g))) == layout_fields(g)
    # a config read back from its own dump is the same layout
    assert fingerprint(g.config.to_dict()) == g.fingerprint()


def test_identical_layouts_built_in_two_processes_have_one_fingerprint():
    # same configs, other process, other hash seed: every fingerprint must agree
    configs = [
        INTERLEAVE_ONLY,
        {**INTERLEAVE_ONLY, "parallel": {"tp": 2, "dcp": 2, "cp_interleave": 16}},
        {"groups": [{"kind": "mla", "block_size": 64, "head_size": 576, "dtype": "bfloat16"}], "offload": {}},
        {
            "groups": [
                {"kind": "full_attention", "block_size": 32, "num_kv_heads": 8, "head_size": 128, "dtype": "fp8"},
                {
                    "kind": "mamba",
                    "block_size": 32,
                    "shapes": [[16, 64, 64], [3, 256]],
                    "dtypes": ["float32", "bfloat16"],
                },
            ],
            "parallel": {"tp": 4, "dcp": 2, "pp": 2},
            "offload": {"blocks_per_chunk": 3},
        },
    ]
    here = [fingerprint(c) for c in configs]
    code = (
        "import json, sys\n"
        "from kvgeom.fingerprint import fingerprint\n"
        "print(json.dumps([fingerprint(c) for c in json.load(sys.stdin)]))"
    )
    root = Path(__file__).resolve().parents[2]
    for seed in ("0", "12345"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        out = subprocess.run(
            [sys.executable, "-c", code],
            input=json.dumps(configs),
            capture_output=True,
            text=True,
            check=True,
            cwd=root,
            env=env,
        )
        assert json.loads(out.stdout) == here
    assert len(set(here)) == len(here)
