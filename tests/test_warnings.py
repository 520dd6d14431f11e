"""Geometry warnings (problems users have reported): each has a stable code and a one-line fix, and fires
exactly on the shape it describes."""

from __future__ import annotations

import pytest

import kvgeom

SEED = kvgeom.DEFAULT_CONFIG


def codes(cfg: dict) -> list[str]:
    return [w.code for w in kvgeom.resolve(cfg).warnings]


def hybrid(attn: int, mamba: int, dcp: int, **extra: object) -> dict:
    return {
        "groups": [{"kind": "mla", "block_size": attn}, {"kind": "mamba", "block_size": mamba}],
        "parallel": {"tp": dcp, "dcp": dcp},
        **extra,
    }


# config, warning code expected present (True) or absent (False); one row per case with its source
CASES = [
    # offload_hit_floor: Kimi-K3 at DCP 8 (#55168): offload loads only 12288-token attention chunks, 8x KDA 1536
    (hybrid(1536, 1536, 8, offload={}), "offload_hit_floor", True),
    # ... same model at DCP 4: 6144 vs 1536 is 4x, below the 8x threshold
    (hybrid(1536, 1536, 4, offload={}), "offload_hit_floor", False),
    # ... k = 8 at DCP 1 makes the attention chunk 8 * 16 = 128 = 8x the 16-token spans
    (hybrid(16, 16, 1, offload={"blocks_per_chunk": 8}), "offload_hit_floor", True),
    # ... no offload section: nothing is loaded from an offload tier
    (hybrid(1536, 1536, 8), "offload_hit_floor", False),
    # retention_unreachable without offloading: the GPU prefix cache thins Mamba states the same way
    (hybrid(16, 16, 1, cache={"retention_interval": 1024, "max_model_len": 512}), "retention_unreachable", True),
    # ... with offloading (the case geometry.py already covered)
    (
        hybrid(16, 16, 1, cache={"retention_interval": 1024, "max_model_len": 512}, offload={}),
        "retention_unreachable",
        True,
    ),
    # ... an interval that fits in max_model_len
    (hybrid(16, 16, 1, cache={"retention_interval": 256, "max_model_len": 512}), "retention_unreachable", False),
    # partial_tails_disabled_by_dcp: the seed hybrid's spans differ (32, 16) and its Mamba span equals H, so
    # DCP is not what turns sub-chunk tails off: no warning
    (SEED, "partial_tails_disabled_by_dcp", False),
    # ... attention 8 x DCP 2 = Mamba 16, H = 8: everything but DCP allows partial tails (#57216)
    (
        {"groups": [{"kind": "full_attention", "block_size": 8}, {"kind": "mamba", "block_size": 16}],
         "parallel": {"tp": 2, "dcp": 2}, "cache": {"prefix_match_unit": 8}, "offload": {}},
        "partial_tails_disabled_by_dcp",
        True,
    ),
    # offload_chunk_exceeds_max_model_len: 32 * 64 = 2048-token chunk vs max_model_len 1024
    (
        {**SEED, "offload": {"blocks_per_chunk": 64}, "cache": {"max_model_len": 1024}},
        "offload_chunk_exceeds_max_model_len",
        True,
    ),
]


@pytest.mark.parametrize(("cfg", "code", "present"), CASES)
def test_warning_fires_on_its_shape(cfg, code, present):
    assert (code in codes(cfg)) is present


def test_offload_hit_floor_quotes_the_chunk():
    (w,) = [w for w in kvgeom.resolve(kvgeom.load_preset("kimi-k3-dcp8")).warnings if w.code == "offload_hit_floor"]
    # a request sharing exactly 12288 tokens plus one more loads the chunk (tests/test_messages.py), so 12288
    assert "12288 tokens" in w.message and "fewer than 12288 tokens" in w.message


@pytest.mark.parametrize("name", kvgeom.preset_names())
def test_every_warning_is_one_line_with_a_fix(name):
    for w in kvgeom.resolve(kvgeom.load_preset(name)).warnings:
        assert "\n" not in w.message
        assert w.code.replace("_", "").isalpha() and w.code.islower()
        # the fix is the clause after the last ';' or ':' and is an instruction
        assert any(verb in w.message for verb in ("lower", "use", "make", "consider", "give", "remove")), w.message
