"""The ``kvgeom`` command: a thin argparse layer over the library.

Subcommands: ``check``, ``explain``, ``hit``, ``diagram``, ``compat``,
``schema``, ``presets``, ``conform`` (``docs/cli.md`` is the reference;
``conform`` is :mod:`kvgeom.conformance.command`); no subcommand
means ``explain``. Every number printed comes from :func:`kvgeom.resolve` and
the query modules; nothing here derives a span, a chunk or a boundary.

A ``CONFIG`` argument is a ``.json``/``.toml`` path or ``preset:NAME``.

Exit codes (stable):

* ``0`` (:data:`EXIT_OK`): success; for ``check``, every file resolves (and,
  with ``--strict``, has no warning);
* ``1`` (:data:`EXIT_INVALID`): a well-formed config describes an invalid
  geometry (a :class:`kvgeom.GeometryError`), or ``--strict`` and a warning;
* ``2`` (:data:`EXIT_USAGE`): usage error, or an unreadable, unparsable or
  malformed input (a :class:`kvgeom.ConfigError`: unknown keys, wrong types,
  out-of-range values), or a query that cannot be asked (a
  :class:`kvgeom.QueryError`, e.g. ``hit`` on a config without offloading).
  When ``check`` sees both kinds of file, 2 wins.

``compat A B`` exits 0 when the two layouts' offloaded keys are
interchangeable, 1 when they are not, and 2 for usage errors or a layout that
does not resolve.

Errors are printed on stderr, one line per problem (``FILE: field: message
[code]``), never as a traceback.

>>> main(["presets"]) == EXIT_OK  # doctest: +ELLIPSIS
deepseek-v3-mla-dcp8 ...
True
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn, TextIO

from kvgeom._format import one_line, show
from kvgeom._resolve import resolve
from kvgeom.config import DEFAULT_CONFIG, KVGeomConfig, load_config, read_file
from kvgeom.errors import MAX_LISTED, ConfigError, KVGeomError, Problem, QueryError
from kvgeom.geometry import Geometry
from kvgeom.presets import load_preset, preset_description, preset_names
from kvgeom.report import explain_text

__all__ = ["EXIT_INVALID", "EXIT_OK", "EXIT_USAGE", "main"]

EXIT_OK = 0
EXIT_INVALID = 1
EXIT_USAGE = 2

PRESET_PREFIX = "preset:"
DEFAULT_LABEL = "default"


class _Fail(Exception):
    """Stop a command: print ``lines`` on stderr and exit with ``code``."""

    def __init__(self, code: int, lines: list[str]) -> None:
        super().__init__(code, lines)
        self.code = code
        self.lines = lines


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser whose usage errors are one line on stderr and exit code 2."""

    def error(self, message: str) -> NoReturn:
        raise _Fail(EXIT_USAGE, [f"{self.prog}: {one_line(message, 300)} (see {self.prog} --help)"])


def _exit_code(err: KVGeomError) -> int:
    """2 for malformed input or an impossible query, 1 for an invalid geometry."""
    return EXIT_USAGE if isinstance(err, ConfigError | QueryError) else EXIT_INVALID


def _problem_line(p: Problem) -> str:
    where = f"{p.field}: " if p.field else ""
    return f"{where}{p.message} [{p.code}]"


def _problem_lines(label: str, problems: Sequence[Problem]) -> list[str]:
    """One line per problem, at most :data:`kvgeom.errors.MAX_LISTED` of them and then a count."""
    lines = [f"{label}: {_problem_line(p)}" for p in problems[:MAX_LISTED]]
    if len(problems) > MAX_LISTED:
        lines.append(f"{label}: ... and {len(problems) - MAX_LISTED} more problems (--format json lists all)")
    return lines


def _fail(label: str, err: KVGeomError) -> _Fail:
    return _Fail(_exit_code(err), _problem_lines(label, err.problems))


def _label(arg: str) -> str:
    """A command-line argument as it is echoed in a message: one line, bounded."""
    return one_line(arg, 200)


