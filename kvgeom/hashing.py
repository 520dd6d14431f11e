"""A request's block hashes, exactly as vLLM 0.33 computes them (what a router must look up).

vLLM names every cached block by a hash chained over the whole prefix at the hash unit H
(:attr:`kvgeom.Geometry.hash_block_size`): hash *i* fingerprints tokens ``[0, (i+1)*H)`` and the request's
extra keys. KV events carry these hashes; a router that wants to look a request up must compute the same
bytes. This module does, with the standard library only (plus ``cbor2`` / ``xxhash`` for the algorithms
that need them). Established by running vLLM 0.33.0 (``docs/hashing.md`` has the commands and the
recorded values; ``tests/test_hashing_vllm.py`` compares byte for byte with vLLM's own request hasher):

* **Algorithm** (``--prefix-caching-hash-algo``, ``CacheConfig.prefix_caching_hash_algo``): ``sha256``
  (the default; SHA-256 of the pickled key, protocol 5), ``sha256_cbor`` (SHA-256 of canonical CBOR),
  ``xxhash`` and ``xxhash_cbor`` (128-bit XXH3 of the same bytes). :data:`ALGORITHMS`.
* **Seed** of the first parent: the first block's parent is ``NONE_HASH = hash(seed)``, the hash of the
  seed *string*. The seed is ``PYTHONHASHSEED`` when the engine's environment sets it (any string, even
  ``"random"``), else ``"vllm-none-hash"`` for the sha256 algorithms and fresh random bytes per process for
  the xxhash ones (so xxhash hashes cannot be reproduced unless the engines set ``PYTHONHASHSEED``).
* **Key** of block *i*: ``(parent, tuple(tokens[i*H:(i+1)*H]), extra)``, where ``extra`` is ``None`` or a
  tuple of, in this order: ``("lora", name, path)`` for a LoRA request, ``("mm", identifier, offset -
  i*H)`` for every multimodal item overlapping the block, ``("cache_salt", salt)`` on block 0 only (a
  non-empty salt). With look-ahead hashes (eagle/MTP without a KV connector, P tokens) the block's hash
  is emitted only once ``(i+1)*H + P`` tokens exist, its multimodal keys cover ``[i*H, (i+1)*H + P)`` and
  ``extra`` becomes ``(extra, *tokens[(i+1)*H:(i+1)*H + P])``.

Invariants of :func:`block_hashes` (property tests in ``tests/test_hashing.py``): the list has
``max(0, len(tokens) - P) // H`` hashes (P = look-ahead, 0 by default); hash *i* depends only on
``tokens[:(i+1)*H + P]``, the seed, the algorithm and the extra keys (so the hashes of a prefix are a prefix
of the hashes); equal inputs give equal bytes in every process.
Not covered: prompt embeddings (vLLM adds a SHA-256 of each block's embedding tensor bytes).
"""

from __future__ import annotations

import hashlib
import importlib
import operator
import pickle
from collections.abc import Callable, Iterable, Sequence
from typing import Any, NamedTuple

from kvgeom._format import show
from kvgeom.errors import KVGeomError, QueryError
from kvgeom.geometry import Geometry

__all__ = [
    "ALGORITHMS",
    "DEFAULT_SEED",
    "MMFeature",
    "block_hashes",
    "hash_function",
    "none_hash",
]

#: The values of vLLM 0.33's ``prefix_caching_hash_algo`` (``CacheConfig``; default ``"sha256"``).
ALGORITHMS: tuple[str, ...] = ("sha256", "sha256_cbor", "xxhash", "xxhash_cbor")

#: The seed of ``NONE_HASH`` when ``PYTHONHASHSEED`` is unset and the algorithm is sha256 or sha256_cbor.
DEFAULT_SEED = "vllm-none-hash"

#: Pickle protocol vLLM's pickle-based algorithms use (``pickle.HIGHEST_PROTOCOL`` of Python 3.8 to 3.14).
PICKLE_PROTOCOL = 5

_RANDOM_SEEDED = ("xxhash", "xxhash_cbor")
_PACKAGES = {"cbor2": "cbor2 (pip install cbor2)", "xxhash": "xxhash >= 3 (pip install xxhash)"}


