"""Messages say only what the geometry implies: every number a warning quotes is derived here by hand
from the config (never from the message code), and the claims the messages make are checked against
the lookup they describe. One row per warning code; the comment names the case."""

from __future__ import annotations

import math

import pytest

import kvgeom
from kvgeom.hits import lookup_hit


def _warning(cfg: dict, code: str) -> str:
    found = [w.message for w in kvgeom.resolve(cfg).warnings if w.code == code]
    assert len(found) == 1, (code, [w.code for w in kvgeom.resolve(cfg).warnings])
    return found[0]


def _hybrid(attn: int, mamba: int, dcp: int, **extra: object) -> dict:
    return {
        "groups": [{"kind": "mla", "block_size": attn}, {"kind": "mamba", "block_size": mamba}],
        "parallel": {"tp": dcp, "dcp": dcp},
        **extra,
    }


# (config, code, the numbers by hand as the phrases the message must contain)
ATTN, MAMBA, D, K = 1536, 1536, 8, 1
FLOOR = ATTN * D * K  # the attention chunk: span B*D times k
PT_CFG = {
    "groups": [{"kind": "full_attention", "block_size": 8}, {"kind": "mamba", "block_size": 16}],
    "parallel": {"tp": 2, "dcp": 2},
    "cache": {"prefix_match_unit": 8},
    "offload": {},
}
ROWS = [
    # Kimi-K3 at DCP 8 (#55168): attention chunk 1536*8*1 = 12288, smallest span 1536 -> 8x
    (_hybrid(ATTN, MAMBA, D, offload={}), "offload_hit_floor",
     [f"chunks of {FLOOR} tokens", f"{FLOOR // MAMBA}x", f"fewer than {FLOOR} tokens"]),
    # attention 8 x DCP 2 = Mamba 16, H = 8, k = 1: DCP alone keeps hits on the 16-token Mamba chunk, not on H = 8
    (PT_CFG, "partial_tails_disabled_by_dcp", ["dcp=2", f"Mamba chunk {16 * 1} tokens", "H=8"]),
    # full attention 128 + Mamba 16 at DCP 1: B_m = H = 16 is not > H, so A = L = lcm(128, 16) = 128 = 8 x 16
    ({"groups": [{"kind": "full_attention", "block_size": 128}, {"kind": "mamba", "block_size": 16}]}, "hit_floor",
     [f"A={math.lcm(128, 16)} tokens", f"{math.lcm(128, 16) // 16}x the smallest span 16",
      f"fewer than {math.lcm(128, 16)} tokens"]),
    # spans 48 and 32: L = lcm = 96, larger than both; Mamba 32 > H = gcd = 16 turns partial hash hits on: A = 16
    ({"groups": [{"kind": "full_attention", "block_size": 48}, {"kind": "mamba", "block_size": 32}]},
     "scheduler_block_lcm_blowup", [f"L=lcm(48, 32)={math.lcm(48, 32)}", f"A={math.gcd(48, 32)}",
                                    f"rounded down to L={math.lcm(48, 32)}"]),
    # two full-attention spans 48 and 32: no Mamba, no partial hash hits, A = L = 96
    ({"groups": [{"kind": "full_attention", "block_size": 48}, {"kind": "full_attention", "block_size": 32}]},
     "scheduler_block_lcm_blowup", [f"L=lcm(48, 32)={math.lcm(48, 32)}",
                                    f"fewer than {math.lcm(48, 32)} tokens never hit"]),
    # seed hybrid with k = 64: chunks 32*64 = 2048 (group 0) and 16*64 = 1024 (group 1); only 2048 > 1024
    ({**kvgeom.DEFAULT_CONFIG, "offload": {"blocks_per_chunk": 64}, "cache": {"max_model_len": 1024}},
     "offload_chunk_exceeds_max_model_len", [f"[{32 * 64}] of groups [0]", "max_model_len=1024"]),
    # retention 1024 past max_model_len 512
    (_hybrid(16, 16, 1, cache={"retention_interval": 1024, "max_model_len": 512}), "retention_unreachable",
     ["retention_interval=1024", "max_model_len=512"]),
    # two full-attention groups with spans 16 and 32 (k = 1): chunks [16, 32], no alignment_tokens
    ({"groups": [{"kind": "full_attention", "block_size": 16}, {"kind": "full_attention", "block_size": 32}],
      "offload": {}}, "alignment_tokens_none", ["[16, 32]"]),
    # chunked local 16 next to full attention 32: A = L = lcm(32, 16) = 32 (no Mamba: no partial hash hits)
    ({"groups": [{"kind": "full_attention", "block_size": 32},
                 {"kind": "chunked_local", "block_size": 16, "attention_chunk_size": 64}]},
     "chunked_local_block_mismatch", ["block_size=16", f"A={math.lcm(32, 16)}", f"block_size={math.lcm(32, 16)}"]),
]


