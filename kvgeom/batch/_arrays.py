"""The array helpers every batch twin shares: input checks, the int64 guard, and integer arithmetic on arrays.

The input rules of :mod:`kvgeom.batch` live here, once (all raise :class:`kvgeom.QueryError`):

* token counts, positions, chunks and block ids are integer arrays of the stated shape (any numpy
  integer dtype or a list of Python ints); bool and float arrays are refused, except that an empty
  input of any dtype is fine (:func:`ints`);
* negative values are refused (``negative``), and so are values or results past what int64 holds
  (``int64_overflow``): the checks are max reductions made before computing (:func:`fits`), so no
  result ever wraps around;
* per-request arrays of one call have the same length (``length_mismatch``, :func:`same_length`);
* a CSR result holds at most :data:`MAX_RESULT` elements (``result_too_large``, :func:`check_total`).

The arithmetic helpers (:func:`div`, :func:`cdiv`, :func:`rdown`) are the array forms of
:mod:`kvgeom._math` for non-negative operands. A private module: its names are plain because the
twin modules of :mod:`kvgeom.batch` import them; users reach the twins through :mod:`kvgeom.batch`.
"""

from __future__ import annotations

from collections.abc import Sized
from typing import Any

import numpy as np
import numpy.typing as npt

from kvgeom._check import nonneg
from kvgeom._format import show
from kvgeom._math import INT64_MAX
from kvgeom.errors import QueryError
from kvgeom.geometry import Geometry, OffloadGeometry
from kvgeom.keys import offload_group

__all__ = [
    "MAX_RESULT",
    "Bools",
    "I64",
    "bools",
    "cdiv",
    "check_range",
    "check_total",
    "div",
    "fits",
    "int64_view",
    "int_or_array",
    "ints",
    "largest",
    "lookup_args",
    "offload_of",
    "overflow",
    "positive",
    "pow2_shift",
    "prompt_tokens",
    "rdown",
    "same_length",
]

I64 = npt.NDArray[np.int64]
Bools = npt.NDArray[np.bool_]


def overflow(name: str, value: int, what: str = "") -> QueryError:
    """The ``int64_overflow`` error for ``name`` reaching ``value`` (to raise; ``what`` qualifies the value)."""
    return QueryError.single(  # type: ignore[return-value]
        "int64_overflow",
        f"{name} reaches {show(value)}{what}, past what int64 holds ({INT64_MAX}); no cache has that many tokens or "
        "blocks: split the request or use smaller numbers",
        name,
        **{name: value},
    )


def _length(x: Sized) -> int:
    """``len(x)``, or ``MAX_RESULT + 1`` (more than any argument may hold) where ``len`` overflows (a range of
    2^64 entries)."""
    try:
        return len(x)
    except OverflowError:
        return MAX_RESULT + 1


def ints(name: str, x: Any, ndim: int = 1, *, allow_minus_one: bool = False, signed: bool = False) -> I64:
    """``x`` as a non-negative int64 array of ``ndim`` dimensions (no copy when it already is one).

    ``allow_minus_one`` accepts ``-1`` as padding; ``signed`` skips the sign check (the caller checks
    the elements it uses, as the scalar does for a block-table row).
    """
    if isinstance(x, np.ndarray) and x.dtype == np.int64 and x.ndim == ndim:
        a = x
    else:
        if not isinstance(x, np.ndarray) and isinstance(x, Sized):  # a range(10**12) is refused, not allocated
            check_total(name, _length(x))
        try:
            a = np.asarray(x)
        except (ValueError, TypeError) as e:
            raise QueryError.single(
                "bad_shape", f"{name} is not a rectangular array ({show(str(e))}); pass a {ndim}-D integer array", name
            ) from None
        if a.ndim != ndim:
            raise QueryError.single(
                "bad_shape",
                f"{name} has shape {a.shape}, expected a {ndim}-D integer array",
                name,
                shape=a.shape,
            )
        if a.size == 0:
            return np.zeros(a.shape, dtype=np.int64)
        if a.dtype == object:
            flat = a.ravel().tolist()
            if not all(type(v) is int or (isinstance(v, np.integer) and not isinstance(v, np.bool_)) for v in flat):
                raise QueryError.single(
                    "not_an_integer_array", f"{name} must hold integers, got {a.dtype} elements", name
                )
            lo, hi = int(min(flat)), int(max(flat))
            if signed and lo < -INT64_MAX - 1:  # signed skips the sign check, not the int64 range (issue 19 fuzz)
                raise QueryError.single(
                    "int64_overflow",
                    f"{name} holds {show(lo)}, below what int64 holds ({-INT64_MAX - 1}); block ids and indices are "
                    "small integers: pass the entries your engine's table holds",
                    name,
                    **{name: lo},
                )
            check_range(name, max(lo, 0) if signed else lo, hi, allow_minus_one)
            return a.astype(np.int64)
        if a.dtype.kind not in "iu":
            raise QueryError.single(
                "not_an_integer_array",
                f"{name} must be an integer array, got dtype {a.dtype}; token counts and indices are integers",
                name,
                dtype=str(a.dtype),
            )
        if a.dtype.kind == "u" and a.dtype.itemsize == 8:
            hi = int(a.max())
            if hi > INT64_MAX:
                raise overflow(name, hi)
        a = a.astype(np.int64, copy=False)
    if a.size and not signed:
        lo = int(a.min())
        if lo < (-1 if allow_minus_one else 0):
            check_range(name, lo, 0, allow_minus_one)
    return a


