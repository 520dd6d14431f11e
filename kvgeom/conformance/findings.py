"""Differences between kvgeom's and an engine's answer sheets, their classification, and reproducers.

A :class:`Difference` is one question (see :data:`kvgeom.conformance.answers.QUESTIONS`) on which the
two sheets disagree. :func:`classify` explains a scenario's differences by the deliberate deviations
of :mod:`kvgeom.deviations`; whatever no deviation explains is a *new finding*. A :class:`Finding`
carries the geometry config, the scenario, the differences and the deviation id (None for a new
finding), and renders as JSON (:meth:`Finding.to_dict`) and as a ready-to-paste Python reproducer
(:meth:`Finding.reproducer`).

Invariants (tested in ``tests/test_conformance_findings.py``):

* :func:`compare` returns one difference per question whose answers differ, in
  :data:`~kvgeom.conformance.answers.QUESTIONS` order, and none for identical sheets; when the engine
  rejects the geometry only ``valid`` is compared (its other answers do not exist);
* :func:`classify` assigns a deviation only through a rule that checks the signature of that
  deviation in the engine's own answers; every id it returns is in :data:`kvgeom.deviations.DEVIATIONS`;
* a reproducer is valid Python that rebuilds the same geometry and scenario.

>>> vllm = {"valid": True, "hit_tokens": 64, "end_token": 64, "offload.mamba_align_size": 24}
>>> ours = {"valid": True, "hit_tokens": 48, "end_token": 48, "offload.mamba_align_size": 24}
>>> [d.question for d in compare(vllm, ours)], classify(compare(vllm, ours), vllm, ours)
(['hit_tokens', 'end_token'], 'realign-after-clamp')
"""

from __future__ import annotations

import json
import pprint
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kvgeom.conformance.answers import QUESTIONS
from kvgeom.conformance.gpu_prefix import PREFIX_QUESTIONS
from kvgeom.deviations import DEVIATIONS

__all__ = ["Difference", "Finding", "RULES", "classify", "compare"]

_HIT_QUESTIONS = frozenset({"hit_tokens", "end_token", "load", "mamba_state_after"})


@dataclass(frozen=True, slots=True)
class Difference:
    """One question on which the engine (``engine``) and kvgeom (``kvgeom``) answer differently."""

    question: str
    engine: Any
    kvgeom: Any

    def to_dict(self) -> dict[str, Any]:
        return {"question": self.question, "engine": self.engine, "kvgeom": self.kvgeom}


def compare(engine: Mapping[str, Any], ours: Mapping[str, Any]) -> list[Difference]:
    """The questions on which two answer sheets differ (a missing answer counts as None).

    ``lookup_error`` (the engine's connector raised during the scenario) and ``prefix.error`` (its KV
    cache coordinator raised during the prefix-cache lookup) are always differences, except that
    when kvgeom declines the prefix-cache lookup (``prefix.declined``) no prefix answer is compared.

    >>> compare({"valid": False, "error": "x", "spans": None}, {"valid": True, "spans": [16]})
    [Difference(question='valid', engine=False, kvgeom=True)]
    """
    if not engine.get("valid", True) or not ours.get("valid", True):
        if engine.get("valid", True) != ours.get("valid", True):
            return [Difference("valid", engine.get("valid", True), ours.get("valid", True))]
        return []
    skip = set(PREFIX_QUESTIONS) if "prefix.declined" in ours else set()
    out = [
        Difference(q, engine.get(q), ours.get(q))
        for q in QUESTIONS
        if q not in skip and engine.get(q) != ours.get(q)
    ]
    for q in ("lookup_error", "prefix.error"):
        if q in engine and not (q == "prefix.error" and skip):
            out.append(Difference(q, engine[q], None))
    return out


# --------------------------------------------------------------------------- deviation rules


def _realign_after_clamp(diffs: Sequence[Difference], engine: Mapping[str, Any], ours: Mapping[str, Any]) -> bool:
    """Only hit answers differ, kvgeom's hit is shorter, and the engine's hit shows one of the two
    signatures of aligning the candidate to the Mamba chunk only once:

    * it ends off the Mamba chunk grid (a later clamp moved it; the Mamba key loaded is a later state), or
    * it is shorter than a full-attention chunk (a windowed group lowered it after the full-attention
      groups were checked; kvgeom's re-aligned candidate fell below one attention chunk, so its hit is 0).
    """
    questions = {d.question for d in diffs}
    if not questions <= _HIT_QUESTIONS or "hit_tokens" not in questions:
        return False
    chunk = engine.get("offload.mamba_align_size")
    end, hit = engine.get("end_token"), engine.get("hit_tokens")
    if not chunk or not isinstance(end, int) or not isinstance(hit, int) or hit <= ours.get("hit_tokens", 0):
        return False
    if end % chunk:
        return True
    full_chunks = [g[2] for g in engine.get("offload.groups") or () if g[4] is None]
    return ours.get("hit_tokens") == 0 and any(hit < c for c in full_chunks)


