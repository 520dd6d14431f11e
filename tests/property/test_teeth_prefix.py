"""Teeth for the prefix laws: vLLM #45614 (a later group growing the common hit past a Mamba
state) reintroduced through a test-only seam, ``kvgeom.prefix._query_limit``.

As in ``test_teeth_hits.py``: the law fails on the historical row, Hypothesis finds (and shrinks,
deterministically) a counterexample, and the counterexample passes once the correct rule is back.
"""

from __future__ import annotations

from _prefix_laws import ROW_45614 as _ROW
from _prefix_laws import check_mamba_state_exact, prefix_cases
from test_teeth_core import fails

from kvgeom import prefix
from kvgeom.strategies import minimal


def _widen_without_drop(candidate, margin, drop, chain):
    """The #45614 shape: a group flagged for the drop is queried ``margin`` past the candidate on
    every pass, also after it has dropped once at this candidate and does not drop again, so its
    answer lands ``margin`` past the candidate the Mamba group settled on."""
    return min(candidate + margin, chain) if margin is not None else candidate


def test_mamba_law_catches_45614_later_group_grows_the_hit(monkeypatch):
    """Correct: 0 (Mamba has no state at or below the attention group's 16). With the seam the
    sliding-window group, looked up after Mamba in the second pass, grows the hit to 16, where no
    Mamba state exists. Caught by ``test_restored_mamba_state_is_exact_with_the_drop``. Minimal
    counterexample: Mamba 9 + sliding window 9 (window 1, drafter), 9 tokens, the window group
    holding the entry at 9: hit 9, no Mamba state at all, and the hit reaches ``num_tokens``."""
    assert prefix.prefix_hit(*_ROW).hit_tokens == 0
    monkeypatch.setattr(prefix, "_query_limit", _widen_without_drop)
    assert prefix.prefix_hit(*_ROW).hit_tokens == 16
    assert fails(check_mamba_state_exact)(_ROW)
    kinds = ["full_attention", "mamba", "sliding_window"]
    cex = minimal(prefix_cases(drop=True, kinds=kinds), fails(check_mamba_state_exact))
    geom, _n, _resident = cex
    assert any(g.family == "mamba" for g in geom.groups) and any(g.proof_margin for g in geom.groups)
    monkeypatch.undo()
    check_mamba_state_exact(cex)
    check_mamba_state_exact(_ROW)
