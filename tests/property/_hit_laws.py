"""Hit-law bodies shared by ``test_hit_laws.py`` and ``test_teeth_hits.py``."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

import kvgeom
from kvgeom.sim import run_scenario
from kvgeom.strategies import configs, scenarios

#: Sizes that keep the token-accurate simulator fast: blocks up to 16 tokens, any DCP size up to
#: 1024, prompts up to 1024 tokens (a span of 16 * 1024 simply gets no hit, which is a case too).
MAX_BLOCK = 16
MAX_TOKENS = 1024


@st.composite
def _hit_cases(draw: st.DrawFn, **config_kwargs: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    kwargs = {"offload": True, "max_block_size": MAX_BLOCK, **config_kwargs}
    cfg = draw(configs(**kwargs))
    geom = kvgeom.resolve(cfg)
    return cfg, draw(scenarios(geom, max_tokens=MAX_TOKENS))


def hit_cases(**config_kwargs: Any) -> st.SearchStrategy[tuple[dict[str, Any], dict[str, Any]]]:
    """(config, scenario): an offloading geometry and a request against it.

    Half the draws are any offloading geometry (every kind, DCP 1..1024); the other half are
    attention/MLA/DSA + Mamba hybrids with DCP up to 64, where hits are frequent enough to
    exercise Mamba restores under DCP.
    """
    if config_kwargs:
        return _hit_cases(**config_kwargs)
    return _hit_cases() | _hit_cases(kinds=["full_attention", "mamba", "mla", "uniform"], max_dcp=64)


def check_hit_restores_exact_state(case: tuple[dict[str, Any], dict[str, Any]]) -> None:
    """Every hit kvgeom plans restores each align Mamba state at exactly the hit boundary N (a multiple
    of the Mamba chunk, or an exact partial tail), never at num_tokens, and the simulator's GPU after
    the load equals a cold run of N tokens (docs/hits.md)."""
    cfg, sc = case
    geom = kvgeom.resolve(cfg)
    assert geom.offload is not None
    n = sc["num_tokens"]
    report = run_scenario(geom, n, local_computed_tokens=sc["local_computed_tokens"], evict=sc["evict"],
                          max_num_batched_tokens=sc.get("max_num_batched_tokens"))
    assert not report.tier_problems, report.tier_problems
    assert not report.restore_problems, report.restore_problems
    hit = report.hit_plan.hit
    assert hit.end_token == hit.local_computed_tokens + hit.hit_tokens
    assert hit.local_computed_tokens % geom.scheduler_block_size == 0
    if hit.hit_tokens == 0:
        return
    N = hit.end_token
    assert n >= N
    windowed = [o for o in geom.offload.groups if o.window_chunks is not None]
    if windowed:
        assert n > N, f"hit ends at num_tokens={n}: the last token's state would be restored"
    Cm = geom.offload.mamba_align_size
    if Cm is not None:
        if hit.partial_tail:
            assert N % geom.hash_block_size == 0
        else:
            assert N % Cm == 0, f"hit end {N} is not a multiple of the Mamba chunk {Cm}"
    for load in report.hit_plan.groups:
        g = geom.groups[load.index]
        if g.is_align_mamba:
            assert load.load_keys == (N,), f"Mamba group {g.index} loads {load.load_keys}, not the key ending at {N}"
        elif load.block_entries:
            assert load.block_entries[-1] == -(-N // g.span) - 1  # loads cdiv(N, S_g) blocks
