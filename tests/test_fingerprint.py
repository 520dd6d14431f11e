"""Layout fingerprint: examples (docs/fingerprint.md)."""

from __future__ import annotations

import re

import pytest

import kvgeom
from kvgeom.fingerprint import canonical_json, fingerprint, layout_fields

HYBRID = {
    "groups": [
        {"kind": "full_attention", "block_size": 16, "num_kv_heads": 4, "head_size": 128, "dtype": "bfloat16"},
        {"kind": "mamba", "block_size": 16, "shapes": [[8, 64, 64]], "dtypes": ["float32"]},
    ],
    "parallel": {"tp": 2, "dcp": 2},
    "offload": {},
}


def with_(base, **changes):
    """A copy of a config with dotted-path changes (``parallel.cp_interleave=16``)."""
    import copy

    cfg = copy.deepcopy(base)
    for path, value in changes.items():
        *parents, last = path.split("__")
        node = cfg
        for p in parents:
            node = node[int(p)] if p.isdigit() else node.setdefault(p, {})
        node[int(last) if last.isdigit() else last] = value
    return cfg


def test_format_and_report_key():
    g = kvgeom.resolve(HYBRID)
    fp = g.fingerprint()
    assert re.fullmatch(r"kvg2-[0-9a-f]{16}", fp)
    assert g.to_report()["fingerprint"] == fp == fingerprint(HYBRID)


CHANGES = [
    # docs/fingerprint.md: vLLM's file tier omits I; two deployments differing only in I must not share keys
    ("interleave", {"parallel__cp_interleave": 16}, True),
    # DCP changes the span and the per-rank slicing of the attention group
    ("dcp", {"parallel__dcp": 1}, True),
    # TP splits the GQA heads: rank r holds other heads
    ("tp", {"parallel__tp": 4}, True),
    # chunk size k
    ("blocks_per_chunk", {"offload": {"blocks_per_chunk": 2}}, True),
    # dtype of the attention page
    ("dtype", {"groups__0__dtype": "fp8"}, True),
    # per-rank block size
    ("block_size", {"groups__0__block_size": 32, "groups__1__block_size": 32}, True),
    # the Mamba state layout (same bytes, different shape)
    ("mamba_shape", {"groups__1__shapes": [[8, 32, 128]]}, True),
    # PP decides which layers a rank's page holds
    ("pp", {"parallel__pp": 2}, True),
    # not byte-relevant: max_model_len (row widths only)
    ("max_model_len", {"cache": {"max_model_len": 8192}}, False),
    # not byte-relevant: retention interval (which keys are kept, not their bytes)
    ("retention", {"cache": {"retention_interval": None}}, False),
    # not byte-relevant: offloading k = 1 written explicitly
    ("k_explicit", {"offload": {"blocks_per_chunk": 1}}, False),
]


@pytest.mark.parametrize(("name", "changes", "differs"), CHANGES, ids=[c[0] for c in CHANGES])
def test_fingerprint_table(name, changes, differs):
    assert (fingerprint(with_(HYBRID, **changes)) != fingerprint(HYBRID)) is differs


def test_interleave_ignored_without_dcp():
    # interleave only matters for a sharded group under DCP > 1
    base = with_(HYBRID, parallel__dcp=1)
    assert fingerprint(base) == fingerprint(with_(base, parallel__cp_interleave=8))


def test_tp_ignored_for_latent_mla():
    # an MLA latent is held whole by every TP rank: TP 2 and TP 4 at DCP 2 store the same bytes per key
    mla = {"groups": [{"kind": "mla", "block_size": 64, "head_size": 576, "dtype": "bfloat16"}], "offload": {}}
    assert fingerprint(with_(mla, parallel={"tp": 2, "dcp": 2})) == fingerprint(
        with_(mla, parallel={"tp": 4, "dcp": 2})
    )


def test_uniform_container_pages_in_fingerprint():
    # DSA: the container page is the sum of the leaves; an indexer dtype change changes the fingerprint
    dsa = {
        "groups": [
            {
                "kind": "uniform",
                "block_size": 64,
                "layers": [
                    {"kind": "mla", "head_size": 576, "dtype": "bfloat16"},
                    {"kind": "mla", "cache_role": "indexer", "head_size": 132, "dtype": "uint8"},
                ],
            }
        ]
    }
    fields = layout_fields(dsa)
    assert fields["groups"][0]["page_bytes"] == 64 * 576 * 2 + 64 * 132
    assert fingerprint(dsa) != fingerprint(with_(dsa, groups__0__layers__1__dtype="bfloat16"))


def test_canonical_json_is_plain_and_sorted():
    text = canonical_json(layout_fields(HYBRID))
    assert " " not in text and text.isascii()
    assert text.index('"blocks_per_chunk"') < text.index('"groups"') < text.index('"hash_block_size"')


def test_chunk_written_as_tokens_or_blocks_is_one_layout():
    # offload.block_size=32 and blocks_per_chunk=2 are the same chunk when both spans are 16 (DCP 1)
    dcp1 = with_(HYBRID, parallel={"tp": 2, "dcp": 1})
    assert fingerprint(with_(dcp1, offload={"block_size": 32})) == fingerprint(
        with_(dcp1, offload={"blocks_per_chunk": 2})
    )