class MMFeature(NamedTuple):
    """One multimodal item of a request: its ``identifier`` (vLLM's ``MultiModalFeatureSpec.identifier``, the
    mm hash with the LoRA prefix if any) and its placeholder tokens ``[offset, offset + length)``."""

    identifier: str
    offset: int
    length: int


def _module(name: str, algorithm: str) -> Any:
    try:
        module = importlib.import_module(name)
    except ImportError:
        module = None
    if module is None or (name == "xxhash" and not hasattr(module, "xxh3_128_digest")):
        raise KVGeomError.single(
            "missing_dependency",
            f"algorithm={algorithm!r} needs the package {_PACKAGES[name]}, which is not installed (or too old) "
            f"in this environment; install it, or use an algorithm the engines run that needs no package "
            f"('sha256')",
            "algorithm",
            algorithm=algorithm,
            package=name,
        )
    return module


def _check_algorithm(algorithm: Any) -> str:
    if not isinstance(algorithm, str) or algorithm not in ALGORITHMS:
        raise QueryError.single(
            "unknown_algorithm",
            f"algorithm={show(algorithm)} is not one of vLLM 0.33's prefix_caching_hash_algo values "
            f"{', '.join(ALGORITHMS)}; pass the value the engines run with (default 'sha256')",
            "algorithm",
            algorithm=algorithm,
        )
    return algorithm


def hash_function(algorithm: str = "sha256") -> Callable[[Any], bytes]:
    """The function vLLM 0.33 applies to a block key under ``algorithm`` (bytes: 32 for the sha256
    algorithms, 16 for the xxhash ones). :class:`QueryError` for an unknown algorithm; :class:`KVGeomError`
    ``missing_dependency`` naming the package when ``cbor2`` or ``xxhash`` is needed and missing.

    >>> hash_function("sha256")("vllm-none-hash").hex()[:16]
    '066b1e8987e02713'
    """
    algorithm = _check_algorithm(algorithm)
    digest: Callable[[bytes], bytes]
    if algorithm.startswith("xxhash"):
        digest = _module("xxhash", algorithm).xxh3_128_digest
    else:
        def digest(data: bytes) -> bytes:
            return hashlib.sha256(data).digest()
    if algorithm.endswith("_cbor"):
        dumps = _module("cbor2", algorithm).dumps
        return lambda key: bytes(digest(dumps(key, canonical=True)))
    return lambda key: bytes(digest(pickle.dumps(key, protocol=PICKLE_PROTOCOL)))


def _check_seed(seed: Any, algorithm: str) -> str:
    if seed is None:
        if algorithm in _RANDOM_SEEDED:
            raise QueryError.single(
                "seed_required",
                f"algorithm={algorithm!r}: without PYTHONHASHSEED vLLM 0.33 seeds the first parent with random "
                f"bytes per process, so no router can reproduce its hashes; set PYTHONHASHSEED to one value on "
                f"every engine and pass the same string as seed=",
                "seed",
                algorithm=algorithm,
            )
        return DEFAULT_SEED
    if not isinstance(seed, str):
        raise QueryError.single(
            "bad_seed",
            f"seed must be a str (the engines' PYTHONHASHSEED, as written in their environment), got "
            f"{show(seed)} ({type(seed).__name__}); pass seed={str(seed)!r}",
            "seed",
            seed=seed,
        )
    return seed


def none_hash(algorithm: str = "sha256", seed: str | None = None) -> bytes:
    """The parent hash of a request's first block (vLLM's ``NONE_HASH``): the hash of the seed string.

    ``seed`` is the engines' ``PYTHONHASHSEED`` when set, else None: :data:`DEFAULT_SEED` for the sha256
    algorithms; the xxhash algorithms need an explicit seed (vLLM draws a random one per process).

    >>> none_hash().hex()[:16], none_hash(seed="0").hex()[:16]
    ('066b1e8987e02713', '1973e23848344dc4')
    """
    algorithm = _check_algorithm(algorithm)
    return hash_function(algorithm)(_fresh(_check_seed(seed, algorithm)))


def _fresh(text: str) -> str:
    # A distinct str object with the same value. Pickle writes a repeated *object* as a back-reference, so
    # ("lora", s, s) with one object pickles differently from two equal objects; vLLM's engine decodes each
    # field of a request separately, and kvgeom hashes them the same way.
    return str(text.encode("utf-8", "surrogatepass"), "utf-8", "surrogatepass")