def check_range(name: str, lo: int, hi: int, allow_minus_one: bool) -> None:
    """Raise ``negative`` when ``lo`` is below 0 (below -1 with ``allow_minus_one``), ``int64_overflow`` when ``hi``
    is past int64."""
    if lo < (-1 if allow_minus_one else 0):
        extra = " (-1 marks padding)" if allow_minus_one else ""
        raise QueryError.single(
            "negative",
            f"{name} holds {show(lo)}, which is negative; token counts and indices are >= 0{extra}",
            name,
            **{name: lo},
        )
    if hi > INT64_MAX:
        raise overflow(name, hi)


def int_or_array(name: str, x: Any, size: int) -> I64:
    """A scalar (broadcast to ``size``) or a 1-D array of length ``size``. A scalar that is no integer (a float,
    a bool, a string) is refused as the scalar API refuses it (``not_an_integer``), not as an array shape."""
    if isinstance(x, int | np.integer) and not isinstance(x, bool | np.bool_):
        v = int(x)
        check_range(name, v, v, False)
        return np.full(size, v, dtype=np.int64)
    if isinstance(x, float | np.floating | bool | np.bool_ | str | bytes):
        nonneg(name, x)  # raises: the scalar's refusal
    a = ints(name, x)
    same_length(name, a, size)
    return a


def same_length(name: str, a: np.ndarray, size: int) -> None:
    """Raise ``length_mismatch`` unless ``a`` has ``size`` entries (one per request)."""
    _check_count(name, a.shape[0], size)


def _check_count(name: str, count: int, size: int) -> None:
    if count != size:
        raise QueryError.single(
            "length_mismatch",
            f"{name} has {count} entries but num_tokens has {size}; pass one value per request",
            name,
            length=int(count),
            expected=size,
        )


def lookup_args(
    n: I64, num_prompt_tokens: Any, local_computed_tokens: Any, max_num_new_tokens: Any, max_load_tokens: Any
) -> tuple[I64, I64, I64 | None, I64 | None]:
    """The per-request arguments of a batch lookup, checked against ``num_tokens`` ``n``: prompt, local
    prefix (``local_past_request`` when past the request), and the optional new-token and load caps."""
    size = n.shape[0]
    prompt = prompt_tokens(num_prompt_tokens, n)
    if local_computed_tokens is None:
        local = np.zeros(size, dtype=np.int64)
    else:
        local = int_or_array("local_computed_tokens", local_computed_tokens, size)
        if (local > n).any():
            i = int(np.argmax(local > n))
            raise QueryError.single(
                "local_past_request",
                f"local_computed_tokens={int(local[i])} exceeds num_tokens={int(n[i])} (request {i})",
                "local_computed_tokens",
                local_computed_tokens=int(local[i]),
                num_tokens=int(n[i]),
            )
    mnn = None if max_num_new_tokens is None else int_or_array("max_num_new_tokens", max_num_new_tokens, size)
    mlt = None if max_load_tokens is None else int_or_array("max_load_tokens", max_load_tokens, size)
    return prompt, local, mnn, mlt


