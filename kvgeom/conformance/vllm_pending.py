"""vLLM 0.33's offload lookup over a tier that answers "pending" (needs an installed vLLM).

An offload manager's ``lookup`` answers each key with one of four ``LookupResult`` values: ``HIT``,
``MISS``, ``HIT_PENDING`` (held, not readable yet) or ``RETRY`` (location unknown). :func:`vllm_pending_hit`
asks vLLM's own ``OffloadingConnectorScheduler.get_num_new_matched_tokens`` (``_lookup`` and
``_lookup_complete_chunks`` with ``_maximal_prefix_lookup`` / ``_sliding_window_lookup``) for one
request over a :class:`TriStateTier` answering exactly the chosen keys; :func:`kvgeom_pending_hit` asks
:func:`kvgeom.hits.lookup_hit` over the same tier object. Both answer the hit in tokens past the local
prefix, or None where the request is deferred (vLLM: ``None``; kvgeom: ``lookup_not_ready``).

Stand-ins (everything else is vLLM's code, built by :mod:`kvgeom.conformance.vllm_objects`, with the
``KVCacheConfig``'s ``hash_block_size`` and ``cache_hit_alignment_tokens`` set as vLLM's engine core sets
them before the connector is built): the tier
(:class:`TriStateTier`: ``answers`` maps an offload key to its ``LookupResult``, every other key is a
``MISS``) and the request (:func:`kvgeom.conformance.vllm_objects.build_request`). Nothing is being
loaded, so the connector's "a hit chunk is already being loaded" delay never applies.

:func:`vllm_pending_trace` and :func:`kvgeom_pending_trace` answer the keys each side asks the tier, in
order, with each key's answer; :func:`trace_sweep` compares them over :func:`random_trace_case` cases (partial
tails with eagle proof margins, load and new-token caps besides :func:`random_case`'s windowed hybrids).

Import this module only where vLLM is installed. Run the sweeps with
``python -m kvgeom.conformance.vllm_pending --cases N --seed S [--traces]``.
"""

from __future__ import annotations

import argparse
import random
from collections.abc import Mapping
from typing import Any

from vllm.v1.core.kv_cache_utils import resolve_cache_hit_alignment_tokens, resolve_kv_cache_block_sizes
from vllm.v1.kv_offload.base import LookupResult, OffloadKey, ReqContext

from kvgeom._resolve import resolve
from kvgeom.conformance import vllm_objects as vo
from kvgeom.errors import KVGeomError, QueryError
from kvgeom.geometry import Geometry

__all__ = [
    "ANSWERS",
    "TriStateTier",
    "classify",
    "classify_trace",
    "kvgeom_pending_hit",
    "kvgeom_pending_trace",
    "random_case",
    "random_trace_case",
    "sweep",
    "trace_sweep",
    "vllm_pending_hit",
    "vllm_pending_trace",
]

ANSWERS: dict[str, LookupResult] = {
    "hit": LookupResult.HIT,
    "pending": LookupResult.HIT_PENDING,
    "retry": LookupResult.RETRY,
    "miss": LookupResult.MISS,
}
"""The answer names a case uses, and vLLM's ``LookupResult`` for each."""


class TriStateTier(vo.ChosenTier):
    """A tier answering ``answers[key]`` for the keys it was given and ``MISS`` for every other key."""

    def __init__(self, answers: Mapping[bytes, LookupResult] | None = None) -> None:
        super().__init__()
        self.answers: dict[bytes, LookupResult] = dict(answers or {})

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        return self.answers.get(bytes(key), LookupResult.MISS)


