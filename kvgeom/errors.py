"""The error hierarchy of kvgeom.

Every problem kvgeom finds in its input is reported as a :class:`KVGeomError`
(a :class:`ValueError`), never as an ``assert`` or a stray ``KeyError``. An
error carries one or more :class:`Problem` records; each problem has a stable
``code`` (safe to match on in scripts), the ``field`` it concerns (a dotted path
such as ``groups[1].block_size``), the numbers involved in ``values`` and a
message that says what is wrong, the numbers, and the fix.

A config with several problems is reported once, with all of them::

    >>> import kvgeom
    >>> try:
    ...     kvgeom.resolve({"groups": [{"kind": "full_attention", "block_size": 0},
    ...                                {"kind": "mamba", "block_size": -16}]})
    ... except kvgeom.ConfigError as e:
    ...     print(len(e.problems), e.problems[0].field, e.problems[1].field)
    2 groups[0].block_size groups[1].block_size
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from kvgeom._format import one_line

__all__ = [
    "ConfigError",
    "GeometryError",
    "KVGeomError",
    "OffloadConfigError",
    "ParallelismError",
    "Problem",
    "QueryError",
]


#: Most characters of a problem's message (longer ones are cut, with a count).
MAX_MESSAGE = 1000
#: Most characters of a problem's field path.
MAX_FIELD = 300
#: Most problems an error's text lists (``problems`` holds them all).
MAX_LISTED = 50
#: Most problems one validation records; past it the last problem is ``too_many_problems`` with the count
#: (100,000 unknown keys must not cost seconds and megabytes to report).
MAX_PROBLEMS = 1000


@dataclass(frozen=True, slots=True)
class Problem:
    """One thing wrong with an input.

    ``code`` is stable across releases; ``field`` names where the problem is
    (``""`` when it concerns the whole input); ``values`` holds the numbers the
    message quotes, by name.
    """

    code: str
    message: str
    field: str = ""
    values: dict[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        # One line each, bounded: a key holding a newline or a megabyte of input cannot split or flood
        # "one line per problem" (values are quoted through kvgeom._format.show where messages are built).
        object.__setattr__(self, "message", one_line(str(self.message), MAX_MESSAGE))
        object.__setattr__(self, "field", one_line(str(self.field), MAX_FIELD))

    def to_dict(self) -> dict[str, Any]:
        return {"code": self.code, "field": self.field, "message": self.message}


class KVGeomError(ValueError):
    """Base of every error kvgeom raises on bad input.

    Attributes:
        problems: every problem found, in input order.
        code: the code of the first problem (``"multiple"`` is never used: look
            at ``problems`` when there are several).
        field: the field of the first problem.
        values: the numbers of the first problem; each is also an attribute of
            the error when it does not shadow one of the above.
    """

    problems: tuple[Problem, ...]
    code: str
    field: str
    values: dict[str, Any]

    def __init__(self, problems: Problem | list[Problem] | tuple[Problem, ...]) -> None:
        if isinstance(problems, Problem):
            problems = (problems,)
        problems = tuple(problems)
        if not problems:
            raise TypeError("KVGeomError needs at least one Problem")
        self.problems = problems
        first = problems[0]
        self.code = first.code
        self.field = first.field
        self.values = dict(first.values)
        for name, value in first.values.items():
            if not hasattr(self, name):
                setattr(self, name, value)
        super().__init__(self._render())

    @classmethod
    def single(cls, code: str, message: str, field: str = "", **values: Any) -> KVGeomError:
        """Build an error holding one problem."""
        return cls(Problem(code=code, message=message, field=field, values=values))

    def _render(self) -> str:
        if len(self.problems) == 1:
            return _line(self.problems[0])
        lines = [f"{len(self.problems)} problems:"]
        lines.extend(f"  - {_line(p)}" for p in self.problems[:MAX_LISTED])
        if len(self.problems) > MAX_LISTED:
            lines.append(f"  ... and {len(self.problems) - MAX_LISTED} more (the error's .problems lists all)")
        return "\n".join(lines)

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.problems,))


def _line(p: Problem) -> str:
    return f"{p.field}: {p.message}" if p.field else p.message


class ConfigError(KVGeomError):
    """The input is not a well-formed kvgeom config: unreadable or unparsable file,
    unknown keys, wrong types, out-of-range values, unknown kinds."""


class GeometryError(KVGeomError):
    """The config is well formed but describes a geometry that cannot work (for
    example a span that the hash unit does not divide). Raised directly when a
    config has problems of several kinds."""


class ParallelismError(GeometryError):
    """Parallel sizes that vLLM rejects, or an interleave that does not fit a
    sharded group's per-rank block."""


class OffloadConfigError(GeometryError):
    """An offloading section that cannot be translated into chunk geometry."""


class QueryError(KVGeomError):
    """A query on a resolved geometry with arguments out of range (negative token
    counts, a chunk past the prefix, a count past int64, ...)."""

    #: On a ``lookup_not_ready`` error raised by :func:`kvgeom.hits.lookup_trace`: the keys the deferred lookup
    #: asked the tier for, in order (:class:`kvgeom.hits.ProbeCall`); empty on every other error.
    probes: tuple[Any, ...] = ()
