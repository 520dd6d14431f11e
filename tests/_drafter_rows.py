"""Shared pieces of the drafter example tables (``test_speculative``, ``test_prefill``, ``test_hits``,
``test_handoff``, ``test_store_plans``): the groups the rows use, a ``speculative`` section and a store/lookup
round trip."""

from __future__ import annotations

from kvgeom import hits

FA16 = {"kind": "full_attention", "block_size": 16}
M16 = {"kind": "mamba", "block_size": 16}
DRAFT16 = {"kind": "full_attention", "block_size": 16, "num_kv_heads": 4, "drafter": True}


def spec(method="eagle", k=2, **kw):
    return {"method": method, "num_speculative_tokens": k, **kw}


def roundtrip(geom, prompt, n=None):
    """Store a finished prefill of ``prompt`` tokens, then look up a request of ``n`` tokens sharing it."""
    plan = hits.plan_store(geom, num_tokens=prompt, num_computed_tokens=prompt)
    stored = {g.index: list(g.end_tokens) for g in plan.groups}
    return hits.lookup_hit(geom, prompt if n is None else n, stored=stored)
