"""The ``prefix_hit`` example rows of ``tests/test_prefix.py``, each with vLLM 0.33's answer."""

from __future__ import annotations

import sys
from pathlib import Path

import kvgeom

sys.path.insert(0, str(Path(__file__).parent / "property"))
from _prefix_laws import with_drop


def _fa(b):
    return {"kind": "full_attention", "block_size": b}


def _m(b):
    return {"kind": "mamba", "block_size": b}


def _sw(b, w):
    return {"kind": "sliding_window", "block_size": b, "sliding_window": w}


def _cl(b, c):
    return {"kind": "chunked_local", "block_size": b, "attention_chunk_size": c}


def _cfg(groups, dcp=1, retention=0):
    return {"groups": groups, "parallel": {"dcp": dcp, "tp": dcp}, "cache": {"retention_interval": retention}}


def geometry(cfg, drop):
    geom = kvgeom.resolve(cfg)
    return with_drop(geom, set(drop)) if drop else geom


_ALL16 = [16, 32, 48, 64, 80, 96, 112, 128]
_EAGLE = {"method": "eagle", "num_speculative_tokens": 2, "lookahead_hashes": False}
_MTP3 = {"method": "mtp", "num_speculative_tokens": 3, "mtp_modules": 3}

#: (name, config, drop groups, num_tokens, resident, vLLM hit, vLLM non-null blocks per group (end tokens))
ROWS = [
    # vLLM #46453's shape, FA16 + Mamba16: Mamba m0 -- -- m3, attention f0 f1 -- --. vLLM: 16 (m0), blocks [16], [16]
    ("46453", _cfg([_fa(16), _m(16)]), (), 70, {"0": [16, 32], "1": [16, 64]}, 16, [[16], [16]]),
    # same under DCP 2 (attention span 32, partial hash hits on, A = H = 16). vLLM: 64, [32, 64], [64]
    ("46453-dcp2", _cfg([_fa(16), _m(16)], 2), (), 70, {"0": [32, 64], "1": [16, 64]}, 64, [[32, 64], [64]]),
    # partial hash hit: attention's partial entry 80 inside block 2, Mamba state 80. vLLM: 80, [32, 64, 80], [80]
    ("partial", _cfg([_fa(16), _m(16)], 2), (), 100, {"0": [32, 64, 80], "1": [16, 48, 80]}, 80,
     [[32, 64, 80], [80]]),
    # partial entry 48 right after the first full block. vLLM: 48, [32, 48], [48]
    ("partial-inner", _cfg([_fa(16), _m(16)], 2), (), 100, {"0": [32, 48], "1": [48]}, 48, [[32, 48], [48]]),
    # attention misses block 0 (32): nothing is usable although 48 and 64 are cached. vLLM: 0
    ("partial-fa-hole", _cfg([_fa(16), _m(16)], 2), (), 100, {"0": [48, 64], "1": [16, 48]}, 0, [[], []]),
    # Mamba 64 > H = 16: fine-grained Mamba states at 112 (a partial tail) and 256. vLLM: 112
    ("mamba-wide", _cfg([_fa(16), _m(64)]), (), 300, {"0": _ALL16, "1": [64, 112, 256]}, 112,
     [_ALL16[:7], [112]]),
    # sliding window 33 needs 2 contiguous 16-blocks: right to left, 96 112 first. vLLM: 112, window blocks [96, 112]
    ("sw", _cfg([_fa(16), _sw(16, 33)]), (), 130, {"0": _ALL16, "1": [16, 48, 64, 96, 112]}, 112,
     [_ALL16[:7], [96, 112]]),
    # SW 16 inside L = 32 (A = 32): a run must end on a multiple of 32; 112, 80, 48 do not, 32 does. vLLM: 32
    ("sw-align", _cfg([_fa(32), _sw(16, 17)]), (), 130, {"0": [32, 64, 96, 128], "1": [16, 32, 48, 80, 112]}, 32,
     [[32], [32]]),
    # SW 65 needs 4 blocks; none found, the run from block 0 (16, 32) counts. vLLM: 32
    ("sw-bottom-run", _cfg([_fa(16), _sw(16, 65)]), (), 130, {"0": _ALL16, "1": [16, 32, 80]}, 32,
     [[16, 32], [16, 32]]),
    # chunked local 32: the hit's chunk [96, 112) starts at the candidate, nothing to look up. vLLM: 96
    ("chunked", _cfg([_fa(16), _cl(16, 32)]), (), 100, {"0": _ALL16[:6], "1": [16, 80]}, 96, [_ALL16[:6], []]),
    # convergence loop: attention 128, the window 96, Mamba 64 (no state at 96), the window again at 64. vLLM: 64
    ("three", _cfg([_fa(16), _sw(16, 33), _m(16)]), (), 130, {"0": _ALL16, "1": _ALL16[:6], "2": [32, 64, 112]}, 64,
     [_ALL16[:4], [48, 64], [64]]),
    # two attention groups with one spec are looked up together: the second one's hole at 48 caps both. vLLM: 32
    ("merged", _cfg([_fa(16), _fa(16), _m(16)]), (), 100, {"0": _ALL16[:4], "1": [16, 32], "2": [32, 64]}, 32,
     [[16, 32], [16, 32], [32]]),
    # retention 0 after a 100-token prompt: Mamba keeps only the replay boundary 96. vLLM: 96
    ("retention0", _cfg([_fa(16), _m(16)]), (), 200, {"0": _ALL16[:6], "1": [96]}, 96, [_ALL16[:6], [96]]),
    # same, attention 96 evicted: the only Mamba state is past attention's 80. vLLM: 0
    ("retention0-fa-evict", _cfg([_fa(16), _m(16)]), (), 200, {"0": _ALL16[:5], "1": [96]}, 0, [[], []]),
    # dense retention, attention 96 evicted: Mamba 80 is there. vLLM: 80
    ("dense-fa-evict", _cfg([_fa(16), _m(16)], retention=None), (), 200, {"0": _ALL16[:5], "1": _ALL16[:6]}, 80,
     [_ALL16[:5], [80]]),
    # retention 32: states 32, 64 (+ 96), attention 96 evicted. vLLM: 64
    ("retention32", _cfg([_fa(16), _m(16)], retention=32), (), 200, {"0": _ALL16[:5], "1": [32, 64, 96]}, 64,
     [_ALL16[:4], [64]]),
    # speculative drop on attention: proves 96, drops one span to 80; Mamba 80. vLLM: 80
    ("drop-fa", _cfg([_fa(16), _m(16)]), (0,), 100, {"0": _ALL16[:6], "1": _ALL16[:6]}, 80, [_ALL16[:5], [80]]),
    # drop with fine-grained lookups (DCP 2): one H = 16 dropped, block 96 still reused. vLLM: 80, [32, 64, 96]
    ("drop-fa-fine", _cfg([_fa(16), _m(16)], 2), (0,), 100, {"0": [32, 64, 96], "1": _ALL16[:6]}, 80,
     [[32, 64, 96], [80]]),
    # drop on attention and SW (widened one block, popped). vLLM: 96, SW [80, 96], Mamba [96]
    ("drop-sw", _cfg([_fa(16), _sw(16, 33), _m(16)]), (0, 1), 130, {"0": _ALL16, "1": _ALL16[:7], "2": [64, 96, 112]},
     96, [_ALL16[:6], [80, 96], [96]]),
    # one group (unitary coordinator): no widening, one span dropped: 128 -> 96. vLLM: 96
    ("drop-unitary", _cfg([_fa(16)], 2), (0,), 130, {"0": [32, 64, 96, 128]}, 96, [[32, 64, 96]]),
    # the #45614 row: attention proves 32, drops to 16; no Mamba state at or below 16. vLLM: 0
    ("45614-row", _cfg([_fa(16), _m(16), _sw(16, 33)]), (0, 2), 80,
     {"0": [16, 32, 64, 80], "1": [32, 48, 64, 80], "2": [16, 32, 48, 64, 80]}, 0, [[], [], []]),
    # real drafter config (eagle, K = 2, no look-ahead hashes): attention is the drafter, drops one span. vLLM: 80
    ("spec-eagle", {"groups": [{**_fa(16), "drafter": True}, _m(16)], "speculative": _EAGLE}, (), 100,
     {"0": _ALL16[:6], "1": _ALL16[:6]}, 80, [_ALL16[:5], [80]]),
    # no group flagged as drafter: vLLM's coordinator drops in every group (Mamba ignores it). vLLM: 80
    ("spec-no-flag", {"groups": [_fa(16), _m(16)], "speculative": _EAGLE}, (), 100,
     {"0": _ALL16[:6], "1": _ALL16[:6]}, 80, [_ALL16[:5], [80]]),
    # MTP K = 3 with look-ahead hashes: no drop, but a 98-token request has floor(95 / 16) = 5 hashes. vLLM: 80
    ("spec-lookahead", {"groups": [{**_fa(16), "drafter": True}, _m(16)], "speculative": _MTP3}, (), 98,
     {"0": _ALL16[:6], "1": _ALL16[:6]}, 80, [_ALL16[:5], [80]]),
    # same with an offload connector: legacy hashes (6 of them), the drop takes 96 to 80. vLLM: 80
    ("spec-mtp-drop", {"groups": [{**_fa(16), "drafter": True}, _m(16)], "speculative": _MTP3, "offload": {}}, (), 98,
     {"0": _ALL16[:6], "1": _ALL16[:6]}, 80, [_ALL16[:5], [80]]),
]
