"""Laws of speculative decoding in the geometry (kvgeom.speculative), named after the rule they check.

* the batch lookup and store paths agree with the scalar ones under speculation;
* no block drop (no section, ``eagle_block_drop: false``, or a method without the drop) answers exactly as
  the same effective geometry without a drafter, but for the multi-module MTP reserve, which stalls some
  prefills the no-drafter geometry finishes;
* with the drop, an offload hit never includes an eagle group's volatile unit;
* a restored Mamba state is never a lookahead state: it is stored and at or below the prompt's shifted
  checkpoint on the H grid (``prompt_hash_checkpoint``);
* under any DCP the checkpoint shift and the connector's pop are reported consistently: without the
  ``speculative_pop_vs_mamba_shift`` warning a resend hits exactly the checkpoint, with it some resend
  falls to 0.
"""

from __future__ import annotations

from dataclasses import replace
from itertools import accumulate

import numpy as np
from _spec_strategies import speculative_geometries, tail_speculative_geometries
from hypothesis import assume, event, example, given
from hypothesis import strategies as st

import kvgeom
from kvgeom import batch, hits
from kvgeom.handoff import default_chunk_ends
from kvgeom.prefill import engine_block_size, mamba_checkpoint, prefill_chunk_ends, prompt_hash_checkpoint
from kvgeom.strategies import geometries

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
        g["drafter"] = None
        for layer in g.get("layers", ()):
            layer["drafter"] = None
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


# ---------------------------------------------------------------------------------------------
# no drop == no drafter
# ---------------------------------------------------------------------------------------------


