"""vLLM 0.33's real v1 ``Scheduler`` storing a prompt to an offload tier and a second request looking it
up, speculative decoding included (needs an installed vLLM).

:func:`run_store_then_lookup` answers "store a prompt of ``n1`` tokens, then look up a request of ``n2``
tokens sharing it" with vLLM's own code, and :func:`kvgeom_store_then_lookup` with kvgeom's public API
(:func:`kvgeom.prefill_chunk_ends`, :func:`kvgeom.hits.plan_store`, :meth:`kvgeom.Geometry.plan_hit`).

vLLM's code (run, not restated): ``Scheduler.schedule`` / ``update_from_output``
(``v1/core/sched/scheduler.py``: the chunked-prefill split, ``_mamba_block_aligned_split``,
``_reserve_prefill_lookahead``, the eagle drop switch of ``Scheduler.__init__``), its
``KVCacheManager`` and coordinator (the Mamba checkpoint shift, the boundary-state hand-offs), the real
``OffloadingConnector`` with its ``OffloadingConnectorScheduler`` (``_build_store_jobs``,
``_build_aligned_boundary_store_jobs``, ``_build_partial_tail_store_jobs``, ``request_finished``,
``get_num_new_matched_tokens``, ``update_state_after_alloc``), ``SchedulerOffloadConfig.from_spec``
(the connector's eagle groups), vLLM's block hasher, and vLLM's ``SpeculativeConfig`` predicates and
``VllmConfig`` speculative properties evaluated on the stand-ins below. The numbers are read where
vLLM hands them on:

* ``chunk_ends``: request A's ``num_computed_tokens`` after each ``schedule()`` that scheduled it
  (``SchedulerOutput.num_scheduled_tokens``), i.e. where each prefill chunk ended;
* ``stored``: per group, the end tokens of every offload key the connector asks the tier's
  ``prepare_store`` to store while A runs and after it finishes (each key's block hash located in A's
  hash chain, as :func:`kvgeom.conformance.vllm_scheduler.scheduler_admits` does for loads);
* ``hit``: the first value of the connector's ``get_num_new_matched_tokens`` answer for request B
  (asked from the local prefix, 0 here: B runs in a fresh scheduler with an empty GPU cache);
* ``loads``: per group, the end tokens of the keys ``update_state_after_alloc`` hands ``prepare_load``
  for B.

Stand-ins (everything else is vLLM's code):

* **VllmConfig**: :func:`kvgeom.conformance.vllm_scheduler.build_scheduler`'s (itself
  :func:`kvgeom.conformance.vllm_objects.build_vllm_config`'s stand-in), with the token budget
  ``max_num_batched_tokens`` (None: 8192, more than any prompt here) in a real ``SchedulerConfig``,
  ``max_in_flight_tokens`` = that budget (one batch in flight), and vLLM's
  ``VllmConfig._set_max_num_scheduled_tokens`` run on it when a drafter is configured (its
  ``max_num_batched_tokens <= num_lookahead_tokens`` refusal included).
* **Speculative decoding**: ``speculative_config`` is
  :mod:`~kvgeom.conformance.vllm_objects`' stand-in (method, K, ``disable_eagle_block_drop``,
  ``disable_lookahead_block_hashes``, a draft ``hf_config`` whose ``num_nextn_predict_layers`` is
  ``mtp_modules``; vLLM's own ``use_eagle`` / ``needs_eagle_block_drop`` / ``use_eagle_block_drop`` /
  ``use_multi_module_mtp`` / ``max_num_new_slots_for_drafting``). ``num_speculative_tokens``,
  ``num_lookahead_tokens``, ``num_prefill_lookahead_tokens`` and ``num_hash_lookahead_tokens`` are
  vLLM's ``VllmConfig`` properties on it; ``is_draft`` / ``is_eagle_group`` / ``extra_retained_tokens``
  are set as ``get_global_kv_cache_groups`` sets them, Mamba ``num_speculative_blocks`` is the kvgeom
  spec's. **Bypassed**: no draft model is loaded and no draft tokens are ever proposed or verified
  (``spec_token_ids`` stay empty; A has ``max_tokens`` 1 and finishes on the step its prefill ends, so
  it never decodes); no ``SpeculativeConfig.__post_init__`` (method auto-detection, draft
  parallel config).
* **The offload tier**: :class:`RecordingTier`, an ``OffloadingManager`` that answers HIT for exactly
  its ``keys``, accepts every key ``prepare_store`` is given (``keys_to_store`` = all of them, an empty
  ``LoadStoreSpec`` as ``store_spec``, nothing evicted) and records them in order, and records
  ``prepare_load``'s keys; ``complete_store`` adds the keys to ``keys``. Registered with vLLM's
  ``OffloadingSpecFactory`` under :data:`SPEC_NAME`.
* **The worker**: a minimal ``ModelRunnerOutput`` per step (vLLM's own class): A's sampled token
  (id ``n1``) on the step its prefill completes, nothing before; its ``kv_connector_output`` reports
  every store and load job of the step's connector metadata completed by all workers (an
  ``OffloadingWorkerMetadata``), so the connector releases the blocks as a worker that finished the
  transfers in one step would.
* **Requests**: :func:`kvgeom.conformance.vllm_objects.build_request` (prompt ids ``0..n-1``,
  ``max_tokens`` 1, hashed with ``num_hash_lookahead_tokens``: 0 whenever an offload section exists).

Import this module only where vLLM is installed; ``import kvgeom`` never imports it. Run the sweep
with ``python -m kvgeom.conformance.vllm_stores --cases N --seed S``.
"""

from __future__ import annotations

import argparse
import random
import sys
from collections import Counter
from collections.abc import Mapping
from typing import Any

