"""Which engines ``kvgeom conform`` can check, and loading one.

:func:`load_engine` finds the installed engine, checks its version against the supported series
(:data:`SUPPORTED`: vLLM 0.33.x, LMCache 0.5.x) and imports the code that asks it questions. An engine that is not
installed, or whose modules do not import, is an :class:`EngineError` (``kvgeom conform`` exits 2);
another version runs, with the warning naming it and what to do: the text on the :class:`Engine` (which
``kvgeom conform`` prints and records in its report) and a
:class:`kvgeom.adapters.vllm.EngineVersionWarning` for callers of :func:`load_engine`. The series is the
adapter's :data:`kvgeom.adapters.vllm.CHECKED_VLLM` (one home, docs/policies.md).

>>> SUPPORTED["vllm"]
'0.33'
>>> version_warning("vllm", "0.34.1").split(":")[0]
'vllm 0.34.1 is installed, but this kvgeom release was checked against vllm 0.33.x only'
>>> version_warning("vllm", "0.33.0") is None
True
"""

from __future__ import annotations

import importlib.metadata
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from kvgeom.adapters.vllm import CHECKED_VLLM, EngineVersionWarning, engine_version_message
from kvgeom.errors import KVGeomError
from kvgeom.geometry import Geometry

__all__ = ["SGLANG_SERIES", "SUPPORTED", "Engine", "EngineError", "load_engine", "load_sglang_engine",
           "version_warning"]

SUPPORTED: dict[str, str] = {"vllm": CHECKED_VLLM, "lmcache": "0.5"}
"""Engine name -> the release series the checker is pinned to."""


class EngineError(KVGeomError):
    """The engine to check is unknown, not installed, or its modules do not import."""


@dataclass(frozen=True, slots=True)
class Engine:
    """A loaded engine: its name, installed version, a version warning (or None), and the function that
    fills its answer sheet for a geometry and a scenario."""

    name: str
    version: str
    warning: str | None
    answer: Callable[[Geometry, Mapping[str, Any]], dict[str, Any]]


def version_warning(name: str, version: str) -> str | None:
    """None when ``version`` is in the supported series of ``name``, else the warning text."""
    return engine_version_message(name, version, SUPPORTED[name])


def load_engine(name: str = "vllm") -> Engine:
    """The engine ``name``, installed and importable; :class:`EngineError` otherwise."""
    if name not in SUPPORTED:
        raise EngineError.single(
            "unknown_engine", f"unknown engine {name!r}; kvgeom conform checks {sorted(SUPPORTED)}", "engine"
        )
    try:
        version = importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        raise EngineError.single(
            "engine_not_installed",
            f"{name} is not installed in this Python environment; install {name} {SUPPORTED[name]}.x "
            "(see docs/checking-your-engine.md) and run kvgeom conform with that environment's Python",
            "engine",
        ) from None
    try:
        if name == "lmcache":  # LMCache's geometry functions on vLLM's real spec objects
            from kvgeom.conformance.lmcache_engine import lmcache_answers as answers
        else:
            from kvgeom.conformance.vllm_engine import vllm_answers as answers
    except Exception as e:
        raise EngineError.single(
            "engine_import_failed",
            f"{name} {version} is installed but its geometry modules do not import ({type(e).__name__}: {e}); "
            f"kvgeom conform supports {name} {SUPPORTED[name]}.x",
            "engine",
            version=version,
        ) from None
    warning = version_warning(name, version)
    if warning is not None:
        warnings.warn(warning, EngineVersionWarning, stacklevel=2)
    return Engine(name, version, warning, answers)


SGLANG_SERIES = "0.5.23"
"""The SGLang release ``kvgeom conform --engine sglang`` is checked against (kvgeom.engines.sglang)."""


def load_sglang_engine() -> tuple[str, str | None]:
    """The installed SGLang's version and a version warning (None for 0.5.23), after importing the
    harness (:mod:`kvgeom.conformance.sglang_engine`); :class:`EngineError` when SGLang is missing or does
    not import."""
    try:
        version = importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError:
        raise EngineError.single(
            "engine_not_installed",
            f"sglang is not installed in this Python environment; install sglang {SGLANG_SERIES} "
            "(scripts/install-sglang-cpu.sh) and run kvgeom conform with that environment's Python",
            "engine",
        ) from None
    try:
        import kvgeom.conformance.sglang_engine  # noqa: F401
    except Exception as e:
        raise EngineError.single(
            "engine_import_failed",
            f"sglang {version} is installed but its geometry modules do not import ({type(e).__name__}: {e}); "
            f"kvgeom conform supports sglang {SGLANG_SERIES} (put scripts/sglang-stubs on PYTHONPATH)",
            "engine",
            version=version,
        ) from None
    warning = None if version == SGLANG_SERIES else (
        f"sglang {version} is installed, but this kvgeom release was checked against sglang {SGLANG_SERIES} only")
    return version, warning
