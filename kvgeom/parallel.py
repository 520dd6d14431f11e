"""How ranks split a KV cache: DCP, PCP, interleave, TP and PP.

Only decode context parallelism shards KV along the sequence in vLLM 0.33:
a DCP-sharded group's block id stands for ``block_size * dcp`` positions. PCP
splits prefill compute and shards nothing (vLLM #46570); ``pcp_shards_kv=True``
reproduces the design before that PR, where KV was dealt over ``dcp * pcp``
ranks.
"""

from __future__ import annotations

from pydantic import Field

from kvgeom._pydantic import FrozenModel, PositiveInt, StrictBool
from kvgeom.errors import Problem

__all__ = ["ParallelConfig", "check_parallel"]



class ParallelConfig(FrozenModel):
    """Parallel sizes, with vLLM's defaults (all 1, ``pcp_shards_kv`` false).

    >>> ParallelConfig(tp=2, dcp=2).kv_shards
    2
    >>> ParallelConfig(tp=4, dcp=2, pcp=2, pcp_shards_kv=True).kv_shards
    4
    """

    FIELD_PREFIX = "parallel"

    dcp: PositiveInt = Field(default=1, description="decode_context_parallel_size")
    pcp: PositiveInt = Field(default=1, description="prefill_context_parallel_size")
    cp_interleave: PositiveInt = Field(
        default=1,
        description="cp_kv_cache_interleave_size: consecutive positions a DCP rank takes before the next rank",
    )
    tp: PositiveInt = Field(default=1, description="tensor_parallel_size")
    pp: PositiveInt = Field(default=1, description="pipeline_parallel_size")
    pcp_shards_kv: StrictBool = Field(
        default=False,
        description="True reproduces the design before vLLM #46570, where PCP also sharded KV "
        "(span = block_size*dcp*pcp).",
    )

    @property
    def kv_shards(self) -> int:
        """How many ranks a sharded group's positions are dealt across (``dcp``, or
        ``dcp*pcp`` with ``pcp_shards_kv``)."""
        return self.dcp * self.pcp if self.pcp_shards_kv else self.dcp


def check_parallel(p: ParallelConfig) -> list[Problem]:
    """The combinations vLLM's ``ParallelConfig`` rejects (vLLM 0.33 `config/parallel.py`).

    With ``pcp == 1``: ``tp % dcp == 0``. With ``pcp > 1``: ``dcp`` is 1, ``pcp``
    or ``tp*pcp``. The interleave is checked per group in :func:`kvgeom.resolve`,
    because it must fit every sharded group's per-rank block.
    """
    problems: list[Problem] = []
    if p.pcp == 1 and p.tp % p.dcp != 0:
        problems.append(
            Problem(
                "tp_not_divisible_by_dcp",
                f"tp={p.tp} is not divisible by dcp={p.dcp}; DCP ranks are carved out of the TP group, "
                f"so choose dcp among the divisors of tp ({_divisors(p.tp)})",
                "parallel.dcp",
                {"tp": p.tp, "dcp": p.dcp},
            )
        )
    if p.pcp > 1 and p.dcp not in {1, p.pcp, p.tp * p.pcp}:
        problems.append(
            Problem(
                "pcp_dcp_combination",
                f"dcp={p.dcp} with pcp={p.pcp} and tp={p.tp}: when PCP is enabled DCP must be 1, span the "
                f"PCP axis (dcp={p.pcp}) or span the whole TP x PCP axis (dcp={p.tp * p.pcp})",
                "parallel.dcp",
                {"tp": p.tp, "dcp": p.dcp, "pcp": p.pcp},
            )
        )
    return problems


_DIVISOR_SEARCH = 1 << 16


def _divisors(n: int, shown: int = 12) -> str:
    """The divisors of ``n`` for a message: at most ``shown`` of them, found in bounded time (trial division
    up to ``min(sqrt(n), 65536)``; a ``tp`` near 2**63 must not loop 2**63 times).

    >>> _divisors(12), _divisors(2**62)
    ('[1, 2, 3, 4, 6, 12]', '[1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, ..., 4611686018427387904]')
    """
    small: list[int] = []
    large: list[int] = []
    d = 1
    while d * d <= n and d <= _DIVISOR_SEARCH:
        if n % d == 0:
            small.append(d)
            if d * d != n:
                large.append(n // d)
        d += 1
    found = small + large[::-1]
    complete = d * d > n
    if complete and len(found) <= shown:
        return "[" + ", ".join(map(str, found)) + "]"
    head = small[: shown - 1]
    return "[" + ", ".join(map(str, head)) + f", ..., {n}]"
