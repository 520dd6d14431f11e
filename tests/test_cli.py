"""The kvgeom command: every subcommand through main(argv), exit codes, one-line errors, golden output.

Golden files live in tests/golden/. After an intended change of the explain text, regenerate them with

    KVGEOM_REGEN_GOLDEN=1 python -m pytest -q tests/test_cli.py -k golden

and review the diff before committing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

import kvgeom
from kvgeom.cli import EXIT_INVALID, EXIT_OK, EXIT_USAGE, main
from kvgeom.presets import preset_names

HERE = Path(__file__).parent
GOLDEN = HERE / "golden"
INVALID = HERE / "invalid"
SVG = "{http://www.w3.org/2000/svg}"


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def write(tmp_path: Path, name: str, data: object) -> str:
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else json.dumps(data), encoding="utf-8")
    return str(path)


def assert_one_line_error(err: str) -> None:
    assert len(err.splitlines()) == 1, err
    assert "Traceback" not in err


# ------------------------------------------------------------------ explain


@pytest.mark.parametrize(
    ("argv", "golden"),
    [
        (["explain"], "explain-default.txt"),  # the README's main-job command: the bundled default
        (["explain", "--prefix", "64"], "explain-default-prefix-64.txt"),  # keys + token axis of vLLM #49964 Ex. 1
    ],
)
def test_explain_default_matches_golden(capsys, argv, golden):
    code, out, err = run(capsys, *argv)
    assert (code, err) == (EXIT_OK, "")
    path = GOLDEN / golden
    if os.environ.get("KVGEOM_REGEN_GOLDEN"):
        path.write_text(out, encoding="utf-8")
    assert out == path.read_text(encoding="utf-8")


def test_explain_text_carries_the_resolved_numbers(capsys):
    # Every number in the table is the resolved geometry's, not a second derivation.
    geom = kvgeom.resolve(kvgeom.DEFAULT_CONFIG)
    _, out, _ = run(capsys, "explain")
    assert f"L  scheduler block  {geom.scheduler_block_size} tokens" in out
    assert f"H  hash unit        {geom.hash_block_size} tokens" in out
    for w in geom.warnings:
        assert f"[{w.code}]" in out


def test_explain_json_is_the_report(capsys):
    code, out, _ = run(capsys, "explain", "--json")
    assert code == EXIT_OK
    assert json.loads(out) == kvgeom.resolve(kvgeom.DEFAULT_CONFIG).to_report()


def test_explain_json_with_prefix_adds_key_map(capsys):
    code, out, _ = run(capsys, "explain", "--preset", "kimi-k3-dcp8", "--prefix", "30000", "--json")
    geom = kvgeom.resolve(kvgeom.load_preset("kimi-k3-dcp8"))
    assert code == EXIT_OK
    assert json.loads(out) == {**geom.to_report(), "keys": geom.key_map(30000)}


def test_explain_preset_forms_agree(capsys):
    # preset:NAME as CONFIG and --preset NAME are the same geometry.
    a = run(capsys, "explain", "preset:glm52-dsa-dcp8", "--json")
    b = run(capsys, "explain", "--preset", "glm52-dsa-dcp8", "--json")
    assert a == b and a[0] == EXIT_OK


def test_explain_prefix_without_offload_is_a_message_not_a_traceback(capsys, tmp_path):
    cfg = write(tmp_path, "mla.json", {"groups": [{"kind": "mla", "block_size": 64}]})
    code, out, err = run(capsys, "explain", cfg, "--prefix", "128")
    assert (code, err) == (EXIT_OK, "")
    assert "no offload section" in out and "token axis" in out
    code, out, err = run(capsys, "explain", cfg, "--prefix", "128", "--json")
    assert code == EXIT_OK and json.loads(out)["keys"] is None
    assert_one_line_error(err)


def test_explain_config_and_preset_together_is_usage(capsys):
    code, _, err = run(capsys, "explain", "preset:seed-hybrid", "--preset", "seed-hybrid")
    assert code == EXIT_USAGE
    assert_one_line_error(err)


def test_explain_text_key_lines_match_key_map(capsys):
    # Each key line quotes key_map's hash index, end token and blocks.
    geom = kvgeom.resolve(kvgeom.DEFAULT_CONFIG)
    _, out, _ = run(capsys, "explain", "--prefix", "64")
    for item in geom.key_map(64)["groups"]:
        for k in item["keys"]:
            assert f"key h{k['hash_index']:<5} prefix [0, {k['end_token']})" in out


# -------------------------------------------------------------------- check


@pytest.mark.parametrize("name", preset_names())
def test_check_every_preset_exits_0(capsys, name):
    code, out, err = run(capsys, "check", f"preset:{name}")
    assert (code, err) == (EXIT_OK, "")
    assert out.splitlines()[-1].startswith(f"preset:{name}: ok")


# file, expected exit code, expected problem code
INVALID_EXAMPLES = [
    ("zero-block-size.json", EXIT_USAGE, "out_of_range"),  # block_size 0
    ("negative-block-size.toml", EXIT_USAGE, "out_of_range"),  # block_size -16
    ("unknown-kind.json", EXIT_USAGE, "unknown_kind"),  # kind not in the tagged union
    ("unknown-key.json", EXIT_USAGE, "unknown_key"),  # misspelt top-level key
    ("wrong-type.json", EXIT_USAGE, "wrong_type"),  # block_size as a string
    ("not-json.json", EXIT_USAGE, "unparsable_file"),  # truncated JSON
    ("not-toml.toml", EXIT_USAGE, "unparsable_file"),  # broken TOML table header
    ("mixed-uniform-leaves.json", EXIT_INVALID, "uniform_mixed_kinds"),  # full + sliding in one uniform group
    ("tp-not-divisible-by-dcp.json", EXIT_INVALID, "tp_not_divisible_by_dcp"),  # tp 3, dcp 2
    ("offload-both.json", EXIT_INVALID, "offload_chunk_both"),  # offload block_size and blocks_per_chunk
    ("span-not-divisible-by-prefix-match-unit.json", EXIT_INVALID, "span_not_divisible_by_hash_unit"),  # 16 % 32
    ("sharded-sliding-window-under-dcp.json", EXIT_INVALID, "sharded_kind_under_dcp"),  # SWA dealt under DCP 2
]


def test_every_invalid_example_is_listed():
    assert sorted(p.name for p in INVALID.iterdir()) == sorted(f for f, _, _ in INVALID_EXAMPLES)


@pytest.mark.parametrize(("name", "exit_code", "problem"), INVALID_EXAMPLES)
def test_check_invalid_example_one_line(capsys, name, exit_code, problem):
    path = str(INVALID / name)
    code, out, err = run(capsys, "check", path)
    assert code == exit_code
    assert out == ""
    assert_one_line_error(err)
    assert err.startswith(f"{path}: ") and err.rstrip().endswith(f"[{problem}]")


def test_check_exit_code_is_the_worst_file(capsys):
    # ok + invalid geometry -> 1; adding a malformed file -> 2.
    ok, bad, broken = "preset:seed-hybrid", str(INVALID / "offload-both.json"), str(INVALID / "not-json.json")
    assert run(capsys, "check", ok, bad)[0] == EXIT_INVALID
    assert run(capsys, "check", ok, bad, broken)[0] == EXIT_USAGE


def test_check_strict_fails_on_warnings(capsys):
    # Kimi-K3 at DCP 8 warns offload_hit_floor: fine by default, a failure under --strict.
    assert kvgeom.resolve(kvgeom.load_preset("kimi-k3-dcp8")).warnings
    code, out, err = run(capsys, "check", "preset:kimi-k3-dcp8")
    assert code == EXIT_OK and "[offload_hit_floor]" in out and err == ""
    code, out, err = run(capsys, "check", "--strict", "preset:kimi-k3-dcp8")
    assert code == EXIT_INVALID and "[offload_hit_floor]" in err
    # A preset without warnings passes --strict.
    assert run(capsys, "check", "--strict", "preset:gemma3-swa")[0] == EXIT_OK


def test_check_json_format(capsys):
    code, out, err = run(capsys, "check", "--format", "json", "preset:gemma3-swa", str(INVALID / "unknown-kind.json"))
    doc = json.loads(out)
    assert code == EXIT_USAGE == doc["exit_code"] and err == ""
    assert [f["status"] for f in doc["files"]] == ["ok", "malformed"]
    assert doc["files"][1]["problems"][0]["code"] == "unknown_kind"
    assert doc["files"][0]["summary"]["scheduler_block_size"] == 16


def test_check_github_format(capsys):
    path = str(INVALID / "tp-not-divisible-by-dcp.json")
    code, out, _ = run(capsys, "check", "--format", "github", path, "preset:kimi-k3-dcp8")
    lines = out.splitlines()
    assert code == EXIT_INVALID
    assert lines[0].startswith(f"::error file={path},title=kvgeom tp_not_divisible_by_dcp::parallel.dcp: tp=3")
    # The preset's warnings become ::warning annotations; ':' in the file property is escaped.
    assert {line.split(",")[0] for line in lines[1:]} == {"::warning file=preset%3Akimi-k3-dcp8"}


@pytest.mark.parametrize(
    ("suffix", "text", "place"),
    [
        (".toml", 'groups = [\n  {kind = "full_attention", block_size = }\n]\n', ",line=2,col=42"),
        (".json", '{"groups": [\n  {"kind": "full_attention", "block_size": 16,}\n]}\n', ",line=2,col=47"),
    ],
)
def test_check_github_annotation_carries_the_parse_errors_line(capsys, tmp_path, suffix, text, place):
    # the error text named line and column, the annotation did not: GitHub could not point at the line
    path = tmp_path / f"bad{suffix}"
    path.write_text(text, encoding="utf-8")
    code, out, _ = run(capsys, "check", "--format", "github", str(path))
    assert code == EXIT_USAGE
    assert out.startswith(f"::error file={path}{place},title=kvgeom unparsable_file::")
    line, col = (int(x.split("=")[1]) for x in place[1:].split(","))
    assert f"line {line}" in out and f"column {col}" in out  # the same place the message names


def test_check_github_annotation_without_a_place_has_no_line(capsys):
    path = str(INVALID / "tp-not-divisible-by-dcp.json")
    _, out, _ = run(capsys, "check", "--format", "github", path)
    assert ",line=" not in out


# ------------------------------------------------------------- bad inputs


@pytest.mark.parametrize(
    ("content", "suffix", "exit_code"),
    [
        (None, ".json", EXIT_USAGE),  # missing file
        ("groups = [", ".toml", EXIT_USAGE),  # not TOML
        ("[1, 2", ".json", EXIT_USAGE),  # not JSON
        ("[1, 2]", ".json", EXIT_USAGE),  # JSON but not a table
        ('{"groups": "mla"}', ".json", EXIT_USAGE),  # wrong type for groups
        ('{"groups": [{"kind": "mla", "block_size": 64.5}]}', ".json", EXIT_USAGE),  # float block size
        ('{"groups": [{"kind": "mla", "block_size": 64}], "parallel": {"dcp": -2}}', ".json", EXIT_USAGE),  # negative
        ('{"groups": [{"kind": "mla", "block_size": 64, "colour": 1}]}', ".json", EXIT_USAGE),  # unknown key
        ("kind: mla", ".yaml", EXIT_USAGE),  # unknown file type
        ('{"groups": [{"kind": "mla", "block_size": 64}], "parallel": {"tp": 1, "dcp": 2}}', ".json", EXIT_INVALID),
    ],
)
@pytest.mark.parametrize("command", ["check", "explain", "diagram"])
def test_bad_input_is_one_line_on_stderr(capsys, tmp_path, content, suffix, exit_code, command):
    path = tmp_path / f"cfg{suffix}"
    if content is not None:
        path.write_text(content, encoding="utf-8")
    argv = [command, str(path)] + (["-o", str(tmp_path / "x.svg")] if command == "diagram" else [])
    code, out, err = run(capsys, *argv)
    assert code == exit_code
    assert out == ""
    assert_one_line_error(err)
    assert err.startswith(str(path))


@pytest.mark.parametrize(
    "argv",
    [
        ["frobnicate"],  # unknown command
        ["check"],  # check needs a file
        ["explain", "--prefix", "-1"],  # negative prefix
        ["explain", "--prefix", "ten"],  # non-integer prefix
        ["check", "--format", "xml", "preset:seed-hybrid"],  # unknown format
        ["diagram", "preset:seed-hybrid"],  # -o is required
        ["explain", "preset:no-such-model"],  # unknown preset
        ["hit", "preset:seed-hybrid"],  # missing scenario
    ],
)
def test_usage_errors_exit_2_with_one_line(capsys, argv):
    code, out, err = run(capsys, *argv)
    assert code == EXIT_USAGE
    assert out == ""
    assert_one_line_error(err)


def test_no_command_is_explain(capsys):
    # The README's `python -m kvgeom` prints the explained default, like `kvgeom explain`.
    assert run(capsys) == run(capsys, "explain")


def test_help_and_version_exit_0(capsys):
    assert main(["--help"]) == EXIT_OK
    assert main(["--version"]) == EXIT_OK
    assert kvgeom.__version__ in capsys.readouterr().out


# ---------------------------------------------------------------------- hit


def test_hit_prints_plan_hit(capsys, tmp_path):
    scenario = {"num_tokens": 64, "stored": {"0": [32, 64], "1": [16, 32, 48]}}
    path = write(tmp_path, "scenario.json", scenario)
    expected = kvgeom.resolve(kvgeom.DEFAULT_CONFIG).plan_hit(scenario)
    code, out, _ = run(capsys, "hit", "preset:seed-hybrid", path, "--json")
    assert code == EXIT_OK and json.loads(out) == expected
    code, out, _ = run(capsys, "hit", "preset:seed-hybrid", path)
    assert code == EXIT_OK
    assert out.splitlines()[0] == f"hit: {expected['hit_tokens']} tokens from the offload tier, ending at token " + str(
        expected["end_token"]
    )
    mamba = expected["groups"][1]
    assert f"state block {mamba['state_block']}" in out


@pytest.mark.parametrize(
    "scenario",
    [
        {"stored": {}},  # num_tokens missing
        {"num_tokens": -4},  # negative
        {"num_tokens": 64, "stored": {"0": [33]}},  # off the hash grid
        {"num_tokens": 64, "colour": 1},  # unknown key
        "not json at all",  # unparsable
    ],
)
def test_hit_bad_scenario_exit_2(capsys, tmp_path, scenario):
    path = write(tmp_path, "scenario.json", scenario if isinstance(scenario, str) else json.dumps(scenario))
    code, out, err = run(capsys, "hit", "preset:seed-hybrid", path)
    assert code == EXIT_USAGE and out == ""
    assert_one_line_error(err)


def test_hit_without_offload_exit_2(capsys, tmp_path):
    cfg = write(tmp_path, "mla.json", {"groups": [{"kind": "mla", "block_size": 64}]})
    path = write(tmp_path, "scenario.json", {"num_tokens": 64})
    code, _, err = run(capsys, "hit", cfg, path)
    assert code == EXIT_USAGE and "[no_offload]" in err
    assert_one_line_error(err)


# ------------------------------------------------------------------ diagram


def lanes(svg: str) -> list[ET.Element]:
    root = ET.fromstring(svg)
    return [g for g in root.iter(f"{SVG}g") if g.get("class") == "lane"]


@pytest.mark.parametrize("name", preset_names())
def test_diagram_is_xml_with_one_lane_per_group(capsys, tmp_path, name):
    out_file = tmp_path / f"{name}.svg"
    code, out, err = run(capsys, "diagram", f"preset:{name}", "-o", str(out_file))
    assert (code, out, err) == (EXIT_OK, "", "")
    geom = kvgeom.resolve(kvgeom.load_preset(name))
    found = lanes(out_file.read_text(encoding="utf-8"))
    assert [(int(g.get("data-group")), g.get("data-kind")) for g in found] == [(x.index, x.kind) for x in geom.groups]


def test_diagram_lane_contents_come_from_the_geometry(capsys):
    # Seed hybrid, 64 tokens: attention 2 blocks + 2 keys + 64 rank runs; Mamba 4 state blocks, 4 boundaries, 4 keys.
    code, out, _ = run(capsys, "diagram", "preset:seed-hybrid", "--prefix", "64", "-o", "-")
    assert code == EXIT_OK
    geom = kvgeom.resolve(kvgeom.DEFAULT_CONFIG)
    km = {g["index"]: g["keys"] for g in geom.key_map(64)["groups"]}
    attn, mamba = lanes(out)
    count = lambda lane, cls: sum(1 for e in lane.iter() if e.get("class") == cls)  # noqa: E731
    assert count(attn, "block") == 64 // geom.groups[0].span
    assert count(attn, "key") == len(km[0])
    ranks = [int(e.get("data-rank")) for e in attn.iter() if e.get("class") == "rank"]
    assert ranks == [kvgeom.ranks.dcp_placement(geom, 0, p).rank for p in range(64)]
    assert count(mamba, "block") == 64 // geom.groups[1].span
    assert count(mamba, "key") == len(km[1])
    assert [int(e.get("data-block")) for e in mamba.iter() if e.get("class") == "state"] == [0, 1, 2, 3]
    assert count(mamba, "rank") == 0  # replicated: no ownership lane


@pytest.mark.parametrize("width", [680, 860, 1180, 2000])
def test_diagram_width_keeps_the_lanes_and_the_text_size(capsys, width):
    # --width narrows or widens the token axis; the text stays 11 px and every shape stays inside the picture.
    code, out, _ = run(capsys, "diagram", "preset:seed-hybrid", "--prefix", "64", "--width", str(width), "-o", "-")
    assert code == EXIT_OK
    root = ET.fromstring(out)
    assert (root.get("width"), root.get("font-size")) == (str(width), "11")
    code, default, _ = run(capsys, "diagram", "preset:seed-hybrid", "--prefix", "64", "-o", "-")
    assert [(g.get("data-group"), len(list(g.iter()))) for g in lanes(out)] == [
        (g.get("data-group"), len(list(g.iter()))) for g in lanes(default)
    ]
    xs = [float(e.get(a)) + float(e.get("width", 0)) for e in root.iter() for a in ("x", "cx", "x2") if e.get(a)]
    assert max(xs) <= width
    if width == 1180:  # the default width draws the default picture, byte for byte
        assert out == default


def test_diagram_too_narrow_exit_2(capsys):
    code, _, err = run(capsys, "diagram", "preset:seed-hybrid", "--width", "679", "-o", "-")
    assert code == EXIT_USAGE and "width=679" in err and ">= 680" in err and "[too_narrow]" in err
    assert_one_line_error(err)


def test_diagram_unwritable_output_exit_2(capsys, tmp_path):
    code, _, err = run(capsys, "diagram", "preset:seed-hybrid", "-o", str(tmp_path / "missing-dir" / "x.svg"))
    assert code == EXIT_USAGE
    assert_one_line_error(err)


# ------------------------------------------------------------------- compat


@pytest.mark.parametrize(
    ("a", "b", "exit_code"),
    [
        ("preset:seed-hybrid", "preset:seed-hybrid", EXIT_OK),  # a layout shares keys with itself
        ("preset:glm52-dsa-dcp2", "preset:glm52-dsa-dcp8", EXIT_INVALID),  # DCP 2 vs 8: spans 128 vs 512
        ("preset:seed-hybrid", "preset:kimi-k3-dcp8", EXIT_INVALID),  # different models
    ],
)
def test_compat_exit_code_is_the_report(capsys, a, b, exit_code):
    report = kvgeom.compat(kvgeom.load_preset(a[7:]), kvgeom.load_preset(b[7:]))
    code, out, err = run(capsys, "compat", a, b)
    assert (code, err) == (exit_code, "") and code == report.exit_code
    assert out == kvgeom.compat_main_text(report) + "\n"
    code, out, _ = run(capsys, "compat", a, b, "--json")
    assert code == exit_code and json.loads(out) == report.to_dict()


@pytest.mark.parametrize(
    "argv",
    [
        ["compat", "preset:seed-hybrid"],  # B missing
        ["compat", "preset:seed-hybrid", str(INVALID / "offload-both.json")],  # B does not resolve
        ["compat", str(INVALID / "not-json.json"), "preset:seed-hybrid"],  # A unparsable
    ],
)
def test_compat_usage_and_unresolvable_exit_2(capsys, argv):
    code, out, err = run(capsys, *argv)
    assert code == EXIT_USAGE and out == ""
    assert_one_line_error(err)


# ---------------------------------------------------------- schema, presets


def test_schema_is_the_pydantic_schema(capsys):
    code, out, _ = run(capsys, "schema")
    schema = json.loads(out)
    assert code == EXIT_OK
    assert schema["title"] == "KVGeomConfig"
    assert set(schema["properties"]) == set(kvgeom.KVGeomConfig.model_json_schema()["properties"])


def test_presets_one_line_each(capsys):
    code, out, _ = run(capsys, "presets")
    lines = out.splitlines()
    assert code == EXIT_OK
    assert [line.split()[0] for line in lines] == list(preset_names())
    assert all(len(line.split(None, 1)) == 2 for line in lines)


# --------------------------------------------------------------- subprocess


@pytest.mark.parametrize(
    ("argv", "exit_code", "needle"),
    [
        (["explain"], EXIT_OK, "scheduler block"),  # the README's main-job command
        (["check", "preset:seed-hybrid"], EXIT_OK, "ok"),
        (["check", str(INVALID / "tp-not-divisible-by-dcp.json")], EXIT_INVALID, ""),
        (["hit", "preset:seed-hybrid", "{scenario}"], EXIT_OK, "hit: 48 tokens"),
        (["diagram", "preset:seed-hybrid", "-o", "-"], EXIT_OK, "<svg"),
        (["compat", "preset:glm52-dsa-dcp2", "preset:glm52-dsa-dcp8"], EXIT_INVALID, "NOT compatible"),
        (["schema"], EXIT_OK, '"KVGeomConfig"'),
        (["presets"], EXIT_OK, "seed-hybrid"),
    ],
)
def test_python_m_kvgeom_subprocess(tmp_path, argv, exit_code, needle):
    scenario = write(tmp_path, "s.json", {"num_tokens": 64, "stored": {"0": [32, 64], "1": [16, 32, 48]}})
    argv = [a.replace("{scenario}", scenario) for a in argv]
    proc = subprocess.run([sys.executable, "-m", "kvgeom", *argv], capture_output=True, text=True, cwd=HERE.parent)
    assert proc.returncode == exit_code, proc.stderr
    assert needle in proc.stdout
    assert "Traceback" not in proc.stderr
