"""LMCache 0.5.6's own geometry functions, asked on vLLM 0.33's real spec objects (needs LMCache and vLLM).

This is ``kvgeom conform --engine lmcache``: :func:`lmcache_answers` fills LMCache's answer sheet for a
resolved geometry and LMCache settings by calling the installed LMCache, in its connector's order:
``validate_mamba_step_alignment``, ``validate_kv_cache_groups``, ``get_group_tokens_per_block``,
``get_vllm_scheduler_block_size`` (its coarse-block warning captured from its logger),
``get_dcp_decorated_model_name`` (vLLM's real interleave adjuster bound to the stand-in config, as LMCache
calls it), ``validate_dcp_support``, then the scheduler-side connector constructed by its own
``__init__`` (the server split, the chunk size against the scheduler block, the lookup's hold-back of
prompts around one and two chunks, the relocation window, the hit unit:
:func:`kvgeom.conformance.lmcache_transfer.connector_answers`), ``slice_block_ids_per_group`` over every
chunk of a request (the chunk-size rule: a chunk off a group's span grid raises there), and the worker's
registration and staging (:func:`kvgeom.conformance.lmcache_transfer.lmcache_staged`; LMCache's own
``create_engine_group_infos_from_vllm`` when no group reaches the worker). LMCache's connectors get vLLM's
config before its model runner appends an encoder-only group, so their groups are vLLM's first ones: the
encoder-only group (always the last) is given span 0 and no block ids on LMCache's side of the sheet. Each case also
checks the chunk hash chain (:func:`hash_chain_differences`) and, for a reference sliding-window group, which
blocks LMCache stores while decoding that vLLM has freed
(:func:`kvgeom.conformance.lmcache_transfer.lmcache_decode_stored_freed`). The spec objects and the
config stand-in are :mod:`kvgeom.conformance.vllm_objects`'s (vLLM's real classes); the transfer config
names LMCache's multiprocess connector.

:func:`run` draws deployments (hybrids, drafters, DCP and PCP, interleaves, scratch ring groups, Mamba
modes, several servers, chunk sizes), compares the sheet with kvgeom's model
(:func:`kvgeom.engines.lmcache.sheet`), and classifies every difference:

* **model**: kvgeom's model of LMCache answers differently from LMCache (a kvgeom bug: a new finding);
* **crash**: LMCache raised something other than its ``ValueError`` refusals (a new finding);
* **parting**: LMCache (the real one) parts from vLLM's geometry: a registered
  :data:`kvgeom.engines.lmcache.FINDINGS` id (counted, with the smallest example), or unregistered (a new
  finding).

Each new finding is shrunk by Hypothesis to a minimal case (the report prints it as a reproducer).

>>> import kvgeom
>>> s = lmcache_answers(kvgeom.resolve(kvgeom.DEFAULT_CONFIG), {})
>>> s["spans"], s["scheduler_block"], s["identity"]
([32, 16], 32, 'model')
"""

from __future__ import annotations

import json
import logging
import types
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import kvgeom.conformance.vllm_objects as vo  # first: quiets vLLM's logging before LMCache imports it

logging.getLogger("lmcache").setLevel(logging.WARNING)

import lmcache  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from lmcache.integration.vllm import lmcache_mp_connector as mp  # noqa: E402
from lmcache.integration.vllm.kv_cache_group_edits import validate_kv_cache_groups  # noqa: E402
from lmcache.v1.multiprocess.group_view import slice_block_ids_per_group  # noqa: E402
from vllm.config import KVTransferConfig, VllmConfig  # noqa: E402

from kvgeom._resolve import resolve  # noqa: E402
from kvgeom.conformance import lmcache_transfer as transfer  # noqa: E402
from kvgeom.conformance.gpu_prefix import drafter_configs  # noqa: E402
from kvgeom.conformance.run import hybrid_configs  # noqa: E402
from kvgeom.conformance.search import NewFinding, search_rounds  # noqa: E402
from kvgeom.engines import lmcache as model  # noqa: E402
from kvgeom.errors import KVGeomError, QueryError  # noqa: E402
from kvgeom.geometry import Geometry  # noqa: E402
from kvgeom.hashing import block_hashes  # noqa: E402
from kvgeom.strategies import ALL_KINDS, configs  # noqa: E402

