"""Example tables for a request's admission (``kvgeom.request.plan_request``): the GPU prefix-cache hit first,
then the connector's hit asked from it rounded down to L, combined as vLLM 0.33's Scheduler combines them
(the connector's load runs only when it reaches past the local hit; ``kvgeom.prefix.scheduler_keeps_load``).

The geometry is the seed with dense retention: FA 16 + Mamba 16 under DCP 2, so L = 32, H = A = 16, attention
chunks of 32 and Mamba chunks of 16.
"""

from __future__ import annotations

import pytest

import kvgeom
from kvgeom.request import plan_request

_DENSE = {**kvgeom.DEFAULT_CONFIG, "cache": {"retention_interval": None}}  # L = 32, H = A = 16
ALL = {"0": [32, 64, 96], "1": [16, 32, 48, 64, 80, 96]}  # the tier holds a whole 100-token prompt


@pytest.mark.parametrize(
    ("resident", "stored", "local", "external", "mamba_keys"),
    [
        # GPU hit 48 (off L); from 32 the tier reaches 96: local 32 + load 64
        ({"0": [32, 64, 96], "1": [48]}, {"0": [32, 64, 96], "1": [96]}, 32, 64, [96]),
        # GPU hit 48; the tier's Mamba state is at 48 only: the load would end at 48, keep 48, load nothing
        ({"0": [32, 64, 96], "1": [48]}, {"0": [32, 64, 96], "1": [48]}, 48, 0, []),
        # GPU hit 64 (on L): the connector is asked from 64 and loads 32 more
        ({"0": [32, 64], "1": [64]}, {"0": [32, 64, 96], "1": [96]}, 64, 32, [96]),
        # nothing on the GPU: the tier serves everything it holds
        ({}, {"0": [32, 64], "1": [64]}, 0, 64, [64]),
        # the tier holds nothing past the GPU hit
        ({"0": [32, 64], "1": [64]}, {"0": [32], "1": [32]}, 64, 0, []),
    ],
)
def test_plan_request(resident, stored, local, external, mamba_keys):
    g = kvgeom.resolve(_DENSE)
    p = plan_request(g, {"num_tokens": 100, "resident": resident, "stored": stored})
    assert (p.local_hit_tokens, p.external_hit_tokens) == (local, external)
    assert list(p.groups[1].load_keys) == mamba_keys
    assert g.plan_request({"num_tokens": 100, "resident": resident, "stored": stored}) == p.to_dict()


def test_plan_request_without_offload():
    g = kvgeom.resolve({"groups": [{"kind": "full_attention", "block_size": 16}]})
    assert g.plan_request({"num_tokens": 50, "resident": {"0": [16, 32, 48]}}) == {
        "local_hit_tokens": 48, "external_hit_tokens": 0, "groups": []
    }
    with pytest.raises(kvgeom.QueryError) as e:
        g.plan_request({"num_tokens": 50, "stored": {"0": [16]}})
    assert e.value.problems[0].code == "no_offload"


@pytest.mark.parametrize(
    ("scenario", "gpu", "local", "external", "loads"),
    [
        # GPU hit 16 (off L): the connector is asked from 0 and reaches 64 > 16, so the load runs: local 0
        ({"num_tokens": 100, "resident": {"0": [32], "1": [16]}, "stored": {"0": [32, 64], "1": [64]}},
         16, 0, 64, [[32, 64], [64]]),
        # GPU hit 32 (on L): the connector's 32 more stand; each group loads only past 32
        ({"num_tokens": 100, "resident": {"0": [32], "1": [32]}, "stored": {"0": [32, 64], "1": [64]}},
         32, 32, 32, [[64], [64]]),
        # everything resident: the GPU hit rdown(99, 16) = 96 is on L; nothing left for the connector
        ({"num_tokens": 100, "resident": ALL, "stored": ALL}, 96, 96, 0, [[], []]),
        # nothing resident, max_load_tokens 40: 40 down to the chunk grids (32 and 16) = 32
        ({"num_tokens": 100, "stored": ALL, "max_load_tokens": 40}, 0, 0, 32, [[32], [32]]),
        # max_num_new_tokens 50: 49 down to the Mamba chunk = 48; attention loads cdiv(48, 32) = 2 chunks
        ({"num_tokens": 100, "stored": ALL, "max_num_new_tokens": 50}, 0, 0, 48, [[32, 64], [48]]),
        # a 97-token request: the last token is recomputed, rdown(96, 16) = 96 is served
        ({"num_tokens": 97, "stored": ALL}, 0, 0, 96, [[32, 64, 96], [96]]),
        # a resend of 120 tokens with a 100-token prompt: the tier holds up to 96, so 96
        ({"num_tokens": 120, "num_prompt_tokens": 100, "stored": ALL}, 0, 0, 96, [[32, 64, 96], [96]]),
    ],
)
def test_plan_request_gpu_hit_then_connector_hit(scenario, gpu, local, external, loads):
    p = plan_request(kvgeom.resolve(_DENSE), scenario)
    assert p.local.hit_tokens == gpu
    assert (p.local_hit_tokens, p.external_hit_tokens) == (local, external)
    assert [list(g.load_keys) for g in p.groups] == loads
