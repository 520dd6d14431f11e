"""Turn pydantic's ValidationError into kvgeom's ConfigError, one Problem per error.

This module sits below the spec modules and imports none of them: the tagged-union tags (the
``kind`` names pydantic puts into an error's location) come from the caller, as the ``tags`` argument
of :func:`field_path` / :func:`config_error_from_validation` or a model's ``UNION_TAGS`` class
variable (:mod:`kvgeom.specs` sets it to ``KINDS`` for the models that hold tagged unions).
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Annotated, Any, ClassVar, Self

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic._internal._model_construction import ModelMetaclass

from kvgeom._format import show
from kvgeom._math import INT64_MAX
from kvgeom.errors import MAX_PROBLEMS, ConfigError, Problem

#: The integer types of the config format: Python ints only (no ``True``, ``1.0`` or ``"1"``), at most
#: int64 (no cache has more tokens or blocks; every derived query is checked against int64 too).
PositiveInt = Annotated[int, Field(strict=True, gt=0, le=INT64_MAX)]
NonNegativeInt = Annotated[int, Field(strict=True, ge=0, le=INT64_MAX)]
#: Booleans are ``true``/``false`` only (no ``"off"``, ``"no"``, ``0`` or ``1.0``).
StrictBool = Annotated[bool, Field(strict=True)]

_CODES = {
    "missing": "missing_field",
    "extra_forbidden": "unknown_key",
    "union_tag_invalid": "unknown_kind",
    "union_tag_not_found": "missing_kind",
    "literal_error": "invalid_choice",
    "greater_than": "out_of_range",
    "greater_than_equal": "out_of_range",
    "less_than": "out_of_range",
    "less_than_equal": "out_of_range",
    "too_short": "too_short",
    "too_long": "too_long",
    "value_error": "invalid_value",
}


def field_path(
    loc: tuple[Any, ...], prefix: str = "", *, last_is_key: bool = False, tags: Collection[str] = frozenset()
) -> str:
    """``('groups', 0, 'mla', 'block_size')`` -> ``groups[0].block_size``.

    A name in ``tags`` (the caller's tagged-union tags, e.g. ``kvgeom.specs.KINDS``) right after a list
    index is the tag pydantic adds for a tagged-union member and is dropped; anywhere else (a top-level
    key ``"mla"``), or as the unknown key itself when ``last_is_key``, it is a key of the input and
    stays. Keys that are not plain names are quoted.

    >>> kinds = {"mla"}
    >>> field_path(("groups", 0, "mla", "block_size"), tags=kinds), field_path(("mla",), last_is_key=True, tags=kinds)
    ('groups[0].block_size', 'mla')
    """
    out = prefix
    last = len(loc) - 1
    for i, part in enumerate(loc):
        if isinstance(part, int):
            out += f"[{part}]"
            continue
        text = str(part)
        tag = text in tags and i > 0 and isinstance(loc[i - 1], int) and not (last_is_key and i == last)
        if tag or text.startswith("function-"):
            continue  # the tag pydantic adds for a tagged union member, or a validator name
        if not text.isidentifier():
            text = show(text, 60)
        out += f".{text}" if out else text
    return out


def _fix(err_type: str, err: Any) -> str:
    value = show(err.get("input"))
    if err_type == "missing":
        return "add it"
    if err_type == "extra_forbidden":
        return "remove it or check its spelling (docs/config.md lists every key)"
    if err_type == "greater_than":
        return f"got {value}; use an integer > {(err.get('ctx') or {}).get('gt')}"
    if err_type == "greater_than_equal":
        return f"got {value}; use an integer >= {(err.get('ctx') or {}).get('ge')}"
    if err_type == "less_than_equal":
        return f"got {value}; use an integer <= {(err.get('ctx') or {}).get('le')}"
    if err_type == "less_than":
        return f"got {value}"
    if err_type == "bool_type":
        return f"got {value} ({type(err.get('input')).__name__}); write true or false"
    if err_type == "int_type":
        kind = type(err.get("input")).__name__
        return f"got {value} ({kind}); write a plain integer (not a float, string or boolean)"
    if err_type.endswith("_type") or err_type.endswith("_parsing"):
        return f"got {value} ({type(err.get('input')).__name__})"
    if err_type in {"literal_error", "union_tag_invalid"}:
        return f"got {value}" if err_type == "literal_error" else ""
    return ""


def config_error_from_validation(
    exc: ValidationError, prefix: str = "", tags: Collection[str] = frozenset()
) -> ConfigError:
    """One :class:`Problem` per pydantic error, with a kvgeom field path (``tags``: see :func:`field_path`)
    and a fix; at most
    :data:`kvgeom.errors.MAX_PROBLEMS` of them, then one ``too_many_problems`` with the count of the rest."""
    problems: list[Problem] = []
    errors = exc.errors(include_url=False)
    failed_locs = [tuple(e["loc"]) for e in errors if e["type"] != "too_short"]
    for n, err in enumerate(errors):
        if len(problems) >= MAX_PROBLEMS:
            rest = sum(1 for e in errors[n:] if e["type"] != "too_short")  # too_short: reported by its items
            problems.append(
                Problem("too_many_problems", f"... and {rest} more problems not listed", "", {"rest": rest})
            )
            break
        err_type = str(err["type"])
        loc = tuple(err["loc"])
        if err_type == "too_short" and any(f[: len(loc)] == loc and len(f) > len(loc) for f in failed_locs):
            continue  # "at least 1 item" only because the items themselves failed
        msg = str(err["msg"])
        if msg.startswith("Value error, "):
            msg = msg[len("Value error, ") :]
        elif msg.startswith("Assertion failed, "):
            msg = msg[len("Assertion failed, ") :]
        path = field_path(loc, prefix, last_is_key=err_type == "extra_forbidden", tags=tags)
        if err_type == "extra_forbidden" and loc:
            msg = f"unknown key {show(loc[-1], 60)}"
        elif err_type == "union_tag_invalid":
            ctx = err.get("ctx") or {}
            msg = f"unknown kind {show(ctx.get('tag'), 60)}; expected one of {ctx.get('expected_tags')}"
        elif err_type == "union_tag_not_found":
            msg = "missing 'kind'; every group names its kind (e.g. \"kind\": \"full_attention\")"
        fix = _fix(err_type, err)
        message = f"{msg}; {fix}" if fix else msg
        values: dict[str, Any] = {}
        if "input" in err and isinstance(err["input"], int | float | str | bool | None):
            values["input"] = err["input"]
        problems.append(
            Problem(code=_CODES.get(err_type, "wrong_type" if err_type.endswith(("_type", "_parsing")) else "invalid"),
                    message=message, field=path, values=values)
        )
    return ConfigError(problems)


class _RaisesConfigError(ModelMetaclass):
    """``Model(**data)`` raises ConfigError instead of pydantic's ValidationError.

    A metaclass rather than an ``__init__`` override: pydantic calls a custom
    ``__init__`` for nested models too, which would wrap our error in its own.
    """

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().__call__(*args, **kwargs)
        except ValidationError as e:
            raise config_error_from_validation(
                e, prefix=getattr(cls, "FIELD_PREFIX", ""), tags=getattr(cls, "UNION_TAGS", frozenset())
            ) from None


class FrozenModel(BaseModel, metaclass=_RaisesConfigError):
    """Base of kvgeom's value models: immutable, unknown keys rejected, hashable,
    and every validation failure a :class:`kvgeom.ConfigError`."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)
    FIELD_PREFIX: ClassVar[str] = ""
    #: The tagged-union tags that may appear in this model's error locations (see :func:`field_path`);
    #: a model holding a tagged union sets them (``kvgeom.specs.KINDS``).
    UNION_TAGS: ClassVar[frozenset[str]] = frozenset()

    @classmethod
    def model_validate(cls, obj: Any, **kwargs: Any) -> Self:
        try:
            return super().model_validate(obj, **kwargs)
        except ValidationError as e:
            raise config_error_from_validation(e, prefix=cls.FIELD_PREFIX, tags=cls.UNION_TAGS) from None
