"""The conformance run: generate geometries and scenarios, ask the engine and kvgeom, classify, shrink.

:func:`run` draws ``(config, scenario)`` cases from :func:`cases` (built on :mod:`kvgeom.strategies`),
asks the engine (a function ``answer(geometry, scenario) -> sheet``; by default vLLM's,
:func:`kvgeom.conformance.vllm_engine.vllm_answers`) and kvgeom
(:func:`kvgeom.conformance.answers.kvgeom_answers`), compares and classifies the differences
(:mod:`kvgeom.conformance.findings`). A difference no documented deviation explains is a new finding:
Hypothesis then shrinks the case to a minimal one, which the report prints as a reproducer. With
``strict`` documented deviations are shrunk and reported as findings too.

Invariants (tested in ``tests/test_conformance_findings.py`` with a stand-in engine, and in
``tests/test_conformance.py`` against an installed vLLM):

* an engine that answers exactly like kvgeom yields no finding and no deviation;
* every finding reported has at least one difference, and a new finding's case is the shrunk one;
* the run is reproducible: the same ``seed`` and ``examples`` give the same report.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from hypothesis import strategies as st

from kvgeom._resolve import resolve
from kvgeom.conformance.answers import kvgeom_answers
from kvgeom.conformance.findings import Finding, classify, compare
from kvgeom.conformance.gpu_prefix import drafter_configs, gpu_residencies
from kvgeom.conformance.search import NewFinding, search_rounds
from kvgeom.deviations import DEVIATIONS
from kvgeom.errors import QueryError
from kvgeom.geometry import Geometry
from kvgeom.strategies import block_sizes, configs, parallel_configs, scenarios

__all__ = ["DEFAULT_EXAMPLES", "DEFAULT_KINDS", "Report", "cases", "hybrid_configs", "run"]

Answer = Callable[[Geometry, Mapping[str, Any]], dict[str, Any]]

DEFAULT_KINDS: tuple[str, ...] = (
    "full_attention", "mla", "mamba", "sliding_window", "chunked_local",
    "rswa", "hisparse_hot", "hisparse_resident", "encoder_only",
)
"""Group kinds the default run draws (those whose vLLM spec classes the checker builds and whose
offload rules kvgeom models without a documented deviation). The last four (issue 19) are vLLM 0.33's
``RSWASpec``, ``HiSparseHotSpec``, ``HiSparseResidentSpec`` and ``EncoderOnlyAttentionSpec``; an
encoder-only group is left out of the scheduler's config, as vLLM's model runner appends it."""

DEFAULT_EXAMPLES = 300
"""Generated cases per round of a default run."""

_MAX_ROUNDS = 6


Case = tuple[dict[str, Any], dict[str, Any]]


def cases(*, kinds: Sequence[str] = DEFAULT_KINDS, max_tokens: int = 512) -> st.SearchStrategy[Case]:
    """``(config, scenario)`` pairs: a config from :func:`kvgeom.strategies.configs` (1-3 groups of
    ``kinds``, DCP up to 4, blocks up to 64, offloading on three times in four, no PCP) and a scenario
    from :func:`kvgeom.strategies.scenarios` plus ``stored_tokens``: how far a previous request sharing
    the prefix stored (all of it, or any shorter prefix), and ``gpu_resident``, the GPU prefix cache's
    entries (:func:`kvgeom.conformance.gpu_prefix.gpu_residencies`); when ``kinds`` has full attention
    and Mamba, hybrid configs (:func:`hybrid_configs`) and speculative-decoding configs with drafter
    groups (:func:`kvgeom.conformance.gpu_prefix.drafter_configs`) are drawn too. Shrinks towards one
    full-attention group and an empty request.

    >>> from kvgeom.strategies import minimal
    >>> minimal(cases())[1]
    {'num_tokens': 0, 'local_computed_tokens': 0, 'evict': [], 'stored_tokens': 0, 'gpu_resident': {'0': [], '1': []}}
    """

    @st.composite
    def build(draw: st.DrawFn) -> tuple[dict[str, Any], dict[str, Any]]:
        offload = draw(st.sampled_from([True, True, True, False]))
        general = configs(
            kinds=kinds, max_groups=3, max_dcp=4, max_block_size=64, offload=offload,
            allow_pcp=False, max_model_len=False,
        )
        if "mamba" in kinds and "full_attention" in kinds:
            # hybrids keep half of the cases (the offload hazards live there); speculative configs
            # (the prefix question's drop) take a quarter from the general draw
            general = st.one_of(general, hybrid_configs(), hybrid_configs(), drafter_configs())
        cfg = draw(general)
        geom = resolve(cfg)
        scenario = dict(draw(scenarios(geom, max_tokens=max_tokens)))
        n = scenario["num_tokens"]
        # Like num_tokens: on, just before or just after a multiple of one of the geometry's units.
        units = sorted({geom.scheduler_block_size, geom.hash_block_size}
                       | {og.tokens_per_chunk for og in (geom.offload.groups if geom.offload else ())})
        unit = draw(st.sampled_from(units))
        near = draw(st.integers(0, n // unit)) * unit + draw(st.sampled_from([0, 1, -1]))
        scenario["stored_tokens"] = draw(st.sampled_from([n, min(max(near, 0), n)]) | st.integers(0, n))
        scenario["gpu_resident"] = draw(gpu_residencies(geom, n))
        return cfg, scenario

    return build()


@st.composite
def _hybrid(draw: st.DrawFn) -> dict[str, Any]:
    attention = draw(block_sizes(max_value=64))
    mamba = draw(block_sizes(max_value=64))
    parallel = draw(parallel_configs(sharded_block_sizes=(attention,), max_dcp=4, allow_pcp=False))
    k = draw(st.integers(1, 3))
    return {
        "groups": [
            {"kind": "full_attention", "block_size": attention},
            {"kind": "mamba", "block_size": mamba, "mamba_cache_mode": "align"},
        ],
        "parallel": parallel,
        "offload": {"blocks_per_chunk": k} if k > 1 else {},
    }


def hybrid_configs() -> st.SearchStrategy[dict[str, Any]]:
    """Offloaded full attention + align-mode Mamba configs whose two block sizes are drawn
    independently (:func:`kvgeom.strategies.block_sizes`, up to 64; DCP up to 4 from
    :func:`kvgeom.strategies.parallel_configs`; 1-3 blocks per chunk): the hybrid layout every
    offloading bug of this family lives in, with chunk ratios :func:`kvgeom.strategies.configs`
    rarely draws (its group blocks are small multiples of one unit).

    >>> import kvgeom
    >>> from kvgeom.strategies import minimal
    >>> [g.span for g in kvgeom.resolve(minimal(hybrid_configs())).groups]
    [1, 1]
    """
    return _hybrid()


@dataclass
class Report:
    """The outcome of :func:`run`."""

    engine: str
    engine_version: str
    examples: int
    seed: int
    strict: bool
    warning: str | None = None
    findings: list[Finding] = field(default_factory=list)
    """Shrunk findings: new ones, plus documented deviations when ``strict``."""
    deviations: Counter[str] = field(default_factory=Counter)
    """Cases explained by each documented deviation (not shrunk, counted once per distinct case)."""
    deviation_examples: dict[str, Finding] = field(default_factory=dict)
    """The smallest case seen per documented deviation."""
    cases_checked: int = 0

    @property
    def new_findings(self) -> list[Finding]:
        return [f for f in self.findings if f.is_new]

    @property
    def exit_code(self) -> int:
        """0: no new finding (documented deviations allowed unless ``strict``); 1: findings."""
        bad = self.findings if self.strict else self.new_findings
        return 1 if bad else 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "engine": self.engine,
            "engine_version": self.engine_version,
            "warning": self.warning,
            "examples": self.examples,
            "seed": self.seed,
            "strict": self.strict,
            "cases_checked": self.cases_checked,
            "exit_code": self.exit_code,
            "findings": [f.to_dict() for f in self.findings],
            "deviations": {
                k: {"count": n, "title": DEVIATIONS[k].title, "example": self.deviation_examples[k].to_dict()}
                for k, n in sorted(self.deviations.items())
            },
        }

    def render(self) -> str:
        lines = []
        if self.warning:
            lines.append(f"warning: {self.warning}")
        lines.append(
            f"kvgeom conform: {self.engine} {self.engine_version}, {self.cases_checked} cases "
            f"(seed {self.seed}, {self.examples} examples per round{', strict' if self.strict else ''})"
        )
        for dev_id, n in sorted(self.deviations.items()):
            ex = self.deviation_examples[dev_id]
            lines.append(f"documented deviation {dev_id}: {n} case(s), e.g. scenario {json.dumps(ex.scenario)}")
        for f in self.findings:
            lines.append("")
            lines.append(f.render())
        if not self.findings:
            lines.append("no new finding")
        return "\n".join(lines)


def _size(f: Finding) -> tuple[int, int, str]:
    return (f.scenario.get("num_tokens", 0), len(f.config.get("groups", ())), json.dumps(f.config, sort_keys=True))


def run(
    *,
    examples: int = DEFAULT_EXAMPLES,
    seed: int = 0,
    strict: bool = False,
    answer: Answer | None = None,
    engine: str = "vllm",
    engine_version: str = "",
    kinds: Sequence[str] = DEFAULT_KINDS,
    warning: str | None = None,
) -> Report:
    """Run the conformance check; see the module docstring. ``answer`` defaults to vLLM's.

    Each round draws ``examples`` cases; a round that hits an unexplained difference (or, with
    ``strict``, any difference) shrinks it, records it and starts the next round with that kind of
    difference (its signature: deviation and questions) no longer stopping the search; at most
    six rounds.
    """
    if type(examples) is not int or examples < 1:
        raise QueryError.single("bad_examples", f"examples must be a positive integer, got {examples!r}", "examples")
    if type(seed) is not int or seed < 0:
        raise QueryError.single("bad_seed", f"seed must be a non-negative integer, got {seed!r}", "seed")
    if answer is None:
        from kvgeom.conformance.vllm_engine import VLLM_VERSION, vllm_answers

        answer = vllm_answers
        engine_version = engine_version or VLLM_VERSION
    report = Report(engine, engine_version, examples, seed, strict, warning)
    seen: set[str] = set()
    known: set[tuple[str | None, tuple[str, ...]]] = set()
    ask = answer

    def check(case: tuple[dict[str, Any], dict[str, Any]]) -> None:
        cfg, scenario = case
        key = json.dumps(case, sort_keys=True)
        fresh = key not in seen
        seen.add(key)
        geom = resolve(cfg)
        engine_sheet = ask(geom, scenario)
        ours = kvgeom_answers(geom, scenario)
        diffs = compare(engine_sheet, ours)
        if not diffs:
            return
        dev = classify(diffs, engine_sheet, ours)
        f = Finding(cfg, scenario, tuple(diffs), dev, engine, engine_version)
        if dev is not None and fresh:
            report.deviations[dev] += 1
            best = report.deviation_examples.get(dev)
            if best is None or _size(f) < _size(best):
                report.deviation_examples[dev] = f
        if (dev is None or strict) and f.signature not in known:
            raise NewFinding(f, f.signature)

    def found(f: Finding) -> None:
        report.findings.append(f)
        known.add(f.signature)

    search_rounds(cases(kinds=kinds), check, found, seed=seed, examples=examples, rounds=_MAX_ROUNDS)
    report.cases_checked = len(seen)
    return report
