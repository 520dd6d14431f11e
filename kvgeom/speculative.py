"""Speculative decoding (EAGLE, EAGLE3, MTP) in the geometry: flags, margins, hazards.

A drafter changes vLLM 0.33's KV-cache geometry in a few precise ways; each is decided once, at
resolve time, in :mod:`kvgeom._resolve.speculative` from the ``speculative`` config section
(:class:`kvgeom.SpeculativeConfig`) and the per-group ``drafter`` flag; this module re-exports those
names (a face). Every consumer reads the results from the resolved :class:`kvgeom.Geometry` (``Geometry.speculative``,
``GroupGeometry.eagle_group`` / ``proof_margin``, ``OffloadGroupGeometry.eagle_group`` /
``proof_margin``). ``docs/speculative.md`` walks through a worked example.

Invariants (property-tested in ``tests/property/test_speculative_laws.py``):

* without a ``speculative`` section (or with ``eagle_block_drop: false``) no group is an eagle group,
  no group has a proof margin and every hit, load and store is exactly the no-drafter answer;
* ``block_drop`` = method in {eagle, eagle3, mtp} and not disabled
  (vLLM ``config/speculative.py::SpeculativeConfig.use_eagle_block_drop``);
* ``lookahead_hashes`` = ``block_drop``, not disabled, prefix caching on and no KV connector
  (vLLM ``config/vllm.py::VllmConfig.num_hash_lookahead_tokens``; an offload section is a connector);
* ``gpu_drop`` = ``block_drop`` and not ``lookahead_hashes`` and prefix caching on
  (vLLM ``v1/core/sched/scheduler.py::Scheduler.__init__``);
* a group's ``proof_margin`` is non-null iff its GPU lookup drops and it is not Mamba; its value is
  H when partial hash hits are on, the manager supports fine-grained lookups and ``S > H``, else S
  (vLLM ``v1/core/kv_cache_utils.py::eagle_proof_margin``).

The query-time rules a drafter touches live beside their callers, and this module re-exports them
under their old names: the Scheduler's prefill split and the Mamba checkpoint in :mod:`kvgeom.prefill`
(it applies without a drafter too; its invariants are stated there), the eagle pop and the store
hold-back in :mod:`kvgeom.hits`, the eagle pair probe in :mod:`kvgeom.probes`, the partial-tail helpers
in :mod:`kvgeom.handoff` and the explain text in :mod:`kvgeom.report`. Import them from those homes.
"""

from __future__ import annotations

# A face: the resolve-time decisions live in kvgeom._resolve.speculative ...
from kvgeom._resolve.speculative import (
    BLOCK_DROP_METHODS,
    HIDDEN_STATE_METHODS,
    apply_defaults,
    check_drafters,
    eagle_proof_margin,
    gpu_dropping_groups,
    is_drafter_group,
    prefill_lookahead_tokens,
    resolve_groups,
    resolve_offload,
    speculative_geometry,
    speculative_warnings,
)

# isort: split
# ... and the query-time rules beside their callers.
from kvgeom.handoff import partial_tail_key, partial_tail_max_boundary
from kvgeom.hits import eagle_pops, eagle_query_end, store_holdback_chunks
from kvgeom.prefill import (
    MambaCheckpoint,
    checkpoint_settings,
    engine_block_size,
    mamba_checkpoint,
    mamba_checkpoint_position,
    prefill_chunk_ends,
    prefill_tail_stop,
    prompt_hash_checkpoint,
)
from kvgeom.probes import eagle_pair_held
from kvgeom.report import explain_lines

__all__ = [
    "BLOCK_DROP_METHODS",
    "HIDDEN_STATE_METHODS",
    "MambaCheckpoint",
    "apply_defaults",
    "check_drafters",
    "eagle_pair_held",
    "eagle_pops",
    "eagle_proof_margin",
    "eagle_query_end",
    "engine_block_size",
    "explain_lines",
    "gpu_dropping_groups",
    "is_drafter_group",
    "mamba_checkpoint",
    "mamba_checkpoint_position",
    "checkpoint_settings",
    "prefill_chunk_ends",
    "prefill_tail_stop",
    "prompt_hash_checkpoint",
    "partial_tail_key",
    "partial_tail_max_boundary",
    "prefill_lookahead_tokens",
    "resolve_groups",
    "resolve_offload",
    "speculative_geometry",
    "speculative_warnings",
    "store_holdback_chunks",
]