def check_no_drop_answers_as_without_drafter(geom: kvgeom.Geometry, n: int, prompt: int, stored_frac: int) -> None:
    """Without the block drop every group, margin, hit, load and store is the no-drafter answer; so is the
    prefill split, except that multi-module MTP keeps its reserve of P > 1 prefill tokens without the drop
    (vLLM 0.33 ``_reserve_prefill_lookahead``; ``disable_eagle_block_drop`` does not clear P), which changes
    the split only by stalling it: ``prefill_chunk_ends`` then raises ``prefill_stalls`` (vLLM run: FA 16 with
    the drafter + Mamba 16, H 8, MTP K 2 with two modules, prompt 9: one chunk to 7, never scheduled again;
    (8, 9) without the drafter), and ``MambaCheckpoint.prefill_chunks`` is its documented total stand-in."""
    plain = without_drafter(geom)
    assert geom.speculative is not None and not geom.speculative.block_drop
    assert not any(g.eagle_group or g.proof_margin for g in geom.groups)
    r, q = geom.to_report(), plain.to_report()
    for key in ("groups", "offload", "scheduler_block_size", "hash_block_size", "hit_alignment_tokens"):
        assert r[key] == q[key], key
    if any(g.is_align_mamba for g in geom.groups) and n:
        a, b = mamba_checkpoint(geom, n, num_prompt_tokens=prompt), mamba_checkpoint(plain, n, num_prompt_tokens=prompt)
        assert replace(a, prefill_chunks=b.prefill_chunks) == b and a.shift == 0
        P = geom.speculative.prefill_lookahead_tokens
        assert a.prefill_chunks == b.prefill_chunks or P > 1
        if prompt:
            try:
                ends = prefill_chunk_ends(geom, prompt)
            except kvgeom.QueryError as e:
                assert e.problems[0].code == "prefill_stalls" and P > 1
            else:
                assert ends == prefill_chunk_ends(plain, prompt)
    if geom.offload is None:
        return
    stored = {og.index: [e for e in store_prompt(geom, prompt)[og.index] if e % stored_frac == 0 or e <= prompt // 2]
              for og in geom.offload.groups}
    assert stored == {og.index: [e for e in store_prompt(plain, prompt)[og.index]
                                 if e % stored_frac == 0 or e <= prompt // 2] for og in plain.offload.groups}
    assert hits.lookup_hit(geom, n, stored=stored, num_prompt_tokens=prompt) == hits.lookup_hit(
        plain, n, stored=stored, num_prompt_tokens=prompt
    )
    for fin in (False, True):
        kw = dict(num_tokens=n, num_computed_tokens=n, num_prompt_tokens=prompt, offload_prompt_only=False,
                  finished=fin)
        assert hits.plan_store(geom, **kw) == hits.plan_store(plain, **kw)


@example(
    kvgeom.resolve({"groups": [{"kind": "full_attention", "block_size": 16, "drafter": True},
                               {"kind": "mamba", "block_size": 16}], "offload": {},
                    "speculative": {"method": "eagle", "num_speculative_tokens": 2, "eagle_block_drop": False}}),
    100, 100, 1,
)
@example(  # vLLM 0.33 run: chunk ends [7], never scheduled again (prefill_stalls); without the drafter [8, 9]
    kvgeom.resolve({"groups": [{"kind": "full_attention", "block_size": 16, "drafter": True},
                               {"kind": "mamba", "block_size": 16}],
                    "cache": {"prefix_match_unit": 8, "retention_interval": 0},
                    "speculative": {"method": "mtp", "num_speculative_tokens": 2, "mtp_modules": 2,
                                    "eagle_block_drop": False, "lookahead_hashes": False}}),
    0, 9, 1,
)
@given(speculative_geometries(block_drop=False), st.integers(0, 300), st.integers(0, 300), st.sampled_from([1, 32]))
def test_no_block_drop_answers_exactly_as_without_drafter(geom, n, prompt, frac):
    check_no_drop_answers_as_without_drafter(geom, max(n, prompt), prompt, frac)


# ---------------------------------------------------------------------------------------------
# the volatile unit
# ---------------------------------------------------------------------------------------------


def check_hit_never_includes_volatile_unit(geom: kvgeom.Geometry, n: int, prompt: int,
                                           stored: dict[int, list[int]]) -> None:
    """With the drop, a full-attention eagle group's offload hit stops one chunk short of its stored run: the
    chunk past the hit (which proves the hit's last unit) is stored; a partial tail's eagle key sits at
    ``N + proof_margin``."""
    hit = hits.lookup_hit(geom, n, stored=stored, num_prompt_tokens=prompt)
    if hit.hit_tokens == 0:
        return
    N = hit.end_token
    for og in geom.offload.groups:
        if not og.eagle_group or og.window_chunks is not None:
            continue
        C = og.tokens_per_chunk
        if hit.partial_tail:
            assert og.proof_margin and N + og.proof_margin in stored[og.index]
        else:
            proof = (-(-N // C) + 1) * C
            assert proof in stored[og.index], (N, proof, stored[og.index])


@given(st.one_of(speculative_geometries(offload=True, block_drop=True), tail_speculative_geometries()), st.data())
def test_offload_hit_never_includes_the_volatile_unit(geom, data):
    H = geom.hash_block_size
    n = data.draw(st.integers(1, 400), label="num_tokens")
    prompt = data.draw(st.integers(1, n), label="prompt")
    stored = {}
    for og in geom.offload.groups:
        top = n // H
        stored[og.index] = sorted(data.draw(st.sets(st.integers(1, max(top, 1)), max_size=top), label=f"g{og.index}"))
        stored[og.index] = [i * H for i in stored[og.index] if i <= top]
    event(f"eagle groups: {sum(og.eagle_group for og in geom.offload.groups)}")
    check_hit_never_includes_volatile_unit(geom, n, prompt, stored)


# ---------------------------------------------------------------------------------------------
# Mamba: never a lookahead state; checkpoint in Mamba block units
# ---------------------------------------------------------------------------------------------


def check_restored_mamba_state_is_never_a_lookahead_state(geom: kvgeom.Geometry, prompt: int, n: int) -> None:
    """A request sharing a stored prompt restores a Mamba state the prefill left in the tier, and never a
    lookahead state: never past the prompt's checkpoint on the H grid (:func:`prompt_hash_checkpoint`, vLLM's
    ``get_mamba_prefill_checkpoint_position`` with unit H: one H below the last full H block under the GPU drop,
    P tokens back under lookahead hashes), the last position whose drafter input the prompt has verified.

    Not the checkpoint on A's grid (:func:`mamba_checkpoint`): with H < A vLLM also ends a prefill chunk at the
    last cacheable boundary of its engine block grid, keys the Mamba state there and restores it (vLLM run:
    FA 32 + Mamba 16 + an FA 16 drafter, EAGLE K 1, offload, a 48-token prompt stores and restores the state at
    32 while the A = 32 checkpoint is 0)."""
    stored = store_prompt(geom, prompt)
    hit = hits.lookup_hit(geom, n, stored=stored, num_prompt_tokens=n)
    if hit.hit_tokens == 0:
        return
    verified = prompt_hash_checkpoint(geom, prompt)
    for og in geom.offload.groups:
        if geom.groups[og.index].is_align_mamba:
            assert hit.end_token in stored[og.index]
            assert hit.end_token <= verified, (hit, verified)


def check_checkpoint_state_block_in_mamba_units(geom: kvgeom.Geometry, prompt: int) -> None:
    """The checkpoint's state block is counted in the Mamba group's own blocks: it agrees with the boundary
    rule, the restore rule, and the block the store plan hands to the tier for that key."""
    from kvgeom import boundaries

    cp = mamba_checkpoint(geom, prompt)
    g = next(x for x in geom.groups if x.is_align_mamba)
    if cp.state_block is None:
        assert cp.position == 0 or cp.position % g.block_size
        return
    assert cp.state_block == boundaries.state_block_for_boundary(geom, g.index, cp.position)
    assert cp.state_block == boundaries.restore_read_block(geom, g.index, cp.position)
    if geom.offload is not None:
        plan = hits.plan_store(geom, num_tokens=prompt, num_computed_tokens=prompt)
        gs = next(x for x in plan.groups if x.index == g.index)
        for end, entries in zip(gs.end_tokens, gs.block_entries, strict=True):
            if end == cp.position:
                assert entries == (cp.state_block,)


_DCP2_WORKED = {
    "groups": [{"kind": "full_attention", "block_size": 16}, {"kind": "mamba", "block_size": 16},
               {"kind": "full_attention", "block_size": 16, "num_kv_heads": 4, "drafter": True}],
    "parallel": {"tp": 2, "dcp": 2}, "offload": {}, "cache": {"retention_interval": None},
    "speculative": {"method": "eagle", "num_speculative_tokens": 2},
}


@example(kvgeom.resolve(_DCP2_WORKED), 100)
@given(speculative_geometries(), st.integers(0, 400))
def test_checkpoint_state_block_is_in_mamba_block_units(geom, prompt):
    assume(any(g.is_align_mamba for g in geom.groups))
    check_checkpoint_state_block_in_mamba_units(geom, prompt)


@example(  # vLLM 0.33 run: chunk ends [32, 48]; Mamba stored at 32 (aligned boundary store job); B restores 32
    kvgeom.resolve({"groups": [{"kind": "full_attention", "block_size": 32}, {"kind": "mamba", "block_size": 16},
                               {"kind": "full_attention", "block_size": 16, "num_kv_heads": 4, "drafter": True}],
                    "offload": {}, "cache": {"retention_interval": 0},
                    "speculative": {"method": "eagle", "num_speculative_tokens": 1}}),
    48, 0,
)
@given(speculative_geometries(offload=True, sliding=False), st.integers(1, 300), st.integers(0, 64))
def test_restored_mamba_state_is_never_a_lookahead_state(geom, prompt, extra):
    assume(any(g.is_align_mamba for g in geom.groups) and geom.config.cache.retention_interval == 0)
    check_restored_mamba_state_is_never_a_lookahead_state(geom, prompt, prompt + extra)


@given(speculative_geometries(), st.integers(0, 500), st.integers(0, 500))
def test_mamba_checkpoint_is_on_its_unit_below_the_prefill_end_and_chunks_sum_to_the_prompt(geom, n, prompt):
    assume(any(g.is_align_mamba for g in geom.groups))
    n = max(n, prompt)
    cp = mamba_checkpoint(geom, n, num_prompt_tokens=prompt)
    assert cp.position % cp.unit == 0 and 0 <= cp.position < max(prompt, n - 1, 1)
    assert cp.shift >= 0 and sum(cp.prefill_chunks) == prompt
    sg = geom.speculative
    if sg is None or not (sg.gpu_drop or sg.lookahead_hashes):
        assert cp.shift == 0
    if sg is not None and sg.gpu_drop:
        assert cp.shift <= cp.unit


# ---------------------------------------------------------------------------------------------
# checkpoint vs pop, under any DCP
# ---------------------------------------------------------------------------------------------


def pop_configs():
    return st.builds(
        lambda dcp, k, fa, mb, flag, extra: {
            "groups": [{"kind": "full_attention", "block_size": fa, "drafter": flag and not extra},
                       {"kind": "mamba", "block_size": mb}]
            + ([{"kind": "full_attention", "block_size": fa, "num_kv_heads": 4, "drafter": True}] if extra else []),
            "parallel": {"tp": dcp, "dcp": dcp},
            "offload": {"blocks_per_chunk": k},
            "speculative": {"method": "mtp", "num_speculative_tokens": 2},
        },
        st.sampled_from([1, 2, 4, 8]), st.sampled_from([1, 1, 2]), st.sampled_from([8, 16, 32]),
        st.sampled_from([8, 16, 32, 64]), st.booleans(), st.booleans(),
    )


def check_pop_and_checkpoint_consistent(cfg: dict) -> None:
    """With an eagle group in the tier: without ``speculative_pop_vs_mamba_shift`` a resend of any stored
    prompt hits exactly the shifted checkpoint (or 0 when that is less than the largest chunk); with it,
    some prompt's resend falls to 0 although its checkpoint is at least a chunk -- the warning is present
    exactly when the offload tier loses the checkpoint (a checkpoint no prefill chunk ends at has no
    state to store, warned or not)."""
    try:
        geom = kvgeom.resolve(cfg)
    except kvgeom.KVGeomError:
        return
    warned = any(w.code == "speculative_pop_vs_mamba_shift" for w in geom.warnings)
    if not any(og.eagle_group for og in geom.offload.groups):
        assert not warned  # no eagle group: the connector pops nothing
        return
    big = max(og.tokens_per_chunk for og in geom.offload.groups)
    lost = []
    for p in range(1, 6 * big + 2 * geom.scheduler_block_size):
        stored = store_prompt(geom, p)
        end = hits.lookup_hit(geom, p, stored=stored).end_token
        cp = mamba_checkpoint(geom, p).position
        if not warned:
            assert end in (0, cp), (p, end, cp)
            # a Mamba state exists only where a prefill chunk ended: with a Mamba block off vLLM's
            # cache_config.block_size grid the checkpoint may be no chunk end (vLLM 0.33 run: 0 too)
            assert end == cp or cp < big or cp not in prefill_chunk_ends(geom, p), (p, end, cp)
        elif end == 0 and cp >= big:
            lost.append(p)
    if warned:
        assert lost, "the warning fired but no resend lost its checkpoint"


@example({"groups": [{"kind": "full_attention", "block_size": 16, "drafter": True},
                     {"kind": "mamba", "block_size": 16}],
          "parallel": {"tp": 2, "dcp": 2}, "offload": {},
          "speculative": {"method": "eagle", "num_speculative_tokens": 2}})
@given(pop_configs())
def test_checkpoint_and_pop_reported_consistently_under_any_dcp(cfg):
    check_pop_and_checkpoint_consistent(cfg)


# ---------------------------------------------------------------------------------------------
# the sliding-window drafter warning
# ---------------------------------------------------------------------------------------------


def sliding_drafter_configs():
    def build(dcp, k, block, window, target, mamba, method):
        groups = [{"kind": "full_attention", "block_size": block}] if target else []
        if mamba:
            groups.append({"kind": "mamba", "block_size": block})
        groups.append({"kind": "sliding_window", "block_size": block, "sliding_window": window, "drafter": True,
                       "dcp_sharded": False})
        return {"groups": groups, "parallel": {"tp": dcp, "dcp": dcp}, "offload": {"blocks_per_chunk": k},
                "speculative": {"method": method, "num_speculative_tokens": 2}}

    return st.builds(build, st.sampled_from([1, 2, 4]), st.sampled_from([1, 2]), st.sampled_from([8, 16, 32]),
                     st.integers(2, 120), st.booleans(), st.booleans(), st.sampled_from(["eagle", "eagle3", "mtp"]))


@given(sliding_drafter_configs(), st.integers(0, 200), st.integers(0, 64))
def test_sliding_drafter_warning_means_no_offload_hit(cfg, extra, more):
    """When ``speculative_sliding_drafter_offload`` fires, every prompt of at least the stated length stores
    nothing a later request sharing it can load (the length derived here from the window, chunk and
    connector alignment)."""
    geom = kvgeom.resolve(cfg)
    warned = [w for w in geom.warnings if w.code == "speculative_sliding_drafter_offload"]
    assert warned  # an offloaded sliding-window eagle group under retention 0 always warns
    og = next(o for o in geom.offload.groups if o.eagle_group and o.window_chunks is not None
              and f"group {o.index} is a sliding-window eagle group" in warned[0].message)
    # the kept window ends at the replay boundary rounded to the connector alignment and holds fewer chunks
    # than the window plus the pop: once it no longer reaches token 0 no run is long enough
    start = (og.window_chunks + 1) * og.tokens_per_chunk + geom.offload.alignment_tokens
    assert f"prompt of {start} tokens or more" in warned[0].message
    p = start + extra
    align, C = geom.offload.alignment_tokens, og.tokens_per_chunk
    assert f"n - rdown(n - 1, {align}) < {C}" in warned[0].message
    # the kept run ends one chunk past b = rdown(p - 1, align) (vLLM 0.33's EAGLE mask): a prompt that
    # reaches that chunk stores the whole run (issue 19: 96 tokens, vLLM hits 80)
    assume(p - (p - 1) // align * align < C)
    stored = store_prompt(geom, p)
    assert hits.lookup_hit(geom, p, stored=stored).hit_tokens == 0
    assert hits.lookup_hit(geom, p + more, stored=stored, num_prompt_tokens=p + more).hit_tokens == 0


@given(st.one_of(speculative_geometries(offload=True, block_drop=True), tail_speculative_geometries()), st.data())
def test_resident_lookups_agree_under_speculation(geom, data):
    """The Residency forms (scalar probe and batch ``lookup_resident``) give the same eagle hits as sets."""
    from kvgeom.batch.lookup import lookup_resident

    H = geom.hash_block_size
    size = data.draw(st.integers(1, 4), label="requests")
    top = 8 * max(og.tokens_per_chunk for og in geom.offload.groups)
    n = [data.draw(st.integers(0, top)) for _ in range(size)]
    chains = [[b"r%d-%d" % (i, j) for j in range(x // H)] for i, x in enumerate(n)]
    res = kvgeom.Residency()
    stored = []
    for i, x in enumerate(n):
        held = {}
        for og in geom.offload.groups:
            ends = sorted(data.draw(st.sets(st.integers(1, max(x // H, 1)), max_size=x // H)))
            held[og.index] = [e * H for e in ends if e <= x // H]
            for e in held[og.index]:
                res.add(og.index, chains[i][e // H - 1])
        stored.append(held)
    batch_hits = lookup_resident(geom, res, chains, n)
    for i, x in enumerate(n):
        want = hits.lookup_hit(geom, x, stored=stored[i])
        assert hits.lookup_hit(geom, x, stored=res, block_hashes=chains[i]) == want
        assert batch_hits.hit(i) == want


# ---------------------------------------------------------------------------------------------
# prefill chunk ends and the Mamba states they leave
# ---------------------------------------------------------------------------------------------


def check_prefill_chunk_ends(geom: kvgeom.Geometry, prompt: int, budget: int | None) -> None:
    """Chunk ends climb strictly to the prompt, land on H or the engine block grid before it (unless the
    budget is narrower than a block), respect the budget, and the unbounded split is the one
    :func:`mamba_checkpoint` reports. A prefill that cannot finish raises ``prefill_stalls``, under any
    budget (vLLM 0.33 requeues it forever); only the multi-module MTP reserve (P > 1) can stall one."""
    try:
        ends = prefill_chunk_ends(geom, prompt, max_num_batched_tokens=budget)
    except kvgeom.QueryError as e:
        assert e.problems[0].code == "prefill_stalls" and geom.speculative.prefill_lookahead_tokens > 1
        return
    assert list(ends) == sorted(set(ends)) and (ends[-1] == prompt if prompt else ends == ())
    B, H = engine_block_size(geom), geom.hash_block_size
    if budget is None or budget >= B:  # a block wider than the budget advances sub-block (vLLM does too)
        assert all(e % H == 0 or e % B == 0 for e in ends[:-1]), ends
    if budget is not None:
        assert all(b - a <= budget for a, b in zip((0, *ends), ends, strict=False)), ends
    else:
        assert tuple(np.cumsum(mamba_checkpoint(geom, prompt).prefill_chunks)) == ends


@example(  # vLLM 0.33 run: FA64 + Mamba64 + eagle3 drafter, H 16, 131 tokens -> chunks [64, 48, 16, 3]
    kvgeom.resolve({"groups": [{"kind": "full_attention", "block_size": 64}, {"kind": "mamba", "block_size": 64},
                               {"kind": "full_attention", "block_size": 64, "num_kv_heads": 4, "drafter": True}],
                    "cache": {"prefix_match_unit": 16}, "offload": {},
                    "speculative": {"method": "eagle3", "num_speculative_tokens": 2}}),
    131, None,
)
@example(  # vLLM 0.33 run (budget 8192): chunk ends [63], never scheduled again: prefill_stalls, not (63, 64, 65)
    kvgeom.resolve({"groups": [{"kind": "full_attention", "block_size": 16, "drafter": True},
                               {"kind": "full_attention", "block_size": 16}, {"kind": "mamba", "block_size": 16}],
                    "cache": {"retention_interval": 0},
                    "speculative": {"method": "mtp", "num_speculative_tokens": 2, "mtp_modules": 2,
                                    "eagle_block_drop": False, "lookahead_hashes": False}}),
    65, None,
)
@given(speculative_geometries(), st.integers(0, 400), st.sampled_from([None, None, 8, 24, 40, 100]))
def test_prefill_chunk_ends_climb_to_the_prompt_on_the_grid(geom, prompt, budget):
    assume(any(g.is_align_mamba for g in geom.groups))
    check_prefill_chunk_ends(geom, prompt, budget)


def check_resumed_prefill_split(geom: kvgeom.Geometry, prompt: int, computed: int, budgets: list[int]) -> None:
    """A prefill resumed at ``computed`` with per-step budgets climbs strictly from ``computed`` to the prompt,
    no chunk longer than its step's budget, and resuming at any of its own chunk ends with the remaining
    budgets continues the same split (the split depends only on where the request stands and the budget of
    each step, as vLLM's Scheduler decides it step by step)."""
    try:
        ends = prefill_chunk_ends(geom, prompt, num_computed_tokens=computed, max_num_batched_tokens=budgets)
    except kvgeom.QueryError as e:
        assert e.problems[0].code == "prefill_stalls" and geom.speculative.prefill_lookahead_tokens > 1
        return
    starts = (computed, *ends)
    assert all(a < b for a, b in zip(starts, ends, strict=False))
    assert ends[-1] == prompt if ends else computed == prompt
    for i, (a, b) in enumerate(zip(starts, ends, strict=False)):
        assert b - a <= budgets[min(i, len(budgets) - 1)], (starts, budgets)
    for i, e in enumerate(ends):
        rest = budgets[i + 1:] or budgets[-1:]
        assert prefill_chunk_ends(geom, prompt, num_computed_tokens=e, max_num_batched_tokens=rest) == ends[i + 1:]
    if computed == 0 and len(set(budgets)) == 1:
        assert ends == prefill_chunk_ends(geom, prompt, max_num_batched_tokens=budgets[0])


@example(  # vLLM 0.33 run: FA 64 + Mamba 64, H 16, a GPU hit of 224 and budgets [8, 100]: (232, 256, 288, 300)
    kvgeom.resolve({"groups": [{"kind": "full_attention", "block_size": 64}, {"kind": "mamba", "block_size": 64}],
                    "cache": {"prefix_match_unit": 16}, "offload": {}}),
    300, 224, [8, 100],
)
@given(speculative_geometries(), st.integers(1, 300), st.integers(0, 300),
       st.lists(st.sampled_from([3, 8, 16, 24, 40, 64, 100, 1000]), min_size=1, max_size=5))
def test_resumed_prefill_split_continues_itself(geom, prompt, computed, budgets):
    assume(any(g.is_align_mamba for g in geom.groups))
    check_resumed_prefill_split(geom, prompt, min(computed, prompt), budgets)


def check_mamba_states_only_where_chunks_end(geom: kvgeom.Geometry, prompt: int, budget: int | None) -> None:
    """Given the prefill's chunk ends, an align Mamba group stores a key inside the prompt only where a chunk
    ended (vLLM writes Mamba states at chunk ends only); other groups are untouched by the filter; the
    default (no ``chunk_ends``) under the GPU drop is the unbounded split."""
    try:
        ends = prefill_chunk_ends(geom, prompt, max_num_batched_tokens=budget)
    except kvgeom.QueryError:
        return
    with_ends = hits.plan_store(geom, num_tokens=prompt, num_computed_tokens=prompt, chunk_ends=ends)
    default = hits.plan_store(geom, num_tokens=prompt, num_computed_tokens=prompt)
    for a, b in zip(with_ends.groups, default.groups, strict=True):
        if geom.groups[a.index].is_align_mamba:
            assert all(e in ends for e in a.end_tokens if e <= prompt), (a.end_tokens, ends)
        else:
            assert a == b
    if budget is None:  # the default is vLLM's unbounded split (issue 19), with or without the GPU drop
        assert with_ends == default


@example(  # vLLM 0.33 run: the state at 64 (a replay boundary a chunk ended at) is stored with the checkpoint
    kvgeom.resolve({"groups": [{"kind": "full_attention", "block_size": 64}, {"kind": "mamba", "block_size": 64},
                               {"kind": "full_attention", "block_size": 64, "num_kv_heads": 4, "drafter": True}],
                    "cache": {"prefix_match_unit": 16}, "offload": {},
                    "speculative": {"method": "eagle3", "num_speculative_tokens": 2}}),
    150, None,
)
@given(speculative_geometries(offload=True), st.integers(0, 400), st.sampled_from([None, None, 24, 40, 100]))
def test_mamba_states_are_stored_only_where_prefill_chunks_end(geom, prompt, budget):
    assume(any(g.is_align_mamba for g in geom.groups))
    check_mamba_states_only_where_chunks_end(geom, prompt, budget)


@given(speculative_geometries(offload=True), st.data())
def test_batch_stores_agree_with_scalar_given_chunk_ends(geom, data):
    assume(any(g.is_align_mamba for g in geom.groups))
    size = data.draw(st.integers(0, 5), label="requests")
    prompts = [data.draw(st.integers(0, 300)) for _ in range(size)]
    budget = data.draw(st.sampled_from([None, 24, 64]), label="budget")
    rows = []
    for p in prompts:
        try:
            rows.append(prefill_chunk_ends(geom, p, max_num_batched_tokens=budget))
        except kvgeom.QueryError:
            rows.append(())
    width = max((len(r) for r in rows), default=0) or 1
    matrix = np.full((size, width), -1, dtype=np.int64)
    for i, r in enumerate(rows):
        matrix[i, : len(r)] = r
    sp = batch.plan_stores(geom, num_tokens=prompts, num_computed_tokens=prompts, chunk_ends=matrix)
    for i, p in enumerate(prompts):
        assert sp.plan(i) == hits.plan_store(geom, num_tokens=p, num_computed_tokens=p, chunk_ends=rows[i])


@example(  # vLLM 0.33 run: FA64 + Mamba64, H 16, DCP 1: a 228-token prompt stores FA and Mamba partial tails at 224
    kvgeom.resolve({"groups": [{"kind": "full_attention", "block_size": 64}, {"kind": "mamba", "block_size": 64}],
                    "cache": {"prefix_match_unit": 16}, "offload": {}}),
    228, None,
)
@given(st.one_of(speculative_geometries(offload=True), tail_speculative_geometries()), st.integers(0, 400),
       st.sampled_from([None, None, 24, 40, 100]))
def test_mamba_handoffs_are_exact_states(geom, prompt, budget):
    """kvgeom.handoff: every Mamba key handed off is a chunk end on the Mamba block grid within the cacheable
    prefix (so block ``e / B_m - 1`` holds the state after exactly ``e``); a partial-tail boundary is an
    H-grid chunk end below the prompt and off the span grid."""
    from kvgeom.handoff import mamba_cacheable_tokens, mamba_handoffs, partial_tail_boundary

    assume(any(g.is_align_mamba for g in geom.groups) and prompt > 0)
    try:
        ends = prefill_chunk_ends(geom, prompt, max_num_batched_tokens=budget)
    except kvgeom.QueryError:
        return  # a stalling MTP prefill (warned separately)
    for g in geom.groups:
        if not g.is_align_mamba:
            continue
        keys = mamba_handoffs(geom, g.index, prompt, prompt, ends)
        assert list(keys) == sorted(keys)
        for e in keys:
            assert e in ends and e % g.block_size == 0, (e, ends)
            assert e <= mamba_cacheable_tokens(geom, g.index, prompt)
    t = partial_tail_boundary(geom, prompt, prompt, ends)
    if t is not None:
        off = geom.offload
        assert off is not None and off.supports_partial_tail
        assert t in ends and 0 < t < prompt and t % geom.hash_block_size == 0
        assert t % off.groups[0].tokens_per_block != 0
        event("partial tail stored")


@given(st.one_of(speculative_geometries(), tail_speculative_geometries()), st.integers(0, 400), st.data())
def test_the_kept_checkpoint_is_a_chunk_end_cached_exactly_and_every_reader_agrees(geom, prompt, data):
    """kvgeom.handoff.checkpoint_step is the one home of "vLLM 0.33 keeps the align Mamba state at the prompt's
    H-grid checkpoint t" (a chunk ended at t and a step cached exactly t tokens). Its answer is such a step end,
    and a partial tail, when planned, is at t and kept."""
    from kvgeom.handoff import checkpoint_step, mamba_cacheable_tokens, partial_tail_boundary, state_ends

    mamba = [g.index for g in geom.groups if g.is_align_mamba]
    assume(mamba and prompt > 0)
    budget = data.draw(st.sampled_from([None, 8, 24, 40, 100, "any"]), label="max_num_batched_tokens")
    if budget == "any" and prompt > 1:  # any split a connector may report
        ends = (*sorted(data.draw(st.sets(st.integers(1, prompt - 1), max_size=12), label="ends")), prompt)
    else:
        try:
            ends = prefill_chunk_ends(geom, prompt, max_num_batched_tokens=None if budget == "any" else budget)
        except kvgeom.QueryError as e:
            assert e.code == "prefill_stalls"
            ends = None  # the default split, as state_ends keeps it
    t = prompt_hash_checkpoint(geom, prompt)
    step = checkpoint_step(geom, mamba[0], prompt, prompt, ends)
    if step is not None:
        assert t in state_ends(geom, prompt, prompt, ends) and t <= step <= prompt
        assert mamba_cacheable_tokens(geom, mamba[0], step) == t
    if geom.offload is not None and partial_tail_boundary(geom, prompt, prompt, ends) is not None:
        assert step is not None and partial_tail_boundary(geom, prompt, prompt, ends) == t


SPLITS = st.one_of(
    st.tuples(st.just("budget"), st.sampled_from([None, 8, 24, 100])),
    st.tuples(st.just("steps"), st.lists(st.sampled_from([1, 2, 3, 5, 16, 20, 64, 100]), min_size=1, max_size=6)),
    st.tuples(st.just("any"), st.frozensets(st.integers(1, 299), max_size=12)),
    # short chunks right after a block boundary or the H-grid checkpoint (multi-module MTP re-prefill, hand-offs)
    st.tuples(st.just("around"), st.integers(0, 2), st.lists(st.integers(1, 6), max_size=3)),
)
"""How a prefill is split, independent of the geometry: vLLM's split under a token budget (fixed or per step), any
split, or short chunks after a mark (0: the prompt's H-grid checkpoint, 1 and 2: the first Mamba block ends)."""


def _split(geom: kvgeom.Geometry, prompt: int, how: tuple) -> tuple[int, ...] | None:
    """The chunk ends ``how`` (:data:`SPLITS`) gives a ``prompt``, or None for vLLM's default split."""
    if how[0] in ("budget", "steps"):
        if not any(g.is_align_mamba for g in geom.groups):
            return None  # kvgeom models vLLM's split only with an align Mamba group; the default is one chunk
        try:
            return prefill_chunk_ends(geom, prompt, max_num_batched_tokens=how[1])
        except kvgeom.QueryError as e:
            assert e.code == "prefill_stalls"
            return None  # the default split, kept total
    if how[0] == "any":
        return (*sorted(e for e in how[1] if e < prompt), prompt)
    blocks = [g.block_size for g in geom.groups if g.is_align_mamba] or [geom.scheduler_block_size]
    mark = prompt_hash_checkpoint(geom, prompt) if how[1] == 0 else blocks[0] * how[1]
    return (*sorted({e for e in accumulate([mark, *how[2]]) if 0 < e < prompt}), prompt)


@st.composite
def _split_tail_geometries(draw: st.DrawFn) -> kvgeom.Geometry:
    """FA + align Mamba (one block, 32 or 64) with H below it and DCP 1, so prompts have partial tails; no drafter,
    MTP (K 1-4, 1-3 modules: re-prefilled tokens) or an eagle drafter group."""
    block = draw(st.sampled_from([32, 64]))
    groups: list[dict] = [{"kind": "full_attention", "block_size": block}, {"kind": "mamba", "block_size": block}]
    cfg: dict = {"groups": groups, "offload": {},
                 "cache": {"prefix_match_unit": draw(st.sampled_from([8, 16])),
                           "retention_interval": draw(st.sampled_from([None, 0]))}}
    method = draw(st.sampled_from([None, "mtp", "mtp", "eagle"]))
    if method == "mtp":
        k = draw(st.integers(1, 4))
        mods = draw(st.integers(1, min(k, 3)))
        cfg["speculative"] = {"method": "mtp", "num_speculative_tokens": k, "mtp_modules": mods}
    elif method == "eagle":
        cfg["speculative"] = {"method": "eagle", "num_speculative_tokens": draw(st.integers(1, 3))}
        groups.append({"kind": "full_attention", "block_size": block, "num_kv_heads": 4, "drafter": True})
    return kvgeom.resolve(cfg)


def _keys(plans) -> list[tuple[int, int]]:
    return [(gs.index, e) for p in plans for gs in p.groups for e in gs.stored_end_tokens]


def _fm(block: int, mamba: int, cache: dict, k: int, modules: int) -> kvgeom.Geometry:
    return kvgeom.resolve({"groups": [{"kind": "full_attention", "block_size": block},
                                      {"kind": "mamba", "block_size": mamba}], "cache": cache, "offload": {},
                           "speculative": {"method": "mtp", "num_speculative_tokens": k, "mtp_modules": modules}})


_MTP3_64 = _fm(64, 64, {"prefix_match_unit": 16}, 3, 3)
_MTP3_32 = _fm(32, 32, {"prefix_match_unit": 16, "retention_interval": None}, 3, 3)
_MTP5_64_32 = _fm(64, 32, {"retention_interval": 64}, 5, 2)


# vLLM 0.33 run: chunk ends 64, 80, 82, 100 store the partial tail at 80 in the step ending at 100, not at 82
@example(geom=_MTP3_64, prompt=100, how=("any", frozenset({64, 80, 82})), loaded=False)
@given(st.one_of(speculative_geometries(offload=True), tail_speculative_geometries(), _split_tail_geometries(),
                 geometries(offload=True, max_dcp=2)), st.integers(1, 300), SPLITS, st.booleans())
def test_a_connector_planning_each_step_stores_each_key_once_and_the_whole_prefills_keys(geom, prompt, how, loaded):
    """kvgeom.hits.plan_store_steps (plan_store with stored_chunks from next_stored_chunk and partial_tail_stored):
    no key is listed in two steps, every step lists only keys one call over the whole prefill lists, and the steps
    together list them all; a partial tail is listed in the first step that ends past the step that cached exactly
    its checkpoint (kvgeom.handoff.checkpoint_step), as vLLM 0.33 hands it over."""
    from kvgeom.handoff import checkpoint_step, partial_tail_boundary

    assume(geom.offload is not None)
    ends = _split(geom, prompt, how)
    steps = hits.plan_store_steps(geom, num_prompt_tokens=prompt, chunk_ends=ends, loaded_from_offload=loaded)
    split = tuple(ends) if ends is not None else default_chunk_ends(geom, prompt)
    assert len(steps) == len(split) + 1
    whole = [hits.plan_store(geom, num_tokens=prompt, num_computed_tokens=prompt, chunk_ends=ends,
                             loaded_from_offload=loaded),
             hits.plan_store(geom, num_tokens=prompt + 1, num_computed_tokens=prompt, num_prompt_tokens=prompt,
                             finished=True, chunk_ends=ends, loaded_from_offload=loaded)]
    listed: dict[tuple[int, int], set[int]] = {}
    for i, p in enumerate(steps):
        for key in _keys([p]):
            listed.setdefault(key, set()).add(i)
    assert all(len(at) == 1 for at in listed.values()), listed  # (an eagle tail key may equal a chunk's key)
    assert set(listed) == set(_keys(whole))
    tail_steps = [i for i, p in enumerate(steps) if any(gs.partial_tail is not None for gs in p.groups)]
    assert len(tail_steps) <= 1
    t = partial_tail_boundary(geom, prompt, prompt, ends, loaded_from_offload=loaded)
    if tail_steps:
        mamba = next(g.index for g in geom.groups if g.is_align_mamba)
        exact = checkpoint_step(geom, mamba, prompt, prompt, ends)
        assert t is not None and exact is not None
        assert tail_steps[0] == next(i for i, e in enumerate((*split, prompt + 1)) if e > exact)
        event("partial tail listed in one step")
    else:
        assert t is None


# vLLM 0.33 runs: chunk ends 64, 65 keep no Mamba state at 64 (MTP K=3 re-prefills 2 tokens); chunk ends 32, 36,
# 56, 64 keep none at the checkpoint 32 (32 tokens are cacheable only at 64, two steps later)
@example(geom=_MTP3_32, prompt=150, how=("any", frozenset({64, 65, 96})))
@example(geom=_MTP5_64_32, prompt=91, how=("any", frozenset({32, 36, 56, 64, 68})))
@given(st.one_of(speculative_geometries(), tail_speculative_geometries(), _split_tail_geometries(),
                 geometries(max_dcp=2)), st.integers(1, 300), SPLITS)
def test_every_mamba_state_kvgeom_keys_was_cacheable_before_its_block_was_reused(geom, prompt, how):
    """An align Mamba state written at chunk end e stays in its block for the step ending at e and the next one;
    vLLM 0.33 caches it only if one of them made e tokens cacheable (chunk ends 64, 65, 96 of an MTP K=3 prefill
    keep no state at 64). Every reader agrees: kvgeom.handoff.mamba_handoffs (the connector's keys), the simulated
    GPU prefix cache's Mamba entries on the block grid, and checkpoint_step's step."""
    from kvgeom.handoff import checkpoint_step, mamba_cacheable_tokens, mamba_handoffs, state_ends
    from kvgeom.sim import GPUPrefixCache

    mamba = [g for g in geom.groups if g.is_align_mamba]
    assume(mamba)
    ends = _split(geom, prompt, how)
    written = state_ends(geom, prompt, prompt, ends)

    def in_time(g, e):
        later = [x for x in written if x > e]
        return e in written and e <= mamba_cacheable_tokens(geom, g.index, later[0] if later else e)

    cache = GPUPrefixCache(geom)
    cache.cache_request(prompt, chunk_ends=ends if ends is not None else None)
    for g in mamba:
        keyed = set(mamba_handoffs(geom, g.index, prompt, prompt, ends)) if geom.offload is not None else set()
        held = {e for (i, e) in cache.entries if i == g.index and e % g.block_size == 0}
        t = prompt_hash_checkpoint(geom, prompt)
        step = checkpoint_step(geom, g.index, prompt, prompt, ends)
        for e in keyed | (held - {t}):
            assert in_time(g, e), (g.index, e, written)
        if step is not None:
            assert step in written[written.index(t):written.index(t) + 2]
            event("checkpoint kept")
