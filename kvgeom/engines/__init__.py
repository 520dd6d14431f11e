"""Engine homes: one module (or package) per serving engine whose geometry differs from vLLM's.

Each ``kvgeom/engines/<engine>.py`` reads what a deployment of that engine states, derives the engine's
own geometry with kvgeom's rules and errors, and never reaches into ``kvgeom._resolve``
(``docs/architecture.md``, "Where a new engine goes"). Nothing here imports an engine.
"""