from vllm.distributed.kv_transfer.kv_connector.v1.offloading.common import OffloadingWorkerMetadata
from vllm.v1.core.kv_cache_utils import (
    get_block_hash,
    get_group_id,
    resolve_cache_hit_alignment_tokens,
    resolve_kv_cache_block_sizes,
)
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_offload.base import (
    LoadStoreSpec,
    PrepareStoreOutput,
    ReqContext,
)
from vllm.v1.kv_offload.factory import OffloadingSpecFactory
from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput
from vllm.v1.request import Request

from kvgeom._resolve import resolve
from kvgeom.conformance import vllm_objects as vo
from kvgeom.conformance import vllm_scheduler as vs
from kvgeom.errors import KVGeomError
from kvgeom.geometry import Geometry
from kvgeom.prefill import prefill_chunk_ends
from kvgeom.residency import split_offload_key

__all__ = [
    "COMPARED",
    "FIELDS",
    "KNOWN_CLASSES",
    "SPEC_NAME",
    "RecordingTier",
    "RecordingTierSpec",
    "classify",
    "differences",
    "gpu_cached_entries",
    "kvgeom_gpu_cached",
    "kvgeom_store_steps",
    "kvgeom_store_then_lookup",
    "random_case",
    "random_split_case",
    "random_swa_drafter_case",
    "run_lookup_trace",
    "run_prefill_split",
    "run_store_then_lookup",
    "store_under_offload_limit",
    "sweep",
]

SPEC_NAME = "KvgeomRecordingTierSpec"
"""Name of the offloading spec registered with vLLM's ``OffloadingSpecFactory`` (a :class:`RecordingTier`)."""

FIELDS = ("chunk_ends", "stored", "hit", "loads")
"""The compared entries of :func:`run_store_then_lookup` and :func:`kvgeom_store_then_lookup`."""

COMPARED = (*FIELDS, "hit_on_vllm_stores", "steps", "gpu_cached")
"""Every entry :func:`differences` may report, in the sweep's order."""

UNBOUNDED_BUDGET = 8192
"""The token budget standing for ``max_num_batched_tokens=None`` (more than any prompt the sweep draws)."""

MAX_STEPS = 2000
"""Steps after which request A counts as stalled (vLLM requeues it forever; raised as RuntimeError)."""


class RecordingTier(vo.ChosenTier):
    """A :class:`~kvgeom.conformance.vllm_objects.ChosenTier` (HIT for exactly ``keys``, ``prepare_load``'s
    keys in ``loaded``) that accepts every store: records every key ``prepare_store`` is asked to store in
    ``stored`` (and, in ``store_calls``, the connector function that asked with its keys); a completed
    store joins ``keys``."""

    def __init__(self) -> None:
        super().__init__()
        self.stored: list[bytes] = []
        self.store_calls: list[tuple[str, list[bytes]]] = []

    def prepare_store(self, keys: Any, req_context: ReqContext) -> PrepareStoreOutput:
        keys = list(keys)
        self.stored.extend(bytes(k) for k in keys)
        # which store path asked (_build_store_jobs, _build_aligned_boundary_store_jobs, ...), for diagnosis
        self.store_calls.append((sys._getframe(1).f_code.co_name, [bytes(k) for k in keys]))
        return PrepareStoreOutput(keys_to_store=keys, store_spec=LoadStoreSpec(), evicted_keys=[])

    def complete_store(self, keys: Any, req_context: ReqContext) -> None:
        self.keys.update(bytes(k) for k in keys)


class RecordingTierSpec(vs.ChosenTierSpec):
    """Offloading spec whose manager is a fresh :class:`RecordingTier`."""

    tier_class = RecordingTier


if SPEC_NAME not in OffloadingSpecFactory._registry:
    OffloadingSpecFactory.register_spec(SPEC_NAME, __name__, "RecordingTierSpec")


Budget = int | list[int] | None
"""A token budget: ``max_num_batched_tokens`` (None: :data:`UNBOUNDED_BUDGET`), or one per step (past the list the
last stays), as :func:`kvgeom.prefill_chunk_ends` takes it."""


def _scheduler(geom: Geometry, budget: Budget, L: int, H: int) -> Scheduler:
    """vLLM's Scheduler over a fresh :class:`RecordingTier` with the token budget ``budget`` (a per-step list:
    built unbounded; :func:`_step_budget` sets each step's)."""
    tokens = budget if isinstance(budget, int) else UNBOUNDED_BUDGET
    return vs.build_scheduler(geom, scheduler_block_size=L, hash_block_size=H, max_num_batched_tokens=tokens,
                              spec_name=SPEC_NAME)


def _step_budget(sched: Scheduler, budget: Budget, step: int) -> None:
    """Set the token budget of the ``step``-th step that schedules the request (a per-step ``budget`` only; past the
    list the last stays): the Scheduler's ``max_num_scheduled_tokens``. :func:`run_store_then_lookup` and
    :func:`run_prefill_split` both split through it."""
    if isinstance(budget, list):
        sched.max_num_scheduled_tokens = budget[min(step, len(budget) - 1)]


def _request(sched: Scheduler, n: int, H: int, request_id: str,
             kv_transfer_params: dict[str, Any] | None = None) -> Request:
    return vo.build_request(n, H, request_id=request_id,
                            hash_lookahead_tokens=sched.vllm_config.num_hash_lookahead_tokens,
                            kv_transfer_params=kv_transfer_params)


def _ends(keys: list[bytes], chain: Mapping[bytes, int], H: int) -> dict[str, list[int]]:
    out: dict[int, set[int]] = {}
    for key in keys:
        block_hash, group = split_offload_key(key)
        out.setdefault(group, set()).add((chain[block_hash] + 1) * H)
    return {str(g): sorted(e) for g, e in sorted(out.items())}


