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
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, field_validator

from kvgeom._pydantic import FrozenModel
from kvgeom.errors import ConfigError
from kvgeom.parallel import ParallelConfig
from kvgeom.specs import GroupSpec
from kvgeom.speculative_config import SpeculativeConfig

__all__ = [
    "DEFAULT_CONFIG",
    "DEFAULT_RETENTION_INTERVAL",
    "CacheConfig",
    "KVGeomConfig",
    "OffloadConfig",
    "load_config",
]

PositiveInt = Annotated[int, Field(strict=True, gt=0)]

#: vLLM 0.33's default ``prefix_cache_retention_interval``: keep only the
#: "semantic" checkpoints (reference §3.2, §8 item 3).
DEFAULT_RETENTION_INTERVAL = 0


class CacheConfig(FrozenModel):
    """Prefix-cache settings (vLLM ``CacheConfig``)."""

    FIELD_PREFIX = "cache"

    prefix_caching: bool = Field(default=True, description="enable_prefix_caching")
    prefix_match_unit: PositiveInt | None = Field(
        default=None, description="Hash unit H when several groups exist (default: gcd of the cacheable spans)."
    )
    retention_interval: Annotated[int, Field(strict=True, ge=0)] | None = Field(
        default=DEFAULT_RETENTION_INTERVAL,
        description="prefix_cache_retention_interval in tokens: 0 keeps only reachable boundaries "
        "(vLLM 0.33's default), R > 0 one checkpoint per R tokens, null or \"dense\" keeps every block.",
    )
    max_model_len: PositiveInt | None = Field(default=None, description="Needed for block-table row widths.")

    @field_validator("retention_interval", mode="before")
    @classmethod
    def _dense(cls, v: Any) -> Any:
        return None if v == "dense" else v


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

    schema_version: Literal[1] = Field(default=1, description="Config format version.")
    groups: tuple[GroupSpec, ...] = Field(min_length=1, description="KV-cache groups, in the engine's group order.")
    parallel: ParallelConfig = Field(default_factory=ParallelConfig)
    cache: CacheConfig = Field(default_factory=CacheConfig)
    offload: OffloadConfig | None = Field(default=None, description="Absent: no offloading connector.")
    speculative: SpeculativeConfig | None = Field(
        default=None, description="Absent: no drafter (speculative decoding off). See docs/speculative.md."
    )

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


def _read_file(path: Path) -> Any:
    suffix = path.suffix.lower()
    if suffix not in {".json", ".toml"}:
        raise ConfigError.single(
            "unknown_file_type",
            f"cannot tell the format of {str(path)!r} (suffix {suffix!r}); name the file *.json or *.toml",
            "",
            path=str(path),
        )
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError.single(
            "unreadable_file", f"cannot read {str(path)!r}: {e.__class__.__name__}: {e}", "", path=str(path)
        ) from None
    try:
        if suffix == ".json":
            return json.loads(text)
        import tomllib  # only when a TOML file is read: keeps `import kvgeom` light

        return tomllib.loads(text)
    except json.JSONDecodeError as e:
        raise ConfigError.single(
            "unparsable_file",
            f"{str(path)!r} is not valid JSON: {e.msg} at line {e.lineno} column {e.colno}",
            "",
            path=str(path),
            line=e.lineno,
            column=e.colno,
        ) from None
    except ValueError as e:  # tomllib.TOMLDecodeError
        raise ConfigError.single(
            "unparsable_file", f"{str(path)!r} is not valid TOML: {e}", "", path=str(path)
        ) from None


def load_config(source: KVGeomConfig | Mapping[str, Any] | str | os.PathLike[str]) -> KVGeomConfig:
    """Read a config from a dict, a ``.json``/``.toml`` path or a config model.

    Every failure is a :class:`kvgeom.ConfigError` naming the field.

    >>> load_config({"groups": [{"kind": "full_attention", "block_size": 16}]}).groups[0].kind
    'full_attention'
    """
    if isinstance(source, KVGeomConfig):
        return source
    data: Any
    if isinstance(source, str | os.PathLike):
        data = _read_file(Path(source))
    else:
        data = source
    if not isinstance(data, Mapping):
        raise ConfigError.single(
            "not_a_table",
            f"a config is a table/object with a 'groups' key, got {type(data).__name__}",
            "",
        )
    return KVGeomConfig.model_validate(dict(data))
