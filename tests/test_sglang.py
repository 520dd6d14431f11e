"""SGLang deployments through the CLI, KV events and the router (``kvgeom/engines/sglang.py``)."""

from __future__ import annotations

import io
import json

import kvgeom
from kvgeom.cli import main
from kvgeom.engines.sglang import event_geometry, event_reader, resolve_sglang
from kvgeom.events import KVEventError
from kvgeom.router import score_replicas

OLD_GRID = {"sglang": {"page_size": 64, "dcp_size": 2, "tp_size": 2, "pools": ["full", "mamba"],
                       "mamba_chunk_size": 192, "checkpoint_grid": "chunk"}}
LCM_GRID = {"sglang": {**OLD_GRID["sglang"], "checkpoint_grid": "lcm", "mamba_track_interval": 768}}


def _run(argv, capsys):
    code = main(argv)
    out = capsys.readouterr()
    return code, out.out, out.err


def test_check_flags_a_grid_off_the_tree_page(tmp_path, capsys):
    # #34808: chunk 192 on a 128-token tree page (64 x DCP 2); a pre-fix build puts checkpoints off the page.
    old = tmp_path / "old.json"
    old.write_text(json.dumps(OLD_GRID))
    code, _out, err = _run(["check", str(old)], capsys)
    assert code == 1
    assert "[checkpoint_off_tree_page]" in err and "192" in err and "128" in err and "384" in err


def test_check_warns_on_the_widened_lcm_grid(tmp_path, capsys):
    new = tmp_path / "new.json"
    new.write_text(json.dumps(LCM_GRID))
    code, out, _err = _run(["check", str(new)], capsys)
    assert code == 0
    assert "[checkpoint_grid_widened]" in out and "page_size=48" in out
    assert out.strip().endswith("ok (SGLang: tree page=128 checkpoint grid=384 track grid=768, 1 warning)")
    code, out, _err = _run(["check", "--strict", "--format", "json", str(new)], capsys)
    assert code == 1 and json.loads(out)["files"][0]["summary"]["checkpoint_grid"] == 384


def test_check_malformed_sglang_section(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"sglang": {"page_size": "16"}}))
    code, _, err = _run(["check", str(bad)], capsys)
    assert code == 2 and err.startswith(f"{bad}: sglang.page_size:")


def test_explain_an_sglang_deployment(tmp_path, capsys):
    new = tmp_path / "new.json"
    new.write_text(json.dumps(LCM_GRID))
    code, out, _ = _run(["explain", str(new)], capsys)
    assert code == 0 and "checkpoint grid: every 384 tokens" in out and "tree page: 128 tokens" in out
    code, out, _ = _run(["explain", "--json", str(new)], capsys)
    assert code == 0 and json.loads(out)["track_grid"] == 768


def test_router_scores_sglang_replicas_from_their_events():
    """SGLang's KV events carry blocks of page_size*dcp_size tokens; the same reader and router as vLLM's."""
    g = resolve_sglang({"page_size": 16, "dcp_size": 2, "tp_size": 2})
    reader = event_reader(g)
    block = g.kv_event_block_size  # 32
    reader.apply_batch([1.0, [{"type": "BlockStored", "block_hashes": ["a", "b"], "parent_block_hash": None,
                               "token_ids": list(range(2 * block)), "block_size": block, "lora_id": None,
                               "medium": "GPU"}]], replica=0)
    reader.apply({"type": "BlockStored", "block_hashes": ["a"], "parent_block_hash": None,
                  "token_ids": list(range(block)), "block_size": block, "lora_id": None, "medium": "GPU"},
                 replica=1)
    scores = score_replicas(event_geometry(g), reader, [["a", "b", "c"]], 3 * block + 5, num_replicas=2)
    assert scores.tier("GPU").tolist() == [[64, 32]]
    assert scores.best().tolist() == [0]
    # a per-rank page (16) is not SGLang's event block under DCP: refused, nothing applied
    try:
        reader.apply({"type": "BlockStored", "block_hashes": ["z"], "parent_block_hash": None,
                      "token_ids": list(range(16)), "block_size": 16, "lora_id": None, "medium": "GPU"})
    except KVEventError as e:
        assert e.code == "block_size_mismatch"
    else:  # pragma: no cover
        raise AssertionError("a 16-token block was read under a 32-token tree page")
    assert isinstance(event_geometry(g), kvgeom.Geometry)


def test_explain_text_stream_is_unchanged_for_kvgeom_configs(capsys):
    code, out, _ = _run(["check", "preset:gemma3-swa"], capsys)
    assert (code, out) == (0, "preset:gemma3-swa: ok (L=16 H=16 A=16, 0 warnings)\n")
    assert io.StringIO  # keep the import honest


def test_the_sglang_page_code_runs():
    import re
    from pathlib import Path

    page = Path(__file__).resolve().parents[1] / "docs" / "engines" / "sglang.md"
    blocks = re.findall(r"```python\n(.*?)```", page.read_text(encoding="utf-8"), flags=re.S)
    assert len(blocks) == 2
    for block in blocks:
        exec(compile(block, str(page), "exec"), {})