def _worker_output(sched: Scheduler, output: Any, request: Request, token: int | None) -> ModelRunnerOutput:
    meta = output.kv_connector_metadata
    jobs = [*getattr(meta, "store_jobs", {}), *getattr(meta, "load_jobs", {})]
    workers = sched.connector.connector_scheduler.config.num_workers if sched.connector is not None else 1
    connector = KVConnectorOutput(
        kv_connector_worker_meta=OffloadingWorkerMetadata(completed_jobs=dict.fromkeys(jobs, workers))
    ) if jobs else None
    scheduled = request.request_id in output.num_scheduled_tokens
    return ModelRunnerOutput(
        req_ids=[request.request_id] if scheduled else [],
        req_id_to_index={request.request_id: 0} if scheduled else {},
        sampled_token_ids=[[token] if token is not None else []] if scheduled else [],
        kv_connector_output=connector,
    )


def gpu_cached_entries(sched: Scheduler, chain: Mapping[bytes, int], H: int) -> dict[str, list[int]]:
    """Per group, the end tokens of the blocks vLLM's GPU prefix cache holds for the hash chain ``chain``
    (``{block hash: index}``): every key of the block pool's ``cached_block_hash_to_block`` whose hash is in the
    chain, at ``(index + 1) * H``."""
    out: dict[int, set[int]] = {}
    for key in sched.kv_cache_manager.block_pool.cached_block_hash_to_block._cache:
        index = chain.get(bytes(get_block_hash(key)))
        if index is not None:
            out.setdefault(get_group_id(key), set()).add((index + 1) * H)
    return {str(g): sorted(e) for g, e in sorted(out.items())}


def run_store_then_lookup(geom: Geometry, n1: int, n2: int, *, max_num_batched_tokens: Budget = None,
                          max_offload_tokens: int | None = None) -> dict[str, Any]:
    """vLLM's answer (see the module docstring): ``{"chunk_ends": [...], "stored": {"<g>": [ends]},
    "hit": int, "loads": {"<g>": [ends]}}``, plus ``"steps"``: the keys stored in each step that scheduled A
    (one entry per chunk end), then those stored in the steps after it finished (one entry), each
    ``{"<g>": [ends]}``; and ``"store_paths"``: the stored end tokens per connector function that asked
    ``prepare_store`` (for diagnosis; not compared). Without an offload section
    ``stored`` is empty and ``hit`` None. ``max_num_batched_tokens``: the token budget, or one per step
    (:data:`Budget`). ``max_offload_tokens`` (None: not sent) is request A's
    ``kv_transfer_params`` entry of that name. vLLM's exceptions propagate; a prefill that never finishes
    raises RuntimeError.

    >>> import kvgeom
    >>> g = kvgeom.resolve({"groups": [{"kind": "full_attention", "block_size": 16},
    ...                                {"kind": "mamba", "block_size": 16}], "offload": {}})
    >>> out = run_store_then_lookup(g, 100, 100)
    >>> out["chunk_ends"], out["stored"], out["hit"]
    ([96, 100], {'0': [16, 32, 48, 64, 80, 96], '1': [96]}, 96)
    >>> out["store_paths"]
    {'_build_aligned_boundary_store_jobs': {'1': [96]}, '_build_store_jobs': {'0': [16, 32, 48, 64, 80, 96]}}
    """
    L, H = resolve_kv_cache_block_sizes(vo.build_kv_cache_config(geom), vo.build_vllm_config(geom))
    sched = _scheduler(geom, max_num_batched_tokens, L, H)
    a = _request(sched, n1, H, "A",
                 None if max_offload_tokens is None else {"max_offload_tokens": max_offload_tokens})
    tier_a: RecordingTier | None = sched.connector.connector_scheduler.manager if sched.connector else None
    sched.add_request(a)
    chunk_ends: list[int] = []
    step_keys: list[list[bytes]] = []  # per step that scheduled A: the keys stored in it
    after_finish: list[bytes] = []  # the keys stored in steps that did not schedule A (A had finished)
    for _ in range(MAX_STEPS):
        before = len(tier_a.stored) if tier_a is not None else 0
        _step_budget(sched, max_num_batched_tokens, len(chunk_ends))
        output = sched.schedule()
        done = a.request_id in output.finished_req_ids
        if a.request_id in output.num_scheduled_tokens:
            chunk_ends.append(a.num_computed_tokens)
            step_keys.append(tier_a.stored[before:] if tier_a is not None else [])
        elif tier_a is not None:
            after_finish.extend(tier_a.stored[before:])  # a step that did not schedule A
        token = n1 if a.num_computed_tokens >= a.num_prompt_tokens else None
        sched.update_from_output(output, _worker_output(sched, output, a, token))
        if done and not sched.has_requests():
            break
    else:
        raise RuntimeError(f"request A ({n1} tokens) did not finish in {MAX_STEPS} steps (computed "
                           f"{a.num_computed_tokens}, chunk ends {chunk_ends[:8]}...)")
    before = len(tier_a.stored) if tier_a is not None else 0
    sched.schedule()  # the step after the finish builds its store jobs (finished_req_ids)
    if tier_a is not None:
        after_finish.extend(tier_a.stored[before:])
    chain_a = {bytes(h): i for i, h in enumerate(a.block_hashes)}
    stored_keys = list(tier_a.stored) if tier_a is not None else []
    out: dict[str, Any] = {"chunk_ends": chunk_ends, "stored": _ends(stored_keys, chain_a, H), "hit": None,
                           "loads": {}, "gpu_cached": gpu_cached_entries(sched, chain_a, H),
                           "steps": [_ends(keys, chain_a, H) for keys in (*step_keys, after_finish)]}
    if tier_a is not None:
        paths: dict[str, dict[str, list[int]]] = {}
        for path, keys in tier_a.store_calls:
            for g, ends in _ends(keys, chain_a, H).items():
                paths.setdefault(path, {}).setdefault(g, []).extend(ends)
        out["store_paths"] = {p: {g: sorted(e) for g, e in sorted(d.items())} for p, d in sorted(paths.items())}
    if tier_a is None:
        return out

    sched_b = _scheduler(geom, max_num_batched_tokens, L, H)
    tier_b: RecordingTier = sched_b.connector.connector_scheduler.manager
    tier_b.keys = set(stored_keys)
    b = _request(sched_b, n2, H, "B")
    seen: dict[str, Any] = {}
    conn = sched_b.connector
    real_match = conn.get_num_new_matched_tokens

    def get_num_new_matched_tokens(req: Any, num_computed_tokens: int) -> Any:
        answer = real_match(req, num_computed_tokens)
        seen.setdefault("hit", answer[0])
        return answer

    conn.get_num_new_matched_tokens = get_num_new_matched_tokens
    sched_b.add_request(b)
    _step_budget(sched_b, max_num_batched_tokens, 0)
    sched_b.schedule()
    out["hit"] = seen.get("hit")
    out["loads"] = _ends(tier_b.loaded, {bytes(h): i for i, h in enumerate(b.block_hashes)}, H)
    return out


