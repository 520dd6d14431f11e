"""kvgeom.hashing without vLLM: rows recorded from vLLM 0.33.0, the laws of the chain, the error cases.

The rows were recorded on this project's CPU machines with vLLM 0.33.0's own request hasher
(``get_request_block_hasher`` on a real ``vllm.v1.request.Request``, ``init_none_hash`` first): the script
in docs/hashing.md ("How the rows were recorded"), run once per algorithm with PYTHONHASHSEED unset (sha256*
only: the xxhash algorithms then draw a random seed) and with PYTHONHASHSEED=0. Each row is (algorithm, the
engine's PYTHONHASHSEED, case, number of hashes, last hash). tests/test_hashing_vllm.py compares with vLLM live.
"""

from __future__ import annotations

import importlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

import kvgeom
from kvgeom.hashing import ALGORITHMS, MMFeature, block_hashes, none_hash

CASES = {
    "nine": {"h": 4, "tokens": list(range(1, 10))},  # 9 tokens at H = 4: two hashes, token 9 is not hashed
    # ids past one byte, two bytes and int32 (the connector page's old helper broke at 256)
    "big_ids": {"h": 4, "tokens": [0, 255, 256, 65535, 65536, 2**31 - 1, 2**31, 2**40, 151643, 7, 8, 9, 10, 11, 12,
                                    13]},
    "salt": {"h": 16, "tokens": list(range(100, 133)), "cache_salt": "tenant-a"},  # salt keys block 0 only
    "lora": {"h": 16, "tokens": list(range(100, 133)), "lora_name": "sql-adapter", "lora_path": "/adapters/sql"},
    "mm": {"h": 16, "tokens": list(range(100, 150)),  # an image over blocks 0-1, another inside block 1
           "mm_features": [MMFeature("img-abc", 5, 20), MMFeature("img-def", 30, 4)]},
    "lookahead": {"h": 16, "tokens": list(range(100, 150)), "lookahead_tokens": 1,  # eagle look-ahead P = 1
                  "mm_features": [MMFeature("img-abc", 5, 20)]},
}

NEEDS = {"sha256": None, "sha256_cbor": "cbor2", "xxhash": "xxhash", "xxhash_cbor": "cbor2"}

