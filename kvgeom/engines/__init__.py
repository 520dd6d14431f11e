"""Engine homes: the geometry another engine keeps beside vLLM's, as kvgeom answers it.

Each engine that keeps its own copy of the KV-cache geometry gets one home here, named for the engine
(:mod:`kvgeom.engines.lmcache`). An engine home reads a resolved :class:`kvgeom.Geometry` (vLLM's
geometry, verified) plus the engine's own settings, answers what the engine derives from it, and names
every place where the engine's derivation parts from vLLM's. Engine homes import no engine: the
harnesses that run the installed engine live in ``kvgeom/conformance/<engine>_*.py``.

Invariant: a module here sits at floor 11 (``docs/architecture.md``) and imports only from below.
"""