def store_under_offload_limit(geom: Geometry, n: int, max_offload_tokens: int) -> dict[str, Any]:
    """What vLLM's connector stores for one ``n``-token prompt sent with ``kv_transfer_params``
    ``{"max_offload_tokens": max_offload_tokens}`` (:func:`run_store_then_lookup`, no token budget):
    ``{"stored": {"<g>": [ends]}, "store_paths": {...}}``, or, where vLLM raises an ``AssertionError``,
    ``{"raised": "AssertionError", "in": <the vLLM function that raised>}``.

    The reproducer of the deviations ``partial-tail-past-offload-limit`` and
    ``partial-tail-zero-offload-limit`` (``docs/deviations.md``): a prompt whose partial tail (the
    H-grid checkpoint ``t``, off the span grid, DCP 1, an align Mamba group) lies past the limit.

    >>> import kvgeom
    >>> g = kvgeom.resolve({"groups": [{"kind": "full_attention", "block_size": 64},
    ...     {"kind": "mamba", "block_size": 64}], "cache": {"prefix_match_unit": 16}, "offload": {}})
    >>> store_under_offload_limit(g, 24, 8)
    {'raised': 'AssertionError', 'in': '_build_partial_tail_store_jobs'}
    >>> store_under_offload_limit(g, 24, 0)["store_paths"]
    {'_build_partial_tail_store_jobs': {'0': [16], '1': [16]}}
    """
    try:
        out = run_store_then_lookup(geom, n, n, max_offload_tokens=max_offload_tokens)
    except AssertionError as exc:
        tb = exc.__traceback__
        while tb is not None and tb.tb_next is not None:
            tb = tb.tb_next
        return {"raised": "AssertionError", "in": tb.tb_frame.f_code.co_name if tb is not None else None}
    return {"stored": out["stored"], "store_paths": out.get("store_paths", {})}


def run_prefill_split(geom: Geometry, n: int, *, resident: Mapping[str, Any] | None = None,
                      stored: Mapping[str, Any] | None = None, budgets: list[int] | None = None) -> dict[str, Any]:
    """vLLM's prefill split of one request of ``n`` prompt tokens that resumes where its hits end: the GPU
    prefix cache holds ``resident`` and the tier ``stored`` (``{"<group>": [end tokens]}``, placed as
    :func:`kvgeom.conformance.vllm_scheduler.scheduler_admits` places them), and step ``i`` runs with the
    Scheduler's token budget ``budgets[i]`` (``Scheduler.max_num_scheduled_tokens`` set before each
    ``schedule()``; past the list the last budget stays; None: 8192). Answers ``{"start": the request's
    ``num_computed_tokens`` when its first chunk was scheduled (the hit), "chunk_ends": [...]}``.

    >>> import kvgeom
    >>> g = kvgeom.resolve({"groups": [{"kind": "full_attention", "block_size": 64},
    ...     {"kind": "mamba", "block_size": 64}], "cache": {"prefix_match_unit": 16}, "offload": {}})
    >>> run_prefill_split(g, 300, resident={"0": [64, 128, 192, 224], "1": [224]}, budgets=[8, 100])
    {'start': 224, 'chunk_ends': [232, 256, 288, 300]}

    The same entries in the offload tier give no hit (vLLM's connector loads nothing, and kvgeom's
    ``lookup_hit`` over them answers 0 as well), so the prefill starts at 0:

    >>> run_prefill_split(g, 300, stored={"0": [64, 128, 192, 224], "1": [224]}, budgets=[8, 100])
    {'start': 0, 'chunk_ends': [8, 64, 128, 192, 256, 288, 300]}
    """
    from kvgeom.prefix import resident_sets

    L, H = resolve_kv_cache_block_sizes(vo.build_kv_cache_config(geom), vo.build_vllm_config(geom))
    steps = list(budgets or [UNBOUNDED_BUDGET])
    sched = _scheduler(geom, steps, L, H)
    request = _request(sched, n, H, "R")
    vs.place_gpu_entries(sched, geom, request, resident_sets(geom, resident or {}), H)
    if sched.connector is not None:
        held = resident_sets(geom, stored or {}, "stored")
        tier: RecordingTier = sched.connector.connector_scheduler.manager
        tier.keys = {vo.offload_key(request, g, e, H) for g, ends in held.items() for e in ends}
    sched.add_request(request)
    start: int | None = None
    ends: list[int] = []
    for _ in range(MAX_STEPS):
        _step_budget(sched, steps, len(ends))
        output = sched.schedule()
        scheduled = output.num_scheduled_tokens.get(request.request_id, 0)
        if scheduled:
            if start is None:
                start = request.num_computed_tokens - scheduled
            ends.append(request.num_computed_tokens)
        token = n if request.num_computed_tokens >= n else None
        sched.update_from_output(output, _worker_output(sched, output, request, token))
        if not sched.has_requests():
            return {"start": start, "chunk_ends": ends}
    raise RuntimeError(f"the request ({n} tokens) did not finish in {MAX_STEPS} steps (chunk ends {ends[:8]}...)")


