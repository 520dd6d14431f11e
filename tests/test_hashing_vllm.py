"""kvgeom.hashing equals vLLM 0.33's own request block hasher, byte for byte (marked ``vllm``).

vLLM side: a real ``vllm.v1.request.Request`` hashed by ``get_request_block_hasher`` with the function
``get_hash_fn_by_name(algorithm)`` and ``NONE_HASH`` from ``init_none_hash`` under the test's
``PYTHONHASHSEED``, with real ``LoRARequest`` and ``MultiModalFeatureSpec`` objects. kvgeom side:
:func:`kvgeom.hashing.block_hashes` with the same inputs, the seed passed as a router would (None when the
engine has no ``PYTHONHASHSEED`` and the algorithm is sha256*, else the seed string). Hypothesis draws
token ids (below 256, above 256, past int32 and int64), lengths around multiples of H, every algorithm,
cache salt, LoRA, multimodal items and look-ahead hashes. Runs in the vLLM venv (``.ci/run``).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from _vllm import NEEDS_VLLM
from hypothesis import given
from hypothesis import strategies as st

import kvgeom
from kvgeom.hashing import ALGORITHMS, block_hashes, none_hash

pytestmark = NEEDS_VLLM


@pytest.fixture(scope="module")
def v() -> Iterator[Any]:
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    import types

    import vllm
    import vllm.lora.request
    import vllm.multimodal.inputs
    import vllm.utils.hashing
    import vllm.v1.core.kv_cache_utils
    import vllm.v1.request

    kcu = vllm.v1.core.kv_cache_utils
    saved = {name: getattr(kcu, name) for name in ("NONE_HASH", "_NONE_HASH_SEED") if hasattr(kcu, name)}
    yield types.SimpleNamespace(
        SamplingParams=vllm.SamplingParams, LoRARequest=vllm.lora.request.LoRARequest,
        MultiModalFeatureSpec=vllm.multimodal.inputs.MultiModalFeatureSpec,
        PlaceholderRange=vllm.multimodal.inputs.PlaceholderRange,
        get_hash_fn_by_name=vllm.utils.hashing.get_hash_fn_by_name,
        kv_cache_utils=kcu, Request=vllm.v1.request.Request,
    )
    for name, value in saved.items():  # leave vLLM's process-wide NONE_HASH as the other vLLM tests found it
        setattr(kcu, name, value)


@contextmanager
def _pythonhashseed(value: str | None):
    old = os.environ.get("PYTHONHASHSEED")
    if value is None:
        os.environ.pop("PYTHONHASHSEED", None)
    else:
        os.environ["PYTHONHASHSEED"] = value
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("PYTHONHASHSEED", None)
        else:
            os.environ["PYTHONHASHSEED"] = old


def _copy(text: str) -> str:
    # a separate str object, as the engine gets each field of a decoded request (kvgeom.hashing does the same)
    return str(text.encode("utf-8"), "utf-8")


def vllm_block_hashes(v, algorithm, env_seed, h, tokens, *, salt=None, lora=None, mm=(), lookahead=0):
    """vLLM's hashes of a new request, and the seed a router passes (None for vLLM's default)."""
    fn = v.get_hash_fn_by_name(algorithm)
    with _pythonhashseed(env_seed):
        v.kv_cache_utils.init_none_hash(fn)
    seed = v.kv_cache_utils.get_none_hash_seed()
    feats = [
        v.MultiModalFeatureSpec(data=None, modality="image", identifier=_copy(i),
                                mm_position=v.PlaceholderRange(offset=o, length=n))
        for i, o, n in mm
    ]
    lora_request = v.LoRARequest(_copy(lora[0]), 1, _copy(lora[1])) if lora else None
    request = v.Request(
        "r", list(tokens), v.SamplingParams(max_tokens=1), None, mm_features=feats or None,
        lora_request=lora_request, cache_salt=None if salt is None else _copy(salt),
        block_hasher=v.kv_cache_utils.get_request_block_hasher(h, fn, lookahead),
    )
    router_seed = None if env_seed is None and not algorithm.startswith("xxhash") else seed
    return list(request.block_hashes), router_seed


TOKEN = st.one_of(
    st.integers(0, 255), st.integers(256, 200_000), st.integers(2**31 - 2, 2**31 + 2), st.integers(0, 2**64 + 5)
)
TEXT = st.text(st.characters(codec="utf-8"), max_size=6)


@st.composite
def requests(draw):
    h = draw(st.sampled_from([1, 2, 3, 4, 16, 32]))
    lookahead = draw(st.sampled_from([0, 0, 0, 1, 2]))
    n = max(0, draw(st.integers(0, 5)) * h + lookahead + draw(st.integers(-1, 1)))
    tokens = draw(st.lists(TOKEN, min_size=n, max_size=n))
    mm, at = [], draw(st.integers(0, 8))
    for _ in range(draw(st.integers(0, 3))):
        length = draw(st.integers(1, 2 * h + 1))
        mm.append((draw(st.sampled_from(["img-a", "img-b", "aud-c"])), at, length))
        at += length + draw(st.integers(0, h))
    return {
        "algorithm": draw(st.sampled_from(ALGORITHMS)),
        "env_seed": draw(st.sampled_from([None, None, "0", "4242", "random"])),
        "h": h,
        "tokens": tokens,
        "salt": draw(st.none() | TEXT),
        "lora": draw(st.none() | st.tuples(TEXT, TEXT.filter(bool))),
        "mm": mm,
        "lookahead": lookahead,
    }


@given(requests())
def test_block_hashes_equal_vllms_request_hasher(v, req):
    expected, seed = vllm_block_hashes(v, **req)
    lora = req["lora"]
    ours = block_hashes(
        req["h"], req["tokens"], algorithm=req["algorithm"], seed=seed, cache_salt=req["salt"],
        lora_name=lora[0] if lora else None, lora_path=lora[1] if lora else None,
        mm_features=[kvgeom.hashing.MMFeature(*f) for f in req["mm"]], lookahead_tokens=req["lookahead"],
    )
    assert ours == expected


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("env_seed", [None, "0", "random"])
def test_none_hash_is_vllms(v, algorithm, env_seed):
    # NONE_HASH = hash(seed string): "vllm-none-hash" unless PYTHONHASHSEED is set (then that string, even
    # "random"); the xxhash algorithms draw a random seed per process without PYTHONHASHSEED.
    fn = v.get_hash_fn_by_name(algorithm)
    with _pythonhashseed(env_seed):
        v.kv_cache_utils.init_none_hash(fn)
    seed = v.kv_cache_utils.get_none_hash_seed()
    if env_seed is None and algorithm.startswith("sha256"):
        assert seed == kvgeom.hashing.DEFAULT_SEED
        assert none_hash(algorithm) == v.kv_cache_utils.NONE_HASH
    elif env_seed is None:
        assert seed != kvgeom.hashing.DEFAULT_SEED and len(seed) == 64  # 32 random bytes, hex
    else:
        assert seed == env_seed
    assert none_hash(algorithm, seed) == v.kv_cache_utils.NONE_HASH


def test_vllm_offers_exactly_these_algorithms(v):
    import typing

    from vllm.config import CacheConfig

    choices = typing.get_args(typing.get_type_hints(CacheConfig)["prefix_caching_hash_algo"])
    assert tuple(choices) == ALGORITHMS
    assert CacheConfig().prefix_caching_hash_algo == "sha256"


def test_under_dcp_vllm_hashes_at_the_resolved_unit(v):
    # kvgeom's default geometry: full attention 16 under DCP 2 + Mamba 16. vLLM resolves H = 16 (the gcd of
    # the spans 32 and 16), and one full attention group under DCP 2 hashes at 16 * 2 = 32, not at the per-rank 16.
    from vllm.v1.core.kv_cache_utils import resolve_kv_cache_block_sizes

    from kvgeom.conformance import vllm_objects as vo

    one_group = {"groups": [{"kind": "full_attention", "block_size": 16}], "parallel": {"tp": 2, "dcp": 2}}
    for config, h in [(kvgeom.DEFAULT_CONFIG, 16), (one_group, 32)]:
        geom = kvgeom.resolve(config)
        _, vllm_h = resolve_kv_cache_block_sizes(vo.build_kv_cache_config(geom), vo.build_vllm_config(geom))
        assert geom.hash_block_size == vllm_h == h
        tokens = list(range(1000, 1000 + 4 * h + 3))
        expected, _ = vllm_block_hashes(v, "sha256", None, vllm_h, tokens)
        assert block_hashes(geom, tokens) == expected and len(expected) == 4


def test_lookahead_comes_from_the_geometry(v):
    # eagle without a KV connector: vLLM's num_hash_lookahead_tokens (1 here) is the geometry's look-ahead.
    from kvgeom.conformance import vllm_objects as vo

    geom = kvgeom.resolve({"groups": [{"kind": "full_attention", "block_size": 16}],
                           "speculative": {"method": "eagle", "num_speculative_tokens": 3}})
    p = vo.build_vllm_config(geom).num_hash_lookahead_tokens
    assert p == 1 and geom.speculative is not None and geom.speculative.lookahead_hashes
    tokens = list(range(5, 5 + 48))  # 48 tokens, P = 1: hashes end at 16 and 32 only
    expected, _ = vllm_block_hashes(v, "sha256", None, 16, tokens, lookahead=p)
    assert block_hashes(geom, tokens) == expected and len(expected) == 2


def test_routing_page_hashes_are_vllms(v):
    # docs/routing.md's end-to-end block, run as written: its chain is what vLLM 0.33 computes for that prompt
    # with its defaults (sha256, PYTHONHASHSEED unset) and the page's cache salt, at the default geometry's H.
    from test_docs_code import run_page

    ns = run_page("routing.md")
    expected, seed = vllm_block_hashes(v, "sha256", None, ns["H"], ns["prompt"], salt="tenant-a")
    assert seed is None and ns["chain"] == expected
