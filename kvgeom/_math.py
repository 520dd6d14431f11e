"""Integer helpers shared by every module (one definition each)."""

from __future__ import annotations

#: Largest value an int64 holds; token counts and block ids past it are errors.
INT64_MAX = (1 << 63) - 1


def cdiv(a: int, b: int) -> int:
    """Ceiling division for a >= 0, b > 0."""
    return -(-a // b)


def rdown(a: int, b: int) -> int:
    """``a`` rounded down to a multiple of ``b`` (b > 0)."""
    return a - a % b


def rup(a: int, b: int) -> int:
    """``a`` rounded up to a multiple of ``b`` (b > 0)."""
    return cdiv(a, b) * b