ROWS = [
    ("sha256", None, "nine", 2, "bee96bce54f5fcaba04c4a3fc2491b30b48e29dbbd38a327d41bc1f76b956dde"),
    ("sha256", None, "big_ids", 4, "aab4cc0fa1ec625b9c03f0ddba62a928f6bb639822168fa3ad089d066e4db788"),
    ("sha256", None, "salt", 2, "c3f5e4841f62f7bdea96283b1381200cbc709e20cdb5938da2150f1199844cd1"),
    ("sha256", None, "lora", 2, "9bf6a539551aa215231ae552cf240658b2cb919e1fe1c0040a6a9448d2044fb2"),
    ("sha256", None, "mm", 3, "7c71ceb5936b4d68bbf60a36aecd7a8b77cb51a535913b67df44f12650935688"),
    ("sha256", None, "lookahead", 3, "271e9d0cf93d8e726b9e034db4aa833d0f77e174952954578587b111e711bb59"),
    ("sha256_cbor", None, "nine", 2, "e1bc29393a2da9fd798f35ff04d215f846aee6df4b803ce3d43b57df56b58fb1"),
    ("sha256_cbor", None, "big_ids", 4, "2343b658d1d023b5c66465b1953d2cb38dfdd3149fa1f83a4189382e5c5f280c"),
    ("sha256_cbor", None, "salt", 2, "d7cfd8f806e7354b03db10e9ebd84756e94adeebd1d514ff4fe63a05dc8c73a4"),
    ("sha256_cbor", None, "lora", 2, "2c6fe6ce98ade7993d8e77d643fde1ec411e3b1d6e3383f14fc296f36255f41c"),
    ("sha256_cbor", None, "mm", 3, "03ba73b13dfc93836672dc2b86c95b3184ecca292b7d1144a9877ed79837f5b6"),
    ("sha256_cbor", None, "lookahead", 3, "e8b9650710c9c1d92dadc5d237f98efb8a5d46057e4344f665b0d2be95168635"),
    ("sha256", '0', "nine", 2, "9e62b5a7ec298f33cb4c7d9e00b659874bb2432d23ad6879ad1746592a2b036b"),
    ("sha256", '0', "big_ids", 4, "c7dcdef2926ca3dd5e4547c42e9722cf8bc43c33fc5568ffd0339386f5020a51"),
    ("sha256", '0', "salt", 2, "f4bdbf3a0af9f7e0f527114e9a7edf5e69d9aa48f29643c446423aaa16165a8a"),
    ("sha256", '0', "lora", 2, "8e6cf778cff5d9003fc3fa0a026b276e8d750809d0f67d1169ff161ba33187a3"),
    ("sha256", '0', "mm", 3, "1caa8f34f9e99004f61760d4b8c808ff2d8dedffbd7c1951cc9d207194c5b80e"),
    ("sha256", '0', "lookahead", 3, "f634d96960abfd4fdd90ae36f2ca3706552e03d33db8ac0f27b8cb9c2beb1921"),
    ("sha256_cbor", '0', "nine", 2, "24125b23e68883b5c2141db2959d48433fe6bde2f26bd914efad121d154ab2d6"),
    ("sha256_cbor", '0', "big_ids", 4, "ebf3776e3d95b810b73b4ef1e86896cde55e5bdef7e6e17d2589df5cb42a04dc"),
    ("sha256_cbor", '0', "salt", 2, "8f11d0ff110478a39613cdb02a15a838b91a6a820207ff38cbf3240585808b07"),
    ("sha256_cbor", '0', "lora", 2, "ac962bec9e6797d56ee03ef6a42d3dc4b842565fda17a4d3a2ce8a15f8838ddb"),
    ("sha256_cbor", '0', "mm", 3, "d10d68912d3ec6a5bcc10a5a5fc6430bdf033ec9ed108af9f094285040c735fc"),
    ("sha256_cbor", '0', "lookahead", 3, "f025ea64c67b96c7dc70a745b095931392eb36a0ba8e39088ae8fb6f290679fc"),
    ("xxhash", '0', "nine", 2, "0c9832567b17003b126077f57e0bb670"),
    ("xxhash", '0', "big_ids", 4, "4a6eab06fbc9519044ab67ca09d9a463"),
    ("xxhash", '0', "salt", 2, "105a19482e01f21ee1a12f70062025a0"),
    ("xxhash", '0', "lora", 2, "ed6559a54ebb75755fef7190d31f0906"),
    ("xxhash", '0', "mm", 3, "e49319f486fccb8fe0de7d5a399aeb9e"),
    ("xxhash", '0', "lookahead", 3, "6562c5c000c6824e11b5926404abf603"),
    ("xxhash_cbor", '0', "nine", 2, "d152782cb4d753bde718a811a3b75e23"),
    ("xxhash_cbor", '0', "big_ids", 4, "e000253f22b8f8bdbe6635f6ab92bc49"),
    ("xxhash_cbor", '0', "salt", 2, "02b646e93e63c8a3e0f5b0f11b647912"),
    ("xxhash_cbor", '0', "lora", 2, "cd75f4111b2e5248d19c081f804fec8b"),
    ("xxhash_cbor", '0', "mm", 3, "a073cfc6ac2025cab855b6e1ba783ab3"),
    ("xxhash_cbor", '0', "lookahead", 3, "7f3be96338b7e7926bf27a33afa2dcff"),
]


def _needs(algorithm):
    for package in {NEEDS[algorithm], "xxhash" if algorithm.startswith("xxhash") else None} - {None}:
        pytest.importorskip(package)


@pytest.mark.parametrize(("algorithm", "env_seed", "case", "count", "last"), ROWS)
def test_rows_recorded_from_vllm(algorithm, env_seed, case, count, last):
    _needs(algorithm)
    args = dict(CASES[case])
    hashes = block_hashes(args.pop("h"), args.pop("tokens"), algorithm=algorithm, seed=env_seed, **args)
    assert (len(hashes), hashes[-1].hex()) == (count, last)