def _load(arg: str) -> KVGeomConfig:
    """A config from a path or ``preset:NAME`` (raises :class:`KVGeomError`)."""
    if arg.startswith(PRESET_PREFIX):
        return load_preset(arg[len(PRESET_PREFIX) :])
    return load_config(arg)


def _resolve_arg(arg: str) -> Geometry:
    try:
        return resolve(_load(arg))
    except KVGeomError as e:
        raise _fail(_label(arg), e) from None


def _nonneg_int(text: str) -> int:
    try:
        value = int(text, 10)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a token count (an integer >= 0), got {show(text, 60)}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a token count >= 0, got {show(value, 60)}")
    return value


def _pos_int(text: str) -> int:
    value = _nonneg_int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {show(value, 60)}")
    return value


# --------------------------------------------------------------------- check


def _lmcache_warnings(geom: Any, args: argparse.Namespace) -> list[dict[str, str]]:
    """``kvgeom check --lmcache``: each place LMCache 0.5.6 would part from ``geom`` harmfully (a wrong block
    stored or loaded, or a refusal to start), as a warning naming LMCache's rule, both numbers, the
    consequence and the fix (:func:`kvgeom.engines.lmcache.partings`)."""
    from kvgeom.engines.lmcache import FINDINGS, LMCacheSettings, partings

    found = partings(geom, LMCacheSettings(chunk_size=args.lmcache_chunk_size, servers=args.lmcache_servers))
    return [{"code": p.code, "message": p.message} for p in found if p.finding is None or FINDINGS[p.finding].harms]



