"""The config format: one schema for JSON, TOML and Python dicts.

Top level: ``groups`` (list of specs, see :mod:`kvgeom.specs`), ``parallel``
(:class:`kvgeom.ParallelConfig`), ``cache`` (:class:`CacheConfig`) and
``offload`` (:class:`OffloadConfig`; absent means no offloading connector) and
``speculative`` (:class:`kvgeom.SpeculativeConfig`; absent means no drafter).
Unknown keys are rejected everywhere. ``docs/config.md`` documents every key.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator

from kvgeom._format import show
from kvgeom._pydantic import FrozenModel, NonNegativeInt, PositiveInt, StrictBool, field_path
from kvgeom.errors import ConfigError, Problem
from kvgeom.parallel import ParallelConfig, check_parallel
from kvgeom.specs import KINDS, GroupSpec
from kvgeom.speculative_config import SpeculativeConfig

__all__ = [
    "DEFAULT_CONFIG",
    "DEFAULT_RETENTION_INTERVAL",
    "CacheConfig",
    "KVGeomConfig",
    "OffloadConfig",
    "load_config",
    "read_file",
]


#: vLLM 0.33's default ``prefix_cache_retention_interval``: keep only the
#: "semantic" checkpoints (vLLM 0.33 `config/cache.py`, `prefix_cache_retention_interval`).
DEFAULT_RETENTION_INTERVAL = 0


class CacheConfig(FrozenModel):
    """Prefix-cache settings (vLLM ``CacheConfig``)."""

    FIELD_PREFIX = "cache"

    prefix_caching: StrictBool = Field(default=True, description="enable_prefix_caching")
    prefix_match_unit: PositiveInt | None = Field(
        default=None, description="Hash unit H when several groups exist (default: gcd of the cacheable spans)."
    )
    retention_interval: NonNegativeInt | None = Field(
        default=DEFAULT_RETENTION_INTERVAL,
        description="prefix_cache_retention_interval in tokens: 0 keeps only reachable boundaries "
        "(vLLM 0.33's default), R > 0 one checkpoint per R tokens, null or \"dense\" no interval (every "
        "Mamba state; a sliding window keeps its blocks before each alignment boundary).",
    )
    max_model_len: PositiveInt | None = Field(default=None, description="Needed for block-table row widths.")

    @field_validator("retention_interval", mode="before")
    @classmethod
    def _dense(cls, v: Any) -> Any:
        return None if isinstance(v, str) and v == "dense" else v


class OffloadConfig(FrozenModel):
    """An offloading connector: give ``blocks_per_chunk`` (k) or ``block_size``
    (tokens per chunk), not both; ``{}`` means k = 1."""

    FIELD_PREFIX = "offload"

    blocks_per_chunk: PositiveInt | None = Field(default=None, description="k: GPU blocks per offload chunk.")
    block_size: PositiveInt | None = Field(
        default=None, description="Tokens per offload chunk; only when every offloaded group has the same span."
    )


class KVGeomConfig(FrozenModel):
    """A whole geometry: cache groups, parallelism, cache and offload settings.

    >>> cfg = KVGeomConfig.model_validate({"groups": [{"kind": "mla", "block_size": 64}]})
    >>> cfg.parallel.dcp, cfg.cache.retention_interval, cfg.offload is None
    (1, 0, True)
    """

    UNION_TAGS = KINDS  # groups are a tagged union on ``kind``

    schema_version: Literal[1] = Field(default=1, description="Config format version.")
    groups: tuple[GroupSpec, ...] = Field(min_length=1, description="KV-cache groups, in the engine's group order.")
    parallel: ParallelConfig = Field(default_factory=ParallelConfig)
    cache: CacheConfig = Field(default_factory=CacheConfig)
    offload: OffloadConfig | None = Field(default=None, description="Absent: no offloading connector.")
    speculative: SpeculativeConfig | None = Field(
        default=None, description="Absent: no drafter (speculative decoding off). See docs/speculative.md."
    )

    @field_validator("schema_version", mode="before")
    @classmethod
    def _exact_version(cls, v: Any) -> Any:
        # Literal[1] alone takes True (True == 1) and 1.0; a version is the integer 1.
        if type(v) is not int:
            raise ValueError(f"must be the integer 1, got {show(v)} ({type(v).__name__})")
        return v

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict that :func:`load_config` reads back to an equal config."""
        return self.model_dump(mode="json", exclude_none=False)

    def to_toml(self) -> str:
        """TOML text that :func:`load_config` reads back to an equal config (``None`` fields are
        omitted, a dense retention interval is written as ``"dense"``).

        >>> cfg = KVGeomConfig.model_validate({"groups": [{"kind": "mla", "block_size": 64}]})
        >>> import tomllib; KVGeomConfig.model_validate(tomllib.loads(cfg.to_toml())) == cfg
        True
        """
        from kvgeom._toml import dumps

        return dumps(self.to_dict())


