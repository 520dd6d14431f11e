"""Laws of the vLLM adapter's key conversion and extra-config reading (kvgeom.adapters.vllm)."""

from __future__ import annotations

from hypothesis import example, given
from hypothesis import strategies as st

import kvgeom
from kvgeom.adapters.vllm import OffloadKeys, coerce_extra_int
from kvgeom.errors import ConfigError
from kvgeom.residency import Residency, make_offload_key

SEED = kvgeom.resolve({**kvgeom.DEFAULT_CONFIG, "offload": {}})  # H = 16, groups 0 and 1


@st.composite
def chains_and_pairs(draw):
    n = draw(st.integers(1, 40))
    chain = draw(st.lists(st.binary(min_size=16, max_size=16), min_size=n, max_size=n, unique=True))
    pairs = draw(st.lists(st.tuples(st.integers(0, 1), st.integers(1, n)), max_size=20))
    return chain, [(g, i * SEED.hash_block_size) for g, i in pairs]


@example(data=([b"\x00" * 16], [(1, 16)]))  # the first hash of a one-hash chain
@given(data=chains_and_pairs())
def test_offload_keys_to_vllm_and_back_are_inverse(data):
    chain, pairs = data
    keys = OffloadKeys(SEED, chain)
    for group, end in pairs:
        key = keys.to_vllm(group, end)
        # vLLM's bytes: the hash ending at `end`, then the group as 4 big-endian bytes
        assert key == make_offload_key(chain[end // SEED.hash_block_size - 1], group)
        assert keys.to_kvgeom(key) == (group, end)
        assert keys.to_vllm(*keys.to_kvgeom(key)) == key


@given(data=chains_and_pairs())
def test_offload_keys_stored_by_vllm_are_what_residency_probes(data):
    chain, pairs = data
    keys = OffloadKeys(SEED, chain)
    r = Residency()
    for group, end in pairs:
        r.add_key(keys.to_vllm(group, end))
    contains = r.probe(SEED, chain)
    held = set(pairs)
    for group in (0, 1):
        for i in range(1, len(chain) + 1):
            assert contains(group, i * SEED.hash_block_size) == ((group, i * SEED.hash_block_size) in held)


@example(value="4")  # issue 10: vLLM int()s extra-config strings; kvgeom used to refuse them
@given(
    value=st.one_of(st.integers(-5, 10**6), st.floats(allow_nan=True), st.text(max_size=6), st.booleans(), st.none())
)
def test_extra_config_reads_exactly_what_int_reads(value):
    try:
        expected = int(value)
    except (TypeError, ValueError, OverflowError):
        try:
            coerce_extra_int(value, "blocks_per_chunk")
        except ConfigError as exc:
            assert exc.code == "bad_extra_config"
        else:
            raise AssertionError(f"{value!r} accepted although int() refuses it")
        return
    assert coerce_extra_int(value, "blocks_per_chunk") == expected
