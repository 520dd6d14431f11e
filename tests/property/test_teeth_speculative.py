"""Teeth for the speculative laws: #55600 and a broken pop reintroduced through seams.

As in ``test_teeth_hits.py``: the law fails on the historical row, :func:`kvgeom.strategies.minimal`
finds a counterexample among generated speculative geometries, and that counterexample passes once the
correct rule is back. Seams: ``kvgeom.prefill._checkpoint_state_block`` and
``kvgeom.hits.eagle_pops``.
"""

from __future__ import annotations

from _spec_strategies import speculative_geometries
from hypothesis import strategies as st
from test_speculative_laws import (
    _DCP2_WORKED,
    check_checkpoint_state_block_in_mamba_units,
    check_hit_never_includes_volatile_unit,
)
from test_teeth_core import fails

import kvgeom
from kvgeom import hits, prefill
from kvgeom.strategies import minimal


def test_checkpoint_law_catches_55600_state_index_in_scheduler_block_units(monkeypatch):
    """vLLM #55600: the Mamba state index was seeded in the wrong block units. Reintroduced as the checkpoint's
    state block counted in scheduler blocks L: under DCP 2 (L = 32, B_m = 16) the checkpoint 96 of a 112-token
    prompt names block 96 // 32 - 1 = 2 (the state after 48 tokens) instead of block 5.

    Caught by ``test_checkpoint_state_block_is_in_mamba_block_units``. Minimal counterexample: a drafter
    full-attention group of block 16 and a Mamba group of block 16 under DCP 2 (L = 32), eagle K = 1 with the drop
    disabled, a 17-token prompt: the checkpoint 16 lies on the Mamba grid (block 0) but not on L's (None).
    """

    def wrong_units(geom, group, position):
        L = geom.scheduler_block_size
        return position // L - 1 if position > 0 and position % L == 0 else None

    geom = kvgeom.resolve(_DCP2_WORKED)
    monkeypatch.setattr(prefill, "_checkpoint_state_block", wrong_units)
    assert prefill.mamba_checkpoint(geom, 112).state_block == 2  # the bug: checkpoint 96 -> block 2, not 5
    assert fails(lambda p: check_checkpoint_state_block_in_mamba_units(geom, p))(112)

    def law(case):
        g, p = case
        if not any(x.is_align_mamba for x in g.groups):
            return
        check_checkpoint_state_block_in_mamba_units(g, p)

    cex = minimal(st.tuples(speculative_geometries(), st.integers(0, 400)), fails(law))
    g, _p = cex
    assert g.scheduler_block_size != next(x for x in g.groups if x.is_align_mamba).block_size
    monkeypatch.undo()
    law(cex)


def test_volatile_law_catches_a_lookup_without_the_pop(monkeypatch):
    """The OffloadingConnector before its eagle handling (#52735's family): an eagle group's lookup neither
    queried the extra chunk nor popped it, so a hit could end on a chunk whose drafter KV is volatile.

    Caught by ``test_offload_hit_never_includes_the_volatile_unit``.
    """
    monkeypatch.setattr(hits, "eagle_pops", lambda og, verified: 0)
    geom = kvgeom.resolve({"groups": [{"kind": "full_attention", "block_size": 16, "drafter": True},
                                      {"kind": "mamba", "block_size": 16}],
                           "offload": {}, "cache": {"retention_interval": None},
                           "speculative": {"method": "eagle", "num_speculative_tokens": 2}})
    stored = {0: [16, 32, 48, 64], 1: [16, 32, 48, 64]}
    assert hits.lookup_hit(geom, 65, stored=stored).end_token == 64  # the bug: 64 with chunk 80 unproven
    assert fails(lambda s: check_hit_never_includes_volatile_unit(geom, 65, 65, s))(stored)
    monkeypatch.undo()
    assert hits.lookup_hit(geom, 65, stored=stored).end_token == 48
    check_hit_never_includes_volatile_unit(geom, 65, 65, stored)
