"""docs/glossary.md: every kvgeom name exists in kvgeom, every vLLM name in vLLM 0.33, both directions agree."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import kvgeom
import kvgeom.adapters.vllm as adapter
from kvgeom import config as config_module
from kvgeom import parallel as parallel_module
from kvgeom import specs as specs_module
from kvgeom.glossary import VLLM_GROUP_NAMES, VLLM_OFFLOAD_GROUP_NAMES, VLLM_REPORT_NAMES

PAGE = Path(__file__).resolve().parents[1] / "docs" / "glossary.md"
TICKED = re.compile(r"`([^`]+)`")
REVERSE_START = "<!-- reverse table: generated from the table above, tests/test_glossary.py checks it -->"


def _table(text: str, header: str) -> list[list[str]]:
    lines = text[text.index(header) :].splitlines()[2:]
    rows = []
    for line in lines:
        if not line.startswith("|"):
            break
        rows.append([c.strip() for c in line.strip().strip("|").split("|")])
    return rows


def forward_rows() -> list[list[str]]:
    return _table(PAGE.read_text(encoding="utf-8"), "| kvgeom | letter | vLLM 0.33 | meaning |")


def reverse_table(rows: list[list[str]]) -> str:
    """The vLLM -> kvgeom table the page must hold, built from the kvgeom -> vLLM table."""
    back: dict[str, list[str]] = {}
    for kv, _letter, vllm, _meaning in rows:
        for name in TICKED.findall(vllm):
            back.setdefault(name, [])
            if kv not in back[name]:
                back[name].append(kv)
    lines = ["| vLLM 0.33 | kvgeom |", "|---|---|"]
    lines += [f"| `{name}` | {'; '.join(back[name])} |" for name in sorted(back, key=str.lower)]
    return "\n".join(lines)


def _spec_fields() -> set[str]:
    out: set[str] = set()
    for obj in vars(specs_module).values():
        if isinstance(obj, type) and hasattr(obj, "model_fields"):
            out |= set(obj.model_fields)
    return out


def kvgeom_name_exists(name: str) -> bool:
    name = name.removesuffix("()")
    if name in specs_module.KINDS:
        return True
    section, _, field = name.partition(".")
    models = {
        "cache": config_module.CacheConfig,
        "parallel": parallel_module.ParallelConfig,
        "offload": config_module.OffloadConfig,
    }
    if section in models and field:
        return field in models[section].model_fields
    if section == "groups[]":
        return field in _spec_fields()
    owner = getattr(kvgeom, section, None) or getattr(adapter, section, None)
    if owner is None:
        return False
    return not field or hasattr(owner, field)


def test_every_kvgeom_name_exists():
    rows = forward_rows()
    assert len(rows) > 40
    missing = [n for row in rows for n in TICKED.findall(row[0]) if not kvgeom_name_exists(n)]
    assert missing == []


def test_names_the_issue_asks_for_are_there():
    text = PAGE.read_text(encoding="utf-8")
    for kv, theirs in [
        ("GroupGeometry.span", "GroupOffloadConfig.tokens_per_block"),
        ("GroupGeometry.span", "SingleTypeKVCacheManager.block_size"),
        ("GroupGeometry.index", "GroupOffloadConfig.group_idx"),
        ("GroupGeometry.index", "OffloadingGroupConfig.group_id"),
        ("Geometry.hit_alignment_tokens", "KVCacheConfig.cache_hit_alignment_tokens"),
        ("OffloadGroupGeometry.window_chunks", "GroupOffloadConfig.sliding_window_size_in_chunks"),
        ("cache.retention_interval", "CacheConfig.prefix_cache_retention_interval"),
        ("Geometry.partial_hash_hits", "KVCacheCoordinator.enable_partial_hash_hits"),
    ]:
        row = next(r for r in forward_rows() if f"`{kv}`" in r[0])
        assert f"`{theirs}`" in row[2], (kv, theirs)
    assert "(../README.md)" not in text  # the page links kvgeom names, not the repository


def test_reverse_table_is_the_forward_table_inverted():
    text = PAGE.read_text(encoding="utf-8")
    shown = text[text.index(REVERSE_START) + len(REVERSE_START) :].strip().split("\n\n")[0]
    assert shown == reverse_table(forward_rows())


def test_report_aliases_are_glossary_names():
    vllm_column = " ".join(r[2] for r in forward_rows())
    for alias in [*VLLM_REPORT_NAMES.values(), *VLLM_GROUP_NAMES.values(), *VLLM_OFFLOAD_GROUP_NAMES.values()]:
        assert alias in vllm_column, alias


def test_to_report_vllm_names_only_adds_keys():
    g = kvgeom.resolve({**kvgeom.DEFAULT_CONFIG, "offload": {}})
    plain, named = g.to_report(), g.to_report(vllm_names=True)
    assert set(plain) < set(named)
    assert {k: named[k] for k in plain if k not in ("groups", "offload")} == {
        k: v for k, v in plain.items() if k not in ("groups", "offload")
    }
    for ours, theirs in VLLM_REPORT_NAMES.items():
        assert named[theirs] == plain[ours]
    for gp, gn in zip(plain["groups"], named["groups"], strict=True):
        assert gn["kv_cache_group_id"] == gp["index"] and {k: gn[k] for k in gp} == gp
    for op, on in zip(plain["offload"]["groups"], named["offload"]["groups"], strict=True):
        assert (on["group_idx"], on["sliding_window_size_in_chunks"]) == (op["index"], op["window_chunks"])


def test_every_vllm_name_is_in_vllm_source():
    vllm = pytest.importorskip("vllm")
    root = Path(vllm.__file__).parent
    words: set[str] = set()
    for path in root.rglob("*.py"):
        words |= set(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", path.read_text(encoding="utf-8", errors="replace")))
    missing = []
    for row in forward_rows():
        for name in TICKED.findall(row[2]):
            for part in re.findall(r"[A-Za-z_][A-Za-z0-9_]*", name):
                if part not in words:
                    missing.append(f"{name} ({part})")
    assert missing == []
