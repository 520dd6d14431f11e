"""Store-plan laws: what a store plan keeps is what a lookup on the same tier can use.

* ``test_store_plan_keeps_every_promised_window``: for every boundary a sliding-window store
  mask promises (each segment end, the request's final segment end with ``retention = None``,
  the aligned replay boundary with a retention interval, every chunk end when the tails cover a
  segment), the plan stores the run of chunks the window reaches there
  (``cdiv(sliding_window - 1 + extra_retained_tokens, C)`` chunks, or back to chunk 0); for an EAGLE
  group (issue 19) one chunk more, ending one chunk past the boundary, and no final-segment tail.
* ``test_lookup_on_the_planned_tier_finds_every_stored_boundary``: after a prompt's store plans
  are put in a tier, a lookup of a longer request sharing the prompt finds at least the largest
  boundary every offloaded group can restore from that tier (computed here by a small oracle,
  not by ``lookup_hit``).
* ``test_swa_store_plans_agree_with_plan_store``: the batch twin equals the scalar path on
  sliding-window geometries with every retention form, ``extra_retained_tokens``, ``k > 1``,
  finished requests and already-stored chunks (the rows the general agreement law reaches rarely).

The three rules and their rows are in ``tests/test_store_plans.py`` (answers from vLLM 0.33).
"""

from __future__ import annotations

import math

from hypothesis import example, given
from hypothesis import strategies as st

import kvgeom
from kvgeom.batch import plan_stores
from kvgeom.hits import lookup_hit, plan_store
from kvgeom.strategies import geometries


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


@st.composite
def swa_geometries(draw: st.DrawFn, eagle: bool = False) -> kvgeom.Geometry:
    """Full attention (optional) + a sliding window (+ optionally a second one), DCP 1, any retention form;
    with ``eagle`` an EAGLE drafter on one or more of the sliding-window groups (the connector's eagle groups)."""
    swa = draw(st.sampled_from([4, 8, 16, 32]))
    groups = []
    groups.append({"kind": "full_attention", "block_size": swa * draw(st.sampled_from([1, 1, 2, 4]))})
    for _ in range(draw(st.integers(1, 2))):
        groups.append(
            {
                "kind": "sliding_window",
                "block_size": swa,
                "sliding_window": draw(st.integers(1, 160)),
                "extra_retained_tokens": draw(st.sampled_from([0, 0, 1, swa, 3 * swa + 5, 40])),
            }
        )
    if draw(st.booleans()):
        del groups[0]  # sliding windows only: the alignment is the largest chunk
    k = draw(st.integers(1, 3))
    spans = [g["block_size"] for g in groups]
    unit = math.lcm(*spans) * k  # a multiple of L and of every windowed chunk
    retention = draw(st.one_of(st.none(), st.just(0), st.integers(1, 6).map(lambda j: j * unit)))
    cfg = {"groups": groups, "cache": {"retention_interval": retention}, "offload": {"blocks_per_chunk": k}}
    if eagle:
        windows = [i for i, g in enumerate(groups) if g["kind"] == "sliding_window"]
        for i in draw(st.sets(st.sampled_from(windows), min_size=1)):
            groups[i]["drafter"] = True
        cfg["speculative"] = {"method": draw(st.sampled_from(["eagle", "eagle3", "mtp"])),
                              "num_speculative_tokens": draw(st.integers(1, 3))}
    return kvgeom.resolve(cfg)


def _ex(groups, retention, k=1):
    cfg = {"groups": groups, "cache": {"retention_interval": retention}, "offload": {"blocks_per_chunk": k}}
    return kvgeom.resolve(cfg)


def _fa(b):
    return {"kind": "full_attention", "block_size": b}


def _sw(b, w, extra=0):
    return {"kind": "sliding_window", "block_size": b, "sliding_window": w, "extra_retained_tokens": extra}


