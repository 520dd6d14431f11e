"""Hypothesis strategies for the fingerprint / compat laws: valid layouts and mutations of them."""

from __future__ import annotations

import copy
from typing import Any

from hypothesis import strategies as st

KINDS = ["full", "mla", "full+mamba", "mla+mamba", "dsa"]


def _attention(kind: str, block: int, pages: bool, dtype: str) -> dict[str, Any]:
    if kind == "full":
        g: dict[str, Any] = {"kind": "full_attention", "block_size": block}
        if pages:
            g.update(num_kv_heads=4, head_size=128, dtype=dtype)
        return g
    if kind == "mla":
        g = {"kind": "mla", "block_size": block}
        if pages:
            g.update(head_size=576, dtype=dtype)
        return g
    layers: list[dict[str, Any]] = [{"kind": "mla"}, {"kind": "mla", "cache_role": "indexer"}]
    if pages:
        layers[0].update(head_size=576, dtype=dtype)
        layers[1].update(head_size=132, dtype="uint8")
    return {"kind": "uniform", "block_size": block, "layers": layers}


@st.composite
def layouts(draw: Any) -> dict[str, Any]:
    """A valid kvgeom config: full / MLA / DSA attention, optionally with an align-Mamba group."""
    tp = draw(st.sampled_from([1, 2, 4, 8]))
    dcp = draw(st.sampled_from([d for d in (1, 2, 4, 8) if tp % d == 0]))
    block = draw(st.sampled_from([16, 32, 64]))
    interleave = draw(st.sampled_from([i for i in (1, 2, 4, 8, 16) if block % i == 0]))
    kind = draw(st.sampled_from(KINDS))
    pages = draw(st.booleans())
    dtype = draw(st.sampled_from(["bfloat16", "fp8"]))
    attention_kind = kind.split("+")[0]
    groups = [_attention(attention_kind, block, pages, dtype)]
    if kind.endswith("+mamba"):
        mamba: dict[str, Any] = {"kind": "mamba", "block_size": block, "mamba_cache_mode": "align"}
        if pages:
            mamba.update(shapes=[[8, 64, 64]], dtypes=["float32"])
        groups.append(mamba)
    cfg: dict[str, Any] = {
        "groups": groups,
        "parallel": {"tp": tp, "dcp": dcp, "cp_interleave": interleave, "pp": draw(st.sampled_from([1, 2]))},
    }
    k = draw(st.none() | st.integers(1, 4))
    if k is not None:
        cfg["offload"] = {"blocks_per_chunk": k}
    return cfg


def _sharded_blocks(cfg: dict[str, Any]) -> list[int]:
    return [g["block_size"] for g in cfg["groups"] if g["kind"] != "mamba"]


def _splits_heads(cfg: dict[str, Any]) -> bool:
    return any(g["kind"] in {"full_attention", "mamba"} for g in cfg["groups"])


def relevant_mutations(cfg: dict[str, Any]) -> list[str]:
    """Mutations that change the bytes behind some offload key, applicable to ``cfg``."""
    par = cfg["parallel"]
    out = ["block", "k", "pp"]
    if par["tp"] < 16:
        out.append("dcp_up")
    if par["dcp"] > 1:
        out.append("interleave")
    if _splits_heads(cfg):
        out.append("tp")
    if "dtype" in cfg["groups"][0] or any("dtype" in x for x in cfg["groups"][0].get("layers", [])):
        out.append("dtype")
    return out


def irrelevant_mutations(cfg: dict[str, Any]) -> list[str]:
    """Mutations that never change what a key's bytes are."""
    par = cfg["parallel"]
    out = ["max_model_len", "retention_dense", "key_order"]
    if par["dcp"] == 1:
        out.append("interleave")
    if not _splits_heads(cfg):
        out.append("tp")
    if _flattenable(cfg):
        out.append("flatten")
    return out


def _flattenable(cfg: dict[str, Any]) -> bool:
    """A uniform container whose layers carry no page field: vLLM's scheduler-side view of it is its first
    layer, and the fingerprint must not tell the two apart."""
    page = ("dtype", "num_kv_heads", "head_size", "head_size_v", "alignment", "shapes", "dtypes")
    return any(
        g["kind"] == "uniform" and not any(k in leaf for leaf in g["layers"] for k in page) for g in cfg["groups"]
    )


def mutate(cfg: dict[str, Any], name: str) -> dict[str, Any]:
    """A copy of ``cfg`` with one named change; the result is a valid config."""
    new = copy.deepcopy(cfg)
    par = new["parallel"]
    match name:
        case "block":
            for g in new["groups"]:
                g["block_size"] *= 2
        case "k":
            k = (new.get("offload") or {}).get("blocks_per_chunk")
            new["offload"] = {"blocks_per_chunk": 1 if k is None else k + 1}
        case "pp":
            par["pp"] = 3 - par["pp"]
        case "dcp_up":
            # a larger DCP carved out of a (possibly larger) TP group
            par["dcp"] *= 2
            par["tp"] = max(par["tp"], par["dcp"])
        case "interleave":
            options = [i for i in (1, 2, 4, 8, 16) if all(b % i == 0 for b in _sharded_blocks(new))]
            par["cp_interleave"] = next(i for i in options if i != par["cp_interleave"])
        case "tp":
            par["tp"] *= 2
        case "dtype":
            g = new["groups"][0]
            target = g if "dtype" in g else g["layers"][0]
            target["dtype"] = "fp8" if target["dtype"] == "bfloat16" else "bfloat16"
        case "max_model_len":
            new.setdefault("cache", {})["max_model_len"] = 8192
        case "retention_dense":
            new.setdefault("cache", {})["retention_interval"] = None
        case "flatten":
            # vLLM 0.33 generate_scheduler_kv_cache_config: a container becomes its first layer spec
            new["groups"] = [
                {**g["layers"][0], "block_size": g["block_size"]} if g["kind"] == "uniform" else g
                for g in new["groups"]
            ]
        case "key_order":
            new = {key: new[key] for key in reversed(list(new))}
            new["groups"] = [{key: g[key] for key in reversed(list(g))} for g in new["groups"]]
        case _:
            raise ValueError(name)
    return new