@pytest.mark.parametrize(
    ("algorithm", "seed", "value"),
    [
        ("sha256", None, "066b1e8987e027138e98701c46128929378935f9b6cd1549105ae6b4f0d71198"),  # "vllm-none-hash"
        ("sha256", "0", "1973e23848344dc43a988a9b478663803cfffe1243480253f9a3cf004b14aa7c"),  # PYTHONHASHSEED=0
        ("sha256_cbor", None, "9bd96a485ad84efdafb72ee48a1d7a69bcead0f8f0433173941b276b9581eef0"),
        ("sha256_cbor", "0", "4e1195df020de59e0d65a33a4279f1183e7ae4e5d980e309f8b55adff2e61c3e"),
        ("xxhash", "0", "6fb31cc38bba6066183f7f2104b9c051"),
        ("xxhash_cbor", "0", "1ebe36576dcb573f26b99533a20aaeca"),
    ],
)
def test_none_hash_rows_recorded_from_vllm(algorithm, seed, value):
    _needs(algorithm)
    assert none_hash(algorithm, seed).hex() == value


def test_a_geometry_gives_its_hash_unit():
    # the default geometry (FA 16 under DCP 2 + Mamba 16) hashes at H = 16; one FA group under DCP 2 at 32
    geom = kvgeom.resolve(kvgeom.DEFAULT_CONFIG)
    tokens = list(range(70))
    assert block_hashes(geom, tokens) == block_hashes(16, tokens) and len(block_hashes(geom, tokens)) == 4
    one = kvgeom.resolve({"groups": [{"kind": "full_attention", "block_size": 16}], "parallel": {"tp": 2, "dcp": 2}})
    assert len(block_hashes(one, tokens)) == 2 == 70 // one.hash_block_size


# laws ------------------------------------------------------------------------------------------------------

TOKENS = st.lists(st.one_of(st.integers(0, 300), st.integers(0, 2**40)), max_size=70)
EXTRAS = st.fixed_dictionaries(
    {},
    optional={
        "cache_salt": st.text(max_size=4),
        "seed": st.sampled_from(["0", "1", "random"]),
        "lookahead_tokens": st.integers(0, 3),
        "mm_features": st.just([MMFeature("img", 3, 9)]),
    },
)


@given(st.integers(1, 17), TOKENS, EXTRAS)
def test_length_is_tokens_minus_lookahead_over_h(h, tokens, extras):
    p = extras.get("lookahead_tokens", 0)
    assert len(block_hashes(h, tokens, **extras)) == max(0, len(tokens) - p) // h


@given(st.integers(1, 17), TOKENS, st.integers(0, 70), EXTRAS)
def test_chain_hashes_of_a_prefix_are_a_prefix(h, tokens, cut, extras):
    # hash i depends only on tokens[:(i+1)H + P]: cutting the request keeps every hash that fits
    full = block_hashes(h, tokens, **extras)
    part = block_hashes(h, tokens[:cut], **extras)
    assert part == full[: len(part)]


@given(st.integers(1, 17), TOKENS.filter(lambda t: len(t) >= 1), st.data())
def test_changing_one_token_changes_its_hash_and_every_later_one(h, tokens, data):
    i = data.draw(st.integers(0, len(tokens) - 1))
    changed = [*tokens[:i], tokens[i] + 1, *tokens[i + 1 :]]
    a, b = block_hashes(h, tokens), block_hashes(h, changed)
    first = i // h
    assert a[:first] == b[:first]
    assert all(x != y for x, y in zip(a[first:], b[first:], strict=True))


@given(st.integers(1, 17), TOKENS, EXTRAS)
def test_deterministic_and_sized(h, tokens, extras):
    a, b = block_hashes(h, tokens, **extras), block_hashes(h, list(tokens), **extras)
    assert a == b and all(isinstance(x, bytes) and len(x) == 32 for x in a)


