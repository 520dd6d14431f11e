"""The answers the golden API corpus records for one config (shared by the generator and its test).

Every public entry point a user reaches with a config is asked: resolve (or its error codes and
messages), ``to_report`` with and without vLLM names, the CLI's ``explain`` (text and JSON), ``check``
(JSON) and ``diagram`` (digest of the SVG), ``key_map``, scenario queries (``plan_hit``, ``prefix_hit``,
``plan_request``), ``plan_store``, the Mamba checkpoint and the prefill split, and the batch twins of the
key and store rules. Answers that raise record the error's codes instead, so a changed refusal shows too.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import tempfile
from pathlib import Path
from typing import Any

import kvgeom
from kvgeom.cli import main as cli_main


def _plain(x: Any) -> Any:
    """Dataclasses, named tuples and numpy arrays as JSON values (stable across numpy's repr changes)."""
    import dataclasses

    import numpy as np

    if isinstance(x, np.ndarray):
        return {"dtype": str(x.dtype), "shape": list(x.shape), "values": x.tolist()}
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return {f.name: _plain(getattr(x, f.name)) for f in dataclasses.fields(x)}
    if isinstance(x, tuple) and hasattr(x, "_fields"):
        return {k: _plain(v) for k, v in zip(x._fields, x, strict=True)}
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    if isinstance(x, dict):
        return {str(k): _plain(v) for k, v in x.items()}
    if isinstance(x, (frozenset, set)):
        return sorted(_plain(v) for v in x)
    return x


def _safe(fn: Any) -> Any:
    try:
        return fn()
    except kvgeom.KVGeomError as e:
        return {"error": type(e).__name__, "codes": [p.code for p in e.problems], "text": str(e)}


def _cli(argv: list[str], tmp: str) -> dict[str, Any]:
    """``kvgeom ARGV`` run in ``tmp`` (so file names in the output are the same on every run)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.chdir(tmp), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = cli_main(argv)
    return {"rc": rc, "out": out.getvalue(), "err": err.getvalue()}


def _lengths(g: kvgeom.Geometry) -> list[int]:
    units = {g.scheduler_block_size, g.hash_block_size}
    if g.offload is not None:
        units.update(og.tokens_per_chunk for og in g.offload.groups)
    big = max(units)
    ns = {0, 1, big - 1, big, big + 1, 2 * big + 1, 3 * min(units) + 1}
    return sorted(n for n in ns if 0 <= n <= 20_000)


def answers(cfg: Any) -> dict[str, Any]:
    """A JSON-ready dict of everything kvgeom answers for ``cfg`` (a config dict or ``preset:NAME``)."""
    from kvgeom import batch, hits
    from kvgeom.speculative import mamba_checkpoint, prefill_chunk_ends

    res: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        if isinstance(cfg, str):
            arg = cfg
        else:
            (Path(tmp) / "cfg.json").write_text(json.dumps(cfg))
            arg = "cfg.json"
        res["check"] = _cli(["check", "--format", "json", arg], tmp)
        res["explain"] = _cli(["explain", arg], tmp)
        svg = Path(tmp) / "d.svg"
        d = _cli(["diagram", arg, "-o", "d.svg", "--title", "golden"], tmp)
        d["svg_sha256"] = hashlib.sha256(svg.read_bytes()).hexdigest() if svg.exists() else None
        res["diagram"] = d
    try:
        g = kvgeom.resolve(kvgeom.load_preset(cfg[7:]) if isinstance(cfg, str) else cfg)
    except kvgeom.KVGeomError as e:
        res["resolve"] = {"error": type(e).__name__, "codes": [p.code for p in e.problems], "text": str(e)}
        return res
    res["report"] = g.to_report()
    res["report_vllm"] = g.to_report(vllm_names=True)
    lengths = _lengths(g)
    per_n: dict[str, Any] = {}
    for n in lengths:
        row: dict[str, Any] = {}
        row["key_map"] = _safe(lambda n=n: g.key_map(n))
        stored: dict[str, list[int]] = {}
        resident: dict[str, list[int]] = {}
        for x in g.groups:
            ends = list(range(x.span, n + 1, x.span))[:64]
            resident[str(x.index)] = ends
        if g.offload is not None:
            for og in g.offload.groups:
                stored[str(og.index)] = list(range(og.tokens_per_chunk, n + 1, og.tokens_per_chunk))[:64]
        row["plan_hit"] = _safe(lambda n=n, s=stored: g.plan_hit({"num_tokens": n, "stored": s}))
        row["prefix_hit"] = _safe(lambda n=n, r=resident: g.prefix_hit({"num_tokens": n, "resident": r}))
        row["plan_request"] = _safe(
            lambda n=n, r=resident, s=stored: g.plan_request({"num_tokens": n, "resident": r, "stored": s})
        )
        if g.offload is not None:
            row["plan_store"] = _safe(
                lambda n=n: hits.plan_store(g, num_tokens=n, num_computed_tokens=n, num_prompt_tokens=n).to_dict()
            )
            row["plan_store_finished"] = _safe(
                lambda n=n: hits.plan_store(
                    g, num_tokens=n + 1, num_computed_tokens=n + 1, num_prompt_tokens=n, finished=True
                ).to_dict()
            )
        row["mamba_checkpoint"] = _safe(lambda n=n: _plain(mamba_checkpoint(g, n)))
        row["prefill_chunk_ends"] = _safe(lambda n=n: list(prefill_chunk_ends(g, n)))
        per_n[str(n)] = row
    res["by_length"] = per_n
    res["batch_key_maps"] = _safe(lambda: _plain(batch.key_maps(g, lengths)))
    if g.offload is not None:
        ns = lengths
        res["batch_plan_stores"] = _safe(
            lambda: _plain(batch.plan_stores(g, num_tokens=ns, num_computed_tokens=ns, num_prompt_tokens=ns))
        )
    return res
