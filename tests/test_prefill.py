"""Example tables for the Scheduler's prefill split (``engine_block_size``, ``mamba_checkpoint``,
``prefill_chunk_ends``, ``prompt_hash_checkpoint``, ``prefill_tail_stop``): where a prompt's Mamba state is
checkpointed and where prefill chunks end, with or without a drafter (``docs/speculative.md``; vLLM 0.33
``Scheduler._mamba_block_aligned_split``). Imported through ``kvgeom.speculative``, their public home today.

The rows marked "(vLLM run)" restate results of running vLLM 0.33 itself on the same deployment.
"""

from __future__ import annotations

import pytest
from _drafter_rows import DRAFT16, FA16, M16, spec

import kvgeom
from kvgeom import hits
from kvgeom.prefill import engine_block_size, mamba_checkpoint, prefill_tail_stop, prompt_hash_checkpoint

# ----------------------------------------------------------------------------------- engine block size


@pytest.mark.parametrize(
    ("cfg", "block"),
    [
        # the seed (FA 16 + Mamba 16, DCP 2): the per-rank block 16, not the attention span 32
        (kvgeom.DEFAULT_CONFIG, 16),
        # DCP 4: still the per-rank block 16 (span 64 is the attention group's, not vLLM's block_size)
        ({"groups": [FA16, M16], "parallel": {"tp": 4, "dcp": 4}}, 16),
        # the smallest prefix-cacheable block: Mamba 32 below attention 64
        ({"groups": [{"kind": "full_attention", "block_size": 64}, {"kind": "mamba", "block_size": 32}]}, 32),
        # a circular buffer is not prefix-cacheable: its 8 does not count, attention 32 does
        ({"groups": [{"kind": "full_attention", "block_size": 32}, {"kind": "circular_buffer", "block_size": 8}]},
         32),
        # no cacheable group at all: the smallest block of all groups
        ({"groups": [{"kind": "circular_buffer", "block_size": 8}, {"kind": "circular_buffer", "block_size": 24}]},
         8),
    ],
)
def test_engine_block_size(cfg, block):
    assert engine_block_size(kvgeom.resolve(cfg)) == block


# ----------------------------------------------------------------------------------- prompt hash checkpoint

SEED_CFG = kvgeom.DEFAULT_CONFIG  # L = 32, H = 16, partial hash hits on
DCP1_CFG = {"groups": [FA16, M16]}  # L = H = 16: no partial hash hits
DROP_CFG = {"groups": [FA16, M16, DRAFT16], "offload": {}, "speculative": spec()}  # GPU drop, L = H = 16
MTP_CFG = {"groups": [FA16, M16, DRAFT16], "speculative": spec("mtp", 3, mtp_modules=3)}  # lookahead hashes, P 3
FINE64_CFG = {"groups": [{"kind": "full_attention", "block_size": 64}, {"kind": "mamba", "block_size": 64}],
              "cache": {"prefix_match_unit": 16}}  # L = 64, H = 16, partial hash hits on


@pytest.mark.parametrize(
    ("cfg", "prompt", "checkpoint", "tail_stop"),
    [
        (SEED_CFG, 0, 0, 0),  # empty prompt: no checkpoint
        (SEED_CFG, 16, 0, 0),  # rdown(16 - 1, 16) = 0: one block is never checkpointed
        (SEED_CFG, 17, 16, 16),  # rdown(16, 16) = 16; H 16 < L 32 with partial hits: the prefill stops there
        (SEED_CFG, 100, 96, 96),  # rdown(99, 16) = 96, off the L grid: a tail stop
        (DCP1_CFG, 17, 16, 0),  # the same checkpoint, but H = L: no tail stop
        (DROP_CFG, 100, 80, 0),  # the GPU drop: rdown(100, 16) - 16 = 80
        (DROP_CFG, 17, 0, 0),  # the drop below the first block: max(16 - 16, 0) = 0
        (MTP_CFG, 98, 80, 0),  # lookahead hashes, P 3: rdown(98 - 3, 16) = 80
        (MTP_CFG, 100, 96, 0),  # rdown(97, 16) = 96
        (FINE64_CFG, 150, 144, 144),  # H 16 under L 64: rdown(149, 16) = 144, a tail stop
    ],
)
def test_prompt_hash_checkpoint_and_prefill_tail_stop(cfg, prompt, checkpoint, tail_stop):
    g = kvgeom.resolve(cfg)
    assert prompt_hash_checkpoint(g, prompt) == checkpoint
    assert prefill_tail_stop(g, prompt) == tail_stop


