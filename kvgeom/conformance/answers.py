"""The questions the conformance checker asks an engine, and kvgeom's own answers to them.

An *answer sheet* is a flat, JSON-serialisable dict with one entry per question, so two sheets
(kvgeom's and an engine's) compare entry by entry. The questions, for a geometry and a scenario
(``num_tokens``, ``local_computed_tokens``, ``stored_tokens``, ``evict``):

* ``valid``: whether the geometry is accepted (kvgeom's sheets come from resolved geometries, so
  kvgeom always says True; an engine that rejects says False and gives ``error``);
* ``spans``, ``scheduler_block_size`` (L), ``hash_block_size`` (H), ``hit_alignment_tokens`` (A);
* ``offload.*``: blocks per chunk, tokens per hash, alignment tokens, the Mamba chunk, whether partial
  tails are on, the retention interval, and per offloaded group ``[index, tokens_per_block,
  tokens_per_chunk, hashes_per_chunk, window_chunks]``;
* ``keys``: per offloaded group, the ``[end_token, hash_index]`` of every key a request of
  ``num_tokens`` tokens has;
* ``hit_tokens`` and ``end_token`` of the offload lookup on a tier holding :func:`tier_contents`;
* ``load``: per group, the end tokens of the keys loaded and the first and number of block entries
  filled;
* ``mamba_state_after``: per align-mode Mamba group, the token count whose state the loaded Mamba key
  holds (the restored state boundary);
* ``prefix.hit_tokens`` and ``prefix.groups``: the GPU prefix-cache hit over the scenario's
  ``gpu_resident`` entries (:mod:`kvgeom.conformance.gpu_prefix`).

Invariant of kvgeom's sheet (the hit laws of ``tests/property``): ``mamba_state_after[g] ==
end_token`` for every align Mamba group that loads.

>>> import kvgeom
>>> g = kvgeom.resolve(kvgeom.DEFAULT_CONFIG)
>>> s = kvgeom_answers(g, {"num_tokens": 65, "local_computed_tokens": 0, "stored_tokens": 64, "evict": []})
>>> s["hit_tokens"], s["mamba_state_after"]
(64, {'1': 64})
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kvgeom._check import nonneg
from kvgeom.conformance.gpu_prefix import PREFIX_QUESTIONS, prefix_answers
from kvgeom.errors import QueryError
from kvgeom.geometry import Geometry
from kvgeom.hits import lookup_hit, plan_load
from kvgeom.keys import key_map, num_keys

__all__ = ["QUESTIONS", "SCENARIO_KEYS", "check_scenario", "kvgeom_answers", "tier_contents"]

SCENARIO_KEYS: tuple[str, ...] = ("num_tokens", "local_computed_tokens", "stored_tokens", "evict", "gpu_resident")
"""The keys of a conformance scenario (only ``num_tokens`` is required; ``gpu_resident``, the GPU
prefix cache's entries per group, see :mod:`kvgeom.conformance.gpu_prefix`)."""

QUESTIONS: tuple[str, ...] = (
    "valid",
    "spans",
    "scheduler_block_size",
    "hash_block_size",
    "hit_alignment_tokens",
    "offload.blocks_per_chunk",
    "offload.tokens_per_hash",
    "offload.alignment_tokens",
    "offload.mamba_align_size",
    "offload.supports_partial_tail",
    "offload.retention_interval",
    "offload.groups",
    "keys",
    "hit_tokens",
    "end_token",
    "load",
    "mamba_state_after",
    *PREFIX_QUESTIONS,
)
"""Every entry of an answer sheet, in the order differences are reported."""


def check_scenario(scenario: Any) -> dict[str, Any]:
    """The scenario with defaults filled in (``local_computed_tokens`` 0, ``stored_tokens`` =
    ``num_tokens``, ``evict`` empty); :class:`kvgeom.QueryError` for anything else than a mapping of
    :data:`SCENARIO_KEYS` with token counts >= 0, a local prefix within the request, and a list of
    booleans for ``evict``.

    >>> check_scenario({"num_tokens": 80})
    {'num_tokens': 80, 'local_computed_tokens': 0, 'stored_tokens': 80, 'evict': []}
    """
    if not isinstance(scenario, Mapping):
        raise QueryError.single("bad_scenario", f"a scenario is a mapping, got {type(scenario).__name__}", "")
    unknown = sorted(set(scenario) - set(SCENARIO_KEYS))
    if unknown:
        raise QueryError.single(
            "unknown_key", f"unknown scenario key(s) {unknown}; allowed: {list(SCENARIO_KEYS)}", str(unknown[0])
        )
    if "num_tokens" not in scenario:
        raise QueryError.single("missing_field", "a scenario needs num_tokens", "num_tokens")
    n = nonneg("num_tokens", scenario["num_tokens"])
    local = nonneg("local_computed_tokens", scenario.get("local_computed_tokens", 0))
    if local > n:
        raise QueryError.single(
            "local_past_request", f"local_computed_tokens={local} exceeds num_tokens={n}", "local_computed_tokens"
        )
    stored = nonneg("stored_tokens", scenario.get("stored_tokens", n))
    evict = scenario.get("evict", [])
    if isinstance(evict, str | bytes) or not isinstance(evict, list | tuple) or not all(
        isinstance(x, bool) for x in evict
    ):
        raise QueryError.single("bad_evict", "evict must be a list of booleans (true: that key was lost)", "evict")
    out = {"num_tokens": n, "local_computed_tokens": local, "stored_tokens": stored, "evict": list(evict)}
    resident = scenario.get("gpu_resident")
    if resident is not None:
        if not isinstance(resident, Mapping):
            raise QueryError.single(
                "bad_resident", "gpu_resident must map a group index to the end tokens it holds", "gpu_resident"
            )
        out["gpu_resident"] = resident  # checked against the geometry by gpu_prefix.check_resident
    return out


def tier_contents(geom: Geometry, scenario: Mapping[str, Any]) -> dict[int, list[int]]:
    """The keys the offload tier holds for the scenario, per offloaded group, as end tokens.

    A previous request sharing the prefix stored every complete chunk of each offloaded group up to
    ``stored_tokens`` (and within ``num_tokens``, the part of the chain the new request shares); then
    the tier lost the keys whose flag in ``evict`` is true, counted in ``(group, end_token)`` order
    (missing flags mean kept).

    >>> import kvgeom
    >>> g = kvgeom.resolve(kvgeom.DEFAULT_CONFIG)
    >>> tier_contents(g, {"num_tokens": 80, "stored_tokens": 64, "evict": [False, True]})
    {0: [32], 1: [16, 32, 48, 64]}
    """
    sc = check_scenario(scenario)
    if geom.offload is None:
        return {}
    n = sc["num_tokens"]
    stored = min(sc["stored_tokens"], n)
    evict = sc["evict"]
    out: dict[int, list[int]] = {}
    i = 0
    for og in geom.offload.groups:
        held = []
        for j in range(min(num_keys(geom, og.index, n), stored // og.tokens_per_chunk)):
            gone = i < len(evict) and evict[i]
            i += 1
            if not gone:
                held.append((j + 1) * og.tokens_per_chunk)
        out[og.index] = held
    return out


def _geometry_answers(geom: Geometry) -> dict[str, Any]:
    sheet: dict[str, Any] = {
        "valid": True,
        "spans": [g.span for g in geom.groups if g.family != "encoder"],  # the groups the scheduler sees
        "scheduler_block_size": geom.scheduler_block_size,
        "hash_block_size": geom.hash_block_size,
        "hit_alignment_tokens": geom.hit_alignment_tokens,
    }
    off = geom.offload
    if off is not None:
        sheet.update(
            {
                "offload.blocks_per_chunk": off.blocks_per_chunk,
                "offload.tokens_per_hash": off.tokens_per_hash,
                "offload.alignment_tokens": off.alignment_tokens,
                "offload.mamba_align_size": off.mamba_align_size,
                "offload.supports_partial_tail": off.supports_partial_tail,
                "offload.retention_interval": off.retention_interval,
                "offload.groups": [
                    [og.index, og.tokens_per_block, og.tokens_per_chunk, og.hashes_per_chunk, og.window_chunks]
                    for og in off.groups
                ],
            }
        )
    return sheet


def kvgeom_answers(geom: Geometry, scenario: Mapping[str, Any]) -> dict[str, Any]:
    """kvgeom's answer sheet for ``geom`` and ``scenario`` (see the module docstring)."""
    scenario = check_scenario(scenario)
    sheet = _geometry_answers(geom)
    sheet.update(prefix_answers(geom, scenario))
    if geom.offload is None:
        return sheet
    n = scenario["num_tokens"]
    km = key_map(geom, n)
    sheet["keys"] = {
        str(g["index"]): [[k["end_token"], k["hash_index"]] for k in g["keys"]] for g in km["groups"]
    }
    hit = lookup_hit(
        geom,
        n,
        stored=tier_contents(geom, scenario),
        local_computed_tokens=scenario["local_computed_tokens"],
    )
    sheet["hit_tokens"] = hit.hit_tokens
    sheet["end_token"] = hit.end_token
    load: dict[str, Any] = {}
    state: dict[str, int] = {}
    if hit.hit_tokens:
        for gl in plan_load(geom, hit):
            entries = list(gl.block_entries)
            load[str(gl.index)] = {
                "keys": list(gl.load_keys),
                "first_entry": entries[0] if entries else None,
                "num_entries": len(entries),
            }
            if geom.groups[gl.index].is_align_mamba and gl.load_keys:
                state[str(gl.index)] = gl.load_keys[-1]
    sheet["load"] = load
    sheet["mamba_state_after"] = state
    return sheet
