"""Page bytes per spec kind (vLLM 0.33 v1/kv_cache_interface.py)."""

from __future__ import annotations

import pytest

from kvgeom.errors import ConfigError
from kvgeom.pages import maybe_page_bytes, missing_page_fields, page_bytes
from kvgeom.specs import (
    FullAttentionSpec,
    MambaSpec,
    MLASpec,
    SlidingWindowSpec,
    UniformSpec,
)

BF16 = 2

CASES = [
    # GQA full attention, 8 KV heads of 128, bf16, block 16: K and V halves (content = (hs + hs_v) * dtype)
    (FullAttentionSpec(block_size=16, num_kv_heads=8, head_size=128, dtype="bfloat16"), 16 * 8 * 256 * BF16),
    # head_size_v different from head_size (e.g. models with 192/128 K/V widths)
    (
        FullAttentionSpec(block_size=16, num_kv_heads=1, head_size=192, head_size_v=128, dtype="bfloat16"),
        16 * (192 + 128) * BF16,
    ),
    # fp8 cache: one byte per element
    (SlidingWindowSpec(block_size=32, sliding_window=4096, num_kv_heads=4, head_size=64, dtype="fp8"), 32 * 4 * 128),
    # MLA latent 576 bf16: latent only, one head by default (DeepSeek-style MLA)
    (MLASpec(block_size=64, head_size=576, dtype="bfloat16"), 64 * 576 * BF16),
    # MLA with alignment: 64*576*2 = 73728 padded up to a multiple of 65536 -> 131072
    (MLASpec(block_size=64, head_size=576, dtype="bfloat16", alignment=65536), 131072),
    # fp8_ds_mla packs a token into 656 bytes whatever head_size says
    (MLASpec(block_size=64, dtype="fp8_ds_mla"), 64 * 656),
    # compressed attention: 4 tokens per state -> 16 states in a 64-token block
    (MLASpec(block_size=64, head_size=512, dtype="fp8", tokens_per_state=4), 16 * 512),
    # Mamba: sum of prod(shape)*dtype bytes, independent of block_size
    (MambaSpec(block_size=2304, shapes=((36, 128, 128), (3, 9216)), dtypes=("float32", "bfloat16")), 2414592),
    # Mamba padded page overrides the states (_align_hybrid_block_size)
    (MambaSpec(block_size=16, shapes=((4, 4),), dtypes=("float32",), page_size_padded=1000), 1000),
    # uniform container (DSA MLA + indexer): sum of the leaves
    (
        UniformSpec(
            block_size=64,
            layers=[
                {"kind": "mla", "head_size": 576, "dtype": "bfloat16"},
                {"kind": "mla", "cache_role": "indexer", "head_size": 132, "dtype": "uint8"},
            ],
        ),
        64 * 576 * 2 + 64 * 132,
    ),
]


@pytest.mark.parametrize(("spec", "expected"), CASES)
def test_page_bytes_table(spec, expected):
    assert maybe_page_bytes(spec) == expected
    assert page_bytes(spec) == expected
    assert missing_page_fields(spec) == []


MISSING = [
    # attention without heads/dtype
    (FullAttentionSpec(block_size=16, head_size=128), ["num_kv_heads", "dtype"]),
    # MLA needs no heads (latent has one) but needs head_size and dtype
    (MLASpec(block_size=64), ["head_size", "dtype"]),
    # Mamba without dtypes
    (MambaSpec(block_size=16, shapes=((4,),)), ["dtypes"]),
    # Mamba with one dtype for two tensors: the pairing is incomplete
    (MambaSpec(block_size=16, shapes=((4,), (5,)), dtypes=("float32",)), ["dtypes"]),
    # uniform container: leaf paths
    (UniformSpec(block_size=16, layers=[{"kind": "mla", "head_size": 576}]), ["layers[0].dtype"]),
]


@pytest.mark.parametrize(("spec", "missing"), MISSING)
def test_missing_fields_maybe_none_strict_raises(spec, missing):
    assert missing_page_fields(spec) == missing
    assert maybe_page_bytes(spec) is None
    with pytest.raises(ConfigError) as info:
        page_bytes(spec, "groups[3]")
    assert info.value.code == "missing_page_fields"
    assert info.value.field == "groups[3]"
    assert all(name in str(info.value) for name in missing)


def test_attention_page_is_linear_in_block_size():
    # the resolution of _align_hybrid_block_size relies on page(n*b) == n*page(b) for unaligned attention pages
    small = page_bytes(FullAttentionSpec(block_size=16, num_kv_heads=2, head_size=80, dtype="float16"))
    large = page_bytes(FullAttentionSpec(block_size=48, num_kv_heads=2, head_size=80, dtype="float16"))
    assert large == 3 * small