__all__ = [
    "COMPARED", "DEFAULT_EXAMPLES", "LMCACHE_VERSION", "Finding", "Report", "cases", "check_case", "compare",
    "hash_chain_differences", "kvgeom_answers", "lmcache_answers", "lookup_lengths", "run", "windowed_configs",
]

LMCACHE_VERSION: str = str(getattr(lmcache, "__version__", "")) or "0.5.6"
"""The installed LMCache's version string."""

DEFAULT_EXAMPLES = 200
"""Generated cases per round of a default ``kvgeom conform --engine lmcache`` run."""

COMPARED = ("refused", "refused_code", "spans", "scheduler_block", "coarse", "identity", "chunk_block_ids", "staged",
            "holds_back_last_token", "lookup_ends", "relocation_window", "hit_alignment", "decode_stored_freed")
"""The questions on which kvgeom's model and LMCache are compared."""


class _Capture(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def _settings(s: Mapping[str, Any]) -> model.LMCacheSettings:
    return model.LMCacheSettings(**dict(s))


def _config(geom: Geometry, s: model.LMCacheSettings) -> tuple[Any, Any]:
    vc = vo.build_vllm_config(geom)
    vc.kv_transfer_config = KVTransferConfig(kv_connector="LMCacheMPConnector", kv_role="kv_both")
    vc.model_config.model = s.model
    vc.scheduler_config.max_num_batched_tokens = s.max_num_batched_tokens
    vc.adjust_dcp_kv_cache_interleave_size = types.MethodType(VllmConfig.adjust_dcp_kv_cache_interleave_size, vc)
    return vc, vo.build_kv_cache_config(geom)


def _refused(code: str, e: Exception) -> dict[str, Any]:
    return {"refused": True, "refused_code": code, "refused_message": str(e)}


def _chunk_ids(spans: list[int], chunk: int, num_chunks: int, slicer: Any) -> list[list[list[int]]]:
    """Each group's block ids 0..n-1 for ``num_chunks`` chunks, sliced chunk by chunk by ``slicer``."""
    end = chunk * num_chunks
    ids = {g: list(range(end // s)) if s else [] for g, s in enumerate(spans)}
    return [slicer(ids, spans, c * chunk, (c + 1) * chunk) for c in range(num_chunks)]


def lmcache_answers(geom: Geometry, scenario: Mapping[str, Any]) -> dict[str, Any]:
    """LMCache's sheet for ``geom`` under the LMCache settings ``scenario`` (this engine's scenario: the
    fields of :class:`kvgeom.engines.lmcache.LMCacheSettings`), from the installed LMCache. A refusal is
    ``refused`` with the kvgeom code of the check that raised; anything else LMCache raises is ``crash``."""
    s = _settings(scenario)
    try:
        vc, kcc = _config(geom, s)
        transfer.check_vllm_plans(kcc)  # vLLM plans its cache before it builds any connector
    except transfer.VLLMRejects as e:
        return {"skip": f"vLLM rejects the objects: {e}"}
    except Exception as e:  # vLLM itself rejects the objects: not LMCache's business
        return {"skip": f"vLLM rejects the objects: {type(e).__name__}: {e}"}
    step = "mamba_step"
    try:
        try:
            mp.validate_mamba_step_alignment(vc, kcc)
        except ValueError as e:
            return _refused("lmcache_mamba_block_sizes" if "one physical block size" in str(e)
                            else "lmcache_mamba_step", e)
        step = "groups"
        try:
            validate_kv_cache_groups(kcc)
        except ValueError as e:
            return _refused("lmcache_unsupported_group", e)
        step = "spans"
        spans = list(mp.get_group_tokens_per_block(vc, kcc))
        # LMCache's groups are vLLM's first ones: an encoder-only group (always the last) never reaches it
        spans += [0] * (len(geom.groups) - len(spans))
        capture = _Capture()
        handlers, propagate = mp.logger.handlers[:], mp.logger.propagate
        mp.logger.handlers[:], mp.logger.propagate = [capture], False  # the warning is an answer, not noise
        try:
            block = mp.get_vllm_scheduler_block_size(vc, kcc)
        except ValueError as e:
            return _refused("lmcache_no_cacheable_group", e)
        finally:
            mp.logger.handlers[:], mp.logger.propagate = handlers, propagate
        step = "identity"
        identity = mp.get_dcp_decorated_model_name(vc, kcc)
        derived = {"spans": spans, "scheduler_block": block, "identity": identity}
        step = "dcp"
        try:
            mp.validate_dcp_support(vc, s.servers, kcc)
        except ValueError as e:
            msg = str(e)
            code = ("lmcache_dcp_with_pcp" if "prefill-context" in msg else
                    "lmcache_interleave" if "cp_kv_cache_interleave_size" in msg else "lmcache_servers")
            return _refused(code, e) | derived
        step = "connector"  # the scheduler-side connector, constructed; its lookup of a few prompt lengths
        conn = transfer.connector_answers(geom, scenario, lookup_lengths(s.chunk_size))
        if conn["refused"]:
            msg = conn["refused_message"]
            code = ("lmcache_servers_split" if "n_servers" in msg and "divisible" in msg else
                    "lmcache_servers_pp" if "pipeline parallelism" in msg else
                    "lmcache_chunk_size" if "chunk size" in msg.lower() else "lmcache_connector_other")
            return {"refused": True, "refused_code": code, "refused_message": msg} | derived
        step = "chunk"
        try:
            chunk_ids = _chunk_ids(spans, s.chunk_size, 2, slice_block_ids_per_group)
        except ValueError as e:
            return _refused("lmcache_chunk_size", e) | derived
        step = "registration"  # the worker's groups, checked and staged (lmcache_transfer)
        worker = transfer.lmcache_worker_registration(geom)
        if worker["refused"]:
            return worker | derived
        staged = transfer.lmcache_staged(geom, scenario, 2)
        if staged["refused"]:
            return staged | derived
        step = "decode_store"  # its decode-time stores beside vLLM's rswa frees
        decode_freed = transfer.lmcache_decode_stored_freed(geom, scenario)
    except transfer.VLLMRejects as e:
        return {"skip": f"vLLM rejects the objects: {e}"}
    except Exception as e:
        return {"crash": f"{step}: {type(e).__name__}: {e}"}
    out = {
        "refused": False,
        "spans": spans,
        "scheduler_block": block,
        "coarse": any("scheduler block" in m for m in capture.messages),
        "identity": identity,
        "chunk_block_ids": chunk_ids,
        "staged": staged["staged"],
        "decode_stored_freed": decode_freed,
    }
    return out | {k: conn[k] for k in ("holds_back_last_token", "lookup_ends", "relocation_window", "hit_alignment")}


def lookup_lengths(chunk_size: int) -> list[int]:
    """The prompt lengths whose lookup end is compared: around one and two chunks, where the hold-back
    matters (a prompt of exactly k chunks reaches only k - 1 with it)."""
    return [0, 1, chunk_size - 1, chunk_size, chunk_size + 1, 2 * chunk_size, 2 * chunk_size + 1]


def kvgeom_answers(geom: Geometry, settings_: Mapping[str, Any]) -> dict[str, Any]:
    """kvgeom's model of the same sheet (:func:`kvgeom.engines.lmcache.sheet`, plus the chunk slices)."""
    s = _settings(settings_)
    out = model.sheet(geom, s)
    if not out["refused"]:
        out["chunk_block_ids"] = _chunk_ids(out["spans"], s.chunk_size, 2, model.slice_block_ids)
        lm = model.lmcache_geometry(geom, s)
        ids = {g: list(range(2 * s.chunk_size // sp)) for g, sp in enumerate(lm.spans) if sp}
        out["staged"] = model.stage_block_ids(lm, ids, 2)
        out["lookup_ends"] = [model.lookup_end(lm, n) for n in lookup_lengths(s.chunk_size)]
        out["relocation_window"] = lm.relocation_window
        out["hit_alignment"] = lm.scheduler_block
        out["decode_stored_freed"] = model.decode_stored_freed(geom, s)
    return out


def hash_chain_differences(geom: Geometry, settings_: Mapping[str, Any]) -> list[tuple[str, Any, Any]]:
    """LMCache's chunk hash chain against kvgeom's map of it (:func:`kvgeom.engines.lmcache.chunk_map`) and
    vLLM's request hashes, on real token lists: two prompts of ``2.5`` chunks that part at each of a few
    positions p. LMCache's ``TokenHasher`` and ``ChunkedTokenDatabase`` must chunk as the map says (whole
    chunks only), and a chunk's hash must agree between the prompts exactly when the map says its prefix
    ends by p, as must vLLM's request hash at the chunk's ``hash_index``. Empty when all agree (or when
    LMCache refuses the deployment)."""
    s = _settings(settings_)
    C = s.chunk_size
    n = 2 * C + C // 2
    try:
        cover = model.chunk_map(geom, n, s)
    except model.LMCacheRefusal:
        return []
    base = [(7 * i + 3) % 50_000 for i in range(n)]
    first = transfer.lmcache_chunks(base, C)
    out: list[tuple[str, Any, Any]] = []
    ranges = [(c.start, c.end) for c in cover]
    if first["ranges"] != ranges or len(first["hashes"]) != len(cover):
        return [("chunk_ranges", first["ranges"], ranges)]  # the chunks themselves differ: nothing to pair up
    H = geom.hash_block_size
    ours_base = block_hashes(H, base, lookahead_tokens=0)
    for p in sorted({0, C - 1, C, n - 1}):
        other = [*base[:p], 50_001, *base[p + 1:]]
        second = transfer.lmcache_chunks(other, C)
        theirs = [a == b for a, b in zip(first["hashes"], second["hashes"], strict=True)]
        db = [a == b for a, b in zip(first["db_hashes"], second["db_hashes"], strict=True)]
        ours = [c.end <= p for c in cover]
        if theirs != ours or db != ours:
            out.append((f"shared_chunks@{p}", theirs, ours))
        vllm_other = block_hashes(H, other, lookahead_tokens=0)
        vllm = [ours_base[c.hash_index] == vllm_other[c.hash_index] for c in cover if c.hash_index is not None]
        if vllm != [c.end <= p for c in cover if c.hash_index is not None]:
            out.append((f"vllm_hash_at_chunk_end@{p}", vllm, ours))
    return out


def compare(theirs: Mapping[str, Any], ours: Mapping[str, Any]) -> list[tuple[str, Any, Any]]:
    """The :data:`COMPARED` questions (only the refusal and what was derived before it, when either side
    refuses) on which LMCache's sheet and kvgeom's differ: ``(question, LMCache's, kvgeom's)``."""
    if theirs.get("refused") or ours.get("refused"):
        qs: tuple[str, ...] = ("refused", "refused_code", "spans", "scheduler_block", "identity")
    else:
        qs = COMPARED
    return [(q, theirs.get(q), ours.get(q)) for q in qs if theirs.get(q) != ours.get(q)]


# --------------------------------------------------------------------------- the run

Case = tuple[dict[str, Any], dict[str, Any]]



def windowed_configs() -> st.SearchStrategy[dict[str, Any]]:
    """Full attention beside a windowed group LMCache cuts per chunk: a sliding window (1-8 blocks, on or
    off the block grid, ``extra_retained_tokens`` 0-3, as speculative decoding sets it) or an align-mode
    Mamba group (vLLM 0.33's ``CacheConfig`` takes no other snapshotting mode), blocks of 1-32 tokens, no
    parallelism: the cases LMCache's staging is exercised on (:func:`kvgeom.strategies.configs` draws
    windows mostly wider than a chunk). Shrinks to a one-token-block Mamba group.

    >>> from kvgeom.strategies import minimal
    >>> minimal(windowed_configs())["groups"][1]
    {'kind': 'mamba', 'block_size': 1, 'mamba_cache_mode': 'align'}
    """

    @st.composite
    def build(draw: st.DrawFn) -> dict[str, Any]:
        block = draw(st.sampled_from([1, 2, 4, 8, 16, 32]))
        if draw(st.booleans()):
            window = draw(st.integers(1, 8)) * block - draw(st.sampled_from([0, 0, 1]))
            second: dict[str, Any] = {"kind": "sliding_window", "block_size": block, "sliding_window": max(window, 1),
                                      "extra_retained_tokens": draw(st.integers(0, 3))}
        else:
            second = {"kind": "mamba", "block_size": block * draw(st.sampled_from([1, 2, 4])),
                      "mamba_cache_mode": "align"}
        return {"groups": [{"kind": "full_attention", "block_size": block}, second]}

    return build()


def cases() -> st.SearchStrategy[Case]:
    """``(config, lmcache settings)`` pairs: configs of :func:`kvgeom.strategies.configs` (1-3 groups of
    every kind: full attention, MLA, sink, sliding windows, chunked local, cross attention, ring-buffer
    scratch groups, Mamba in every mode, reference sliding windows (``rswa``), HiSparse hot and resident
    groups, an encoder-only last group, uniform groups; DCP up to 4, PCP, interleaves, prefix caching on
    or off), hybrids
    (:func:`kvgeom.conformance.run.hybrid_configs`), drafter configs and windowed groups
    (:func:`windowed_configs`); settings: chunk sizes around
    LMCache's 256 or a multiple of vLLM's scheduler block, 1-4 servers, a batch budget around the Mamba
    block, ``save_decode_cache`` one time in four. Shrinks to one-token blocks, chunk 256, one server.

    >>> from kvgeom.strategies import minimal
    >>> minimal(cases())[1]
    {'chunk_size': 256, 'servers': 1, 'max_num_batched_tokens': 8192}
    """
    general = configs(kinds=ALL_KINDS, max_groups=3, max_dcp=4, max_block_size=64, max_model_len=False)
    cfgs = st.one_of(general, general, hybrid_configs(), drafter_configs(), windowed_configs())

    @st.composite
    def build(draw: st.DrawFn) -> Case:
        cfg = draw(cfgs)
        # the chunk a user picks from vLLM's geometry (a multiple of its scheduler block), or a fixed one
        unit = resolve(cfg).scheduler_block_size
        chunk = draw(st.sampled_from([256, 512, 128, 96, 48]) | st.integers(1, 4).map(lambda k: k * unit))
        opts = {
            "chunk_size": chunk,
            "servers": draw(st.sampled_from([1, 1, 2, 4])),
            "max_num_batched_tokens": draw(st.sampled_from([8192, 8192, 16, 32])),
        }
        if draw(st.sampled_from([False, False, False, True])):  # LMCache's default: prompt chunks only
            opts["save_decode_cache"] = True
        return cfg, opts

    return build()


@dataclass(frozen=True, slots=True)
class Finding:
    """One case where something differs: ``kind`` is ``model``, ``crash`` or ``parting``; ``finding`` the
    registered id of a parting (None: new); ``details`` the differences."""

    kind: str
    finding: str | None
    config: dict[str, Any]
    settings: dict[str, Any]
    details: tuple[tuple[str, Any, Any], ...]

    @property
    def is_new(self) -> bool:
        return self.finding is None

    @property
    def signature(self) -> tuple[str, str | None, tuple[str, ...]]:
        return (self.kind, self.finding, tuple(sorted({d[0] for d in self.details})))

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "finding": self.finding, "config": self.config, "lmcache": self.settings,
                "details": [{"question": q, "lmcache": a, "other": b} for q, a, b in self.details]}

    def reproducer(self) -> str:
        return (f"import kvgeom\nfrom kvgeom.engines.lmcache import LMCacheSettings, partings\n"
                f"geom = kvgeom.resolve({self.config!r})\nprint(partings(geom, LMCacheSettings(**{self.settings!r})))")

    def render(self) -> str:
        head = {"model": "kvgeom's model of LMCache is wrong", "crash": "LMCache crashed",
                "parting": "LMCache parts from vLLM"}[self.kind]
        reg = f" (registered: {self.finding})" if self.finding else " (NEW)"
        lines = [f"{head}{reg}: config {json.dumps(self.config)} lmcache {json.dumps(self.settings)}"]
        other = "kvgeom" if self.kind == "model" else "vLLM"
        lines += [f"  {q}: LMCache {json.dumps(a)} vs {other} {json.dumps(b)}" for q, a, b in self.details]
        return "\n".join(lines)


@dataclass
class Report:
    """The outcome of :func:`run`."""

    examples: int
    seed: int
    strict: bool = False
    findings: list[Finding] = field(default_factory=list)
    """Shrunk new findings."""
    registered: Counter[str] = field(default_factory=Counter)
    examples_by_id: dict[str, Finding] = field(default_factory=dict)
    cases_checked: int = 0
    skipped: int = 0

    @property
    def exit_code(self) -> int:
        """1 on a new finding (with ``strict``, on a registered one too), else 0."""
        return 1 if self.findings or (self.strict and self.registered) else 0

    def to_dict(self) -> dict[str, Any]:
        return {"engine": "lmcache", "engine_version": LMCACHE_VERSION, "examples": self.examples,
                "seed": self.seed, "cases_checked": self.cases_checked, "skipped": self.skipped,
                "exit_code": self.exit_code, "findings": [f.to_dict() for f in self.findings],
                "registered": {k: {"count": n, "title": model.FINDINGS[k].title,
                                   "example": self.examples_by_id[k].to_dict()}
                               for k, n in sorted(self.registered.items())}}

    def render(self) -> str:
        lines = [f"kvgeom conform: lmcache {LMCACHE_VERSION}, {self.cases_checked} cases "
                 f"(seed {self.seed}, {self.examples} examples per round; {self.skipped} rejected by vLLM)"]
        for k, n in sorted(self.registered.items()):
            ex = self.examples_by_id[k]
            lines.append(f"registered finding {k}: {n} case(s), e.g. config {json.dumps(ex.config)} "
                         f"lmcache {json.dumps(ex.settings)}")
        for f in self.findings:
            lines += ["", f.render(), "reproducer:", f.reproducer()]
        if not self.findings:
            lines.append("no new finding")
        return "\n".join(lines)


def _size(f: Finding) -> tuple[int, str]:
    return (len(f.config.get("groups", ())), json.dumps(f.config, sort_keys=True))


def check_case(cfg: dict[str, Any], opts: dict[str, Any]) -> list[Finding] | None:
    """Every finding of one case (None when vLLM rejects the objects)."""
    geom = resolve(cfg)
    theirs = lmcache_answers(geom, opts)
    if "skip" in theirs:
        return None
    if "crash" in theirs:
        return [Finding("crash", None, cfg, opts, (("crash", theirs["crash"], None),))]
    out = []
    diffs = compare(theirs, kvgeom_answers(geom, opts)) + hash_chain_differences(geom, opts)
    if diffs:
        out.append(Finding("model", None, cfg, opts, tuple(diffs)))
    found = model.partings_of(geom, theirs)
    if not theirs.get("refused") and not diffs:  # the staging and decode-store partings, from LMCache's own answers
        found += model.staging_partings(geom, _settings(opts), theirs["staged"])
        found += model.decode_store_partings(geom, _settings(opts), theirs["decode_stored_freed"])
    for p in found:
        out.append(Finding("parting", p.finding, cfg, opts, ((p.question, p.lmcache, p.vllm),)))
    return out


def run(*, examples: int = DEFAULT_EXAMPLES, seed: int = 0, strict: bool = False) -> Report:
    """Draw ``examples`` cases per round (:func:`cases`), classify (module docstring), shrink each new kind
    of finding; at most six rounds."""
    if type(examples) is not int or examples < 1:
        raise QueryError.single("bad_examples", f"examples must be a positive integer, got {examples!r}", "examples")
    if type(seed) is not int or seed < 0:
        raise QueryError.single("bad_seed", f"seed must be a non-negative integer, got {seed!r}", "seed")
    report = Report(examples, seed, strict)
    seen: set[str] = set()
    known: set[tuple[str, str | None, tuple[str, ...]]] = set()

    def check(case: Case) -> None:
        cfg, opts = case
        key = json.dumps(case, sort_keys=True)
        fresh = key not in seen
        seen.add(key)
        try:
            found = check_case(cfg, opts)
        except KVGeomError:
            return
        if found is None:
            if fresh:
                report.skipped += 1
            return
        for f in found:
            if f.finding is not None:
                if fresh:
                    report.registered[f.finding] += 1
                    best = report.examples_by_id.get(f.finding)
                    if best is None or _size(f) < _size(best):
                        report.examples_by_id[f.finding] = f
            elif f.signature not in known:
                raise NewFinding(f, f.signature)

    def on_found(f: Finding) -> None:
        report.findings.append(f)
        known.add(f.signature)

    search_rounds(cases(), check, on_found, seed=seed, examples=examples, rounds=6)
    report.cases_checked = len(seen)
    return report