def prompt_tokens(num_prompt_tokens: Any, n: I64) -> I64:
    """Per request, ``num_prompt_tokens`` checked against ``num_tokens`` (``None``: all prompt); the batch
    twin of :func:`kvgeom._check.prompt_tokens` (``prompt_longer_than_request`` names the first request)."""
    if num_prompt_tokens is None:
        return n
    prompt = ints("num_prompt_tokens", num_prompt_tokens)
    same_length("num_prompt_tokens", prompt, n.shape[0])
    if (prompt > n).any():
        i = int(np.argmax(prompt > n))
        raise QueryError.single(
            "prompt_longer_than_request",
            f"num_prompt_tokens={int(prompt[i])} exceeds num_tokens={int(n[i])} (request {i}); a request "
            "holds its whole prompt",
            "num_prompt_tokens",
            num_prompt_tokens=int(prompt[i]),
            num_tokens=int(n[i]),
        )
    return prompt


def fits(name: str, max_result: int) -> None:
    """Raise unless a result bounded by ``max_result`` (a Python int) fits int64."""
    if max_result > INT64_MAX:
        raise overflow(name, max_result, " in the result")


MAX_RESULT = 1 << 26
"""Most elements a CSR result may hold (2**26 int64 = 512 MiB per array, seconds to build): beyond it, refuse
up front."""


def check_total(what: str, total: int) -> None:
    """Refuse a result too large to build, before numpy tries to allocate it."""
    if total > MAX_RESULT:
        raise QueryError.single(
            "result_too_large",
            f"{what} would hold {total} entries (more than {MAX_RESULT}); ask for fewer requests or shorter "
            "prefixes at a time",
            what,
            total=total,
        )


def largest(a: I64) -> int:
    """The largest element of ``a`` as a Python int (0 for an empty array)."""
    return int(a.max()) if a.size else 0


def offload_of(geom: Geometry) -> OffloadGeometry:
    """``geom.offload``, or the ``no_offload`` :class:`kvgeom.QueryError` of the scalar rules when there is none."""
    if geom.offload is None:
        offload_group(geom, 0)  # raises the no_offload QueryError
    assert geom.offload is not None
    return geom.offload


def pow2_shift(d: int) -> int | None:
    """``log2(d)`` when ``d`` is a power of two (a division by ``d`` is then a shift), else None."""
    return d.bit_length() - 1 if d & (d - 1) == 0 else None


def div(a: I64, d: int) -> I64:
    """``a // d`` for non-negative ``a`` (a shift when ``d`` is a power of two)."""
    s = pow2_shift(d)
    if s == 0:
        return a
    out: I64 = np.right_shift(a, s) if s is not None else np.floor_divide(a, d)
    return out


def cdiv(a: I64, d: int) -> I64:
    """Ceiling division for non-negative ``a`` (no overflow: ``a // d + (a % d != 0)``)."""
    q, r = np.divmod(a, d)
    out: I64 = q + (r != 0)
    return out


def rdown(a: I64, d: int) -> I64:
    """``a`` rounded down to a multiple of ``d`` (non-negative ``a``)."""
    return a - a % d


def int64_view(name: str, x: Any) -> I64:
    """``x`` as a 1-D int64 array without a value check (the caller checks with one max reduction)."""
    if isinstance(x, np.ndarray) and x.dtype == np.int64 and x.ndim == 1:
        return x
    return ints(name, x)


def positive(name: str, x: Any) -> I64:
    """:func:`ints`, and the ``zero`` error when an element is 0 (end tokens and boundaries are positive)."""
    a = ints(name, x)
    if a.size and int(a.min()) == 0:
        raise QueryError.single("zero", f"{name} must be positive, got 0", name, **{name: 0})
    return a


def bools(name: str, x: Any, size: int) -> Bools:
    """A bool (broadcast to ``size``) or a 1-D bool array of ``size`` entries (``bad_shape`` otherwise)."""
    if isinstance(x, bool | np.bool_):
        return np.full(size, bool(x))
    if not isinstance(x, np.ndarray | str | bytes) and isinstance(x, Sized):  # a range(10**12): refused, not built
        _check_count(name, _length(x), size)
    a = np.asarray(x)
    if a.ndim != 1 or (a.size and a.dtype != np.bool_):
        raise QueryError.single("bad_shape", f"{name} must be a bool or a 1-D bool array", name)
    same_length(name, a, size)
    return a.astype(np.bool_, copy=False)
