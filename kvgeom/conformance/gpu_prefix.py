"""The GPU prefix-cache hit as a conformance question: kvgeom's answer, and the cases that ask it.

A scenario may carry ``gpu_resident``: per prefix-cacheable group (a string index, as in JSON), the
end tokens of the entries of this request's hash chain that the GPU prefix cache holds (see
:func:`kvgeom.prefix.prefix_hit`). The question is the hit the KV cache coordinator finds for a
request of ``num_tokens`` tokens over exactly those entries:

* ``prefix.hit_tokens``: the hit length (vLLM's ``num_new_computed_tokens``);
* ``prefix.groups``: per group (string index, every group the scheduler sees: all but encoder-only), the end
  tokens of the entries the hit reuses (vLLM: the non-null blocks it returns for the group), ascending.

When kvgeom declines the lookup (:func:`kvgeom.prefix.prefix_hit` raises a
:class:`kvgeom.QueryError`, e.g. a chunked-local group whose span is not the hit alignment), the
sheet says so in ``prefix.declined`` (the problem code) and the two prefix answers are not compared.

:func:`gpu_residencies` draws residencies that stress the lookup: per group a resident prefix with
holes, with or without the partial (off-span) entries of partial hash hits, entries past the
resident prefix, groups that hold nothing, and what a previous request left under the retention
interval. :func:`drafter_configs` draws speculative-decoding
configs whose drafter groups take the GPU drop (or, with look-ahead hashes, do not).

Invariant (``tests/test_conformance_gpu_prefix.py``): kvgeom's answer is exactly
:func:`kvgeom.prefix.prefix_hit`'s, and every end token a group reuses is one the scenario made
resident for that group.

>>> import kvgeom
>>> g = kvgeom.resolve(kvgeom.DEFAULT_CONFIG)
>>> prefix_answers(g, {"num_tokens": 100, "gpu_resident": {"0": [32, 64, 80], "1": [16, 48, 80]}})
{'prefix.hit_tokens': 80, 'prefix.groups': {'0': [32, 64, 80], '1': [80]}}
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from kvgeom._resolve import resolve
from kvgeom.errors import KVGeomError, QueryError
from kvgeom.geometry import Geometry
from kvgeom.prefix import prefix_hit, resident_sets

if TYPE_CHECKING:
    from hypothesis import strategies as st

__all__ = ["PREFIX_QUESTIONS", "check_resident", "drafter_configs", "gpu_residencies", "prefix_answers"]

PREFIX_QUESTIONS: tuple[str, ...] = ("prefix.hit_tokens", "prefix.groups")
"""The answer-sheet entries of the GPU prefix-cache question."""


def check_resident(geom: Geometry, resident: Any) -> dict[str, list[int]]:
    """``gpu_resident`` checked against ``geom`` (:func:`kvgeom.prefix.resident_sets`: prefix-cacheable
    groups, end tokens positive multiples of H) and normalised to JSON form: string keys in group
    order, sorted end tokens. :class:`kvgeom.QueryError` for anything else.

    >>> import kvgeom
    >>> check_resident(kvgeom.resolve(kvgeom.DEFAULT_CONFIG), {1: [48, 16], "0": []})
    {'0': [], '1': [16, 48]}
    """
    sets = resident_sets(geom, resident, "gpu_resident")
    return {str(g): sorted(sets[g]) for g in sorted(sets)}


def prefix_answers(geom: Geometry, scenario: Mapping[str, Any]) -> dict[str, Any]:
    """kvgeom's prefix entries of the answer sheet (see the module docstring); empty when the
    scenario has no ``gpu_resident``."""
    if scenario.get("gpu_resident") is None:
        return {}
    resident = check_resident(geom, scenario["gpu_resident"])  # bad input raises, it is not "declined"
    try:
        hit = prefix_hit(geom, scenario["num_tokens"], resident)
    except QueryError as e:
        return {"prefix.declined": e.problems[0].code}
    return {
        "prefix.hit_tokens": hit.hit_tokens,
        # the groups vLLM's scheduler sees: not the encoder-only group its model runner appends
        "prefix.groups": {
            str(g.index): list(g.end_tokens) for g in hit.groups if geom.groups[g.index].family != "encoder"
        },
    }


def gpu_residencies(geom: Geometry, num_tokens: int) -> st.SearchStrategy[dict[str, list[int]]]:
    """Residencies of a ``num_tokens`` request's chain for ``geom`` (JSON form).

    Per prefix-cacheable group: entries ending on every H boundary up to a drawn resident prefix
    (all of the chain, none, or anywhere between), minus drawn holes; the partial entries (end tokens
    that are not multiples of the group's span) kept or dropped for the whole group; plus a few
    stray entries past the resident prefix. One time in four instead: what kvgeom's simulated GPU
    cache (:class:`kvgeom.sim.GPUPrefixCache`) holds after caching a previous request sharing the
    prefix (so the retention interval thins the sliding-window and Mamba entries), minus up to three
    evicted boundaries. Shrinks towards every group holding the whole chain.

    >>> import kvgeom
    >>> from kvgeom.strategies import minimal
    >>> minimal(gpu_residencies(kvgeom.resolve(kvgeom.DEFAULT_CONFIG), 70))
    {'0': [32, 64], '1': [16, 32, 48, 64]}
    """
    from hypothesis import strategies as st

    H = geom.hash_block_size
    boundaries = num_tokens // H
    groups = [g for g in geom.groups if g.prefix_cacheable]

    @st.composite
    def cached(draw: st.DrawFn) -> dict[str, list[int]]:
        from kvgeom.sim import GPUPrefixCache

        cache = GPUPrefixCache(geom)
        cache.cache_request(draw(st.integers(0, num_tokens + 2 * H)))
        held = cache.resident()
        lost = draw(st.sets(st.integers(1, max(boundaries, 1)), max_size=3))
        return {
            str(g.index): [e for e in held.get(str(g.index), []) if e // H not in lost] for g in groups
        }

    @st.composite
    def build(draw: st.DrawFn) -> dict[str, list[int]]:
        if draw(st.integers(0, 3)) == 3:
            return draw(cached())
        out: dict[str, list[int]] = {}
        for g in groups:
            upto = draw(st.sampled_from([boundaries, 0]) | st.integers(0, boundaries))
            holes = draw(st.sets(st.integers(1, max(boundaries, 1)), max_size=4)) if boundaries else set()
            partial = draw(st.booleans()) or g.family == "mamba"
            strays = draw(st.sets(st.integers(1, max(boundaries, 1)), max_size=3)) if boundaries else set()
            ends = {
                j * H for j in range(1, boundaries + 1) if (j <= upto and j not in holes) or j in strays
            }
            if not partial:
                ends = {e for e in ends if e % g.span == 0}
            out[str(g.index)] = sorted(ends)
        return out

    return build()


def drafter_configs(*, max_block_size: int = 32) -> st.SearchStrategy[dict[str, Any]]:
    """Speculative-decoding configs (EAGLE, EAGLE-3 or MTP, 1-3 speculative tokens, look-ahead hashes
    on or off): 1-3 groups of full attention, MLA, sliding window or Mamba, one or more attention
    groups marked ``drafter`` (one time in four a sliding-window drafter beside full attention, DCP 1, the
    default or dense retention); DCP 1 or 2 for full attention; an offload section one time in two
    (``{}`` or two blocks per chunk, where the config resolves with it), so the connector's eagle
    lookups (sliding-window eagle groups included) are asked too. :func:`kvgeom.resolve` decides whether
    the GPU drop is on.

    >>> import kvgeom
    >>> from kvgeom.strategies import minimal
    >>> g = kvgeom.resolve(minimal(drafter_configs()))
    >>> [x.eagle_group for x in g.groups], g.speculative.method
    ([True], 'eagle')
    """
    from hypothesis import strategies as st

    from kvgeom.strategies import block_sizes

    @st.composite
    def build(draw: st.DrawFn) -> dict[str, Any]:
        # one time in four the shape of issue 19: a sliding-window drafter beside the target, DCP 1
        swa_drafter = draw(st.integers(0, 3)) == 3
        kinds = ["sliding_window"] if swa_drafter else draw(
            st.lists(st.sampled_from(["full_attention", "mamba", "sliding_window", "mla"]), min_size=0, max_size=2)
        )
        dcp = 1 if swa_drafter else draw(st.sampled_from([1, 2]))
        if dcp > 1:
            kinds = [k for k in kinds if k != "sliding_window"]
        first = draw(block_sizes(max_value=max_block_size))
        groups: list[dict[str, Any]] = [{"kind": "full_attention", "block_size": first}]
        for kind in kinds:
            g: dict[str, Any] = {"kind": kind, "block_size": draw(block_sizes(max_value=max_block_size))}
            if kind == "sliding_window":
                g["sliding_window"] = draw(st.integers(2, 4 * max_block_size))
            groups.append(g)
        drafters = [i for i, g in enumerate(groups) if g["kind"] != "mamba"]
        marked = {len(groups) - 1} if swa_drafter else draw(st.sets(st.sampled_from(drafters), min_size=1))
        for i in marked:
            groups[i]["drafter"] = True
        method = draw(st.sampled_from(["eagle", "eagle3", "mtp"]))
        spec: dict[str, Any] = {
            "method": method,
            "num_speculative_tokens": draw(st.integers(1, 3)),
            "lookahead_hashes": draw(st.booleans()),
        }
        cfg: dict[str, Any] = {"groups": groups, "parallel": {"dcp": dcp, "tp": dcp}, "speculative": spec}
        if swa_drafter and draw(st.booleans()):
            cfg["cache"] = {"retention_interval": None}  # dense: every segment's run (else the default R = 0)
        offload = draw(st.sampled_from([None, {}, {}, {"blocks_per_chunk": 2}] if swa_drafter
                                       else [None, None, {}, {"blocks_per_chunk": 2}]))
        if offload is not None:
            # an offload section is a KV connector: legacy hashes, the GPU drop and the connector's eagle pop
            # (sliding-window eagle groups: the window plus one chunk, issue 19); kept only where it resolves
            try:
                resolve({**cfg, "offload": offload})
                cfg["offload"] = offload
            except KVGeomError:
                pass
        return cfg

    return build()
