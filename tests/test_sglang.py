"""SGLang deployments through the CLI, KV events and the router (``kvgeom/engines/sglang.py``)."""

from __future__ import annotations

import io
import json

import pytest

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
    assert len(blocks) == 3
    for block in blocks:
        exec(compile(block, str(page), "exec"), {})


# -- kvgeom diagram on an SGLang deployment ---------------------------------------------------------------
def _lanes(svg):
    import xml.etree.ElementTree as ET

    root = ET.fromstring(svg)
    ns = "{http://www.w3.org/2000/svg}"
    return root, [g.get("data-lane") for g in root.iter(ns + "g")], ns


def test_diagram_draws_the_grids_and_the_prompts_checkpoints(tmp_path, capsys):
    new = tmp_path / "new.json"
    new.write_text(json.dumps(LCM_GRID))
    out_file = tmp_path / "x.svg"
    code, out, err = _run(["diagram", str(new), "--prefix", "1000", "-o", str(out_file)], capsys)
    assert (code, out, err) == (0, "", "")
    root, lanes, ns = _lanes(out_file.read_text(encoding="utf-8"))
    assert lanes == ["tree-page", "mamba-chunk", "checkpoint-grid", "track-grid", "prompt"]
    # 1000 tokens: 8 tree pages of 128 (the last one partial), chunk ends every 192, grid lcm = 384, track 768
    assert len([r for r in root.iter(ns + "rect") if r.get("class") == "page"]) == 8
    assert len([e for e in root.iter(ns + "line") if e.get("class") == "chunk"]) == 5
    dots = {c: [e.get("data-token") for e in root.iter(ns + "circle") if e.get("class") == c]
            for c in ("grid", "track", "checkpoint")}
    assert dots == {"grid": ["384", "768"], "track": ["768"], "checkpoint": ["384", "768"]}
    hit = [r for r in root.iter(ns + "rect") if r.get("class") == "hit"]
    assert [r.get("data-tokens") for r in hit] == ["768"]  # a repeat reuses up to the last checkpoint


def test_diagram_to_stdout_and_a_sliding_window(tmp_path, capsys):
    swa = tmp_path / "swa.toml"
    swa.write_text('[sglang]\npage_size = 16\npools = ["full", "swa"]\nsliding_window_size = 40\n')
    code, out, _ = _run(["diagram", str(swa), "--prefix", "100", "-o", "-"], capsys)
    assert code == 0
    root, lanes, ns = _lanes(out)
    assert lanes == ["tree-page", "prompt"]
    kinds = {r.get("class"): r.get("data-tokens") for r in root.iter(ns + "rect")}
    assert kinds["hit"] == "96" and kinds["swa-window"] == "40"  # whole tree pages; the window kept


def test_diagram_of_a_refused_deployment_exit_1(tmp_path, capsys):
    old = tmp_path / "old.json"
    old.write_text(json.dumps(OLD_GRID))
    out_file = tmp_path / "x.svg"
    code, out, err = _run(["diagram", str(old), "-o", str(out_file)], capsys)
    assert code == 1 and out == "" and "[checkpoint_off_tree_page]" in err and "Traceback" not in err
    assert not out_file.exists()


@pytest.mark.parametrize("argv, code, needle", [
    (["--prefix", "0"], 2, "[bad_num_tokens]"),
    (["--prefix", "100000000"], 2, "[result_too_large]"),
    (["--width", "600"], 2, "[too_narrow]"),
])
def test_diagram_bad_numbers_exit_2(tmp_path, capsys, argv, code, needle):
    new = tmp_path / "new.json"
    new.write_text(json.dumps(LCM_GRID))
    got, out, err = _run(["diagram", str(new), *argv, "-o", "-"], capsys)
    assert (got, out) == (code, "") and needle in err and err.startswith(str(new))


def test_diagram_of_a_malformed_section_exit_2(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"sglang": {"page_size": 0}}))
    code, _, err = _run(["diagram", str(bad), "-o", "-"], capsys)
    assert code == 2 and err.startswith(f"{bad}: sglang.page_size:")
