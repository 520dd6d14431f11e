"""Argument checks for queries: plain ints in [0, int64 max], raising QueryError."""

from __future__ import annotations

from typing import Any

import numpy as np

from kvgeom._math import INT64_MAX
from kvgeom.errors import QueryError


def nonneg(name: str, value: Any) -> int:
    """``value`` as an int in ``[0, INT64_MAX]``, else :class:`QueryError` naming ``name``."""
    if type(value) is not int:
        if isinstance(value, np.integer) and not isinstance(value, np.bool_):
            value = int(value)
        elif isinstance(value, bool) or not isinstance(value, int):
            raise QueryError.single(
                "not_an_integer", f"{name} must be an integer, got {value!r} ({type(value).__name__})", name
            )
    if value < 0:
        raise QueryError.single("negative", f"{name}={value} is negative; token counts and indices are >= 0", name,
                                **{name: value})
    if value > INT64_MAX:
        raise QueryError.single(
            "int64_overflow",
            f"{name}={value} is past what int64 holds ({INT64_MAX}); no cache has that many tokens or blocks",
            name,
            **{name: value},
        )
    return int(value)


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
