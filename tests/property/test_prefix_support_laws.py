"""Law of the GPU prefix-cache hit's support: whether kvgeom declines a lookup depends on the geometry
only, never on the request (vLLM 0.33's coordinator asks every group's manager even for an empty
hit, so a group it cannot look up fails every request). Scalar ``prefix_hit`` and batch
``prefix_hits`` decline the same geometries."""

from __future__ import annotations

import numpy as np
from hypothesis import example, given
from hypothesis import strategies as st

import kvgeom
from kvgeom.batch.prefix import prefix_hits
from kvgeom.prefix import prefix_hit
from kvgeom.strategies import configs

#: Found by ``kvgeom conform``: chunked local (span 47) beside full attention sharded by DCP 2
#: (span 94); vLLM's chunked-local manager asserts its block equals A even for a 0-token request.
_CHUNKED_BESIDE_WIDER_FA = {
    "groups": [
        {"kind": "chunked_local", "block_size": 47, "dcp_sharded": False, "attention_chunk_size": 731},
        {"kind": "full_attention", "block_size": 47},
    ],
    "parallel": {"dcp": 2, "tp": 2},
}


def _declined(call) -> str | None:
    try:
        call()
    except kvgeom.QueryError as e:
        return e.problems[0].code
    return None


@given(
    cfg=configs(kinds=("full_attention", "sliding_window", "chunked_local", "mamba"), max_groups=3,
                max_dcp=2, max_block_size=64, allow_pcp=False),
    n=st.integers(0, 300),
)
@example(cfg=_CHUNKED_BESIDE_WIDER_FA, n=0)
@example(cfg=_CHUNKED_BESIDE_WIDER_FA, n=1)
def test_declining_depends_on_the_geometry_only(cfg, n):
    geom = kvgeom.resolve(cfg)
    empty = _declined(lambda: prefix_hit(geom, 0, {}))
    assert _declined(lambda: prefix_hit(geom, n, {})) == empty
    cols = n // geom.hash_block_size
    held = {g.index: np.ones((1, cols), np.bool_) for g in geom.groups if g.prefix_cacheable}
    assert _declined(lambda: prefix_hits(geom, np.array([n]), held)) == empty
