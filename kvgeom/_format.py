"""Safe formatting of user input inside messages: bounded, one line, never raising.

Every message kvgeom builds about a user's value goes through :func:`show` (a value) or
:func:`one_line` (text that already quotes values). The invariants, property-tested in
``tests/property/test_fuzz.py``:

* the result is at most about :data:`MAX_SHOWN` characters, whatever the input's size: long
  strings, lists and mappings are cut with a count of what was left out;
* the result holds no line break (a key with a newline cannot split "one line per problem");
* formatting never raises, and never runs for long: integers past Python's int-to-str digit
  limit are shown by their digit count, nesting deeper than :data:`MAX_DEPTH` is shown as ``...``,
  objects whose ``repr`` raises are shown by their type name.

>>> show(10**5000)
'<an integer of about 5001 digits>'
>>> show("a\\nb")
"'a\\\\nb'"
>>> show(list(range(1000)))[-29:]
'17, 18, 19, ... (1000 items)]'
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

__all__ = ["MAX_DEPTH", "MAX_SHOWN", "one_line", "show"]

#: Most characters of user input a message quotes (a value, a key, a path).
MAX_SHOWN = 200
#: Nesting levels :func:`show` descends into before writing ``...``.
MAX_DEPTH = 4
_MAX_ITEMS = 20
#: Characters that end a line for str.splitlines() (and so for a reader of stderr).
_BREAKS = re.compile("[\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029]")


def _escape(m: re.Match[str]) -> str:
    c = ord(m.group())
    return {10: "\\n", 13: "\\r"}.get(c) or (f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}")


def _int(v: int) -> str:
    # bit_length bounds the digit count without converting (str() of a huge int is quadratic and may raise)
    if v.bit_length() <= 196:  # < 10**59: at most 60 characters
        return str(v)
    digits = int(v.bit_length() * math.log10(2)) + 1
    sign = "a negative" if v < 0 else "an"
    if digits > 4000:  # past what str() converts quickly (and near its 4300-digit limit)
        return f"<{sign} integer of about {digits} digits>"
    return f"<{sign} integer of {len(str(abs(v)))} digits>"


def _cut(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text)} chars)"


def _show(v: Any, depth: int, budget: int) -> str:
    if isinstance(v, bool) or v is None:
        return repr(v)
    if isinstance(v, int):
        return _int(v)
    if isinstance(v, float):
        return repr(v)
    if isinstance(v, str):
        return repr(v[:budget]) + f"... ({len(v)} chars)" if len(v) > budget else repr(v)
    if isinstance(v, bytes | bytearray):
        return repr(bytes(v[:budget])) + (f"... ({len(v)} bytes)" if len(v) > budget else "")
    if isinstance(v, Mapping | list | tuple | set | frozenset):
        return _container(v, depth, budget)
    try:
        text = repr(v)
    except Exception:
        return f"<{type(v).__name__}>"
    return _cut(text, budget)


def _container(v: Any, depth: int, budget: int) -> str:
    if isinstance(v, Mapping):
        opening, closing = "{", "}"
    elif isinstance(v, list):
        opening, closing = "[", "]"
    elif isinstance(v, tuple):
        opening, closing = "(", ")"
    else:
        opening, closing = "{", "}"
    try:
        n = len(v)
    except Exception:
        return f"<{type(v).__name__}>"
    if n == 0:
        return "{}" if isinstance(v, Mapping) else ("set()" if isinstance(v, set | frozenset) else opening + closing)
    if depth >= MAX_DEPTH:
        return f"{opening}... ({n} items){closing}"
    parts: list[str] = []
    used = 0
    try:
        items = iter(v.items()) if isinstance(v, Mapping) else iter(v)
        for i, item in enumerate(items):
            if i >= _MAX_ITEMS or used >= budget:
                break
            if isinstance(v, Mapping):
                key, value = item
                part = f"{_show(key, depth + 1, budget // 2)}: {_show(value, depth + 1, budget // 2)}"
            else:
                part = _show(item, depth + 1, budget // 2)
            parts.append(part)
            used += len(part) + 2
    except Exception:
        return f"<{type(v).__name__} of {n} items>"
    more = f", ... ({n} items)" if len(parts) < n else ""
    return opening + ", ".join(parts) + more + closing


def show(value: Any, limit: int = MAX_SHOWN) -> str:
    """``repr(value)`` for a message: one line, at most about ``limit`` characters, never raising.

    >>> show("x" * 1000)[-20:]
    "xxx'... (1000 chars)"
    """
    text = _show(value, 0, limit)
    return _bound(one_line(text), limit)


def _bound(text: str, limit: int) -> str:
    if len(text) <= limit + 40:
        return text
    return f"{text[:limit]}... ({len(text)} chars)"


def one_line(text: str, limit: int | None = None) -> str:
    """``text`` with line breaks written as ``\\n`` (and other control characters escaped), cut to
    ``limit`` characters with a count when given.

    >>> one_line("a\\nb")
    'a\\\\nb'
    """
    if _BREAKS.search(text):
        text = _BREAKS.sub(_escape, text)
    if limit is not None and len(text) > limit:
        return f"{text[:limit]}... ({len(text)} chars)"
    return text
