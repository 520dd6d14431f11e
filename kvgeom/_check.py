"""Argument checks for queries: plain ints in [0, int64 max], raising QueryError."""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sized
from itertools import islice
from typing import Any

import numpy as np

from kvgeom._format import show
from kvgeom._math import INT64_MAX
from kvgeom.errors import QueryError


def nonneg(name: str, value: Any) -> int:
    """``value`` as an int in ``[0, INT64_MAX]``, else :class:`QueryError` naming ``name``."""
    if type(value) is not int:
        if isinstance(value, np.integer) and not isinstance(value, np.bool_):
            value = int(value)
        elif isinstance(value, bool) or not isinstance(value, int):
            raise QueryError.single(
                "not_an_integer", f"{name} must be an integer, got {show(value)} ({type(value).__name__})", name
            )
    if value < 0:
        raise QueryError.single(
            "negative", f"{name}={show(value)} is negative; token counts and indices are >= 0", name, **{name: value}
        )
    if value > INT64_MAX:
        raise QueryError.single(
            "int64_overflow",
            f"{name}={show(value)} is past what int64 holds ({INT64_MAX}); no cache has that many tokens or blocks",
            name,
            **{name: value},
        )
    return int(value)


def flag(name: str, value: Any) -> bool:
    """``value`` as a bool (``True``/``False`` or a numpy bool), else :class:`QueryError` ``not_a_bool`` naming
    ``name``: a string ``"false"`` is truthy and must not pass as one."""
    if type(value) is bool or isinstance(value, np.bool_):
        return bool(value)
    raise QueryError.single(
        "not_a_bool", f"{name} must be true or false, got {show(value)} ({type(value).__name__})", name
    )


def bounded_ints(name: str, values: Any, limit: int, item: str, what: str) -> list[int]:
    """``values`` as a list of ints in ``[0, int64 max]`` (each checked by :func:`nonneg` as ``item``): an
    iterable, not a string or mapping (``bad_<name>``), of at most ``limit`` items (``result_too_large``,
    checked before the items are read: a ``range`` of 10**12 is refused at once). ``what`` names the items
    in the messages.
    """
    if isinstance(values, str | bytes | Mapping) or not isinstance(values, Iterable) or _unsized_array(values):
        raise QueryError.single(
            f"bad_{name}", f"{name} must be a collection of {what}, got {show(values)} ({type(values).__name__})", name
        )
    items = values if isinstance(values, Sized) else list(islice(values, limit + 1))
    try:
        count = len(items)
    except OverflowError:  # a range past sys.maxsize
        count = INT64_MAX + 1
    if count > limit:
        many = str(count) if count <= INT64_MAX else "more than 2^63"
        raise QueryError.single(
            "result_too_large",
            f"{name} lists {many} {what}, more than the scalar path reads ({limit})",
            name,
            count=count,
            limit=limit,
        )
    return [nonneg(item, v) for v in items]


def _unsized_array(values: Any) -> bool:
    return isinstance(values, np.ndarray) and values.ndim != 1


def mapping(name: str, value: Any) -> Mapping[Any, Any]:
    """``value`` when it is a mapping, else :class:`QueryError` ``not_a_mapping`` naming ``name``."""
    if isinstance(value, Mapping):
        return value
    raise QueryError.single(
        "not_a_mapping", f"{name} must map a group index to a count, got {show(value)} ({type(value).__name__})", name
    )


def positive(name: str, value: Any) -> int:
    v = nonneg(name, value)
    if v == 0:
        raise QueryError.single("zero", f"{name} must be positive, got 0", name, **{name: 0})
    return v


def multiple(name: str, value: int, unit: int, what: str) -> None:
    """Raise unless ``value`` is a multiple of ``unit`` (``what`` names the unit)."""
    if value % unit:
        raise QueryError.single(
            "not_on_grid",
            f"{name}={value} is not a multiple of {what}={unit}; "
            f"use {value - value % unit} or {value - value % unit + unit}",
            name,
            **{name: value, "unit": unit},
        )


def result(name: str, value: int) -> int:
    """``value`` unchanged, or :class:`QueryError` ``int64_overflow`` when an answer would not fit an int64
    (the batch paths compute in int64, so the scalar path refuses the same inputs)."""
    if value > INT64_MAX:
        raise QueryError.single(
            "int64_overflow",
            f"the {name} for these arguments is {show(value)}, past what int64 holds ({INT64_MAX}); no cache has that "
            "many tokens or blocks",
            name,
            **{name: value},
        )
    return value


def group_key(name: str, key: Any) -> int:
    """A group index given as a mapping key: an int, or the canonical decimal string of one (``"0"``, ``"12"``:
    ASCII digits, no sign, no leading zero, no spaces or underscores), as JSON writes it. Anything else --
    ``"0_1"``, ``" 1 "``, ``"\u0661"``, ``1.9``, ``True`` -- is a :class:`QueryError` ``bad_group_key``.

    >>> group_key("stored", "12"), group_key("stored", 3)
    (12, 3)
    """
    if isinstance(key, np.integer) and not isinstance(key, np.bool_):
        key = int(key)
    if type(key) is int:
        if 0 <= key <= INT64_MAX:
            return key
    elif isinstance(key, str) and 0 < len(key) <= 19 and key.isascii() and key.isdigit() and (
        key == "0" or key[0] != "0"
    ):
        return int(key)
    raise QueryError.single(
        "bad_group_key",
        f"{name} key {show(key, 60)} ({type(key).__name__}) is not a group index; write the index as an integer "
        'or its plain decimal string ("0", "1", ...)',
        name,
        key=show(key, 60),
    )


def prompt_tokens(num_prompt_tokens: Any, num_tokens: int) -> int:
    """``num_prompt_tokens`` checked against a request of ``num_tokens`` (``None``: the whole request is
    prompt); :class:`QueryError` ``prompt_longer_than_request`` when the prompt is longer."""
    if num_prompt_tokens is None:
        return num_tokens
    prompt = nonneg("num_prompt_tokens", num_prompt_tokens)
    if prompt > num_tokens:
        raise QueryError.single(
            "prompt_longer_than_request",
            f"num_prompt_tokens={prompt} exceeds num_tokens={num_tokens}; a request holds its whole prompt",
            "num_prompt_tokens",
            num_prompt_tokens=prompt,
            num_tokens=num_tokens,
        )
    return prompt


def scenario(value: Any, allowed: Collection[str]) -> Mapping[Any, Any]:
    """A JSON scenario checked for its shape: an object (``bad_scenario``) whose keys are all in
    ``allowed`` (``unknown_key``; keys of any type, quoted with bounded length) and which has
    ``num_tokens`` (``missing_field``). Shared by ``plan_hit``, ``prefix_hit`` and ``plan_request``."""
    if not isinstance(value, Mapping):
        raise QueryError.single("bad_scenario", f"a scenario is an object, got {type(value).__name__}", "")
    unknown = [k for k in value if not (isinstance(k, str) and k in allowed)]  # keys of any type, in order
    if unknown:
        raise QueryError.single(
            "unknown_key", f"unknown scenario key(s) {show(unknown)}; allowed: {sorted(allowed)}", show(unknown[0], 60)
        )
    if "num_tokens" not in value:
        raise QueryError.single("missing_field", "a scenario needs num_tokens", "num_tokens")
    return value