def _text(name: str, value: Any) -> str:
    if not isinstance(value, str):
        raise QueryError.single(
            "not_a_string", f"{name} must be a str, got {show(value)} ({type(value).__name__})", name, **{name: value}
        )
    return value


def _tokens(token_ids: Any) -> list[int]:
    if isinstance(token_ids, (str, bytes)) or not isinstance(token_ids, Iterable):
        raise QueryError.single(
            "bad_token_ids",
            f"token_ids must be a sequence of ints (the prompt's token ids), got {show(token_ids)}",
            "token_ids",
        )
    out = []
    for i, t in enumerate(token_ids):
        try:
            if isinstance(t, bool):
                raise TypeError
            v = operator.index(t)
        except TypeError:
            raise QueryError.single(
                "not_an_integer",
                f"token_ids[{i}] must be an integer token id, got {show(t)} ({type(t).__name__}); pass the ids "
                f"the tokenizer returned",
                f"token_ids[{i}]",
                index=i,
            ) from None
        if v < 0:
            raise QueryError.single(
                "negative",
                f"token_ids[{i}]={v} is negative; token ids are >= 0 (a padding id such as -1 is not a token)",
                f"token_ids[{i}]",
                index=i,
                value=v,
            )
        out.append(v)
    return out


def _mm_features(mm_features: Any) -> list[MMFeature]:
    if mm_features is None:
        return []
    out: list[MMFeature] = []
    for i, f in enumerate(mm_features):
        field = f"mm_features[{i}]"
        if isinstance(f, tuple) and len(f) == 3:
            ident, offset, length = f
        elif hasattr(f, "identifier") and hasattr(f, "mm_position"):  # vLLM's MultiModalFeatureSpec
            ident, offset, length = f.identifier, f.mm_position.offset, f.mm_position.length
        else:
            raise QueryError.single(
                "bad_mm_feature",
                f"{field} must be an MMFeature(identifier, offset, length) or vLLM's MultiModalFeatureSpec, "
                f"got {show(f)}",
                field,
            )
        _text(f"{field}.identifier", ident)
        for name, v, low in (("offset", offset, 0), ("length", length, 1)):
            if isinstance(v, bool) or not isinstance(v, int) or v < low:
                raise QueryError.single(
                    "bad_mm_feature",
                    f"{field}.{name}={show(v)} must be an int >= {low} (placeholder tokens [offset, offset+length))",
                    f"{field}.{name}",
                )
        if out and offset < out[-1].offset + out[-1].length:
            prev = out[-1]
            raise QueryError.single(
                "mm_features_unsorted",
                f"{field} starts at token {offset}, inside or before mm_features[{i - 1}] "
                f"[{prev.offset}, {prev.offset + prev.length}); vLLM hashes items sorted by offset and "
                f"non-overlapping: sort them by offset",
                field,
                offset=offset,
            )
        out.append(MMFeature(_fresh(ident), int(offset), int(length)))
    return out


def _resolve_unit(geom_or_h: Any, lookahead_tokens: Any) -> tuple[int, int]:
    if isinstance(geom_or_h, Geometry):
        h = geom_or_h.hash_block_size
        default_p = geom_or_h.hash_lookahead_tokens
    elif isinstance(geom_or_h, int) and not isinstance(geom_or_h, bool) and geom_or_h >= 1:
        h, default_p = geom_or_h, 0
    else:
        raise QueryError.single(
            "bad_hash_block_size",
            f"geom_or_H must be a resolved Geometry or the hash unit H (an int >= 1), got {show(geom_or_h)}; "
            f"pass kvgeom.resolve(config) or geom.hash_block_size",
            "geom_or_H",
        )
    if lookahead_tokens is None:
        return h, default_p
    if isinstance(lookahead_tokens, bool) or not isinstance(lookahead_tokens, int) or lookahead_tokens < 0:
        raise QueryError.single(
            "bad_lookahead",
            f"lookahead_tokens={show(lookahead_tokens)} must be an int >= 0 (vLLM's num_hash_lookahead_tokens); "
            f"leave it None to take it from the geometry",
            "lookahead_tokens",
        )
    return h, lookahead_tokens


