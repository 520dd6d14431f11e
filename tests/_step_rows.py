"""Rows of a prefill's stores step by step and the GPU prefix cache afterwards, each from a vLLM 0.33 run
(``tests/test_store_conformance.py`` runs vLLM on them; ``tests/test_store_plans.py`` checks kvgeom's side)."""

from __future__ import annotations

import pytest


def _fa(b, **kw):
    return {"kind": "full_attention", "block_size": b, **kw}


def _m(b):
    return {"kind": "mamba", "block_size": b, "mamba_cache_mode": "align"}


#: (config, prompt, token budget per step, vLLM 0.33's chunk ends, the keys its connector stored in each step (then
#: in the steps after the request finished), its GPU prefix cache's entries afterwards)
_MTP3 = {"method": "mtp", "num_speculative_tokens": 3, "mtp_modules": 3}
_TAIL64 = {"groups": [_fa(64), _m(64)], "cache": {"prefix_match_unit": 16}, "offload": {}}
_M32 = {"groups": [_fa(32), _m(32)], "cache": {"prefix_match_unit": 16, "retention_interval": None}, "offload": {},
        "speculative": _MTP3}
STEP_ROWS = [
    # the partial tail at 80: 80 tokens are cacheable at 82 (MTP re-prefills 2); handed over and stored at 100 once
    pytest.param({**_TAIL64, "speculative": _MTP3}, 100, [64, 16, 2, 100], [64, 80, 82, 100],
                 [{"0": [64]}, {}, {}, {"0": [80], "1": [80]}, {}], {"0": [64, 96], "1": [80]},
                 id="mtp3-tail-after-82"),
    # one token after 64 under MTP K=3: the state at 64 is not cacheable before its block is reused (lost)
    pytest.param(_M32, 150, [64, 1, 100], [64, 65, 96, 128, 150],
                 [{"0": [32, 64]}, {}, {"0": [96]}, {"0": [128], "1": [96]}, {"1": [128]}, {}],
                 {"0": [32, 64, 96, 128, 144], "1": [96, 128]}, id="mtp3-one-token-after-64"),
    # two tokens after 64: cacheable in the next step, so kept and handed over there
    pytest.param(_M32, 150, [64, 2, 100], [64, 66, 96, 128, 150],
                 [{"0": [32, 64]}, {"1": [64]}, {"0": [96]}, {"0": [128], "1": [96]}, {"1": [128]}, {}],
                 {"0": [32, 64, 96, 128, 144], "1": [64, 96, 128]}, id="mtp3-two-tokens-after-64"),
    # the checkpoint 32 is cacheable only at 64, two steps after the chunk end 36 reused its block: not kept
    pytest.param({"groups": [_fa(64), _m(32)], "cache": {"retention_interval": 64}, "offload": {},
                  "speculative": {"method": "mtp", "num_speculative_tokens": 5, "mtp_modules": 2}}, 91,
                 [100, 4, 20, 64, 4, 100], [32, 36, 56, 64, 68, 91], [{}, {}, {}, {"0": [64]}, {"1": [64]}, {}, {}],
                 {"0": [64], "1": [64]}, id="mtp5-checkpoint-two-steps-late"),
    # ... and at 64, the third chunk end from 32 (36 reused its block): not kept either
    pytest.param({"groups": [_fa(64), _m(32)], "cache": {"retention_interval": 64}, "offload": {},
                  "speculative": {"method": "mtp", "num_speculative_tokens": 5, "mtp_modules": 2}}, 91,
                 [100, 4, 100], [32, 36, 64, 91], [{}, {}, {"0": [64]}, {"1": [64]}, {}],
                 {"0": [64], "1": [64]}, id="mtp5-checkpoint-third-end"),
    # a chunk end just below the checkpoint 80 does not move the step that caches exactly 80 (82): tail at 100
    pytest.param({**_TAIL64, "speculative": _MTP3}, 100, [64, 15, 1, 2, 100], [64, 79, 80, 82, 100],
                 [{"0": [64]}, {}, {}, {}, {"0": [80], "1": [80]}, {}], {"0": [64, 96], "1": [80]},
                 id="mtp3-end-below-checkpoint"),
    # the checkpoint 32 on the Mamba block grid: kept whatever the retention-0 mask says (GPU and connector)
    pytest.param({"groups": [_fa(16), _m(16), _fa(16, num_kv_heads=4, drafter=True)], "parallel": {"dcp": 2, "tp": 2},
                  "speculative": {"method": "eagle", "num_speculative_tokens": 1}, "cache": {"retention_interval": 0},
                  "offload": {"blocks_per_chunk": 2}}, 62, [64], [32, 62], [{"1": [32]}, {}, {}],
                 {"0": [32, 48], "1": [32], "2": [32, 48]}, id="eagle-dcp2-checkpoint-on-grid"),
    # the tail at 224 stored once, in the step after the one ending at it
    pytest.param({**_TAIL64, "cache": {"prefix_match_unit": 16, "retention_interval": None}}, 228, [64],
                 [64, 128, 192, 224, 228],
                 [{"0": [64], "1": [64]}, {"0": [128], "1": [128]}, {"0": [192], "1": [192]}, {},
                  {"0": [224], "1": [224]}, {}],
                 {"0": [64, 128, 192, 224], "1": [64, 128, 192, 224]}, id="h16-tail-once"),
    # a sliding window (block 16, window 16) beside FA 64, retention None: each prefill step stores the window's
    # last block of each finished 64-token segment, and not the current segment's tail (a prefill step is not
    # the request's end); the tail 176 of the last, partial segment is stored with the prompt's last chunk
    pytest.param({"groups": [_fa(64), {"kind": "sliding_window", "block_size": 16, "sliding_window": 16}],
                  "cache": {"retention_interval": None}, "offload": {}}, 190, [40], [40, 80, 120, 160, 190],
                 [{}, {"0": [64], "1": [64]}, {}, {"0": [128], "1": [128]}, {"1": [176]}, {}],
                 {"0": [64, 128], "1": [64, 128]}, id="swa16-steps"),
    # ... and a 31-token prompt: the window's block 16 once, not again when the request finishes
    pytest.param({"groups": [_fa(64), {"kind": "sliding_window", "block_size": 16, "sliding_window": 16}],
                  "cache": {"retention_interval": None}, "offload": {}}, 31, [100], [31], [{"1": [16]}, {}], {},
                 id="swa16-31"),
    # retention 0 with multi-module MTP: the checkpoint is kept whatever the mask says only where a step cached
    # exactly it (32, at 34); 64, a chunk end the next step made cacheable past it, is not a checkpoint: dropped
    pytest.param({"groups": [_fa(32), _m(32)], "cache": {"retention_interval": 0, "prefix_match_unit": 16},
                  "offload": {}, "speculative": {"method": "mtp", "num_speculative_tokens": 2, "mtp_modules": 2}},
                 89, [64, 2, 16, 1, 20], [32, 34, 50, 51, 64, 84, 89],
                 [{"0": [32]}, {"1": [32]}, {}, {}, {"0": [64]}, {}, {}, {}], {"0": [32, 64, 80], "1": [32]},
                 id="mtp2-checkpoint-kept-64-dropped"),
    # ... and it is the request's own split that decides (vLLM's unbounded split would not cache exactly 32)
    pytest.param({"groups": [_fa(16), _m(32)], "cache": {"retention_interval": 0}, "offload": {},
                  "speculative": {"method": "mtp", "num_speculative_tokens": 4, "mtp_modules": 3}},
                 48, [64, 3, 34], [32, 35, 48], [{"0": [16, 32]}, {"1": [32]}, {"0": [48]}, {}],
                 {"0": [16, 32], "1": [32]}, id="mtp4-checkpoint-of-the-given-split"),
]


