"""A request's admission: the GPU prefix-cache hit, then the connector's, combined as vLLM 0.33's
Scheduler combines them (``v1/core/sched/scheduler.py``, ``Scheduler.schedule`` where a waiting
request calls ``get_computed_blocks`` and the connector's ``get_num_new_matched_tokens``).

1. The local hit is :func:`kvgeom.prefix.prefix_hit` of the resident entries.
2. The connector is asked from the local hit rounded down to the scheduler block L
   (:func:`kvgeom.hits.lookup_hit`) and answers the tokens it can load past that.
3. Local hit a multiple of L: the answer stands. Otherwise the load runs only when it reaches
   strictly past the unrounded local hit (the local tail block is dropped and the load covers
   it); else the local hit is kept and nothing is loaded.

Invariants (``tests/property/test_prefix_laws.py``): ``local + external <= num_tokens``;
``external > 0`` implies the loads start at a multiple of L and end past the local hit;
``external == 0`` implies no group loads anything; the values agree with the token-accurate
simulator (:func:`kvgeom.sim.run_request`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kvgeom._check import scenario as check_scenario
from kvgeom.errors import QueryError
from kvgeom.geometry import Geometry
from kvgeom.hits import GroupLoad, Hit, lookup_hit, plan_load
from kvgeom.prefix import PrefixHit, prefix_hit, scheduler_keeps_load

__all__ = ["RequestPlan", "plan_request"]


@dataclass(frozen=True, slots=True)
class RequestPlan:
    """What the Scheduler hands to slot allocation for a new request."""

    local: PrefixHit
    """The GPU prefix-cache lookup as it came back (before a connector load can drop its tail)."""
    local_hit_tokens: int
    external_hit_tokens: int
    hit: Hit | None
    """The connector's lookup (None without an offload section)."""
    groups: tuple[GroupLoad, ...]
    """Loads the Scheduler runs (empty loads when ``external_hit_tokens == 0``)."""

    def to_dict(self) -> dict[str, Any]:
        """The stable ``plan_request`` contract."""
        return {
            "local_hit_tokens": self.local_hit_tokens,
            "external_hit_tokens": self.external_hit_tokens,
            "groups": [g.to_dict() for g in self.groups],
        }


_ALLOWED = {"num_tokens", "num_prompt_tokens", "resident", "stored", "max_load_tokens", "max_num_new_tokens"}


def plan_request(geom: Geometry, scenario: Mapping[str, Any]) -> RequestPlan:
    """Local and external hit of a request as the Scheduler admits it.

    ``scenario``: ``num_tokens``, optional ``num_prompt_tokens``, ``resident``
    (``{"<group>": [end tokens]}`` on the GPU), ``stored`` (``{"<group>": [end tokens]}`` in the
    offload tier), ``max_load_tokens``, ``max_num_new_tokens``; unknown keys are an error.
    ``stored`` needs an offload section.

    Postconditions: ``local_hit_tokens + external_hit_tokens <= num_tokens``; with
    ``external_hit_tokens > 0`` the local hit is a multiple of L; loads are empty exactly when
    ``external_hit_tokens == 0``.

    >>> import kvgeom
    >>> g = kvgeom.resolve(kvgeom.DEFAULT_CONFIG)        # L = 32, H = 16
    >>> sc = {"num_tokens": 100, "resident": {"0": [32, 48], "1": [48]}, "stored": {"0": [32, 64], "1": [64]}}
    >>> p = plan_request(g, sc).to_dict(); p["local_hit_tokens"], p["external_hit_tokens"]
    (32, 32)
    """
    check_scenario(scenario, _ALLOWED)
    n = scenario["num_tokens"]
    local = prefix_hit(geom, n, scenario.get("resident", {}))
    if geom.offload is None:
        if scenario.get("stored"):
            raise QueryError.single(
                "no_offload",
                "the scenario has stored keys but the geometry has no offload section: add one or drop stored",
                "stored",
            )
        return RequestPlan(local, local.hit_tokens, 0, None, ())
    L = geom.scheduler_block_size
    tail = local.hit_tokens % L
    hit = lookup_hit(
        geom,
        n,
        stored=scenario.get("stored", {}),
        num_prompt_tokens=scenario.get("num_prompt_tokens"),
        local_computed_tokens=local.hit_tokens - tail,
        max_load_tokens=scenario.get("max_load_tokens"),
        max_num_new_tokens=scenario.get("max_num_new_tokens"),
    )
    if not scheduler_keeps_load(local.hit_tokens, L, hit.hit_tokens):
        none = plan_load(geom, Hit(0, hit.local_computed_tokens, hit.local_computed_tokens, False))
        return RequestPlan(local, local.hit_tokens, 0, hit, none)
    return RequestPlan(local, local.hit_tokens - tail, hit.hit_tokens, hit, plan_load(geom, hit))
