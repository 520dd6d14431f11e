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
        "candidate hit down to the Mamba chunk once, before the per-group clamps. A full-attention clamp can "
        "then lower the hit below that Mamba boundary, and the Mamba scan (which reads the chunks up to "
        "cdiv(hit, chunk)) accepts the key ending past the hit: the state loaded is the state after a later "
        "token than the hit's end. It happens in a plain two-request flow whenever the Mamba chunk is not a "
        "multiple of the attention chunk.",
        "Re-aligns the candidate to the Mamba chunk after every clamp; when that leaves less than one "
        "chunk past the local prefix, or no Mamba key ends at the aligned candidate, the hit is lower (0 "
        "when nothing is left).",
        "A restored Mamba state must be the state after exactly the hit's end token; anything else "
        "silently corrupts the recurrent state (the bug family of vLLM #44599).",
    ),
    Deviation(
        "interleave-per-sharded-group",
        "The DCP interleave is checked against every DCP-sharded group's per-rank block",
        "VllmConfig.validate_block_size checks cp_kv_cache_interleave_size against cache_config.block_size "
        "only, which the engine core sets to the smallest per-rank block of the prefix-cacheable groups "
        "(replicated groups included).",
        "Every DCP-sharded group's per-rank block must be >= the interleave and a multiple of it; "
        "replicated groups are not dealt and do not count.",
        "vLLM's single check rejects valid layouts (a replicated Mamba block below the interleave) and "
        "accepts layouts whose slots overflow their block (a sharded block that is not a multiple).",
    ),
    Deviation(
        "swa-mask-own-span",
        "Sliding-window store masks use the group's own span under DCP",
        "SlidingWindowManager.reachable_block_mask multiplies the block by the DCP size it is given, and "
        "the offloading scheduler passes the global DCP size, although a sliding-window group under DCP is "
        "never DCP-sharded: the mask is computed on a grid DCP times too coarse.",
        "Computes the mask on the group's own span.",
        "A sliding-window group under DCP is replicated: its span is its block size.",
    ),
    Deviation(
        "dcp-sharded-windowed-rejected",
        "DCP-sharded sliding-window, chunked-local, cross-attention and circular-buffer groups are rejected "
        "up front",
        "Rejects them only in the hybrid coordinator (prefix caching on, two or more groups). Otherwise a "
        "sharded sliding-window group fails at memory planning (SlidingWindowSpec.max_memory_usage_bytes), "
        "a chunked-local one at its first prefix-cache lookup (not at all with prefix caching off), and "
        "cross-attention and circular-buffer groups are accepted.",
        "Rejects a DCP-sharded group of any of these kinds whatever the number of groups, with the fix "
        "(replicate it, dcp_sharded=false).",
        "One rule for every deployment, reported before the engine starts; kvgeom deals only "
        "full-attention-family groups across DCP ranks.",
    ),
    Deviation(
        "mamba-all-mode",
        "Mamba 'all' mode is still accepted",
        "vLLM 0.33 rejects mamba_cache_mode='all' in CacheConfig (its MambaCacheMode is 'align' or 'none').",
        "Accepts it for the older releases that had it (H = L, the Mamba chunk alignment of #51100), with "
        "the warning mamba_mode_all_legacy.",
        "Deployments on earlier releases still use it.",
    ),
    Deviation(
        "sink-attention",
        "Sink full attention resolves where vLLM 0.33 crashes",
        "Building the KV cache manager of any sink_full_attention group raises TypeError "
        "(SinkFullAttentionManager.__init__ does not accept the needs_kv_cache_zeroing keyword the "
        "coordinator passes), so an engine with a sink group does not start; its own rule, an assert, is "
        "sink_len % (block_size * dcp) == 0.",
        "Resolves a sink group as full attention and checks sink_len against the group's span up front "
        "(GeometryError sink_len_not_multiple_of_span, naming the numbers and the fix).",
        "kvgeom models the geometry the manager is written for; the crash is a signature mismatch, not a "
        "geometry rule, and an assert is not an error message.",
    ),
    Deviation(
        "chunked-local-mixed-blocks",
        "Chunked local attention next to groups of another block size is accepted",
        "ChunkedLocalAttentionManager.find_longest_cache_hit asserts that the group's block equals the hit "
        "alignment ('KV cache groups with different block sizes are not compatible with chunked local "
        "attention now'): with prefix caching on and a chunked-local block that is not the hit alignment, "
        "the first prefix-cache lookup crashes the engine.",
        "Resolves the geometry with the warning chunked_local_block_mismatch and answers its queries (the "
        "chunked-local group is a window of cdiv(attention_chunk_size, C) chunks for the offload tier).",
        "The geometry is well defined; the assert is a missing feature of vLLM's lookup, not a rule of the "
        "layout.",
    ),
    Deviation(
        "mamba-state-keyed-past-chunk-end",
        "An align Mamba state is stored only under the key of the token its chunk ended at",
        "The scheduler ends prefill chunks on cache_config.block_size's grid (Scheduler._mamba_block_aligned_split) "
        "while the Mamba manager keys a state block at the block's end (MambaManager.cache_blocks hands it to the "
        "connector, _build_aligned_boundary_store_jobs stores it). When the Mamba block is wider than "
        "cache_config.block_size (a mamba_block_size set by hand) a chunk can end inside a Mamba block -- under the "
        "eagle drop the last cacheable position rdown(n, B) - B does -- and that block, holding the state after "
        "the chunk end, is cached in the GPU prefix cache, stored, and served as the state after the block's end.",
        "Lists a Mamba key inside the prompt only where a prefill chunk ended exactly at it "
        "(kvgeom.handoff.mamba_handoffs; kvgeom.sim.GPUPrefixCache keeps a state only there too); the hit then "
        "ends lower (0 when no chunk ended on the Mamba grid).",
        "A restored Mamba state must be the state after exactly the hit's end token (the bug family of vLLM "
        "#49964 and #44599); vLLM's own split comment states the invariant its keying breaks here.",
    ),
    Deviation(
        "packed-bucket-unbalanced",
        "A packed bucket with unequal layer counts per page is refused",
        "Under a block-outermost KV cache layout (BLHNC, BLNHC, BHLNC) the packed grouping "
        "(v1/core/kv_cache_planning.py, _get_packed_kv_cache_groups) splits a bucket without a repeating "
        "pattern to fit the block and pairs its pages' layers with zip: when the pages have unequal layer "
        "counts (4 sliding layers of one page, 2 of another) the extra layers end up in no group at all, "
        "and with 3 + 1 the split raises StopIteration.",
        "Refuses the layered config with the GeometryError packed_bucket_unbalanced on "
        "model.kv_cache_layout (kvgeom.resolution.resolve_block_sizes).",
        "A layer in no group has no KV cache: there is no geometry to answer with, and an answer that "
        "placed the layers would describe an engine that does not exist.",
    ),
    Deviation(
        "lookahead-past-unitary-window",
        "A windowed first lookup under lookahead hashes is looked up",
        "With lookahead hashes of P >= 2 tokens (multi-module MTP, no connector) and prefix caching on, when no "
        "full-attention group leads the GPU lookup (one Mamba or sliding-window group under the "
        "UnitaryKVCacheCoordinator, or a hybrid of sliding-window and Mamba groups only), the first manager's "
        "find_longest_cache_hit scans (n - 1) // S blocks from the right while the request has only (n - P) // H "
        "block hashes: whenever floor((n - 1) / S) * S exceeds floor((n - P) / H) * H (block 16, P = 3: n = 17, 18, "
        "33) the first schedule() raises IndexError (vLLM 0.33, run). A full-attention group first (it reads "
        "only the hashes there are) or prefix caching off runs.",
        "Resolves the geometry and reads the hit only from the hashes the request has (as vLLM does where a "
        "full-attention group leads): a 40-token request of Mamba block 2 with P = 3 holding the state at 36 "
        "hits 36.",
        "The crash is an index past the hash list, not a geometry rule; the rule every other coordinator applies "
        "is well defined.",
    ),
    Deviation(
        "partial-tail-past-offload-limit",
        "A partial tail past a request's max_offload_tokens is not stored",
        "With a partial tail (DCP 1, an align Mamba group, the prompt's H-grid checkpoint t off the span grid), "
        "a request whose kv_transfer_params carry max_offload_tokens with 0 < limit < t makes the "
        "OffloadingConnector scheduler (offloading/scheduler.py, _build_partial_tail_store_jobs) raise "
        "AssertionError in the step whose prefill passes t: it checks the hand-off's boundary against the limit "
        "instead of skipping it (vLLM 0.33, run: FA 64 + Mamba 64, prefix_match_unit 16, prompt 24, limit 8 or "
        "15; prompt 100, limit 64 or 80). A limit at or past t, DCP 2 or a model without Mamba runs.",
        "Stores no partial tail past the limit (kvgeom.handoff.partial_tail_boundary is None, plan_store stores "
        "the chunks up to the limit only): prompt 24, limit 8 stores nothing; prompt 100, limit 64 stores the "
        "chunks ending at 64.",
        "max_offload_tokens bounds what a request offloads, and vLLM's chunk path applies it as a cut (no chunk "
        "past it); a tail past the limit is one more key past it, not a reason to stop the engine.",
    ),
    Deviation(
        "partial-tail-zero-offload-limit",
        "max_offload_tokens = 0 stores no partial tail",
        "_build_partial_tail_store_jobs bounds the tail by max_offload_tokens or the prompt, so a limit of 0 "
        "counts as no limit: the partial tail at t is stored for every group while the chunk path, which "
        "honours 0, stores no chunk (vLLM 0.33, run: FA 64 + Mamba 64, prefix_match_unit 16, prompt 24 stores "
        "both groups' keys at 16; prompt 100 stores them at 96 and no chunk at 64).",
        "A limit of 0 offloads nothing: partial_tail_boundary is None and plan_store stores no key.",
        "0 is a valid limit (vLLM accepts any non-negative int and its chunk path honours it); a request that "
        "asks to offload nothing should offload nothing, not only the one key past every chunk.",
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
