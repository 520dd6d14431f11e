"""A small TOML writer for kvgeom's config schema (Python ships only a TOML reader).

Only what the schema needs: tables, arrays of tables (``[[groups]]`` and
``[[groups.layers]]``), and integers, booleans, strings, floats and nested
arrays of those. ``None`` cannot be written in TOML: a null
``cache.retention_interval`` is written as the string ``"dense"`` (which the
reader maps back to ``None``), every other ``None`` is omitted (it is the field's
default). ``tomllib.loads(dumps(d))`` reads back ``d`` up to those two rules.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

from kvgeom.errors import ConfigError

__all__ = ["dumps"]

_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")
_ESCAPES = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\t": "\\t", "\n": "\\n", "\f": "\\f", "\r": "\\r"}

#: Paths whose ``None`` means something other than "the default": written as a string.
_NULL_AS = {("cache", "retention_interval"): "dense"}


def _key(k: Any, path: tuple[str, ...]) -> str:
    if not isinstance(k, str):
        raise ConfigError.single(
            "toml_bad_key",
            f"key {k!r} at {'.'.join(path) or 'top level'} is not a string; TOML keys are strings",
            ".".join(path),
        )
    return k if _BARE_KEY.fullmatch(k) else _string(k)  # fullmatch: '$' would accept a trailing newline


def _string(s: str) -> str:
    out = []
    for ch in s:
        if ch in _ESCAPES:
            out.append(_ESCAPES[ch])
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def _is_table(v: Any) -> bool:
    return isinstance(v, Mapping)


def _is_table_array(v: Any) -> bool:
    return isinstance(v, list | tuple) and len(v) > 0 and all(_is_table(x) for x in v)


def _value(v: Any, path: tuple[str, ...]) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        return repr(v)
    if isinstance(v, str):
        return _string(v)
    if isinstance(v, Mapping):
        items = [f"{_key(k, path)} = {_value(x, (*path, str(k)))}" for k, x in v.items() if x is not None]
        return "{" + ", ".join(items) + "}" if items else "{}"
    if isinstance(v, Sequence):
        if any(x is None for x in v):
            raise ConfigError.single(
                "toml_null_in_array",
                f"{'.'.join(path)} holds null inside an array, which TOML cannot write; remove the nulls",
                ".".join(path),
            )
        return "[" + ", ".join(_value(x, path) for x in v) + "]"
    raise ConfigError.single(
        "toml_unsupported_value",
        f"{'.'.join(path)} holds a {type(v).__name__} ({v!r}), which kvgeom's TOML writer does not write; "
        "use integers, booleans, strings, arrays and tables",
        ".".join(path),
    )


def _table(d: Mapping[str, Any], path: tuple[str, ...], header: str | None, lines: list[str]) -> None:
    if header is not None:
        if lines:
            lines.append("")
        lines.append(header)
    nested = []
    for k, v in d.items():
        p = (*path, str(k))
        if v is None:
            if p in _NULL_AS:
                lines.append(f"{_key(k, path)} = {_string(_NULL_AS[p])}")
            continue
        if _is_table(v) or _is_table_array(v):
            nested.append((k, v))
        else:
            lines.append(f"{_key(k, path)} = {_value(v, p)}")
    for k, v in nested:
        p = (*path, str(k))
        dotted = ".".join(_key(x, path) for x in p)
        if _is_table(v):
            _table(v, p, f"[{dotted}]", lines)
        else:
            for item in v:
                _table(item, p, f"[[{dotted}]]", lines)


def dumps(config: Mapping[str, Any]) -> str:
    """Write a config dict (as :meth:`kvgeom.KVGeomConfig.to_dict` returns) as TOML text.

    Contract: ``tomllib.loads(dumps(d))`` equals ``d`` with ``None`` values dropped and a null
    ``cache.retention_interval`` turned into ``"dense"``; ``kvgeom.load_config`` of the result
    equals ``load_config(d)``. Unsupported values raise :class:`kvgeom.ConfigError`.

    >>> print(dumps({"groups": [{"kind": "mla", "block_size": 64}], "cache": {"retention_interval": None}}))
    [[groups]]
    kind = "mla"
    block_size = 64
    <BLANKLINE>
    [cache]
    retention_interval = "dense"
    <BLANKLINE>
    """
    if not isinstance(config, Mapping):
        raise ConfigError.single("not_a_table", f"a config is a table/object, got {type(config).__name__}", "")
    lines: list[str] = []
    _table(config, (), None, lines)
    return "\n".join(lines) + "\n"