# issue 13's three rows (vLLM 0.33 stores 64/128/192; 64/80/96; every block up to 120)
EX1 = _ex([_fa(64), _sw(32, 16)], None)
EX2 = _ex([_fa(16), _sw(16, 32, 16)], 0)
EX3 = _ex([_fa(8), _sw(8, 48)], 32)
# issue 19: an EAGLE sliding-window drafter under R = 64 (vLLM 0.33 stores 48-80, 112-144, 176-192)
EX_EAGLE = kvgeom.resolve({"groups": [_fa(16), {**_sw(16, 32), "drafter": True}], "cache": {"retention_interval": 64},
                           "offload": {}, "speculative": {"method": "eagle", "num_speculative_tokens": 1}})


def _eagle(g: kvgeom.Geometry, index: int) -> int:
    """1 when the connector treats the group as an EAGLE group (it needs one chunk past its boundary)."""
    return int(g.offload.group(index).eagle_group)


def _store_need(g: kvgeom.Geometry, index: int, chunk: int) -> int:
    """Chunks a store mask keeps before a chunk-aligned boundary: the positions the window reaches
    (written from the rule, not the code)."""
    spec = g.groups[index].spec
    return _cdiv(spec.sliding_window - 1 + spec.extra_retained_tokens, chunk)


def _lookup_need(g: kvgeom.Geometry, index: int, chunk: int) -> int:
    """Chunks the lookup needs before a chunk-aligned boundary: at least the window in chunks,
    ``max(cdiv(sliding_window, C), cdiv(sliding_window - 1 + extra, C))``, as vLLM 0.33's
    ``_sliding_window_lookup`` asks (one more than the store keeps when ``sliding_window - 1`` is a
    multiple of C and there is no extra: vLLM stores a tail its own lookup cannot use; see
    docs/hits.md)."""
    spec = g.groups[index].spec
    return max(_cdiv(spec.sliding_window, chunk), _store_need(g, index, chunk))


def _holds_window(ends: set[int], b: int, chunk: int, need: int) -> bool:
    top = b // chunk
    return all((j + 1) * chunk in ends for j in range(max(top - need, 0), top))


