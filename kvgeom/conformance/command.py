"""``kvgeom conform``: the command-line entry of the conformance checker (``kvgeom/cli.py`` delegates here).

Exit codes: 0 no new finding (documented deviations are fine unless ``--strict``), 1 new findings
(or, with ``--strict``, any difference), 2 usage or engine problems (the engine is not installed or does
not import, Hypothesis is missing, bad ``--examples``/``--seed``).
"""

from __future__ import annotations

import json
from typing import TextIO

from kvgeom.errors import KVGeomError

__all__ = ["conform"]


def conform(
    *, engine: str, examples: int | None, seed: int, strict: bool, as_json: bool, out: TextIO, err: TextIO
) -> int:
    """Run the check and print the report (text, or JSON with ``as_json``); return the exit code."""
    from kvgeom.conformance.engines import load_engine

    try:
        eng = load_engine(engine)
        try:
            from kvgeom.conformance.run import DEFAULT_EXAMPLES, run
        except ImportError as e:
            err.write(f"kvgeom conform: needs Hypothesis ({e}); pip install 'kvgeom[vllm]'\n")
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