@pytest.mark.parametrize(("cfg", "code", "phrases"), ROWS)
def test_warning_quotes_the_numbers_of_its_geometry(cfg, code, phrases):
    message = _warning(cfg, code)
    for phrase in phrases:
        assert phrase in message, (phrase, message)


def test_chunked_local_warning_only_where_vllm_asserts():
    # the chunked-local block equals A (32 and 32): vLLM's lookup accepts it, no warning
    ok = {"groups": [{"kind": "full_attention", "block_size": 16},
                     {"kind": "chunked_local", "block_size": 32, "attention_chunk_size": 64}]}
    assert "chunked_local_block_mismatch" not in [w.code for w in kvgeom.resolve(ok).warnings]
    # prefix caching off: no lookup, no assert
    off = {"groups": [{"kind": "full_attention", "block_size": 32},
                      {"kind": "chunked_local", "block_size": 16, "attention_chunk_size": 64}],
           "cache": {"prefix_caching": False}}
    assert "chunked_local_block_mismatch" not in [w.code for w in kvgeom.resolve(off).warnings]


def test_offload_hit_floor_is_the_chunk_itself():
    # The floor claim is tight: a request sharing exactly one attention chunk (12288 tokens) plus one more
    # token loads all of it, so "fewer than 12288" is the true bound (the message used to say 12289).
    g = kvgeom.resolve(_hybrid(ATTN, MAMBA, D, offload={}))
    hit = lookup_hit(g, FLOOR + 1, stored={0: [FLOOR], 1: [FLOOR]})
    assert hit.hit_tokens == FLOOR
    assert lookup_hit(g, FLOOR, stored={0: [FLOOR], 1: [FLOOR]}).hit_tokens == 0


def test_default_geometry_has_no_partial_tail_warning():
    # The seed hybrid's spans differ (32 vs 16) and its Mamba span equals H: partial tails would be off at
    # DCP 1 too, so the warning does not blame DCP. Its offload hits land on the 16-token Mamba grid: a
    # 64-token request on a tier holding the 64-token prefix hits 48 (vLLM 0.33's _lookup_complete_chunks
    # gives 48 on the same tier), a multiple of the Mamba chunk 16, not of alignment_tokens 32.
    g = kvgeom.resolve(kvgeom.DEFAULT_CONFIG)
    assert "partial_tails_disabled_by_dcp" not in [w.code for w in g.warnings]
    assert g.offload is not None and g.offload.alignment_tokens == 32 and g.offload.mamba_align_size == 16
    assert lookup_hit(g, 64, stored={0: [32, 64], 1: [16, 32, 48, 64]}).end_token == 48


@pytest.mark.parametrize(
    ("kind", "says", "never_says"),
    [
        # vLLM 0.33 runs a DCP-sharded circular buffer outside the hybrid coordinator
        ("circular_buffer", "otherwise runs it", "fails"),
        # a sharded sliding window: hybrid coordinator, else memory planning
        ("sliding_window", "memory planning", "runs it"),
        # a sharded chunked-local group: hybrid coordinator, else its first prefix-cache lookup
        ("chunked_local", "first prefix-cache lookup", "runs it"),
        # cross attention: only the hybrid coordinator
        ("cross_attention", "only in the hybrid coordinator", "memory planning"),
    ],
)
def test_sharded_kind_message_states_what_vllm_does(kind, says, never_says):
    extra = {"sliding_window": 64} if kind == "sliding_window" else {}
    if kind == "chunked_local":
        extra = {"attention_chunk_size": 64}
    cfg = {
        "groups": [{"kind": "full_attention", "block_size": 16}, {"kind": kind, "block_size": 16, "dcp_sharded": True,
                                                                 **extra}],
        "parallel": {"tp": 2, "dcp": 2},
    }
    with pytest.raises(kvgeom.KVGeomError) as info:
        kvgeom.resolve(cfg)
    (problem,) = [p for p in info.value.problems if p.code == "sharded_kind_under_dcp"]
    assert says in problem.message and never_says not in problem.message
    assert "dcp=2" in problem.message and "2 KV shards" in problem.message