#: The bundled example: full attention block 16 + Mamba (align) block 16 under
#: TP 2 / DCP 2 with offloading on -- the geometry of vLLM #49964.
DEFAULT_CONFIG: dict[str, Any] = {
    "groups": [
        {"kind": "full_attention", "block_size": 16},
        {"kind": "mamba", "block_size": 16, "mamba_cache_mode": "align"},
    ],
    "parallel": {"tp": 2, "dcp": 2},
    "offload": {},
}


#: Largest config or scenario file kvgeom reads (bytes); a real one is a few kilobytes.
MAX_FILE_BYTES = 4 << 20
#: Deepest nesting of tables/arrays a config or scenario may have (the schema needs 5).
MAX_NESTING = 32
#: Most decimal digits an integer literal in a file may have (Python's int-from-string limit is 4300; no
#: token count needs more than 19).
MAX_INT_DIGITS = 4000
_MAX_INT_BITS = int(MAX_INT_DIGITS * 3.3219)
#: Most items one array of a config or scenario may hold (issue 19: a million-element list took seconds to
#: validate, and resolving 100,000 groups more than 5 s; 10,000 groups resolve in about a second).
MAX_ITEMS = 10_000


class _Refused(Exception):
    """A file-level problem found while parsing (a duplicate key, a huge integer literal)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _Refused(
                "duplicate_key",
                f"key {show(key, 60)} appears twice in one object; JSON readers disagree on which one wins, "
                "so kvgeom refuses the file: keep one",
            )
        out[key] = value
    return out


def _parse_int(text: str) -> int:
    digits = len(text.lstrip("-"))
    if digits > MAX_INT_DIGITS:
        raise _Refused(
            "integer_too_large",
            f"holds an integer literal of {digits} digits (kvgeom reads at most {MAX_INT_DIGITS}); token counts "
            "and sizes fit in 19 digits",
        )
    return int(text)


def check_nesting(data: Any, limit: int = MAX_NESTING, max_items: int | None = None) -> None:
    """Raise :class:`ConfigError` ``nested_too_deep`` when ``data`` nests tables/arrays deeper than ``limit``,
    ``integer_too_large`` when it holds an integer of more than :data:`MAX_INT_DIGITS` digits (the
    validator would try to print it, past Python's int-to-str limit), or ``too_many_items`` when an array
    holds more than ``max_items`` items (a config: :data:`MAX_ITEMS`; validating a million would take seconds;
    None: no bound, for scenario files, whose ``stored`` lists grow with the prompt).

    Iterative (a deep input cannot exhaust the stack) and linear in the input's size; a container reached
    twice (a shared or cyclic reference) is walked once.

    >>> check_nesting({"groups": [{"kind": "mla"}]}) is None
    True
    """
    stack: list[tuple[Any, int, tuple[Any, ...]]] = [(data, 0, ())]
    seen: set[int] = set()
    while stack:
        item, depth, path = stack.pop()
        if type(item) is int:
            if item.bit_length() > _MAX_INT_BITS:
                raise ConfigError.single(
                    "integer_too_large",
                    f"holds an integer of about {int(item.bit_length() * 0.30103) + 1} digits (kvgeom reads at most "
                    f"{MAX_INT_DIGITS}); token counts and sizes fit in 19 digits",
                    field_path(path, tags=KINDS),
                )
            continue
        if isinstance(item, Mapping):
            children: Any = item.items()
        elif isinstance(item, list | tuple):
            if max_items is not None and len(item) > max_items:
                raise ConfigError.single(
                    "too_many_items",
                    f"holds an array of {len(item)} items; a config holds at most {max_items} (a real model has a "
                    "few groups, at most a few hundred)",
                    field_path(path, tags=KINDS),
                    items=len(item),
                    limit=max_items,
                )
            children = enumerate(item)
        else:
            continue
        if id(item) in seen:
            continue
        seen.add(id(item))
        if depth >= limit:
            raise ConfigError.single(
                "nested_too_deep",
                f"the input nests tables/arrays more than {limit} levels deep; a kvgeom config needs at most 5",
                field_path(path[:4], tags=KINDS),
                limit=limit,
            )
        for key, child in children:  # push only what needs a look: ints and containers
            if type(child) is int:
                if child.bit_length() > _MAX_INT_BITS:
                    stack.append((child, depth + 1, (*path, key)))
            elif isinstance(child, Mapping | list | tuple):
                stack.append((child, depth + 1, (*path, key)))


def read_file(path: Path) -> Any:
    """Parse a ``.json``/``.toml`` file (at most :data:`MAX_FILE_BYTES`, no duplicate keys, nesting at most
    :data:`MAX_NESTING`); every failure is a :class:`ConfigError`. The one reader of config, layered-config
    and scenario files (:func:`load_config`, :func:`kvgeom.resolve_block_sizes`, ``kvgeom hit``).

    >>> import pathlib, tempfile
    >>> with tempfile.TemporaryDirectory() as d:
    ...     path = pathlib.Path(d, "scenario.json")
    ...     _ = path.write_text('{"num_tokens": 64}')
    ...     read_file(path)
    {'num_tokens': 64}
    """
    suffix = path.suffix.lower()
    name = show(str(path))
    if suffix not in {".json", ".toml"}:
        raise ConfigError.single(
            "unknown_file_type",
            f"cannot tell the format of {name} (suffix {show(suffix, 40)}); name the file *.json or *.toml",
            "",
            path=str(path),
        )
    try:
        with path.open("rb") as f:
            raw = f.read(MAX_FILE_BYTES + 1)
        if len(raw) > MAX_FILE_BYTES:
            raise ConfigError.single(
                "file_too_large",
                f"{name} is larger than {MAX_FILE_BYTES} bytes, the most kvgeom reads; a config is a few kilobytes",
                "",
                path=str(path),
                limit=MAX_FILE_BYTES,
            )
        text = raw.decode("utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError.single(
            "unreadable_file", f"cannot read {name}: {e.__class__.__name__}: {show(str(e))}", "", path=str(path)
        ) from None
    fmt = "JSON" if suffix == ".json" else "TOML"
    try:
        if suffix == ".json":
            data = json.loads(text, object_pairs_hook=_unique_keys, parse_int=_parse_int)
        else:
            import tomllib  # only when a TOML file is read: keeps `import kvgeom` light

            try:
                data = tomllib.loads(text)  # refuses duplicate keys and tables itself
            except tomllib.TOMLDecodeError as e:
                # tomllib names the place only in its message ("... (at line 2, column 5)"; lineno from 3.14)
                at = re.search(r"\(at line (\d+), column (\d+)\)", str(e))
                where = {"line": int(at[1]), "column": int(at[2])} if at else {}
                raise ConfigError.single(
                    "unparsable_file", f"{name} is not valid TOML: {show(str(e))}", "", path=str(path), **where
                ) from None
            except ValueError:  # tomllib's int() of a literal past Python's int-from-string digit limit
                raise _Refused(
                    "integer_too_large",
                    "holds an integer literal past Python's 4300-digit limit; token counts and sizes fit in 19 digits",
                ) from None
    except json.JSONDecodeError as e:
        raise ConfigError.single(
            "unparsable_file",
            f"{name} is not valid JSON: {e.msg} at line {e.lineno} column {e.colno}",
            "",
            path=str(path),
            line=e.lineno,
            column=e.colno,
        ) from None
    except _Refused as e:
        sep = ":" if e.code == "duplicate_key" else ""
        raise ConfigError.single(e.code, f"{name}{sep} {e.message}", "", path=str(path)) from None
    except RecursionError:
        raise ConfigError.single(
            "nested_too_deep",
            f"{name} nests arrays/tables too deeply for the {fmt} reader; a kvgeom config needs at most 5 levels",
            "",
            path=str(path),
        ) from None
    check_nesting(data)
    return data


def load_config(source: KVGeomConfig | Mapping[str, Any] | str | os.PathLike[str]) -> KVGeomConfig:
    """Read a config from a dict, a ``.json``/``.toml`` path or a config model.

    Every failure is a :class:`kvgeom.ConfigError` naming the field, listing every schema problem of every
    section at once; when the schema refuses the config and its ``parallel`` section is itself well-formed,
    the error also lists that section's rule problems (``tp_not_divisible_by_dcp``, ...: they depend on no
    other section), so a problem in ``groups`` does not hide one in ``parallel``. Files are read up to
    :data:`MAX_FILE_BYTES`; duplicate keys, integer literals past :data:`MAX_INT_DIGITS` digits and
    nesting past :data:`MAX_NESTING` levels are refused (codes ``file_too_large``, ``duplicate_key``,
    ``integer_too_large``, ``nested_too_deep``).

    >>> load_config({"groups": [{"kind": "full_attention", "block_size": 16}]}).groups[0].kind
    'full_attention'
    """
    if isinstance(source, KVGeomConfig):
        return source
    data: Any
    if isinstance(source, str | os.PathLike):
        data = read_file(Path(source))
    else:
        data = source
    if not isinstance(data, Mapping):
        raise ConfigError.single(
            "not_a_table",
            f"a config is a table/object with a 'groups' key, got {type(data).__name__}",
            "",
        )
    check_nesting(data, max_items=MAX_ITEMS)
    try:
        return KVGeomConfig.model_validate(dict(data))
    except ConfigError as e:
        extra = _parallel_problems(data, e.problems)
        if not extra:
            raise
        raise type(e)([*e.problems, *extra]) from None
    except RecursionError:  # a cyclic or pathological Python object pydantic cannot walk
        raise ConfigError.single(
            "nested_too_deep", "the config refers to itself or nests too deeply to validate", ""
        ) from None


def _parallel_problems(data: Mapping[str, Any], problems: tuple[Problem, ...]) -> list[Problem]:
    """The rule problems of ``data``'s parallel section (:func:`kvgeom.parallel.check_parallel`), or none when
    the section is absent or one of ``problems`` (the schema's) is in it or about the whole config."""
    if "parallel" not in data or any(p.field == "" or re.match(r"parallel\b", p.field) for p in problems):
        return []
    try:
        return check_parallel(ParallelConfig.model_validate(data["parallel"]))
    except (ValueError, TypeError):  # ConfigError is a ValueError; the schema already reported the section
        return []
