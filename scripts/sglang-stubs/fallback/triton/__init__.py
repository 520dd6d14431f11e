"""A stand-in triton for SGLang's CPU venv: importable, compiles nothing (see ../README.md).

SGLang's kernel modules are imported by its geometry and radix-cache code but never launched on CPU. Every
name here (and in any ``triton.*`` submodule) is a permissive placeholder; ``jit``, ``autotune`` and
``heuristics`` return the function they decorate; calling a kernel raises.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types
from typing import Any

__version__ = "0.0.0+kvgeom-stub"


class _Placeholder:
    """Any attribute, call, index or arithmetic gives another placeholder."""

    def __init__(self, name: str = "triton") -> None:
        self._name = name

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return _Placeholder(f"{self._name}.{name}")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return _Placeholder(f"{self._name}()")

    def __getitem__(self, key: Any) -> Any:
        return _Placeholder(f"{self._name}[]")

    def __mro_entries__(self, bases: tuple[Any, ...]) -> tuple[type, ...]:
        return (object,)

    def __repr__(self) -> str:
        return f"<kvgeom triton stub {self._name}>"

    __add__ = __radd__ = __mul__ = __rmul__ = __sub__ = __rsub__ = __or__ = __ror__ = __call__


class _Kernel:
    def __init__(self, fn: Any) -> None:
        self.fn = fn
        self.__name__ = getattr(fn, "__name__", "kernel")
        self.__doc__ = getattr(fn, "__doc__", None)

    def __getitem__(self, grid: Any) -> Any:
        return self

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(f"triton kernel {self.__name__} called, but triton is a stub in this venv (CPU only)")


def _decorator(*args: Any, **kwargs: Any) -> Any:
    if len(args) == 1 and callable(args[0]) and not kwargs:
        return _Kernel(args[0])
    return lambda fn: _Kernel(fn)


jit = autotune = heuristics = _decorator


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def next_power_of_2(n: int) -> int:
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


class Config:
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.args, self.kwargs = args, kwargs


def _name(owner: str, name: str) -> Any:
    """A class for a capitalised name (``isinstance`` checks need a type), a placeholder otherwise."""
    if name[:1].isupper():
        return type(name, (), {"__module__": owner, "__init__": lambda self, *a, **k: None})
    return _Placeholder(f"{owner}.{name}")


class _Module(types.ModuleType):
    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        value = _name(self.__name__, name)
        setattr(self, name, value)
        return value


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname.startswith("triton."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec: Any) -> Any:
        m = _Module(spec.name)
        m.__path__ = []
        return m

    def exec_module(self, module: Any) -> None:
        if module.__name__ == "triton.language":
            module.constexpr = _Placeholder("triton.language.constexpr")
        if module.__name__ == "triton.runtime":
            module.driver = _NoDriver()


class _NoDriver:
    """``triton.runtime.driver``: no active GPU driver, as real triton answers on a CPU-only machine."""

    @property
    def active(self) -> Any:
        raise RuntimeError("0 active drivers ([]): triton is a CPU stub")


sys.meta_path.append(_Finder())


def __getattr__(name: str) -> Any:
    if name.startswith("__"):
        raise AttributeError(name)
    return _name("triton", name)