@given(st.integers(1, 8), TOKENS.filter(lambda t: len(t) >= 16), st.text(min_size=1, max_size=4))
def test_salt_changes_every_hash_lora_too(h, tokens, salt):
    plain = block_hashes(h, tokens)
    assert all(x != y for x, y in zip(plain, block_hashes(h, tokens, cache_salt=salt), strict=True))
    lora = block_hashes(h, tokens, lora_name="a", lora_path="/p")
    assert all(x != y for x, y in zip(plain, lora, strict=True))


def test_numpy_ids_hash_as_ints():
    np = pytest.importorskip("numpy")
    tokens = list(range(40))
    assert block_hashes(16, np.arange(40, dtype=np.int64)) == block_hashes(16, tokens)


def test_vllms_feature_objects_are_read():
    class Pos:
        offset, length = 5, 20

    class Spec:  # the attributes of vLLM's MultiModalFeatureSpec that the hash reads
        identifier, mm_position = "img-abc", Pos()

    tokens = list(range(100, 150))
    assert block_hashes(16, tokens, mm_features=[Spec()]) == block_hashes(16, tokens, mm_features=[("img-abc", 5, 20)])


# errors ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "code", "field", "words"),
    [
        ({"token_ids": [1, -1, 2]}, "negative", "token_ids[1]", "token_ids[1]=-1 is negative"),
        ({"token_ids": [1, 2.0]}, "not_an_integer", "token_ids[1]", "2.0 (float)"),
        ({"token_ids": [True]}, "not_an_integer", "token_ids[0]", "bool"),
        ({"token_ids": "abc"}, "bad_token_ids", "token_ids", "sequence of ints"),
        ({"algorithm": "md5"}, "unknown_algorithm", "algorithm", "sha256, sha256_cbor, xxhash, xxhash_cbor"),
        ({"seed": 0}, "bad_seed", "seed", "pass seed='0'"),
        ({"algorithm": "xxhash"}, "seed_required", "seed", "PYTHONHASHSEED"),
        ({"lora_name": "a"}, "lora_incomplete", "lora_path", "pass both"),
        ({"lora_path": "/p"}, "lora_incomplete", "lora_name", "pass both"),
        ({"lora_name": "a", "lora_path": ""}, "empty_lora_path", "lora_path", "without a path"),
        ({"cache_salt": 5}, "not_a_string", "cache_salt", "must be a str"),
        ({"mm_features": [("a", 10, 5), ("b", 12, 1)]}, "mm_features_unsorted", "mm_features[1]", "sort them"),
        ({"mm_features": [("a", 0, 0)]}, "bad_mm_feature", "mm_features[0].length", ">= 1"),
        ({"mm_features": ["a"]}, "bad_mm_feature", "mm_features[0]", "MMFeature"),
        ({"lookahead_tokens": -1}, "bad_lookahead", "lookahead_tokens", ">= 0"),
        ({"geom_or_H": 0}, "bad_hash_block_size", "geom_or_H", "int >= 1"),
    ],
)
def test_bad_input_names_field_numbers_and_fix(kwargs, code, field, words):
    args = {"geom_or_H": 4, "token_ids": [1, 2, 3, 4], **kwargs}
    with pytest.raises(kvgeom.QueryError) as e:
        block_hashes(args.pop("geom_or_H"), args.pop("token_ids"), **args)
    assert (e.value.code, e.value.field) == (code, field)
    assert words in str(e.value)


@pytest.mark.parametrize(("algorithm", "package"), [("sha256_cbor", "cbor2"), ("xxhash", "xxhash")])
def test_missing_package_is_named(monkeypatch, algorithm, package):
    real = importlib.import_module

    def without(name, *args):
        if name == package:
            raise ImportError(name)
        return real(name, *args)

    monkeypatch.setattr(importlib, "import_module", without)
    with pytest.raises(kvgeom.KVGeomError) as e:
        block_hashes(4, [1, 2, 3, 4], algorithm=algorithm, seed="0")
    assert e.value.code == "missing_dependency" and f"pip install {package}" in str(e.value)


def test_every_algorithm_is_offered():
    assert ALGORITHMS == ("sha256", "sha256_cbor", "xxhash", "xxhash_cbor")