def run_lookup_trace(geom: Geometry, n: int, stored: Mapping[str, Any], *, local_computed_tokens: int = 0
                     ) -> dict[str, Any]:
    """Every key vLLM's ``OffloadingConnectorScheduler.get_num_new_matched_tokens`` (``_lookup`` ->
    ``_lookup_complete_chunks``) asks the offload manager's ``lookup`` for, in order, for a request of ``n``
    tokens over a tier holding exactly ``stored`` (``{"<group>": [end tokens]}``) from the L-aligned local
    prefix: ``{"hit": tokens, "probes": [[group, end_token, held], ...]}`` (each key's block hash located in
    the request's hash chain; a key outside it is listed with end token -1).

    >>> import kvgeom
    >>> g = kvgeom.resolve({"groups": [{"kind": "full_attention", "block_size": 16},
    ...                                {"kind": "mamba", "block_size": 16}], "offload": {}})
    >>> run_lookup_trace(g, 70, {"0": [16, 32, 48, 64], "1": [32]})["probes"][4:]
    [[1, 64, False], [1, 48, False], [1, 32, True]]
    """
    from kvgeom.prefix import resident_sets

    assert geom.offload is not None, "run_lookup_trace needs an offload section"
    vc = vo.build_vllm_config(geom)
    kcc = vo.build_kv_cache_config(geom)
    L, H = resolve_kv_cache_block_sizes(kcc, vc)
    # as vLLM's engine core sets them before the connector is built (v1/engine/core.py): an eagle group's
    # partial-tail proof margin reads the hit alignment (without it the margin is a whole block, not H)
    kcc.hash_block_size = H
    kcc.cache_hit_alignment_tokens = resolve_cache_hit_alignment_tokens(kcc, vc, L, H)
    tier = vo.ChosenTier()
    sched = vo.build_scheduler(geom, tier, vllm_config=vc, kv_cache_config=kcc)
    request = vo.build_request(n, H)
    chain = {bytes(h): i for i, h in enumerate(request.block_hashes)}
    tier.keys = {vo.offload_key(request, g, e, H) for g, ends in resident_sets(geom, stored, "stored").items()
                 for e in ends if e // H <= len(request.block_hashes)}  # past the chain: no hash to key
    probes: list[list[Any]] = []
    real_lookup = tier.lookup

    def lookup(key: Any, req_context: Any) -> Any:
        answer = real_lookup(key, req_context)
        block_hash, group = split_offload_key(bytes(key))
        index = chain.get(block_hash)
        probes.append([group, -1 if index is None else (index + 1) * H, answer.name == "HIT"])
        return answer

    tier.lookup = lookup  # type: ignore[method-assign]
    sched.on_new_request(request)
    local = local_computed_tokens - local_computed_tokens % L
    hit, _ = sched.get_num_new_matched_tokens(request, local)
    return {"hit": hit or 0, "probes": probes}


def _kvgeom_chunk_ends(geom: Geometry, n1: int, budget: Budget) -> list[int] | None:
    if not any(g.is_align_mamba for g in geom.groups):
        return None  # kvgeom models the chunk split only with an align Mamba group
    return list(prefill_chunk_ends(geom, n1, max_num_batched_tokens=budget))


def kvgeom_store_then_lookup(geom: Geometry, n1: int, n2: int, *, max_num_batched_tokens: Budget = None
                             ) -> dict[str, Any]:
    """kvgeom's answer in :func:`run_store_then_lookup`'s shape.

    ``chunk_ends``: :func:`kvgeom.prefill_chunk_ends` (None without an align Mamba group: kvgeom does not
    model the split then). ``stored``: the union of :func:`kvgeom_store_steps` over A's steps. ``hit`` and
    ``loads``: :meth:`kvgeom.Geometry.plan_hit` of ``n2`` tokens over that store, from local prefix 0 (the
    connector's ``get_num_new_matched_tokens`` in a fresh scheduler).

    >>> import kvgeom
    >>> g = kvgeom.resolve({"groups": [{"kind": "full_attention", "block_size": 16},
    ...                                {"kind": "mamba", "block_size": 16}], "offload": {}})
    >>> kvgeom_store_then_lookup(g, 100, 100)["stored"]
    {'0': [16, 32, 48, 64, 80, 96], '1': [96]}
    """
    chunk_ends = _kvgeom_chunk_ends(geom, n1, max_num_batched_tokens)
    stored: dict[str, set[int]] = {}
    for step in kvgeom_store_steps(geom, n1, chunk_ends):
        for g, ends in step.items():
            stored.setdefault(g, set()).update(ends)
    stored_out = {g: sorted(e) for g, e in sorted(stored.items(), key=lambda item: int(item[0]))}
    hit = geom.plan_hit({"num_tokens": n2, "stored": stored_out})
    return {
        "chunk_ends": chunk_ends,
        "stored": stored_out,
        "hit": hit["hit_tokens"],
        "loads": {str(g["index"]): list(g["load_keys"]) for g in hit["groups"] if g["load_keys"]},
    }


def kvgeom_store_steps(geom: Geometry, n1: int, chunk_ends: list[int] | None) -> list[dict[str, list[int]]]:
    """kvgeom's stores per step of request A in :func:`run_store_then_lookup`'s ``steps`` shape:
    :func:`kvgeom.hits.plan_store_steps` of the ``n1``-token prompt split at ``chunk_ends`` (None: one step ending
    at ``n1``), A finishing after its prefill.

    >>> import kvgeom
    >>> g = kvgeom.resolve({"groups": [{"kind": "full_attention", "block_size": 64},
    ...     {"kind": "mamba", "block_size": 64}], "cache": {"prefix_match_unit": 16}, "offload": {},
    ...     "speculative": {"method": "mtp", "num_speculative_tokens": 3, "mtp_modules": 3}})
    >>> kvgeom_store_steps(g, 100, [64, 80, 82, 100])   # vLLM 0.33 run: the partial tail at 80 in step 100
    [{'0': [64]}, {}, {}, {'0': [80], '1': [80]}, {}]
    """
    from kvgeom.hits import plan_store_steps

    plans = plan_store_steps(geom, num_prompt_tokens=n1, chunk_ends=chunk_ends or [n1])
    return [{str(gs.index): sorted(gs.stored_end_tokens) for gs in plan.groups if gs.stored_end_tokens}
            for plan in plans]


def differences(geom: Geometry, n1: int, n2: int, *, max_num_batched_tokens: Budget = None,
                theirs: Mapping[str, Any] | None = None) -> dict[str, tuple[Any, Any]]:
    """Entries where kvgeom and vLLM disagree: ``{name: (kvgeom, vllm)}`` over :data:`FIELDS` (empty when
    they agree; ``chunk_ends`` is not compared when kvgeom gives None). One more entry,
    ``hit_on_vllm_stores``, is kvgeom's hit over the keys *vLLM* stored (a lookup difference on its own,
    separated from a store difference); ``steps`` is :func:`kvgeom_store_steps` over vLLM's own chunk ends
    against vLLM's ``steps`` (which step stores which key), and ``gpu_cached`` :func:`kvgeom_gpu_cached` over them
    against vLLM's GPU prefix cache. ``theirs``: a :func:`run_store_then_lookup` answer already run."""
    budget = max_num_batched_tokens
    if theirs is None:
        theirs = run_store_then_lookup(geom, n1, n2, max_num_batched_tokens=budget)
    ours = kvgeom_store_then_lookup(geom, n1, n2, max_num_batched_tokens=budget)
    out = {k: (ours[k], theirs[k]) for k in FIELDS if ours[k] != theirs[k]}
    if "chunk_ends" in out and ours["chunk_ends"] is None:
        del out["chunk_ends"]
    on_theirs = geom.plan_hit({"num_tokens": n2, "stored": theirs["stored"]})["hit_tokens"]
    if on_theirs != theirs["hit"]:
        out["hit_on_vllm_stores"] = (on_theirs, theirs["hit"])
    ours_steps = kvgeom_store_steps(geom, n1, list(theirs["chunk_ends"]))
    if ours_steps != theirs["steps"]:
        out["steps"] = (ours_steps, theirs["steps"])
    ours_gpu = kvgeom_gpu_cached(geom, n1, list(theirs["chunk_ends"]))
    if ours_gpu != theirs["gpu_cached"]:
        out["gpu_cached"] = (ours_gpu, theirs["gpu_cached"])
    return out


def kvgeom_gpu_cached(geom: Geometry, n1: int, chunk_ends: list[int]) -> dict[str, list[int]]:
    """kvgeom's answer to :func:`run_store_then_lookup`'s ``gpu_cached``: :class:`kvgeom.sim.GPUPrefixCache`
    after ``cache_request(n1, chunk_ends=chunk_ends)``, the groups that hold nothing left out."""
    from kvgeom.sim import GPUPrefixCache

    cache = GPUPrefixCache(geom)
    cache.cache_request(n1, chunk_ends=chunk_ends)
    return {g: ends for g, ends in cache.resident().items() if ends}


# ------------------------------------------------------------------ classes of difference

KNOWN_CLASSES: dict[str, str] = {
    "mamba-state-keyed-past-chunk-end": "vLLM keys an align Mamba block at its end although no prefill chunk "
    "ended there: a chunk ended inside the block (the Mamba block is not cache_config.block_size), so the block "
    "holds the state after that earlier token (the registered deviation of kvgeom.deviations)",
    "realign-after-clamp": "kvgeom's lookup over vLLM's own stores differs because vLLM loads an align Mamba "
    "state that ends past its hit (the registered deviation of kvgeom.deviations)",
}
"""Difference classes :func:`classify` recognises (id: description), each a registered deviation
(:data:`kvgeom.deviations.DEVIATIONS`)."""


def _store_class(geom: Geometry, group: int, end: int, only_in_vllm: bool, chunk_ends: list[int]) -> str | None:
    """``mamba-state-keyed-past-chunk-end`` for a Mamba key only vLLM stores, at the end of a block that a
    chunk ended inside (and no chunk ended at ``end``); None (a new finding) otherwise."""
    g = geom.groups[group]
    if not (only_in_vllm and g.is_align_mamba) or end in chunk_ends:
        return None
    B = g.block_size
    if any(e % B and -(-e // B) * B == end for e in chunk_ends):
        return "mamba-state-keyed-past-chunk-end"
    return None


def classify(geom: Geometry, n1: int, n2: int, diff: Mapping[str, tuple[Any, Any]],
             theirs: Mapping[str, Any]) -> str | None:
    """The known classes (:data:`KNOWN_CLASSES` ids, ``+``-joined and sorted when several) that explain a
    non-empty :func:`differences` answer ``diff`` for vLLM's answer ``theirs``, or None when any part of it
    is unexplained (a new finding).

    Every stored key one side has and the other lacks must fall in a store class; a ``hit`` / ``loads``
    difference is explained by the store difference only when kvgeom's lookup over vLLM's stores agrees
    with vLLM (no ``hit_on_vllm_stores`` entry), else it needs ``realign-after-clamp``; a ``chunk_ends``
    difference is never explained, and a ``steps`` or ``gpu_cached`` difference only key by key as a stored key
    is."""
    if not diff or "chunk_ends" in diff:
        return None
    classes: set[str] = set()
    pairs = [diff[f] for f in ("stored", "gpu_cached") if f in diff]
    if "steps" in diff:  # a key stored in another step than vLLM's is explained by no class
        pairs.extend(zip(*diff["steps"], strict=True))
    for ours, vllm in pairs:
        for key in set(ours) | set(vllm):
            a, b = set(ours.get(key, ())), set(vllm.get(key, ()))
            for end, only_in_vllm in [*((e, True) for e in b - a), *((e, False) for e in a - b)]:
                cls = _store_class(geom, int(key), end, only_in_vllm, list(theirs["chunk_ends"]))
                if cls is None:
                    return None
                classes.add(cls)
    if "hit_on_vllm_stores" in diff:
        hit = theirs["hit"] or 0
        loads = theirs["loads"].items()
        if not any(geom.groups[int(g)].is_align_mamba and ends and ends[-1] > hit for g, ends in loads):
            return None
        classes.add("realign-after-clamp")
    elif ("hit" in diff or "loads" in diff) and "stored" not in diff:
        return None
    return "+".join(sorted(classes)) or None


# ------------------------------------------------------------------ the sweep


def random_case(rng: random.Random) -> tuple[dict[str, Any], int, int, int | None]:
    """One random deployment and request pair: ``(config, n1, n2, max_num_batched_tokens)``.

    FA + align Mamba (blocks from {16, 32, 64}, the Mamba block equal or different), an optional drafter
    (its own FA group with 4 KV heads, or the target FA group), DCP in {1, 2, 4, 8} (TP = DCP),
    speculative None / eagle / eagle3 / mtp (K 1-3, sometimes ``eagle_block_drop: false``, MTP sometimes
    with more modules), ``prefix_match_unit`` sometimes 16, retention 0 / 64 / None, offload ``{}`` or
    ``{"blocks_per_chunk": 2}``, budget None or 64..512, ``n1`` in 20..300, ``n2`` in ``n1..n1+100``."""
    fa = rng.choice([16, 32, 64])
    mb = fa if rng.random() < 0.5 else rng.choice([16, 32, 64])
    groups: list[dict[str, Any]] = [{"kind": "full_attention", "block_size": fa},
                                    {"kind": "mamba", "block_size": mb, "mamba_cache_mode": "align"}]
    dcp = rng.choice([1, 1, 2, 4, 8])
    cfg: dict[str, Any] = {"groups": groups, "parallel": {"dcp": dcp, "tp": dcp}}
    method = rng.choice([None, "eagle", "eagle3", "mtp"])
    if method is not None:
        spec: dict[str, Any] = {"method": method, "num_speculative_tokens": rng.randint(1, 3)}
        if rng.random() < 0.25:
            spec["eagle_block_drop"] = False
        if method == "mtp" and rng.random() < 0.5:
            spec["mtp_modules"] = rng.randint(2, 3)
        cfg["speculative"] = spec
        where = rng.choice(["own", "own", "target", "none"])
        if where == "own":
            groups.append({"kind": "full_attention", "block_size": fa, "num_kv_heads": 4, "drafter": True})
        elif where == "target":
            groups[0]["drafter"] = True
    cache: dict[str, Any] = {"retention_interval": rng.choice([0, 64, None])}
    if rng.random() < 0.4:
        cache["prefix_match_unit"] = 16
    cfg["cache"] = cache
    cfg["offload"] = rng.choice([{}, {"blocks_per_chunk": 2}])
    budget = rng.choice([None, rng.randint(64, 512)])
    n1 = rng.randint(20, 300)
    return cfg, n1, rng.randint(n1, n1 + 100), budget


def random_swa_drafter_case(rng: random.Random) -> tuple[dict[str, Any], int, int, int | None]:
    """One random sliding-window drafter deployment (issue 19): full attention (block 16 or 32) + a
    sliding-window group (block 16 or 32, window 1-100) marked ``drafter`` -- or a second sliding-window
    group with 4 KV heads as the drafter, or the full-attention group too -- EAGLE / EAGLE3 / MTP (K 1-3, MTP
    sometimes with 3 modules, so ``extra_retained_tokens`` > 0), retention 0 / 64 / 128 / None,
    ``prefix_match_unit`` sometimes 16, offload ``{}`` or two blocks per chunk, DCP 1, no budget; ``n1`` in
    20..300, ``n2`` in ``n1..n1+80``."""
    fa, sb = rng.choice([16, 32]), rng.choice([16, 32])
    groups: list[dict[str, Any]] = [
        {"kind": "full_attention", "block_size": fa},
        {"kind": "sliding_window", "block_size": sb, "sliding_window": rng.choice([1, 2, 16, 17, 32, 33, 64, 100])},
    ]
    where = rng.choice(["window", "window", "both", "own"])
    if where in ("window", "both"):
        groups[1]["drafter"] = True
    if where == "both":
        groups[0]["drafter"] = True
    if where == "own":
        groups.append({"kind": "sliding_window", "block_size": sb, "sliding_window": 32, "num_kv_heads": 4,
                       "drafter": True})
    method = rng.choice(["eagle", "eagle3", "mtp"])
    spec: dict[str, Any] = {"method": method, "num_speculative_tokens": rng.randint(1, 3)}
    if method == "mtp" and rng.random() < 0.5:
        spec["mtp_modules"] = 3
    cache: dict[str, Any] = {"retention_interval": rng.choice([0, 64, 128, None])}
    if rng.random() < 0.4:
        cache["prefix_match_unit"] = 16
    cfg = {"groups": groups, "parallel": {"dcp": 1, "tp": 1}, "speculative": spec, "cache": cache,
           "offload": rng.choice([{}, {"blocks_per_chunk": 2}])}
    n1 = rng.randint(20, 300)
    return cfg, n1, rng.randint(n1, n1 + 80), None


def random_split_case(rng: random.Random) -> tuple[dict[str, Any], int, int, list[int]]:
    """One random deployment whose prefill runs with a token budget that changes per step (issue 19): FA +
    align Mamba (blocks from {16, 32, 64}), speculative None / eagle (its own drafter group) / MTP (K 1-5,
    often with 2-3 modules), ``prefix_match_unit`` sometimes 16, retention 0 / 64 / None, offload ``{}`` or two
    blocks per chunk, DCP 1 or 2, and 1-6 per-step budgets from 1..100 (the last one stays); ``n1`` in 40..260,
    ``n2 = n1``."""
    fa = rng.choice([16, 32, 64])
    mb = fa if rng.random() < 0.6 else rng.choice([16, 32, 64])
    groups: list[dict[str, Any]] = [{"kind": "full_attention", "block_size": fa},
                                    {"kind": "mamba", "block_size": mb, "mamba_cache_mode": "align"}]
    dcp = rng.choice([1, 1, 1, 2])
    cfg: dict[str, Any] = {"groups": groups, "parallel": {"dcp": dcp, "tp": dcp}}
    method = rng.choice([None, "eagle", "mtp", "mtp"])
    if method == "eagle":
        cfg["speculative"] = {"method": "eagle", "num_speculative_tokens": rng.randint(1, 3)}
        groups.append({"kind": "full_attention", "block_size": fa, "num_kv_heads": 4, "drafter": True})
    elif method == "mtp":
        k = rng.randint(1, 5)
        cfg["speculative"] = {"method": "mtp", "num_speculative_tokens": k, "mtp_modules": rng.randint(1, min(k, 3))}
    cache: dict[str, Any] = {"retention_interval": rng.choice([0, 64, None])}
    if rng.random() < 0.6:
        cache["prefix_match_unit"] = 16
    cfg["cache"] = cache
    cfg["offload"] = rng.choice([{}, {"blocks_per_chunk": 2}])
    budgets = [rng.choice([1, 2, 3, 4, 5, 8, 16, 20, 34, 64, 100]) for _ in range(rng.randint(1, 6))]
    n1 = rng.randint(40, 260)
    return cfg, n1, n1, budgets


def summary(cfg: Mapping[str, Any]) -> str:
    """A compact one-line description of a :func:`random_case` config."""
    parts = []
    for g in cfg["groups"]:
        tag = {"full_attention": "FA", "mamba": "M"}.get(g["kind"], g["kind"]) + str(g["block_size"])
        if g.get("drafter"):
            tag += "*d" + ("h4" if g.get("num_kv_heads") else "")
        parts.append(tag)
    s = cfg.get("speculative")
    out = "+".join(parts) + f" dcp{cfg['parallel']['dcp']}"
    if s:
        out += f" {s['method']}K{s['num_speculative_tokens']}"
        if s.get("eagle_block_drop") is False:
            out += "-nodrop"
        if s.get("mtp_modules", 1) > 1:
            out += f"-mods{s['mtp_modules']}"
    c = cfg.get("cache", {})
    if c.get("prefix_match_unit"):
        out += f" pmu{c['prefix_match_unit']}"
    out += f" ret{c.get('retention_interval')}"
    if cfg.get("offload", {}).get("blocks_per_chunk"):
        out += f" k{cfg['offload']['blocks_per_chunk']}"
    return out


def sweep(n: int, seed: int, *, swa_drafters: bool = False, split_budgets: bool = False) -> dict[str, Any]:
    """Run ``n`` random cases (:func:`random_case`, :func:`random_swa_drafter_case` with ``swa_drafters``, or
    :func:`random_split_case` with ``split_budgets``; seeded) through both sides: kvgeom refusals
    (:class:`kvgeom.KVGeomError`) skipped, vLLM refusals (any exception) recorded separately. Returns
    ``{"cases", "kvgeom_refused": Counter(code), "vllm_refused": [...], "agree": {field: count}, "compared",
    "differences": [(cfg, n1, n2, budget, diff, class)]}``."""
    rng = random.Random(seed)
    report: dict[str, Any] = {"cases": n, "kvgeom_refused": Counter(), "vllm_refused": [], "compared": 0,
                              "agree": Counter(), "differences": []}
    draw: Any = random_swa_drafter_case if swa_drafters else random_split_case if split_budgets else random_case
    for _ in range(n):
        cfg, n1, n2, budget = draw(rng)
        try:
            geom = resolve(cfg)
            kvgeom_store_then_lookup(geom, n1, n2, max_num_batched_tokens=budget)
        except KVGeomError as e:
            report["kvgeom_refused"][e.code] += 1
            continue
        try:
            theirs = run_store_then_lookup(geom, n1, n2, max_num_batched_tokens=budget)
        except Exception as e:  # any vLLM exception is vLLM refusing the case
            report["vllm_refused"].append((cfg, n1, n2, budget, f"{type(e).__name__}: {e}"[:160]))
            continue
        diff = differences(geom, n1, n2, max_num_batched_tokens=budget, theirs=theirs)
        report["compared"] += 1
        for f in COMPARED:
            report["agree"][f] += f not in diff
        if diff:
            report["differences"].append((cfg, n1, n2, budget, diff, classify(geom, n1, n2, diff, theirs)))
    return report


def _print_report(report: Mapping[str, Any]) -> None:
    c = report["compared"]
    refused = report["kvgeom_refused"]
    print(f"cases {report['cases']}: kvgeom refused {sum(refused.values())} ({dict(refused)}), vLLM refused "
          f"{len(report['vllm_refused'])}, compared {c}")
    print("agree: " + ", ".join(f"{f} {report['agree'][f]}/{c}" for f in COMPARED))
    for cfg, n1, n2, budget, why in report["vllm_refused"]:
        print(f"  vLLM refuses: {summary(cfg)} n1={n1} n2={n2} budget={budget}: {why}")
    classes = Counter(cls for *_, cls in report["differences"])
    print("difference classes: " + ", ".join(f"{k}: {v}" for k, v in sorted(classes.items(), key=str)))
    for cfg, n1, n2, budget, diff, cls in report["differences"]:
        fields = "; ".join(f"{k} kvgeom={a} vllm={b}" for k, (a, b) in diff.items())
        print(f"  [{cls}] {summary(cfg)} n1={n1} n2={n2} budget={budget}: {fields}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", type=int, default=100)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--swa-drafters", action="store_true", help="draw sliding-window drafter deployments")
    ap.add_argument("--split-budgets", action="store_true", help="draw token budgets that change per step")
    args = ap.parse_args(argv)
    _print_report(sweep(args.cases, args.seed, swa_drafters=args.swa_drafters, split_budgets=args.split_budgets))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
