"""Bundled presets: geometries of real model families, one TOML file each.

Each file starts with a comment line describing the geometry, followed by
comment lines citing where its numbers come from. Presets are package data,
read with :mod:`importlib.resources`, so they work from a wheel or a zip.

>>> "seed-hybrid" in preset_names()
True
>>> load_preset("seed-hybrid").parallel.dcp
2
"""

from __future__ import annotations

import tomllib
from importlib import resources
from importlib.resources.abc import Traversable

from kvgeom._format import show
from kvgeom.config import KVGeomConfig, load_config
from kvgeom.errors import ConfigError

__all__ = ["load_preset", "preset_description", "preset_names", "preset_text"]

_SUFFIX = ".toml"


def _files() -> dict[str, Traversable]:
    root = resources.files(__name__)
    return {
        entry.name[: -len(_SUFFIX)]: entry
        for entry in root.iterdir()
        if entry.is_file() and entry.name.endswith(_SUFFIX)
    }


def preset_names() -> tuple[str, ...]:
    """The names of the bundled presets, sorted (``NAME`` in ``preset:NAME`` and ``--preset NAME``).

    >>> preset_names() == tuple(sorted(preset_names()))
    True
    """
    return tuple(sorted(_files()))


def preset_text(name: str) -> str:
    """The TOML text of preset ``name``; :class:`kvgeom.ConfigError` ``unknown_preset`` if there is none.

    >>> preset_text("seed-hybrid").startswith("# ")
    True
    """
    files = _files()
    if not isinstance(name, str) or name not in files:
        raise ConfigError.single(
            "unknown_preset",
            f"no preset named {show(name, 60)}; the bundled presets are {', '.join(sorted(files))} (kvgeom presets)",
            "preset",
            preset=show(name, 60),
        )
    return files[name].read_text(encoding="utf-8")


def preset_description(name: str) -> str:
    """The first comment line of preset ``name``, without the ``#`` (its one-line description).

    >>> preset_description("falcon-mamba").startswith("Falcon-Mamba")
    True
    """
    first = preset_text(name).splitlines()[0]
    return first.lstrip("#").strip()


def load_preset(name: str) -> KVGeomConfig:
    """Preset ``name`` as a validated :class:`kvgeom.KVGeomConfig`.

    Invariant (tested): every bundled preset resolves without error.

    >>> import kvgeom
    >>> [g.span for g in kvgeom.resolve(load_preset("kimi-k3-dcp8")).groups]
    [12288, 1536]
    """
    text = preset_text(name)
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:  # a broken bundled file: still a ConfigError, never a traceback
        raise ConfigError.single("unparsable_file", f"preset {name!r} is not valid TOML: {e}", "preset") from None
    return load_config(data)
