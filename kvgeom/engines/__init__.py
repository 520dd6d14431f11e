"""Engine homes: one module per serving engine (or offload layer) that keeps its own geometry beside vLLM's.

Each ``kvgeom/engines/<engine>.py`` (:mod:`kvgeom.engines.lmcache`, :mod:`kvgeom.engines.sglang`) reads what a
deployment of that engine states (and, for a layer in front of vLLM, the resolved :class:`kvgeom.Geometry`),
derives the engine's own geometry with kvgeom's rules and errors, and names every place where the engine's
derivation parts from vLLM's. Engine homes import no engine and never reach into ``kvgeom._resolve``
(``docs/architecture.md``, "Where a new engine goes"): the harnesses that run the installed engine live in
``kvgeom/conformance/<engine>_*.py``.

Invariant: a module here sits at floor 11 (``docs/architecture.md``) and imports only from below.
"""