def _tier(geom: Geometry, request: Any, answers: Mapping[str, Mapping[int, str]], H: int) -> TriStateTier:
    # an end token off the hash grid names no key (it would alias the key below it)
    chain = len(request.block_hashes)
    return TriStateTier({vo.offload_key(request, int(g), int(e), H): ANSWERS[a]
                         for g, ends in answers.items() for e, a in ends.items()
                         if 0 < int(e) // H <= chain and int(e) % H == 0})


def _sizes(geom: Geometry) -> tuple[int, int]:
    L, H = resolve_kv_cache_block_sizes(vo.build_kv_cache_config(geom), vo.build_vllm_config(geom))
    return int(L), int(H)


def _engine_setup(geom: Geometry, num_tokens: int) -> tuple[Any, Any, int, int, Any]:
    """vLLM's config and KV cache config for ``geom`` (hash unit and hit alignment set as the engine core sets
    them before the connector is built, v1/engine/core.py: the connector's partial-tail proof margins read the
    hit alignment), its block and hash sizes L and H, and a ``num_tokens``-token request hashed at H."""
    vc = vo.build_vllm_config(geom)
    kcc = vo.build_kv_cache_config(geom)
    L, H = resolve_kv_cache_block_sizes(kcc, vc)
    kcc.hash_block_size = H
    kcc.cache_hit_alignment_tokens = resolve_cache_hit_alignment_tokens(kcc, vc, L, H)
    return vc, kcc, L, H, vo.build_request(num_tokens, H)


def vllm_pending_hit(geom: Geometry, num_tokens: int, answers: Mapping[str, Mapping[int, str]], *,
                     local_computed_tokens: int = 0) -> int | None:
    """vLLM's ``get_num_new_matched_tokens`` for a ``num_tokens`` request whose keys answer ``answers``
    (``{"<group>": {end_token: "hit" | "pending" | "retry" | "miss"}}``; unlisted keys miss), asked from
    the local prefix rounded down to L. None: vLLM defers the request.

    >>> import kvgeom
    >>> g = kvgeom.resolve({"groups": [{"kind": "full_attention", "block_size": 16},
    ...     {"kind": "sliding_window", "block_size": 16, "sliding_window": 32}], "offload": {},
    ...     "cache": {"retention_interval": None}})
    >>> every = {e: "hit" for e in range(16, 193, 16)}
    >>> vllm_pending_hit(g, 200, {"0": every, "1": {**every, 192: "pending", 176: "miss"}})  # the miss cancels it
    160
    >>> vllm_pending_hit(g, 200, {"0": every, "1": {**every, 176: "pending"}}) is None  # pending inside the run
    True
    """
    vc, kcc, L, H, request = _engine_setup(geom, num_tokens)
    sched = vo.build_scheduler(geom, _tier(geom, request, answers, H), vllm_config=vc, kv_cache_config=kcc)
    sched.on_new_request(request)
    hit, _ = sched.get_num_new_matched_tokens(request, local_computed_tokens - local_computed_tokens % L)
    return None if hit is None else int(hit)


def kvgeom_pending_hit(geom: Geometry, num_tokens: int, answers: Mapping[str, Mapping[int, str]], *,
                       local_computed_tokens: int = 0) -> int | None:
    """:func:`kvgeom.hits.lookup_hit` over the same :class:`TriStateTier` (the request's own hash chain as
    ``block_hashes``); None where it raises ``lookup_not_ready``.

    >>> import kvgeom
    >>> g = kvgeom.resolve({"groups": [{"kind": "full_attention", "block_size": 16},
    ...     {"kind": "sliding_window", "block_size": 16, "sliding_window": 32}], "offload": {},
    ...     "cache": {"retention_interval": None}})
    >>> every = {e: "hit" for e in range(16, 193, 16)}
    >>> kvgeom_pending_hit(g, 200, {"0": every, "1": {**every, 192: "pending", 176: "miss"}})
    160
    """
    from kvgeom.hits import lookup_hit

    _, H = _sizes(geom)
    request = vo.build_request(num_tokens, H)
    tier = _tier(geom, request, answers, H)
    try:
        hit = lookup_hit(geom, num_tokens, stored=tier, block_hashes=[bytes(h) for h in request.block_hashes],
                         local_computed_tokens=local_computed_tokens)
    except QueryError as e:
        if e.code == "lookup_not_ready":
            return None
        raise
    return hit.hit_tokens


_NAMES = {v: k for k, v in ANSWERS.items()}


class _RecordingTier(TriStateTier):
    """A :class:`TriStateTier` that records every key it is asked, in order, as ``[group, end_token, answer]``
    (the key's block hash located in the request's hash chain; -1 for a key outside it)."""

    def __init__(self, answers: Mapping[bytes, LookupResult], chain: Mapping[bytes, int], H: int) -> None:
        super().__init__(answers)
        self.chain, self.H = chain, H
        self.calls: list[list[Any]] = []

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        from kvgeom.residency import split_offload_key

        answer = super().lookup(key, req_context)
        block_hash, group = split_offload_key(bytes(key))
        index = self.chain.get(block_hash)
        self.calls.append([group, -1 if index is None else (index + 1) * self.H, _NAMES[answer]])
        return answer


def vllm_pending_trace(geom: Geometry, num_tokens: int, answers: Mapping[str, Mapping[int, str]], *,
                       local_computed_tokens: int = 0, max_load_tokens: int | None = None,
                       max_num_new_tokens: int | None = None) -> dict[str, Any]:
    """Every key vLLM 0.33's ``get_num_new_matched_tokens`` asks the offload manager's ``lookup`` for, in
    order, over a tier answering ``answers`` (as :func:`vllm_pending_hit`; ``max_load_tokens`` as the
    request's ``kv_transfer_params``, ``max_num_new_tokens`` as the scheduler passes it):
    ``{"hit": tokens or None (deferred), "probes": [[group, end_token, answer], ...]}``.

    >>> import kvgeom
    >>> g = kvgeom.resolve({"groups": [{"kind": "full_attention", "block_size": 16},
    ...     {"kind": "sliding_window", "block_size": 16, "sliding_window": 32}], "offload": {},
    ...     "cache": {"retention_interval": None}})
    >>> t = vllm_pending_trace(g, 70, {"0": {16: "hit", 32: "pending"}, "1": {64: "hit", 48: "hit"}})
    >>> t["hit"], t["probes"]  # full attention defers at 32; the window's run 48-64 lowers nothing: deferred
    (None, [[0, 16, 'hit'], [0, 32, 'pending'], [0, 48, 'miss'], [1, 64, 'hit'], [1, 48, 'hit']])
    """
    vc, kcc, L, H, request = _engine_setup(geom, num_tokens)
    if max_load_tokens is not None:
        request.kv_transfer_params = {"max_load_tokens": max_load_tokens}
    chain = {bytes(h): i for i, h in enumerate(request.block_hashes)}
    tier = _RecordingTier(_tier(geom, request, answers, H).answers, chain, H)
    sched = vo.build_scheduler(geom, tier, vllm_config=vc, kv_cache_config=kcc)
    sched.on_new_request(request)
    hit, _ = sched.get_num_new_matched_tokens(request, local_computed_tokens - local_computed_tokens % L,
                                              max_num_new_tokens)
    return {"hit": None if hit is None else int(hit), "probes": tier.calls}


def kvgeom_pending_trace(geom: Geometry, num_tokens: int, answers: Mapping[str, Mapping[int, str]], *,
                         local_computed_tokens: int = 0, max_load_tokens: int | None = None,
                         max_num_new_tokens: int | None = None) -> dict[str, Any]:
    """:func:`kvgeom.hits.lookup_trace` over the same tier, in :func:`vllm_pending_trace`'s shape (each key's
    answer read back from the tier's own record of the same calls); where kvgeom raises ``lookup_not_ready``
    the hit is None and the keys are the error's ``probes``. ``asked``: every key the tier was asked, in the
    same shape: ``probes`` itself, each key once per time the walk asks it, where the settled walk and the walk by
    vLLM's rules agree on the settled answers before the first unsettled one (:class:`kvgeom.probes.Tape`)."""
    from kvgeom.hits import lookup_trace

    _, H = _sizes(geom)
    request = vo.build_request(num_tokens, H)
    chain = {bytes(h): i for i, h in enumerate(request.block_hashes)}
    tier = _RecordingTier(_tier(geom, request, answers, H).answers, chain, H)
    hit: int | None
    try:
        trace = lookup_trace(geom, num_tokens, stored=tier, block_hashes=[bytes(h) for h in request.block_hashes],
                             local_computed_tokens=local_computed_tokens, max_load_tokens=max_load_tokens,
                             max_num_new_tokens=max_num_new_tokens)
        hit, probes = trace.hit.hit_tokens, trace.probes
    except QueryError as e:
        if e.code != "lookup_not_ready":
            raise
        hit, probes = None, e.probes
    # the trace lists the last len(probes) calls the tier saw: read their answers back from it
    seen = tier.calls[len(tier.calls) - len(probes):] if probes else []
    assert [[p.group, p.end_token] for p in probes] == [c[:2] for c in seen], "the trace is not the tier's record"
    return {"hit": hit, "probes": seen, "asked": tier.calls}


def random_case(rng: random.Random) -> tuple[dict[str, Any], int, int, dict[str, dict[int, str]]]:
    """One random ``(config, num_tokens, local_computed_tokens, answers)``: full attention (optional) with
    sliding-window, Mamba or chunked-local groups, EAGLE drafters one time in three, 1-2 blocks per chunk,
    ``prefix_match_unit`` sometimes 8; every key of the request held, then a few turned into misses,
    pending or retried keys (near the top, where the lookups look)."""
    fa = rng.choice([8, 16])
    groups: list[dict[str, Any]] = []
    if rng.random() < 0.85:
        groups.append({"kind": "full_attention", "block_size": fa})
    for _ in range(rng.randint(1, 2)):
        kind = rng.choice(["sliding_window", "sliding_window", "mamba", "chunked_local"])
        g: dict[str, Any] = {"kind": kind, "block_size": rng.choice([8, 16])}
        if kind == "sliding_window":
            g["sliding_window"] = rng.choice([1, 8, 17, 32, 48])
        elif kind == "chunked_local":
            g["attention_chunk_size"] = 32
        elif kind == "mamba":
            g["mamba_cache_mode"] = "align"
        groups.append(g)
    cfg: dict[str, Any] = {"groups": groups, "cache": {"retention_interval": None}, "offload": {}}
    if rng.random() < 0.3:
        cfg["offload"] = {"blocks_per_chunk": 2}
    if rng.random() < 0.3:
        cfg["cache"]["prefix_match_unit"] = 8
    attention = [i for i, g in enumerate(groups) if g["kind"] != "mamba"]
    if attention and rng.random() < 0.33:
        groups[rng.choice(attention)]["drafter"] = True
        cfg["speculative"] = {"method": "eagle", "num_speculative_tokens": 1}
    n = rng.randint(24, 160)
    local = rng.choice([0, 0, 0, rng.randint(0, n)])
    answers: dict[str, dict[int, str]] = {str(i): {e: "hit" for e in range(8, n + 1, 8)} for i in range(len(groups))}
    for _ in range(rng.randint(1, 5)):
        g_ends = answers[str(rng.randrange(len(groups)))]
        e = max(8, n // 8 * 8 - 8 * int(rng.expovariate(0.25)))
        g_ends[e] = rng.choice(["miss", "miss", "pending", "pending", "retry"])
    return cfg, n, local, answers


def random_trace_case(rng: random.Random) -> tuple[dict[str, Any], int, int, dict[str, Any], dict[str, dict[int, str]]]:
    """One random ``(config, num_tokens, local_computed_tokens, caps, answers)`` for :func:`trace_sweep`: one
    draw in three is :func:`random_case`'s (windowed hybrids); the rest are full attention alone or beside an
    align Mamba group of the same block (the partial-tail geometries, with ``prefix_match_unit`` 4 or 8 below
    the block), a second full-attention group sometimes, an EAGLE drafter on a full-attention group one time in
    two (K 1 or 2: the partial-tail proof margin). ``caps``: ``max_load_tokens`` / ``max_num_new_tokens`` one
    time in five each. Every key held, a few turned into misses, pending or retried keys near the top or at
    the bridge chunk past the complete hit."""
    caps: dict[str, Any] = {}
    if rng.random() < 1 / 3:
        cfg, n, local, answers = random_case(rng)
    else:
        block = rng.choice([16, 16, 32])
        groups: list[dict[str, Any]] = [{"kind": "full_attention", "block_size": block}]
        if rng.random() < 0.4:
            groups.append({"kind": "full_attention", "block_size": block, "num_kv_heads": 4})
        if rng.random() < 0.8:
            groups.insert(rng.randrange(len(groups) + 1), {"kind": "mamba", "block_size": block,
                                                            "mamba_cache_mode": "align"})
        cfg = {"groups": groups, "cache": {"retention_interval": None}, "offload": {}}
        if rng.random() < 0.8:
            cfg["cache"]["prefix_match_unit"] = rng.choice([4, 8])
        attention = [i for i, g in enumerate(groups) if g["kind"] != "mamba"]
        if rng.random() < 0.5:
            groups[rng.choice(attention)]["drafter"] = True
            cfg["speculative"] = {"method": "eagle", "num_speculative_tokens": rng.choice([1, 2])}
        H = cfg["cache"].get("prefix_match_unit", block)
        n = rng.randint(8, 160)
        local = rng.choice([0, 0, 0, rng.randint(0, n)])
        answers = {str(i): {e: "hit" for e in range(H, n + 1, H)} for i in range(len(groups))}
        for _ in range(rng.randint(1, 6)):
            g_ends = answers[str(rng.randrange(len(groups)))]
            if not g_ends:
                continue
            e = rng.choice(list(g_ends)) if rng.random() < 0.5 else max(H, n // H * H - H * int(rng.expovariate(0.3)))
            g_ends[e] = rng.choice(["miss", "miss", "pending", "pending", "retry"])
    if rng.random() < 0.2:
        caps["max_load_tokens"] = rng.randint(0, n)
    if rng.random() < 0.2:
        caps["max_num_new_tokens"] = rng.randint(0, n)
    return cfg, n, local, caps, answers


def classify(geom: Geometry, local: int, ours: int | None, theirs: int | None) -> str | None:
    """The registered deviation (:data:`kvgeom.deviations.DEVIATIONS` id) behind a difference, or None (a new
    finding):

    * ``realign-after-clamp``: vLLM's hit ends off an align Mamba group's chunk, which kvgeom re-aligns to;
      or one side defers and the geometry has a group whose chunk is finer than the Mamba chunk, so vLLM's
      candidate (not re-aligned) can sit off the Mamba grid and ask a key kvgeom's re-aligned one never asks;
    * ``chunked-local-mixed-blocks``: a chunked-local group whose block is not the hit alignment (vLLM 0.33
      refuses such a geometry in the real engine; kvgeom answers with a fixed window of
      ``cdiv(attention_chunk_size, C)`` chunks).
    """
    off = geom.offload
    if off is None:
        return None
    Cm = off.mamba_align_size
    if ours is None or theirs is None or not Cm or any(w.code == "chunked_local_block_mismatch" for w in geom.warnings):
        return classify_trace(geom)  # one side defers: the geometry's rule, as for traces
    end = local - local % geom.scheduler_block_size + theirs
    return "realign-after-clamp" if end % Cm and ours < theirs else None


def sweep(n: int, seed: int) -> dict[str, Any]:
    """``n`` :func:`random_case` cases through both sides: ``{"cases", "kvgeom_refused", "compared",
    "deferred", "agree", "differences": [(cfg, n, local, answers, kvgeom, vllm, class)]}`` (class: see
    :func:`classify`)."""
    rng = random.Random(seed)
    report: dict[str, Any] = {"cases": n, "kvgeom_refused": 0, "compared": 0, "deferred": 0, "agree": 0,
                              "differences": []}
    for _ in range(n):
        cfg, num, local, answers = random_case(rng)
        try:
            geom = resolve(cfg)
            ours = kvgeom_pending_hit(geom, num, answers, local_computed_tokens=local)
        except KVGeomError:
            report["kvgeom_refused"] += 1
            continue
        theirs = vllm_pending_hit(geom, num, answers, local_computed_tokens=local)
        report["compared"] += 1
        report["deferred"] += theirs is None
        if ours == theirs:
            report["agree"] += 1
        else:
            report["differences"].append((cfg, num, local, answers, ours, theirs, classify(geom, local, ours, theirs)))
    return report


def classify_trace(geom: Geometry) -> str | None:
    """The registered deviation that can make a geometry's traces (:func:`kvgeom_pending_trace`,
    :func:`vllm_pending_trace`) differ, or None (a difference is then a new finding): ``realign-after-clamp``
    where the geometry has an align Mamba group and a group whose chunk is finer than the Mamba chunk (vLLM's
    candidate, not re-aligned, can sit off the Mamba grid, ask keys kvgeom's re-aligned one never asks and end
    its hit there); ``chunked-local-mixed-blocks`` as :func:`classify` says."""
    if any(w.code == "chunked_local_block_mismatch" for w in geom.warnings):
        return "chunked-local-mixed-blocks"
    off = geom.offload
    Cm = off.mamba_align_size if off is not None else None
    if not Cm or off is None:
        return None
    finer = any(og.tokens_per_chunk < Cm and Cm % og.tokens_per_chunk == 0 for og in off.groups)
    return "realign-after-clamp" if finer else None


def trace_sweep(n: int, seed: int) -> dict[str, Any]:
    """``n`` :func:`random_trace_case` cases through both sides, comparing hits and the keys asked (group, end
    token and answer, in order): ``{"cases", "kvgeom_refused", "compared", "unsettled", "deferred",
    "hit_differs", "trace_differs", "asked", "vllm_asked", "asked_differs", "differences": [(cfg, n, local, caps,
    answers, kvgeom, vllm, class)]}`` (``unsettled``: cases where vLLM was answered HIT_PENDING or RETRY for a key it
    asked; ``asked`` / ``vllm_asked``: the tier's ``lookup`` calls over all compared cases, kvgeom's and vLLM's;
    ``asked_differs``: cases outside ``differences`` where the keys the tier saw from kvgeom are not vLLM's keys, in
    order; class: :func:`classify_trace`)."""
    rng = random.Random(seed)
    report: dict[str, Any] = {"cases": n, "kvgeom_refused": 0, "compared": 0, "unsettled": 0, "deferred": 0,
                              "hit_differs": 0, "trace_differs": 0, "asked": 0, "vllm_asked": 0, "asked_differs": 0,
                              "differences": []}
    for _ in range(n):
        cfg, num, local, caps, answers = random_trace_case(rng)
        try:
            geom = resolve(cfg)
            ours = kvgeom_pending_trace(geom, num, answers, local_computed_tokens=local, **caps)
        except KVGeomError:
            report["kvgeom_refused"] += 1
            continue
        theirs = vllm_pending_trace(geom, num, answers, local_computed_tokens=local, **caps)
        report["compared"] += 1
        report["unsettled"] += any(a in ("pending", "retry") for _, _, a in theirs["probes"])
        report["deferred"] += theirs["hit"] is None
        report["hit_differs"] += ours["hit"] != theirs["hit"]
        report["asked"] += len(ours["asked"])
        report["vllm_asked"] += len(theirs["probes"])
        if ours["hit"] != theirs["hit"] or ours["probes"] != theirs["probes"]:
            report["trace_differs"] += 1
            report["differences"].append((cfg, num, local, caps, answers, ours, theirs,
                                          classify_trace(geom)))
        elif ours["asked"] != theirs["probes"]:
            report["asked_differs"] += 1
    return report


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--traces", action="store_true", help="compare the keys asked (trace_sweep), not the hits")
    args = ap.parse_args(argv)
    if args.traces:
        traces = trace_sweep(args.cases, args.seed)
        print(f"cases {traces['cases']}: kvgeom refused {traces['kvgeom_refused']}, compared {traces['compared']} "
              f"(vLLM met a pending or retried key {traces['unsettled']}, deferred {traces['deferred']}), "
              f"hits differ {traces['hit_differs']}, traces differ {traces['trace_differs']}; tier lookups: kvgeom "
              f"{traces['asked']}, vLLM {traces['vllm_asked']}, other keys than vLLM's {traces['asked_differs']}")
        for cfg, num, local, caps, answers, ours, theirs, cls in traces["differences"]:
            unsettled = {g: {e: a for e, a in ends.items() if a != "hit"} for g, ends in answers.items()}
            print(f"  [{cls}] {cfg} n={num} local={local} caps={caps} non-hits={unsettled}:\n"
                  f"    kvgeom {ours['hit']} {ours['probes']}\n    vllm   {theirs['hit']} {theirs['probes']}")
        return 0
    report = sweep(args.cases, args.seed)
    print(f"cases {report['cases']}: kvgeom refused {report['kvgeom_refused']}, compared {report['compared']} "
          f"(vLLM deferred {report['deferred']}), agree {report['agree']}")
    for cfg, num, local, answers, ours, theirs, cls in report["differences"]:
        unsettled = {g: {e: a for e, a in ends.items() if a != "hit"} for g, ends in answers.items()}
        print(f"  [{cls}] {cfg} n={num} local={local} non-hits={unsettled}: kvgeom={ours} vllm={theirs}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