def _promised(g: kvgeom.Geometry, index: int, storable: int, prompt: int, finished: bool) -> list[int]:
    """Boundaries (chunk-aligned, within the stored extent) the store mask of a sliding group promises."""
    off = g.offload
    og = next(o for o in off.groups if o.index == index)
    C, S = og.tokens_per_chunk, og.tokens_per_block
    align = off.alignment_tokens
    R = g.config.cache.retention_interval
    if align is None or align % S:
        return []  # dense: nothing is promised beyond "everything", checked by the window test anyway
    spec = g.groups[index].spec
    eagle = _eagle(g, index)
    need_blocks = _cdiv(spec.sliding_window - 1 + spec.extra_retained_tokens, S) + eagle
    extent = storable * C
    out = []
    segment = align if R is None else (R or None)
    if segment is not None:
        if need_blocks >= segment // S:
            out += range(C, extent + 1, C)  # the tails cover every segment: every chunk end
        else:
            out += range(segment, extent + 1, segment)
        if R is None and not eagle:  # an EAGLE group has no final tail
            horizon = storable if finished else (prompt // C if storable <= prompt // C else None)
            if horizon is not None and horizon <= storable:
                out.append(horizon * C)
    if R is not None and prompt > 0:
        out.append((prompt - 1) // align * align)
    # an EAGLE group's run ends one chunk past its boundary: that chunk must be stored too
    return [b for b in out if b > 0 and b + eagle * C <= extent and b % C == 0]


@example(g=EX2, prompt=100, finished=False)
@example(g=EX3, prompt=120, finished=False)
@example(g=EX1, prompt=230, finished=False)
@example(g=EX_EAGLE, prompt=200, finished=False)
@given(st.one_of(swa_geometries(), swa_geometries(eagle=True)), st.integers(0, 400), st.booleans())
def test_store_plan_keeps_every_promised_window(g, prompt, finished):
    plan = plan_store(g, num_tokens=prompt, num_computed_tokens=prompt, finished=finished)
    for gs in plan.groups:
        if g.groups[gs.index].family != "sliding":
            continue
        og = next(o for o in g.offload.groups if o.index == gs.index)
        C = og.tokens_per_chunk
        ends = set(gs.end_tokens)
        storable = prompt // C  # nothing stored before, everything computed, keys for every chunk
        need = _store_need(g, gs.index, C)
        eagle = _eagle(g, gs.index)  # EAGLE: the window plus the chunk past b, which the lookup pops
        for b in _promised(g, gs.index, storable, prompt, finished):
            assert _holds_window(ends, b + eagle * C, C, need + eagle), (gs.index, b, need, sorted(ends))


def _restorable(g: kvgeom.Geometry, tier: dict[int, set[int]], b: int) -> bool:
    """Every offloaded group holds what a hit ending at b needs (b a multiple of every chunk)."""
    for og in g.offload.groups:
        C = og.tokens_per_chunk
        grp = g.groups[og.index]
        ends = tier.get(og.index, set())
        if b % C:
            return False
        match grp.family:
            case "full":
                if not all((j + 1) * C in ends for j in range(b // C)):
                    return False
            case "sliding":
                if not _holds_window(ends, b, C, _lookup_need(g, og.index, C)):
                    return False
            case "chunked":
                if not _holds_window(ends, b, C, _cdiv(grp.spec.attention_chunk_size, C)):
                    return False
            case "mamba":
                if b not in ends:
                    return False
            case _:
                return False
    return True


@example(g=EX2, prompt=100, more=20)
@example(g=EX3, prompt=120, more=10)
@example(g=EX1, prompt=200, more=50)
@given(st.one_of(swa_geometries(), geometries(offload=True, max_dcp=1)), st.integers(1, 400), st.integers(0, 64))
def test_lookup_on_the_planned_tier_finds_every_stored_boundary(g, prompt, more):
    plan = plan_store(g, num_tokens=prompt, num_computed_tokens=prompt)
    tier = {gs.index: set(gs.end_tokens) for gs in plan.groups}
    m = prompt + more
    windowed = any(g.groups[og.index].family != "full" for og in g.offload.groups)
    top = m - 1 if windowed else m
    unit = math.lcm(*(og.tokens_per_chunk for og in g.offload.groups))
    best = max((b for b in range(unit, min(top, prompt) + 1, unit) if _restorable(g, tier, b)), default=0)
    hit = lookup_hit(g, m, stored={i: sorted(e) for i, e in tier.items()})
    assert hit.end_token >= best


@given(st.one_of(swa_geometries(), swa_geometries(eagle=True)), st.data())
def test_swa_store_plans_agree_with_plan_store(g, data):
    size = data.draw(st.integers(1, 5), label="requests")
    hi = 6 * max(og.tokens_per_chunk for og in g.offload.groups) + 40
    prompt = data.draw(st.lists(st.integers(0, hi), min_size=size, max_size=size), label="prompt")
    n = [p + data.draw(st.sampled_from([0, 0, data.draw(st.integers(0, hi))])) for p in prompt]
    computed = [x if data.draw(st.booleans()) else data.draw(st.integers(0, x)) for x in n]
    stored = {og.index: [data.draw(st.integers(0, x // og.tokens_per_chunk + 1)) for x in n]
              for og in g.offload.groups if data.draw(st.booleans())}
    fin = [data.draw(st.booleans()) for _ in n]
    opo = data.draw(st.booleans(), label="offload_prompt_only")
    mot = data.draw(st.none() | st.integers(0, hi), label="max_offload_tokens")
    batch = plan_stores(g, num_tokens=n, num_computed_tokens=computed, num_prompt_tokens=prompt,
                        stored_chunks=stored, finished=fin, offload_prompt_only=opo, max_offload_tokens=mot)
    for i in range(size):
        assert batch.plan(i) == plan_store(
            g, num_tokens=n[i], num_computed_tokens=computed[i], num_prompt_tokens=prompt[i],
            stored_chunks={gi: v[i] for gi, v in stored.items()}, finished=fin[i],
            offload_prompt_only=opo, max_offload_tokens=mot,
        )
