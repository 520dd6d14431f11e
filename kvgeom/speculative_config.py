"""The ``speculative`` config section: which drafter serves the model, and how vLLM treats it.

One schema for dicts, JSON and TOML (it is a field of :class:`kvgeom.KVGeomConfig`)::

    "speculative": {"method": "mtp", "num_speculative_tokens": 2,
                    "eagle_block_drop": true, "lookahead_hashes": true, "mtp_modules": 1}

plus ``"drafter": true`` on each group that holds drafter layers. The effective settings
(what vLLM 0.33 actually does with them) are decided by :func:`kvgeom.resolve` and reported as
:class:`kvgeom.SpeculativeGeometry`; ``docs/speculative.md`` explains each one.

Invariants:

* ``num_speculative_tokens`` is required and > 0 (vLLM 0.33
  ``config/speculative.py::SpeculativeConfig._verify_args`` raises otherwise);
* ``mtp_modules`` (the draft checkpoint's ``num_nextn_predict_layers``) is >= 1;
* the model round-trips: ``SpeculativeConfig.model_validate(s.model_dump()) == s``.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, model_validator

from kvgeom._pydantic import FrozenModel

__all__ = ["SPECULATIVE_METHODS", "SpeculativeConfig", "SpeculativeMethod"]

SpeculativeMethod = Literal["eagle", "eagle3", "mtp", "draft_model", "ngram", "dflash"]

#: The method names the ``speculative`` section accepts.
SPECULATIVE_METHODS: tuple[str, ...] = ("eagle", "eagle3", "mtp", "draft_model", "ngram", "dflash")


class SpeculativeConfig(FrozenModel):
    """A drafter (vLLM ``SpeculativeConfig``): method, K and the switches that change the geometry.

    >>> s = SpeculativeConfig.model_validate({"method": "mtp", "num_speculative_tokens": 2})
    >>> s.eagle_block_drop, s.lookahead_hashes, s.mtp_modules
    (True, True, 1)
    """

    FIELD_PREFIX = "speculative"

    method: SpeculativeMethod = Field(
        description="Speculative method: eagle, eagle3, mtp (block drop family), dflash (drafts from hidden "
        "states, no drop), draft_model, ngram."
    )
    num_speculative_tokens: Annotated[int, Field(strict=True)] = Field(
        description="K: draft tokens proposed per step (> 0)."
    )
    eagle_block_drop: bool = Field(
        default=True,
        description="false = vLLM's disable_eagle_block_drop: no eagle group, no GPU drop, no Mamba checkpoint "
        "shift, no offload pop.",
    )
    lookahead_hashes: bool = Field(
        default=True,
        description="false = vLLM's disable_lookahead_block_hashes: the GPU prefix cache drops a unit instead "
        "of proving the boundary token with lookahead hashes.",
    )
    mtp_modules: Annotated[int, Field(strict=True, gt=0)] = Field(
        default=1,
        description="MTP modules of the draft checkpoint (num_nextn_predict_layers); min(mtp_modules, K) > 1 "
        "is multi-module MTP.",
    )

    @model_validator(mode="before")
    @classmethod
    def _k_given_and_positive(cls, data: Any) -> Any:
        # vLLM's own two rejections, with its reason and the fix (SpeculativeConfig._verify_args).
        if not isinstance(data, dict):
            return data
        if "num_speculative_tokens" not in data or data["num_speculative_tokens"] is None:
            raise ValueError(
                "num_speculative_tokens must be provided with a speculative method (vLLM 0.33 rejects a "
                "speculative config without it): add e.g. \"num_speculative_tokens\": 2"
            )
        k = data["num_speculative_tokens"]
        if isinstance(k, int) and not isinstance(k, bool) and k <= 0:
            raise ValueError(
                f"num_speculative_tokens={k}: vLLM 0.33 expects a number of speculative tokens greater than "
                "zero; use K >= 1 or remove the speculative section"
            )
        return data