def test_prompt_hash_checkpoint_bad_input():
    with pytest.raises(kvgeom.QueryError):
        prompt_hash_checkpoint(kvgeom.resolve(SEED_CFG), -1)


# ----------------------------------------------------------------------------------- Mamba checkpoint


@pytest.mark.parametrize(
    ("extra", "section", "n", "position", "shift", "chunks"),
    [
        ({"offload": {}}, spec(), 100, 80, 16, (80, 20)),  # vLLM run: chunks [80, 20] instead of [96, 4]
        ({"offload": {}}, None, 100, 96, 0, (96, 4)),  # no drafter
        ({"offload": {}}, spec(), 96, 80, 0, (80, 16)),  # on the grid: drop and plain agree (96 - 16)
        ({}, spec("mtp", 3, mtp_modules=3), 100, 96, 0, (96, 4)),  # lookahead hashes: rdown(100 - 3, 16)
        ({}, spec("mtp", 3, mtp_modules=3), 98, 80, 16, (80, 18)),  # rdown(95, 16) = 80 vs plain 96
        ({"offload": {}}, spec(eagle_block_drop=False), 100, 96, 0, (96, 4)),  # drop disabled
        ({"offload": {}}, spec(), 15, 0, 0, (15,)),  # shorter than a block: no checkpoint
    ],
)
def test_mamba_checkpoint(extra, section, n, position, shift, chunks):
    cfg = {"groups": [FA16, M16, DRAFT16 if section else {**DRAFT16, "drafter": False}], **extra}
    if section is not None:
        cfg["speculative"] = section
    cp = mamba_checkpoint(kvgeom.resolve(cfg), n)
    assert (cp.position, cp.shift, cp.prefill_chunks) == (position, shift, chunks)
    assert cp.state_block == (position // 16 - 1 if position else None)


def test_mamba_checkpoint_needs_align_mamba():
    with pytest.raises(kvgeom.QueryError, match="no align-mode Mamba"):
        mamba_checkpoint(kvgeom.resolve({"groups": [FA16]}), 10)


# ----------------------------------------------------------------------------------- prefill chunks and Mamba stores

FA64, M64 = {"kind": "full_attention", "block_size": 64}, {"kind": "mamba", "block_size": 64}
FA32, M32 = {"kind": "full_attention", "block_size": 32}, {"kind": "mamba", "block_size": 32}
DRAFT64 = {**FA64, "num_kv_heads": 4, "drafter": True}
DRAFT32 = {**FA32, "num_kv_heads": 4, "drafter": True}
FINE = {"prefix_match_unit": 16}
DENSE = {"retention_interval": None}


@pytest.mark.parametrize(
    ("groups", "extra", "section", "prompt", "budget", "ends", "mamba", "resend", "hit"),
    [
        # vLLM run: Mamba 64 wider than H 16: the chunk ending at 64 (a replay boundary) leaves a stored state
        ([FA64, M64, DRAFT64], {"cache": FINE}, spec("eagle3"), 150, None, (64, 128, 150), (64, 128), 200, 64),
        # vLLM run: H-grid tail 112, then the next block boundary 128; only the replay boundary 64 is kept
        ([FA64, M64, DRAFT64], {"cache": FINE}, spec("eagle3", 2), 131, None, (64, 112, 128, 131), (64,), 197, 64),
        # vLLM run: replay boundary 96 and checkpoint 128 both end chunks
        ([FA32, M32, DRAFT32], {"cache": FINE}, spec(), 155, None, (96, 128, 155), (96, 128), 230, 96),
        # vLLM run: MTP K 3, checkpoint 272 is off the Mamba grid; the replay boundary 256 is stored
        ([FA32, M32, DRAFT32], {"cache": FINE}, spec("mtp", 3), 297, None, (256, 272, 288, 297), (256,), 444, 256),
        # vLLM run: Mamba 16 off vLLM's cache_config.block_size 8 grid: no chunk ends at the checkpoint 16
        ([{"kind": "full_attention", "block_size": 8}, M16, {**DRAFT16, "block_size": 8}],
         {"parallel": {"tp": 2, "dcp": 2}}, spec("mtp", 2), 32, None, (24, 32), (), 32, 0),
        # vLLM run, max_num_batched_tokens 40: chunk ends 32, 64 (budget), 80 (last cacheable) hold states
        ([FA16, M16, DRAFT16], {"cache": DENSE}, spec(), 100, 40, (32, 64, 80, 100), (32, 64, 80), 100, 80),
        # vLLM run, same without a drafter: 96 instead of 80
        ([FA16, M16], {"cache": DENSE}, None, 100, 40, (32, 64, 96, 100), (32, 64, 96), 100, 96),
        # vLLM run, multi-module MTP K 3, budget 48: ends 48, 80 (last cacheable), 100
        ([FA16, M16, DRAFT16], {"cache": DENSE}, spec("mtp", 3, mtp_modules=3), 100, 48, (48, 80, 100), (48, 80),
         100, 80),
    ],
)
def test_prefill_chunks_and_mamba_stores_match_vllm(groups, extra, section, prompt, budget, ends, mamba, resend, hit):
    from kvgeom.prefill import prefill_chunk_ends

    cfg = {"groups": groups, "offload": {}, **extra}
    if section is not None:
        cfg["speculative"] = section
    g = kvgeom.resolve(cfg)
    got = prefill_chunk_ends(g, prompt, max_num_batched_tokens=budget)
    assert got == ends
    plan = hits.plan_store(g, num_tokens=prompt, num_computed_tokens=prompt, chunk_ends=got if budget else None)
    assert plan.groups[1].end_tokens == mamba
    stored = {s.index: list(s.end_tokens) for s in plan.groups}
    assert hits.lookup_hit(g, resend, stored=stored).hit_tokens == hit


MTP2_NODROP = {"groups": [{**FA16, "drafter": True}, FA16, M16], "cache": {"retention_interval": 0},
               "speculative": spec("mtp", 2, mtp_modules=2, eagle_block_drop=False, lookahead_hashes=False)}


@pytest.mark.parametrize(
    ("section", "prompt", "budget", "ends"),
    [
        # vLLM run (budget 8192): the last cacheable boundary 64 is within P = 2 of the end, the reserve trims the
        # chunk to 63 and the next step's 1 token (to the block boundary 64) to nothing: never scheduled again
        (None, 65, None, 63),
        (None, 65, 100, 63),
        # vLLM run: the next lengths finish (the reserve leaves at least one token to schedule)
        (None, 64, None, (48, 64)),
        (None, 66, None, (64, 66)),
        # vLLM run: with the drop the checkpoint moves to 48 and the remainder 17 is more than P
        ({"eagle_block_drop": True}, 65, None, (48, 65)),
    ],
)
def test_multi_module_mtp_prefill_stalls_as_vllm(section, prompt, budget, ends):
    from kvgeom.prefill import prefill_chunk_ends

    cfg = {**MTP2_NODROP, "speculative": {**MTP2_NODROP["speculative"], **(section or {})}}
    g = kvgeom.resolve(cfg)
    if isinstance(ends, int):
        with pytest.raises(kvgeom.QueryError) as e:
            prefill_chunk_ends(g, prompt, max_num_batched_tokens=budget)
        assert e.value.problems[0].code == "prefill_stalls" and e.value.problems[0].values["stalled_at"] == ends
        assert "speculative_mtp_prefill_stall" in {w.code for w in g.warnings}
        # mamba_checkpoint stays total: the split the prefill would take past the stall, documented as such
        assert sum(mamba_checkpoint(g, prompt).prefill_chunks) == prompt
    else:
        assert prefill_chunk_ends(g, prompt, max_num_batched_tokens=budget) == ends


def test_multi_module_mtp_reserve_survives_the_disabled_drop():
    """vLLM run (FA 16 with the drafter + Mamba 16, H 8, MTP K 2 with two modules, drop and lookahead hashes off,
    prompt 9): one chunk to 7 (the H-grid checkpoint 8 trimmed by P = 2), never scheduled again; without the
    drafter the chunks end at 8 and 9; a prompt of 24 splits (16, 24) either way."""
    from kvgeom.prefill import prefill_chunk_ends

    cfg = {"groups": [{**FA16, "drafter": True}, M16], "cache": {"prefix_match_unit": 8, "retention_interval": 0},
           "speculative": spec("mtp", 2, mtp_modules=2, eagle_block_drop=False, lookahead_hashes=False)}
    g = kvgeom.resolve(cfg)
    plain = kvgeom.resolve({**cfg, "groups": [FA16, M16], "speculative": None})
    with pytest.raises(kvgeom.QueryError) as e:
        prefill_chunk_ends(g, 9)
    assert e.value.problems[0].values == {"num_prompt_tokens": 9, "stalled_at": 7}
    assert prefill_chunk_ends(plain, 9) == (8, 9)
    assert prefill_chunk_ends(g, 24) == prefill_chunk_ends(plain, 24) == (16, 24)


def test_prefill_chunk_ends_bad_input():
    from kvgeom.prefill import prefill_chunk_ends

    g = kvgeom.resolve({"groups": [FA16, M16, DRAFT16], "offload": {}, "speculative": spec()})
    with pytest.raises(kvgeom.QueryError, match="max_num_batched_tokens=0"):
        prefill_chunk_ends(g, 100, max_num_batched_tokens=0)
    with pytest.raises(kvgeom.QueryError):
        prefill_chunk_ends(g, -1)
    with pytest.raises(kvgeom.QueryError, match="no align-mode Mamba"):
        prefill_chunk_ends(kvgeom.resolve({"groups": [FA16]}), 10)
    with pytest.raises(kvgeom.QueryError):
        hits.plan_store(g, num_tokens=100, num_computed_tokens=100, chunk_ends=[-5])


# ------------------------------------------------------------------ resumed prefills and per-step budgets

_H16 = {"groups": [{"kind": "full_attention", "block_size": 64}, {"kind": "mamba", "block_size": 64}],
        "cache": {"prefix_match_unit": 16, "retention_interval": 0}, "offload": {}}
_F16 = {"groups": [FA16, M16], "cache": {"retention_interval": 0}, "offload": {}}


@pytest.mark.parametrize(
    ("cfg", "prompt", "computed", "budgets", "ends"),
    [
        # every row a vLLM 0.33 run (kvgeom.conformance.vllm_stores.run_prefill_split: the Scheduler's budget set
        # before each step; "computed" is where a GPU prefix hit left the request)
        # a GPU hit of 224 (off the 64-block grid): the 8-token chunk, then stop at the next block boundary 256
        (_H16, 300, 224, [8, 100], (232, 256, 288, 300)),
        # from 0 with the same budgets: 8 tokens, then 92 more stop at the block boundary 64
        (_H16, 300, 0, [8, 100], (8, 64, 128, 192, 256, 288, 300)),
        # budgets that change per step: 100 -> 64 (block), 30 < block -> 94, 70 -> stop at 128, then unbounded
        (_H16, 300, 0, [100, 30, 70, 1000], (64, 94, 128, 256, 288, 300)),
        # a budget narrower than the block: every other chunk ends mid-block, the next one at the boundary
        (_H16, 300, 0, [40], (40, 64, 104, 128, 168, 192, 232, 256, 288, 300)),
        # the last budget repeats past the list
        (_H16, 300, 0, [40, 200], (40, 64, 256, 288, 300)),
        (_H16, 300, 0, None, (256, 288, 300)),
        # FA 16 + Mamba 16: 20 -> 16, 50 -> 64, 7 (narrower than the block) -> 71, then the boundary 80
        (_F16, 100, 0, [20, 50, 7, 100], (16, 64, 71, 80, 96, 100)),
        # resumed at a GPU hit of 32 with the same budgets
        (_F16, 100, 32, [20, 50, 7, 100], (48, 96, 100)),
        (_F16, 100, 32, [10], (42, 48, 58, 64, 74, 80, 90, 96, 100)),
        # nothing left to prefill
        (_F16, 100, 100, [10], ()),
    ],
)
def test_resumed_prefill_split_with_per_step_budgets_as_vllm(cfg, prompt, computed, budgets, ends):
    from kvgeom.prefill import prefill_chunk_ends

    g = kvgeom.resolve(cfg)
    assert prefill_chunk_ends(g, prompt, num_computed_tokens=computed, max_num_batched_tokens=budgets) == ends
    if budgets is not None and len(budgets) == 1:  # one budget for every step: the int form says the same
        assert prefill_chunk_ends(g, prompt, num_computed_tokens=computed, max_num_batched_tokens=budgets[0]) == ends


def test_resumed_prefill_split_bad_input():
    from kvgeom.prefill import prefill_chunk_ends

    g = kvgeom.resolve(_F16)
    for kwargs, code in [
        ({"num_computed_tokens": 101}, "out_of_range"),
        ({"num_computed_tokens": -1}, "negative"),
        ({"max_num_batched_tokens": []}, "out_of_range"),
        ({"max_num_batched_tokens": [16, 0]}, "out_of_range"),
        ({"max_num_batched_tokens": [16, "x"]}, "not_an_integer"),
        ({"max_num_batched_tokens": "16"}, "not_an_integer"),
    ]:
        with pytest.raises(kvgeom.QueryError) as e:
            prefill_chunk_ends(g, 100, **kwargs)
        assert e.value.problems[0].code == code, kwargs
