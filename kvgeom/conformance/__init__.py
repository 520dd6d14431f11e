"""Conformance: run kvgeom's rules against an installed serving engine and hand back shrunk counterexamples.

``kvgeom conform --engine vllm`` (or :func:`run`) generates geometries and scenarios with
:mod:`kvgeom.strategies`, builds the engine's own objects for each
(:mod:`kvgeom.conformance.vllm_objects`), asks the engine's code and kvgeom the same questions
(:mod:`kvgeom.conformance.answers`, :mod:`kvgeom.conformance.vllm_engine`), and classifies every
difference as a documented deviation (:mod:`kvgeom.deviations`) or a new finding, which Hypothesis
shrinks to a minimal geometry and scenario (:mod:`kvgeom.conformance.findings`,
:mod:`kvgeom.conformance.run`). ``docs/checking-your-engine.md`` is the guide.

``import kvgeom`` never imports this package; importing this package imports neither the engine nor
Hypothesis: :func:`run`, :func:`cases` and :class:`Report` (Hypothesis) and :func:`vllm_answers`
(vLLM, torch) load on first access. Install with the ``vllm`` extra.

>>> import kvgeom.conformance as c
>>> c.SUPPORTED, "realign-after-clamp" in c.RULES
({'vllm': '0.33', 'lmcache': '0.5'}, True)

``kvgeom conform --engine lmcache`` checks kvgeom's model of LMCache (:mod:`kvgeom.engines.lmcache`)
against LMCache's own functions (:mod:`kvgeom.conformance.lmcache_engine`).
"""

from __future__ import annotations

from typing import Any

from kvgeom.conformance.answers import QUESTIONS, kvgeom_answers, tier_contents
from kvgeom.conformance.engines import SUPPORTED, Engine, EngineError, load_engine, version_warning
from kvgeom.conformance.findings import RULES, Difference, Finding, classify, compare

__all__ = [
    "QUESTIONS",
    "RULES",
    "SUPPORTED",
    "Difference",
    "Engine",
    "EngineError",
    "Finding",
    "Report",
    "cases",
    "classify",
    "compare",
    "kvgeom_answers",
    "load_engine",
    "run",
    "tier_contents",
    "version_warning",
    "vllm_answers",
]

_LAZY = {
    "run": "kvgeom.conformance.run",
    "cases": "kvgeom.conformance.run",
    "Report": "kvgeom.conformance.run",
    "vllm_answers": "kvgeom.conformance.vllm_engine",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'kvgeom.conformance' has no attribute {name!r}")
