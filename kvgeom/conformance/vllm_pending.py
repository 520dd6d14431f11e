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

Import this module only where vLLM is installed. Run the sweep with
``python -m kvgeom.conformance.vllm_pending --cases N --seed S``.
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

__all__ = ["ANSWERS", "TriStateTier", "classify", "kvgeom_pending_hit", "random_case", "sweep", "vllm_pending_hit"]

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
    chain = len(request.block_hashes)
    return TriStateTier({vo.offload_key(request, int(g), int(e), H): ANSWERS[a]
                         for g, ends in answers.items() for e, a in ends.items() if 0 < int(e) // H <= chain})


def _sizes(geom: Geometry) -> tuple[int, int]:
    L, H = resolve_kv_cache_block_sizes(vo.build_kv_cache_config(geom), vo.build_vllm_config(geom))
    return int(L), int(H)


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
    vc = vo.build_vllm_config(geom)
    kcc = vo.build_kv_cache_config(geom)
    L, H = resolve_kv_cache_block_sizes(kcc, vc)
    # as the engine core sets them before the connector is built (v1/engine/core.py): the connector's
    # partial-tail proof margins read the hit alignment
    kcc.hash_block_size = H
    kcc.cache_hit_alignment_tokens = resolve_cache_hit_alignment_tokens(kcc, vc, L, H)
    request = vo.build_request(num_tokens, H)
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
    if any(w.code == "chunked_local_block_mismatch" for w in geom.warnings):
        return "chunked-local-mixed-blocks"
    Cm = off.mamba_align_size
    if not Cm:
        return None
    if ours is not None and theirs is not None:
        end = local - local % geom.scheduler_block_size + theirs
        return "realign-after-clamp" if end % Cm and ours < theirs else None
    finer = any(og.tokens_per_chunk < Cm and Cm % og.tokens_per_chunk == 0 for og in off.groups)
    return "realign-after-clamp" if finer else None


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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    report = sweep(args.cases, args.seed)
    print(f"cases {report['cases']}: kvgeom refused {report['kvgeom_refused']}, compared {report['compared']} "
          f"(vLLM deferred {report['deferred']}), agree {report['agree']}")
    for cfg, num, local, answers, ours, theirs, cls in report["differences"]:
        unsettled = {g: {e: a for e, a in ends.items() if a != "hit"} for g, ends in answers.items()}
        print(f"  [{cls}] {cfg} n={num} local={local} non-hits={unsettled}: kvgeom={ours} vllm={theirs}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