def _cmd_check(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    results: list[dict[str, Any]] = []
    found: list[tuple[Problem, ...]] = []  # each file's problems, with their values (a parse error's line/column)
    for arg in args.configs:
        item: dict[str, Any] = {"file": arg, "status": "ok", "exit_code": EXIT_OK, "problems": [], "warnings": []}
        found.append(())
        sglang = _sglang_section(arg)
        if sglang is not None:
            _check_sglang(item, sglang, args.strict)
            results.append(item)
            continue
        try:
            geom = resolve(_load(arg))
        except KVGeomError as e:
            found[-1] = tuple(e.problems)
            code = _exit_code(e)
            item.update(
                status="malformed" if code == EXIT_USAGE else "invalid",
                exit_code=code,
                problems=[p.to_dict() for p in e.problems],
            )
        else:
            item["warnings"] = [{"code": w.code, "message": w.message} for w in geom.warnings]
            if args.lmcache:
                item["warnings"] += _lmcache_warnings(geom, args)
            item["summary"] = {
                "scheduler_block_size": geom.scheduler_block_size,
                "hash_block_size": geom.hash_block_size,
                "hit_alignment_tokens": geom.hit_alignment_tokens,
            }
            if args.strict and item["warnings"]:  # geom.warnings, plus LMCache's with --lmcache
                item.update(status="warned", exit_code=EXIT_INVALID)
        results.append(item)
    exit_code = max(r["exit_code"] for r in results)
    match args.format:
        case "json":
            json.dump({"exit_code": exit_code, "strict": args.strict, "files": results}, out, indent=2)
            out.write("\n")
        case "github":
            for r, problems in zip(results, found, strict=True):
                for p in problems[:MAX_LISTED]:
                    out.write(_gh("error", r["file"], p.code, _problem_line(p), _gh_place(p)) + "\n")
                level = "error" if args.strict else "warning"
                for w in r["warnings"]:
                    out.write(_gh(level, r["file"], w["code"], w["message"]) + "\n")
        case "text":
            for r in results:
                for line in _problem_lines(_label(r["file"]), [Problem(**p) for p in r["problems"]]):
                    err.write(line + "\n")
                stream = err if args.strict else out
                for w in r["warnings"]:
                    stream.write(f"{r['file']}: warning: {w['message']} [{w['code']}]\n")
                if r["status"] in {"ok", "warned"} and r.get("engine") == "sglang":
                    s = r["summary"]
                    grids = (f" checkpoint grid={s['checkpoint_grid']} track grid={s['track_grid']}"
                             if s["checkpoint_grid"] is not None else "")
                    out.write(
                        f"{r['file']}: {'ok' if r['status'] == 'ok' else 'fails --strict'} "
                        f"(SGLang: tree page={s['tree_page']}{grids}, "
                        f"{len(r['warnings'])} warning{'' if len(r['warnings']) == 1 else 's'})\n"
                    )
                elif r["status"] in {"ok", "warned"}:
                    s = r["summary"]
                    out.write(
                        f"{r['file']}: {'ok' if r['status'] == 'ok' else 'fails --strict'} "
                        f"(L={s['scheduler_block_size']} H={s['hash_block_size']} A={s['hit_alignment_tokens']}, "
                        f"{len(r['warnings'])} warning{'' if len(r['warnings']) == 1 else 's'})\n"
                    )
        case _:  # argparse restricts the choices
            raise AssertionError(args.format)
    return int(exit_code)


def _sglang_section(arg: str) -> Any:
    """The parsed file when ``arg`` is an SGLang deployment (a top-level ``sglang`` table), else None (a
    file that cannot be read is left to the kvgeom path, which reports it)."""
    from kvgeom.engines.sglang import is_sglang_source

    if arg.startswith(PRESET_PREFIX):
        return None
    try:
        data = read_file(Path(arg))
    except (KVGeomError, OSError):
        return None
    return data if is_sglang_source(data) else None


def _check_sglang(item: dict[str, Any], data: Any, strict: bool) -> None:
    """Fill a ``check`` result for an SGLang deployment (kvgeom.engines.sglang)."""
    from kvgeom.engines.sglang import resolve_sglang

    item["engine"] = "sglang"
    try:
        geom = resolve_sglang(data)
    except KVGeomError as e:
        code = _exit_code(e)
        item.update(status="malformed" if code == EXIT_USAGE else "invalid", exit_code=code,
                    problems=[p.to_dict() for p in e.problems])
        return
    item["warnings"] = [{"code": w.code, "message": w.message} for w in geom.warnings]
    item["summary"] = {"tree_page": geom.tree_page, "checkpoint_grid": geom.checkpoint_grid,
                       "track_grid": geom.track_grid, "kv_event_block_size": geom.kv_event_block_size}
    if strict and geom.warnings:
        item.update(status="warned", exit_code=EXIT_INVALID)


def _gh_escape(text: str, prop: bool) -> str:
    text = text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")
    if prop:
        text = text.replace(":", "%3A").replace(",", "%2C")
    return text


def _gh_place(p: Problem) -> str:
    """``,line=L,col=C`` for a problem that knows where in its file it is (a JSON or TOML parse error), else ``""``."""
    line, column = p.values.get("line"), p.values.get("column")
    if type(line) is not int or line < 1:
        return ""
    return f",line={line}" + (f",col={column}" if type(column) is int and column >= 1 else "")


def _gh(level: str, file: str, code: str, message: str, place: str = "") -> str:
    """A GitHub Actions workflow-command annotation line (``place``: :func:`_gh_place`)."""
    return (f"::{level} file={_gh_escape(file, True)}{place},title={_gh_escape('kvgeom ' + code, True)}::"
            + _gh_escape(message, False))


# ------------------------------------------------------------------- explain


def _pick_source(args: argparse.Namespace) -> KVGeomConfig | dict[str, Any]:
    if args.config is not None and args.preset is not None:
        raise _Fail(EXIT_USAGE, ["kvgeom explain: give CONFIG or --preset NAME, not both (see kvgeom explain --help)"])
    if args.preset is not None:
        return _load(PRESET_PREFIX + args.preset)
    if args.config is not None:
        return _load(args.config)
    return DEFAULT_CONFIG


def _cmd_explain(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    label = _label(args.config or (PRESET_PREFIX + args.preset if args.preset else DEFAULT_LABEL))
    sglang = _sglang_section(args.config) if args.config is not None and args.preset is None else None
    if sglang is not None:
        from kvgeom.engines.sglang import explain_sglang, resolve_sglang

        try:
            sgeom = resolve_sglang(sglang)
        except KVGeomError as e:
            raise _fail(label, e) from None
        if args.json:
            json.dump(sgeom.to_dict(), out, indent=2)
            out.write("\n")
        else:
            out.write(explain_sglang(sgeom, label) + "\n")
        return EXIT_OK
    try:
        source = _pick_source(args)
        geom = resolve(source)
    except KVGeomError as e:
        raise _fail(label, e) from None
    try:  # a prefix whose key map or rank list is past its documented size: refused, exit 2
        report = geom.to_report() if args.json else {}
        if args.json and args.prefix is not None:
            report["keys"] = geom.key_map(args.prefix) if geom.offload is not None else None
        text = "" if args.json else explain_text(geom, _shown(label), args.prefix)
    except KVGeomError as e:
        raise _fail(label, e) from None
    if args.json:
        json.dump(report, out, indent=2)
        out.write("\n")
        if args.prefix is not None and geom.offload is None:
            err.write(f'{label}: no offload section, so no offload keys ("keys": null); add "offload": {{}}\n')
        return EXIT_OK
    out.write(text)
    return EXIT_OK


def _shown(label: str) -> str:
    return "the bundled default (the seed hybrid under DCP=2)" if label == DEFAULT_LABEL else label


# ----------------------------------------------------------------------- hit


def _cmd_hit(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    geom = _resolve_arg(args.config)
    try:
        scenario = read_file(Path(args.scenario))
        plan = geom.plan_hit(scenario)
    except KVGeomError as e:
        label = _label(args.config if e.code == "no_offload" else args.scenario)
        raise _Fail(EXIT_USAGE, _problem_lines(label, e.problems)) from None
    if args.json:
        json.dump(plan, out, indent=2)
        out.write("\n")
        return EXIT_OK
    out.write(f"hit: {plan['hit_tokens']} tokens from the offload tier, ending at token {plan['end_token']}\n")
    for item in plan["groups"]:
        g = geom.groups[item["index"]]
        line = (
            f"  group {g.index} ({g.kind}): load keys ending at {item['load_keys']}, "
            f"block entries {item['block_entries']}"
        )
        if item["state_block"] is not None:
            line += f", state block {item['state_block']}"
        out.write(line + "\n")
    return EXIT_OK


# ------------------------------------------------------------------- diagram


def _cmd_diagram(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    from kvgeom.diagram import render_svg

    sglang = _sglang_section(args.config)
    try:
        if sglang is not None:  # an SGLang deployment: its tree page, Mamba grids and one prompt
            from kvgeom.engines.sglang import resolve_sglang
            from kvgeom.engines.sglang_diagram import render_sglang_svg

            svg = render_sglang_svg(resolve_sglang(sglang), args.prefix, title=args.title or args.config,
                                    width=args.width)
        else:
            svg = render_svg(_resolve_arg(args.config), args.prefix, title=args.title or args.config,
                             width=args.width)
    except KVGeomError as e:
        raise _fail(_label(args.config), e) from None
    if args.output == "-":
        out.write(svg)
        return EXIT_OK
    try:
        Path(args.output).write_text(svg, encoding="utf-8")
    except OSError as e:
        reason = one_line(f"{e.__class__.__name__}: {e}", 300)
        raise _Fail(EXIT_USAGE, [f"{_label(args.output)}: cannot write the diagram: {reason}"]) from None
    return EXIT_OK


# -------------------------------------------------------------------- compat


def _cmd_compat(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    from kvgeom.compat import compat, compat_main_text

    configs = []
    for arg in (args.a, args.b):
        try:
            configs.append(resolve(_load(arg)))
        except KVGeomError as e:
            # A layout that does not resolve cannot be compared: exit 2, since 1 means "not interchangeable".
            raise _Fail(EXIT_USAGE, _problem_lines(_label(arg), e.problems)) from None
    report = compat(configs[0], configs[1])
    if args.json:
        json.dump(report.to_dict(), out, indent=2)
        out.write("\n")
    else:
        out.write(compat_main_text(report) + "\n")
    return EXIT_OK if report.compatible else EXIT_INVALID


# ------------------------------------------------------------ schema, presets


def config_schema() -> dict[str, Any]:
    """The JSON Schema of the config format (draft 2020-12), from the pydantic models.

    >>> config_schema()["title"]
    'KVGeomConfig'
    """
    schema = KVGeomConfig.model_json_schema()
    defs = schema.get("$defs", {})
    # Two rules of the format that pydantic's generated schema cannot see: the "dense" spelling of a null
    # retention interval (a before-validator), and "block_size or blocks_per_chunk, not both" (offload_chunk_both).
    retention = defs.get("CacheConfig", {}).get("properties", {}).get("retention_interval")
    if retention is not None and "anyOf" in retention:
        retention["anyOf"].append({"const": "dense"})
    if "OffloadConfig" in defs:
        defs["OffloadConfig"]["not"] = {"required": ["block_size", "blocks_per_chunk"]}
    _layers_inherit_block_size(defs)
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", **schema}


def _layers_inherit_block_size(defs: dict[str, Any]) -> None:
    """A uniform container and its layers may each omit ``block_size`` (one inherits the other's, a
    before-validator the generated schema does not show): point the layers at copies of the leaf
    specs without ``block_size`` in ``required``, and drop it from the container's."""
    uniform = defs.get("UniformSpec")
    if uniform is None:
        return
    uniform["required"] = [r for r in uniform.get("required", []) if r != "block_size"]
    items = uniform["properties"]["layers"]["items"]
    renamed: dict[str, str] = {}
    for option in items.get("oneOf", []):
        name = option["$ref"].rsplit("/", 1)[-1]
        layer = copy.deepcopy(defs[name])
        layer["required"] = [r for r in layer.get("required", []) if r != "block_size"]
        defs[f"{name}Layer"] = layer
        renamed[f"#/$defs/{name}"] = f"#/$defs/{name}Layer"
        option["$ref"] = renamed[f"#/$defs/{name}"]
    mapping = items.get("discriminator", {}).get("mapping", {})
    for kind, ref in mapping.items():
        mapping[kind] = renamed.get(ref, ref)


def _cmd_schema(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    json.dump(config_schema(), out, indent=2)
    out.write("\n")
    return EXIT_OK


def _cmd_presets(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    names = preset_names()
    width = max(len(n) for n in names)
    for name in names:
        out.write(f"{name.ljust(width)}  {preset_description(name)}\n")
    return EXIT_OK


# ---------------------------------------------------------------------- main


def _parser() -> _Parser:
    from kvgeom import __version__

    p = _Parser(
        prog="kvgeom",
        description="KV-cache block geometry: check configs in CI, explain and draw a geometry, plan hits.",
        epilog="CONFIG is a .json/.toml file or preset:NAME. Exit codes: 0 ok, 1 invalid geometry "
        "(or a warning under --strict), 2 usage error or unreadable/malformed input.",
    )
    p.add_argument("--version", action="version", version=f"kvgeom {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    c = sub.add_parser("check", help="resolve configs; exit 1 on an invalid geometry (a CI gate)")
    c.add_argument("configs", nargs="+", metavar="CONFIG")
    c.add_argument("--format", choices=["text", "json", "github"], default="text")
    c.add_argument("--strict", action="store_true", help="treat warnings as failures (exit 1)")
    c.add_argument("--lmcache", action="store_true",
                   help="LMCache 0.5.6 is in front of vLLM: also warn where its geometry parts from vLLM's")
    c.add_argument("--lmcache-chunk-size", type=_pos_int, default=256, metavar="N",
                   help="LMCache's chunk_size (default 256; with --lmcache)")
    c.add_argument("--lmcache-servers", type=_pos_int, default=1, metavar="N",
                   help="LMCache servers the ranks are split over (default 1; with --lmcache)")
    c.set_defaults(func=_cmd_check)

    e = sub.add_parser("explain", help="explain a geometry (default: the bundled seed hybrid under DCP=2)")
    e.add_argument("config", nargs="?", metavar="CONFIG")
    e.add_argument("--preset", metavar="NAME", help="a bundled preset (see kvgeom presets)")
    e.add_argument("--prefix", type=_nonneg_int, metavar="N", help="also show the keys of an N-token prefix")
    e.add_argument("--json", action="store_true", help='print to_report() (and key_map under "keys")')
    e.set_defaults(func=_cmd_explain)

    h = sub.add_parser("hit", help="hit length and load plan of a scenario")
    h.add_argument("config", metavar="CONFIG")
    h.add_argument("scenario", metavar="SCENARIO.json")
    h.add_argument("--json", action="store_true")
    h.set_defaults(func=_cmd_hit)

    d = sub.add_parser("diagram", help="draw the token axis, one lane per group, as SVG")
    d.add_argument("config", metavar="CONFIG")
    d.add_argument(
        "--prefix",
        type=_nonneg_int,
        metavar="N",
        help="tokens to draw (default: two of the largest chunk or scheduler block)",
    )
    d.add_argument("-o", "--output", required=True, metavar="FILE.svg", help="output file ('-' for stdout)")
    d.add_argument("--title", help="title line (default: CONFIG)")
    d.add_argument(
        "--width",
        type=_nonneg_int,
        metavar="PX",
        help="picture width in px, at least 680 (default 1180); text stays 11 px, the token axis narrows",
    )
    d.set_defaults(func=_cmd_diagram)

    cp = sub.add_parser("compat", help="can two layouts share offloaded keys? exit 0 yes, 1 no")
    cp.add_argument("a", metavar="A", help="CONFIG of the first deployment")
    cp.add_argument("b", metavar="B", help="CONFIG of the second deployment")
    cp.add_argument("--json", action="store_true", help="print the CompatReport as JSON")
    cp.set_defaults(func=_cmd_compat)

    s = sub.add_parser("schema", help="print the JSON Schema of the config format")
    s.set_defaults(func=_cmd_schema)

    ps = sub.add_parser("presets", help="list the bundled presets")
    ps.set_defaults(func=_cmd_presets)

    cf = sub.add_parser("conform", help="check an installed engine against kvgeom; exit 1 on a new finding")
    cf.add_argument(
        "--engine",
        default="vllm",
        help="engine to check (default: vllm; supported: vllm 0.33.x, lmcache 0.5.6 beside vllm, sglang 0.5.23)",
    )
    cf.add_argument("--examples", type=int, metavar="N", help="generated cases per round (default 300)")
    cf.add_argument("--seed", type=int, default=0, metavar="S", help="Hypothesis seed (default 0)")
    cf.add_argument("--strict", action="store_true", help="report documented deviations as findings too")
    cf.add_argument("--json", action="store_true", help="print the report as JSON")
    cf.set_defaults(func=_cmd_conform)
    return p


def _cmd_conform(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    from kvgeom.conformance.command import conform  # imports the engine only when asked to

    return conform(engine=args.engine, examples=args.examples, seed=args.seed, strict=args.strict,
                   as_json=args.json, out=out, err=err)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``kvgeom`` command with ``argv`` (default ``sys.argv[1:]``); return the exit code.

    Never raises for bad input: problems are printed on stderr, one line each.

    >>> main(["check", "preset:gemma3-swa"])
    preset:gemma3-swa: ok (L=16 H=16 A=16, 0 warnings)
    0
    """
    out, err = sys.stdout, sys.stderr
    parser = _parser()
    try:
        try:
            args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
        except SystemExit as e:  # --help and --version
            return e.code if isinstance(e.code, int) else EXIT_OK
        if args.command is None:  # bare `kvgeom` / `python -m kvgeom`: the main job, explain the default
            args = parser.parse_args(["explain"])
        return int(args.func(args, out, err))
    except _Fail as f:
        for line in f.lines:
            err.write(line + "\n")
        return f.code
    except RecursionError:  # belt and braces: readers and loaders refuse deep nesting before this
        err.write("kvgeom: the input nests too deeply to read; a kvgeom config needs at most 5 levels "
                  "[nested_too_deep]\n")
        return EXIT_USAGE
    except BrokenPipeError:  # e.g. kvgeom schema | head: the reader left; not an error of ours
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        except (OSError, ValueError):
            pass
        return EXIT_OK
