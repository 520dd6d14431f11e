"""vLLM's names for the keys of :meth:`kvgeom.Geometry.to_report` (``docs/glossary.md`` has every name).

kvgeom keeps its own report keys stable; where vLLM 0.33 has a name a connector author already
knows, :func:`add_vllm_names` adds it next to kvgeom's key (``to_report(vllm_names=True)``), with
the same value. No kvgeom key is renamed or removed, so the report contract is unchanged when the
option is off and only grows when it is on.

>>> VLLM_REPORT_NAMES["hit_alignment_tokens"]
'cache_hit_alignment_tokens'
"""

from __future__ import annotations

from typing import Any

__all__ = ["VLLM_GROUP_NAMES", "VLLM_OFFLOAD_GROUP_NAMES", "VLLM_REPORT_NAMES", "add_vllm_names"]

#: Top-level report keys -> vLLM 0.33's name (``KVCacheConfig``, ``KVCacheCoordinator``).
VLLM_REPORT_NAMES: dict[str, str] = {
    "hit_alignment_tokens": "cache_hit_alignment_tokens",
    "partial_hash_hits": "enable_partial_hash_hits",
}

#: ``groups[i]`` keys -> vLLM's name (``SingleTypeKVCacheManager.kv_cache_group_id``).
VLLM_GROUP_NAMES: dict[str, str] = {
    "index": "kv_cache_group_id",
}

#: ``offload.groups[i]`` keys -> vLLM's name (offloading ``GroupOffloadConfig``).
VLLM_OFFLOAD_GROUP_NAMES: dict[str, str] = {
    "index": "group_idx",
    "window_chunks": "sliding_window_size_in_chunks",
}


def add_vllm_names(report: dict[str, Any]) -> dict[str, Any]:
    """Add vLLM's name of each aliased key next to kvgeom's, in place; returns ``report``.

    Contract: every key of ``report`` keeps its value; each added key holds the value of the kvgeom
    key it names; a key already present is never overwritten.

    >>> import kvgeom
    >>> r = add_vllm_names(kvgeom.resolve(kvgeom.DEFAULT_CONFIG).to_report())
    >>> r["cache_hit_alignment_tokens"] == r["hit_alignment_tokens"], r["groups"][1]["kv_cache_group_id"]
    (True, 1)
    """

    def alias(d: dict[str, Any], names: dict[str, str]) -> None:
        for ours, theirs in names.items():
            if ours in d and theirs not in d:
                d[theirs] = d[ours]

    alias(report, VLLM_REPORT_NAMES)
    for g in report.get("groups", []):
        alias(g, VLLM_GROUP_NAMES)
    off = report.get("offload")
    if off is not None:
        for og in off.get("groups", []):
            alias(og, VLLM_OFFLOAD_GROUP_NAMES)
    return report
