"""Which blocks of a decoding request vLLM 0.33 frees in a reference sliding-window (``rswa``) group (needs an
installed vLLM 0.33).

vLLM's own KV cache coordinator (``get_kv_cache_coordinator``) is built over the scheduler-view
``KVCacheConfig`` of :func:`kvgeom.conformance.vllm_objects.build_kv_cache_config` (prefix caching as
configured, vLLM's DCP size, L and H from kvgeom's geometry). A request of ``num_prompt_tokens`` tokens is
allocated, then decoded: at every processed-token count ``T`` of ``steps`` the row holds the slots of the ``T``
tokens computed so far (``allocate_new_blocks`` for ``T``), the coordinator's
``remove_skipped_blocks(request, T, num_prompt_tokens=P)`` runs, as the Scheduler calls it in
``allocate_slots``, and then ``allocate_new_blocks`` for ``T + 1`` tokens. After each step the answer is
the indices of the group's row that hold vLLM's null block (below ``cdiv(T, S)``; a prefix that no group
skips has none). :func:`kvgeom.hits.rswa_gap_blocks` answers the same question.
"""

from __future__ import annotations

from collections.abc import Sequence

from kvgeom.conformance import vllm_objects as vo
from kvgeom.geometry import Geometry

__all__ = ["vllm_null_blocks"]


def vllm_null_blocks(geom: Geometry, group: int, num_prompt_tokens: int, steps: Sequence[int]) -> list[list[int]]:
    """vLLM's null-block indices in ``group``'s row after each processed-token count of ``steps`` (ascending,
    each ``>= num_prompt_tokens``).

    >>> import kvgeom
    >>> g = kvgeom.resolve({"groups": [{"kind": "full_attention", "block_size": 16},
    ...                                {"kind": "rswa", "block_size": 16, "rswa_window": 40}]})
    >>> vllm_null_blocks(g, 1, 50, [100, 120, 160])
    [[], [4], [4, 5, 6]]
    """
    P = num_prompt_tokens
    top = max([P, *steps]) + 1
    kcc = vo.build_kv_cache_config(geom)
    kcc.num_blocks = max(vo.NUM_GPU_BLOCKS, 4 * len(kcc.kv_cache_groups) * (top // geom.hash_block_size + 2))
    coordinator = vo.build_coordinator(
        geom, kcc, max_model_len=max(geom.config.cache.max_model_len or 0, top + 1),
        scheduler_block_size=geom.scheduler_block_size, hash_block_size=geom.hash_block_size,
    )
    rid = "rswa"
    coordinator.allocate_new_blocks(rid, max(P, 1), max(P, 1))
    span = geom.group(group).span
    out: list[list[int]] = []
    for T in steps:
        coordinator.allocate_new_blocks(rid, T, T)  # the T processed tokens had their slots when computed
        coordinator.remove_skipped_blocks(rid, T, num_prompt_tokens=P)
        coordinator.allocate_new_blocks(rid, T + 1, T + 1)
        row = coordinator.get_blocks(rid)[group]
        out.append([i for i, b in enumerate(row[: -(-T // span)]) if b.is_null])
    return out
