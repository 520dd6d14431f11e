"""``kvgeom conform``: the command-line entry of the conformance checker (``kvgeom/cli.py`` delegates here).

Exit codes: 0 no new finding (documented deviations are fine unless ``--strict``), 1 new findings
(or, with ``--strict``, any difference), 2 usage or engine problems (the engine is not installed or does
not import, Hypothesis is missing, bad ``--examples``/``--seed``).

An engine outside the checked series is said once: the command prints ``warning: ...`` (and records it in
the report), and the same text as a Python :class:`kvgeom.adapters.vllm.EngineVersionWarning` (from
:func:`kvgeom.conformance.engines.load_engine` and the adapter) is silenced while the command runs.
"""

from __future__ import annotations

import json
import warnings
from typing import TextIO

from kvgeom.errors import KVGeomError

INSTALL_HINT = (
    "install vLLM 0.33 for CPU and Hypothesis with scripts/install-vllm-cpu.sh (docs/checking-your-engine.md) "
    "and run kvgeom conform with that environment's Python"
)
"""What ``kvgeom conform`` tells a user whose environment cannot run the checker (no Hypothesis)."""

__all__ = ["INSTALL_HINT", "conform"]


def conform(
    *, engine: str, examples: int | None, seed: int, strict: bool, as_json: bool, out: TextIO, err: TextIO
) -> int:
    """Run the check and print the report (text, or JSON with ``as_json``); return the exit code."""
    from kvgeom.adapters.vllm import EngineVersionWarning

    with warnings.catch_warnings():  # said once, by the warning: line below and the report
        warnings.simplefilter("ignore", EngineVersionWarning)
        return _conform(engine, examples, seed, strict, as_json, out, err)


def _conform(engine: str, examples: int | None, seed: int, strict: bool, as_json: bool, out: TextIO,
             err: TextIO) -> int:
    from kvgeom.conformance.engines import load_engine

    if engine == "sglang":
        return _conform_sglang(examples=examples, seed=seed, as_json=as_json, out=out, err=err)
    try:
        eng = load_engine(engine)
        try:
            from kvgeom.conformance.run import DEFAULT_EXAMPLES, run
        except ImportError as e:
            err.write(f"kvgeom conform: needs Hypothesis ({e}); {INSTALL_HINT}\n")
            return 2
        if eng.warning:
            err.write(f"warning: {eng.warning}\n")
        if eng.name == "lmcache":  # LMCache's own run: its sheet, kvgeom's model of it, and vLLM's geometry
            from kvgeom.conformance.lmcache_engine import DEFAULT_EXAMPLES as LM_EXAMPLES
            from kvgeom.conformance.lmcache_engine import run as run_lmcache

            lm = run_lmcache(examples=LM_EXAMPLES if examples is None else examples, seed=seed, strict=strict)
            out.write((json.dumps(lm.to_dict(), indent=2) if as_json else lm.render()) + "\n")
            return lm.exit_code
        report = run(
            examples=DEFAULT_EXAMPLES if examples is None else examples,
            seed=seed,
            strict=strict,
            answer=eng.answer,
            engine=eng.name,
            engine_version=eng.version,
            warning=eng.warning,
        )
    except KVGeomError as e:
        for p in e.problems:
            err.write(f"kvgeom conform: {p.field + ': ' if p.field else ''}{p.message} [{p.code}]\n")
        return 2
    out.write((json.dumps(report.to_dict(), indent=2) if as_json else report.render()) + "\n")
    return report.exit_code


def _conform_sglang(*, examples: int | None, seed: int, as_json: bool, out: TextIO, err: TextIO) -> int:
    """``kvgeom conform --engine sglang``: kvgeom.conformance.sglang_engine's run (every difference is a
    finding; ``--strict`` changes nothing, SGLang has no documented deviation yet)."""
    from kvgeom.conformance.engines import load_sglang_engine

    try:
        if examples is not None and (type(examples) is not int or examples < 1):
            raise KVGeomError.single("bad_examples", f"examples must be a positive integer, got {examples!r}",
                                     "examples")
        if type(seed) is not int or seed < 0:
            raise KVGeomError.single("bad_seed", f"seed must be a non-negative integer, got {seed!r}", "seed")
        _version, warning = load_sglang_engine()
        from kvgeom.conformance.sglang_engine import run_sglang
    except KVGeomError as e:
        for p in e.problems:
            err.write(f"kvgeom conform: {p.field + ': ' if p.field else ''}{p.message} [{p.code}]\n")
        return 2
    if warning:
        err.write(f"warning: {warning}\n")
    report = run_sglang(examples=200 if examples is None else examples, seed=seed)
    out.write((json.dumps(report.to_dict(), indent=2) if as_json else report.render()) + "\n")
    return report.exit_code