def _interleave(diffs: Sequence[Difference], engine: Mapping[str, Any], ours: Mapping[str, Any]) -> bool:
    """The engine rejects a geometry kvgeom accepts, at its single interleave check."""
    return [d.question for d in diffs] == ["valid"] and "cp_kv_cache_interleave_size" in str(engine.get("error"))


def _sink(diffs: Sequence[Difference], engine: Mapping[str, Any], ours: Mapping[str, Any]) -> bool:
    """The engine's sink manager asserts where kvgeom reports an error (only for configs kvgeom rejects)."""
    return [d.question for d in diffs] == ["valid"] and "sink_len" in str(engine.get("error"))


Rule = Callable[[Sequence[Difference], Mapping[str, Any], Mapping[str, Any]], bool]

RULES: dict[str, Rule] = {
    "realign-after-clamp": _realign_after_clamp,
    "interleave-per-sharded-group": _interleave,
    "sink-attention": _sink,
}
"""Deviation id -> the rule recognising its signature in a scenario's differences."""


def classify(diffs: Sequence[Difference], engine: Mapping[str, Any], ours: Mapping[str, Any]) -> str | None:
    """The deviation id explaining all of ``diffs``, or None (a new finding). Empty ``diffs`` -> None.

    >>> classify([Difference("valid", False, True)], {"valid": False, "error": "cp_kv_cache_interleave_size (2)"}, {})
    'interleave-per-sharded-group'
    """
    if not diffs:
        return None
    for dev_id, rule in RULES.items():
        if rule(diffs, engine, ours):
            return dev_id
    return None


# --------------------------------------------------------------------------- findings


@dataclass(frozen=True, slots=True)
class Finding:
    """A scenario on which an engine and kvgeom differ: ``deviation`` is the documented deviation that
    explains it, or None for a new finding."""

    config: dict[str, Any]
    scenario: dict[str, Any]
    differences: tuple[Difference, ...]
    deviation: str | None
    engine: str = "vllm"
    engine_version: str = ""

    @property
    def is_new(self) -> bool:
        return self.deviation is None

    @property
    def signature(self) -> tuple[str | None, tuple[str, ...]]:
        """What makes two findings "the same": the deviation and the questions that differ."""
        return self.deviation, tuple(d.question for d in self.differences)

    def to_dict(self) -> dict[str, Any]:
        return {
            "engine": self.engine,
            "engine_version": self.engine_version,
            "new": self.is_new,
            "deviation": self.deviation,
            "config": self.config,
            "scenario": self.scenario,
            "differences": [d.to_dict() for d in self.differences],
            "reproducer": self.reproducer(),
        }

    def reproducer(self) -> str:
        """A Python snippet that rebuilds the geometry and scenario and prints both answers.

        >>> f = Finding({"groups": [{"kind": "full_attention", "block_size": 16}]}, {"num_tokens": 16},
        ...             (Difference("hit_tokens", 16, 0),), None)
        >>> compile(f.reproducer(), "<reproducer>", "exec") is not None
        True
        """
        questions = [d.question for d in self.differences]
        what = ", ".join(questions)
        label = f"documented deviation {self.deviation!r}" if self.deviation else "new finding"
        version = f" {self.engine_version}" if self.engine_version else ""
        return (
            f"# kvgeom conform: {label} on {self.engine}{version} ({what} differ)\n"
            "import kvgeom\n"
            "from kvgeom.conformance.answers import kvgeom_answers\n"
            "from kvgeom.conformance.vllm_engine import vllm_answers  # needs vLLM installed\n"
            "\n"
            f"config = {pprint.pformat(self.config, sort_dicts=True, width=100)}\n"
            f"scenario = {pprint.pformat(self.scenario, sort_dicts=True, width=100)}\n"
            "geom = kvgeom.resolve(config)\n"
            "engine, ours = vllm_answers(geom, scenario), kvgeom_answers(geom, scenario)\n"
            f"for q in {questions!r}:\n"
            "    print(q, '| vLLM:', engine.get(q), '| kvgeom:', ours.get(q))\n"
        )

    def render(self) -> str:
        """Human-readable text: the differences, then the reproducer."""
        head = "NEW FINDING" if self.is_new else f"documented deviation {self.deviation}"
        lines = [f"{head}: {self.engine} {self.engine_version} differs from kvgeom"]
        lines.append(f"  config:   {json.dumps(self.config, sort_keys=True)}")
        lines.append(f"  scenario: {json.dumps(self.scenario, sort_keys=True)}")
        for d in self.differences:
            lines.append(f"  {d.question}: vLLM {json.dumps(d.engine)} | kvgeom {json.dumps(d.kvgeom)}")
        if self.deviation:
            lines.append(f"  ({DEVIATIONS[self.deviation].title}; see docs/deviations.md)")
        lines.append("  reproducer:")
        lines.extend("    " + x for x in self.reproducer().splitlines())
        return "\n".join(lines)

