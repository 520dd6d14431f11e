"""Laws of speculative decoding in the geometry (kvgeom.speculative), named after the rule they check.

* the batch lookup and store paths agree with the scalar ones under speculation;
* no block drop (no section, ``eagle_block_drop: false``, or a method without the drop) answers exactly as
  the same effective geometry without a drafter;
* with the drop, an offload hit never includes an eagle group's volatile unit;
* a restored Mamba state is never a lookahead state: it is at or below the shifted checkpoint of the
  prompt that stored it;
* under any DCP the checkpoint shift and the connector's pop are reported consistently: without the
  ``speculative_pop_vs_mamba_shift`` warning a resend hits exactly the checkpoint, with it some resend
  falls to 0.
"""

from __future__ import annotations

import numpy as np
from _spec_strategies import speculative_configs, speculative_geometries, tail_speculative_geometries
from hypothesis import assume, event, example, given
from hypothesis import strategies as st

import kvgeom
from kvgeom import batch, hits
from kvgeom.speculative import mamba_checkpoint

# ---------------------------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------------------------


def store_prompt(geom: kvgeom.Geometry, prompt: int) -> dict[int, list[int]]:
    """The keys a finished prefill of ``prompt`` tokens leaves in the tier (one store after the prefill)."""
    plan = hits.plan_store(geom, num_tokens=prompt, num_computed_tokens=prompt)
    return {g.index: list(g.end_tokens) for g in plan.groups}


def without_drafter(geom: kvgeom.Geometry) -> kvgeom.Geometry:
    """The same effective geometry (slot defaults kept) with no speculative section and no drafter flags."""
    cfg = geom.config.to_dict()
    cfg.pop("speculative")
    for g in cfg["groups"]:
        g["drafter"] = False
        for layer in g.get("layers", ()):
            layer["drafter"] = False
    return kvgeom.resolve(cfg)


# ---------------------------------------------------------------------------------------------
# batch == scalar
# ---------------------------------------------------------------------------------------------


@given(st.one_of(speculative_geometries(offload=True), tail_speculative_geometries()), st.data())
def test_batch_lookup_agrees_with_scalar_under_speculation(geom, data):
    H = geom.hash_block_size
    size = data.draw(st.integers(0, 8), label="requests")
    top = max(og.tokens_per_chunk for og in geom.offload.groups) * 6 + 3 * H
    width = top // H + 2
    n = [data.draw(st.integers(0, top)) for _ in range(size)]
    local = [data.draw(st.integers(0, x)) if data.draw(st.integers(0, 3)) == 0 else 0 for x in n]
    prompt = [data.draw(st.integers(0, x)) if data.draw(st.booleans()) else x for x in n]
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1), label="seed"))
    stored = {}
    for og in geom.offload.groups:
        density = rng.choice([0.3, 0.85, 1.0], size=(size, 1))
        prefix = rng.integers(0, width + 1, size=(size, 1))
        stored[og.index] = (np.arange(width)[None, :] < prefix) | (rng.random((size, width)) < density)
    mnn = data.draw(st.none() | st.integers(0, top), label="mnn")
    h = batch.lookup_hits(geom, n, stored=stored, num_prompt_tokens=prompt, local_computed_tokens=local,
                          max_num_new_tokens=mnn)
    lp = batch.plan_loads(geom, h)
    event(f"hit > 0: {bool((h.hit_tokens > 0).any())}; partial tail: {bool(h.partial_tail.any())}")
    for i in range(size):
        held = {g: [(c + 1) * H for c in np.flatnonzero(m[i])] for g, m in stored.items()}
        hit = hits.lookup_hit(geom, n[i], stored=held, num_prompt_tokens=prompt[i], local_computed_tokens=local[i],
                              max_num_new_tokens=mnn)
        assert h.hit(i) == hit
        assert lp.plan(i) == hits.plan_load(geom, hit)


@given(speculative_geometries(offload=True), st.data())
def test_batch_stores_agree_with_scalar_under_speculation(geom, data):
    size = data.draw(st.integers(0, 6), label="requests")
    hi = 6 * max(og.tokens_per_chunk for og in geom.offload.groups) + 40
    n = [data.draw(st.integers(0, hi)) for _ in range(size)]
    computed = [x if data.draw(st.booleans()) else data.draw(st.integers(0, hi)) for x in n]
    prompt = [data.draw(st.integers(0, x)) if data.draw(st.booleans()) else x for x in n]
    opo = data.draw(st.booleans(), label="offload_prompt_only")
    fin = [data.draw(st.booleans()) for _ in n]
    sp = batch.plan_stores(geom, num_tokens=n, num_computed_tokens=computed, num_prompt_tokens=prompt,
                           offload_prompt_only=opo, finished=np.array(fin, dtype=bool))
    for i in range(size):
        assert sp.plan(i) == hits.plan_store(geom, num_tokens=n[i], num_computed_tokens=computed[i],
                                             num_prompt_tokens=prompt[i], offload_prompt_only=opo,
                                             finished=fin[i])
