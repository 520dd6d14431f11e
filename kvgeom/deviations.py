"""Every place where kvgeom deliberately differs from vLLM 0.33, by a stable id.

This registry is the one home of the list: ``docs/deviations.md`` states each entry with vLLM's
behaviour, a minimal reproducer and the reason (a test checks that the page and the registry name
the same ids), and the conformance checker (:mod:`kvgeom.conformance`) classifies a difference
between kvgeom and an installed engine as one of these ids or as a new finding.

>>> DEVIATIONS["realign-after-clamp"].title
'Offload hits re-align to the Mamba chunk after every clamp'
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["DEVIATIONS", "Deviation", "deviation"]


@dataclass(frozen=True, slots=True)
class Deviation:
    """One deliberate difference from vLLM 0.33.

    ``id`` is stable (safe to match on and to cite in a finding); ``title`` is one line; ``vllm``
    says what vLLM 0.33 does, ``kvgeom`` what kvgeom does instead, ``reason`` why.
    """

    id: str
    title: str
    vllm: str
    kvgeom: str
    reason: str


_ALL = (
    Deviation(
        "realign-after-clamp",
        "Offload hits re-align to the Mamba chunk after every clamp",
        "The OffloadingConnector scheduler (offloading/scheduler.py, _lookup_complete_chunks) rounds the "
        "candidate hit down to the Mamba chunk once, before the per-group clamps; a later clamp by an "
        "attention group can leave a hit that is not a multiple of the Mamba chunk, and the Mamba state "
        "loaded is then the state after a later token than the hit's end.",
        "Re-aligns the candidate to the Mamba chunk after every clamp; when that leaves less than one "
        "attention chunk past the local prefix, the hit is 0.",
        "A restored Mamba state must be the state after exactly the hit's end token; anything else "
        "silently corrupts the recurrent state (the bug family of vLLM #44599).",
    ),
    Deviation(
        "interleave-per-sharded-group",
        "The DCP interleave is checked against every DCP-sharded group's per-rank block",
        "Checks cp_kv_cache_interleave_size against cache_config.block_size only (the smallest per-rank "
        "block of the prefix-cacheable groups, replicated groups included).",
        "Every DCP-sharded group's per-rank block must be >= the interleave and a multiple of it; "
        "replicated groups are not dealt and do not count.",
        "vLLM's single check rejects valid layouts and accepts layouts whose slots overflow their block.",
    ),
    Deviation(
        "swa-mask-own-span",
        "Sliding-window store masks use the group's own span under DCP",
        "SlidingWindowManager.reachable_block_mask multiplies the block by the DCP size it is given, and "
        "the offloading scheduler passes the global DCP size, although a sliding-window group is never "
        "DCP-sharded.",
        "Computes the mask on the group's own span.",
        "A sliding-window group under DCP is replicated: its span is its block size.",
    ),
    Deviation(
        "dcp-sharded-windowed-rejected",
        "DCP-sharded sliding-window, chunked-local and circular-buffer groups are rejected up front",
        "Rejects them only in the hybrid coordinator (prefix caching on, two or more groups); otherwise a "
        "sharded sliding-window group fails at memory planning, a chunked-local one at its first lookup, "
        "and a circular buffer runs.",
        "Rejects a DCP-sharded windowed group whatever the number of groups, with the fix (replicate it).",
        "One rule for every deployment, reported before the engine starts.",
    ),
    Deviation(
        "mamba-all-mode",
        "Mamba 'all' mode is still accepted",
        "vLLM 0.33 rejects mamba_cache_mode='all' in CacheConfig.",
        "Accepts it for the older releases that had it, with a warning.",
        "Deployments on earlier releases still use it.",
    ),
    Deviation(
        "sink-attention",
        "Sink full attention resolves where vLLM 0.33 crashes",
        "SinkFullAttentionManager asserts sink_len % (block_size * dcp) == 0 at start-up.",
        "Reports the same condition as a GeometryError naming the numbers and the fix.",
        "An assert is not an error message (and python -O strips it).",
    ),
    Deviation(
        "chunked-local-mixed-blocks",
        "Chunked local attention with mixed block sizes is an error with a message",
        "Asserts inside the chunked-local manager.",
        "Reports the condition as a GeometryError naming the numbers and the fix.",
        "An assert is not an error message.",
    ),
)

DEVIATIONS: dict[str, Deviation] = {d.id: d for d in _ALL}
"""Every deviation by id, in documentation order."""


def deviation(id: str) -> Deviation:
    """The deviation ``id``; ``KeyError`` naming the known ids when there is none."""
    try:
        return DEVIATIONS[id]
    except KeyError:
        raise KeyError(f"no deviation {id!r}; known: {sorted(DEVIATIONS)}") from None