def block_hashes(
    geom_or_H: Geometry | int,
    token_ids: Sequence[int],
    *,
    algorithm: str = "sha256",
    lora_name: str | None = None,
    lora_path: str | None = None,
    cache_salt: str | None = None,
    mm_features: Iterable[Any] | None = None,
    seed: str | None = None,
    lookahead_tokens: int | None = None,
) -> list[bytes]:
    """The block hashes vLLM 0.33 gives a request of ``token_ids`` (``request.block_hashes`` of a new request).

    Args:
        geom_or_H: a resolved :class:`~kvgeom.Geometry` (its hash unit H and, with eagle/MTP look-ahead
            hashes, its look-ahead P) or H itself. Under DCP, H is the resolved hash unit (``block_size * dcp``
            for one group), never the per-rank block.
        token_ids: the prompt's token ids (ints >= 0; numpy integers are read as ints).
        algorithm: the engines' ``prefix_caching_hash_algo``, one of :data:`ALGORITHMS`.
        lora_name, lora_path: the request's LoRA adapter (``LoRARequest.lora_name`` and ``.lora_path``,
            a non-empty path), or both None.
        cache_salt: the request's ``cache_salt`` (keys block 0 only; an empty salt is no salt).
        mm_features: multimodal items sorted by offset, non-overlapping: :class:`MMFeature` tuples or vLLM's
            ``MultiModalFeatureSpec`` objects.
        seed: the engines' ``PYTHONHASHSEED`` string, or None when unset (then required for xxhash).
        lookahead_tokens: vLLM's ``num_hash_lookahead_tokens`` P; None takes it from the geometry (0 for an int H).

    Returns:
        ``max(0, len(token_ids) - P) // H`` hashes (32 bytes for sha256*, 16 for xxhash*); hash *i* depends
        only on ``token_ids[:(i+1)*H + P]``, the extra keys, the seed and the algorithm, so the hashes of a
        prefix are a prefix of these; equal inputs give equal bytes in every process.

    Raises:
        QueryError: a token id that is negative or not an integer, an unknown algorithm, a seed that is not a
            str (or missing for xxhash), malformed multimodal items, an H below 1.
        KVGeomError: ``missing_dependency`` when the algorithm needs ``cbor2`` or ``xxhash`` and it is missing.

    >>> hs = block_hashes(4, [1, 2, 3, 4, 5, 6, 7, 8, 9])
    >>> len(hs), hs[0].hex()[:16], block_hashes(4, [1, 2, 3, 4]) == hs[:1]
    (2, '52a7f141c60918f6', True)
    """
    h, p = _resolve_unit(geom_or_H, lookahead_tokens)
    algorithm = _check_algorithm(algorithm)
    seed_text = _check_seed(seed, algorithm)
    tokens = _tokens(token_ids)
    lora: tuple[Any, ...] | None = None
    if (lora_name is None) != (lora_path is None):
        given, missing = ("lora_name", "lora_path") if lora_path is None else ("lora_path", "lora_name")
        raise QueryError.single(
            "lora_incomplete",
            f"{given} is given without {missing}; vLLM keys a LoRA request by its name and its path "
            f"(LoRARequest.lora_name, .lora_path): pass both, or neither for a request without LoRA",
            missing,
        )
    if lora_name is not None and lora_path is not None:
        if not _text("lora_path", lora_path):
            raise QueryError.single(
                "empty_lora_path", "lora_path is empty; vLLM refuses a LoRARequest without a path", "lora_path"
            )
        _text("lora_name", lora_name)
        lora = ("lora", _fresh(lora_name), _fresh(lora_path))
    salt = _fresh(_text("cache_salt", cache_salt)) if cache_salt is not None else ""
    items = _mm_features(mm_features)
    fn = hash_function(algorithm)
    parent = fn(_fresh(seed_text))
    out: list[bytes] = []
    for start in range(0, len(tokens) - p - h + 1, h):
        end = start + h
        keys: list[Any] = [lora] if lora is not None else []
        keys += [("mm", f.identifier, f.offset - start)
                 for f in items if f.offset < end + p and f.offset + f.length > start]
        if start == 0 and salt:
            keys.append(("cache_salt", salt))
        extra: Any = tuple(keys) if keys else None
        if p:
            extra = (extra, *tokens[end : end + p])
        parent = fn((parent, tuple(tokens[start:end]), extra))
        out.append(parent)
    return out
