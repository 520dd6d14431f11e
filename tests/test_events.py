"""KV events reader (kvgeom.events): example tables.

Event shapes follow vLLM 0.33 ``distributed/kv_events.py``: msgspec encodes each event as a map
tagged ``"type"`` (``omit_defaults`` drops ``group_idx`` & co. when None) and a batch as the
array ``[ts, events, data_parallel_rank]``; JSON encodes hash bytes as base64 strings.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

import kvgeom
from kvgeom.events import KVEventError, KVEventReader, vllm_spec_kinds

DEFAULT = kvgeom.resolve(kvgeom.DEFAULT_CONFIG)  # attention span 32 (block 16 x DCP 2), Mamba 16, H = 16


def stored(hashes, block_size, group=0, medium="GPU", **kw: Any) -> dict[str, Any]:
    ev = {"type": "BlockStored", "block_hashes": list(hashes), "parent_block_hash": None,
          "token_ids": list(range(len(hashes) * block_size)), "block_size": block_size, "lora_id": None,
          "medium": medium, "lora_name": None}
    if group is not None:
        ev["group_idx"] = group
    ev.update(kw)
    return ev


def removed(hashes, group=0, medium="GPU") -> dict[str, Any]:
    return {"type": "BlockRemoved", "block_hashes": list(hashes), "medium": medium, "group_idx": group}


@dataclass
class BlockStored:
    """A stand-in with vLLM's class name and fields (kvgeom's tests never import vLLM)."""

    block_hashes: list[Any]
    parent_block_hash: Any
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None
    extra_keys: list[Any] | None = field(default=None)


def test_stored_dicts_become_holder_bits_per_replica_group_medium():
    r = KVEventReader(DEFAULT)
    r.apply(stored([b"h1", b"h3"], 32, group=0), replica=0)  # full attention blocks at the span
    r.apply(stored([b"h0", b"h1"], 16, group=1, medium="CPU"), replica=3)  # Mamba states, CPU tier
    gpu, cpu = r.residency("GPU"), r.residency("CPU")
    assert gpu.holders(0, b"h3") == 0b1 and gpu.holders(1, b"h0") == 0
    assert cpu.holders(1, b"h1") == 0b1000 and len(r.residency("STORAGE")) == 0
    assert r.num_events == 2


def test_vllm_event_objects_are_read_like_dicts():
    r = KVEventReader(DEFAULT)
    event = BlockStored([b"h1"], None, list(range(32)), 32, None, None, group_idx=0,
                        kv_cache_spec_kind="full_attention")
    r.apply(event)
    assert r.residency("GPU").contains(0, b"h1")  # medium None is the GPU prefix cache


def test_msgpack_batch_array_is_read_with_every_event():
    r = KVEventReader(DEFAULT)
    batch = [1.5, [stored([b"h1"], 32), stored([b"h0"], 16, group=1), {"type": "AllBlocksCleared"},
                   stored([b"h3"], 32)], 0]
    assert r.apply_batch(batch, replica=1) == 4
    # the clear dropped h1 and h0; h3 came after it
    assert list(r.residency("GPU").entries(0)) == [b"h3"] and list(r.residency("GPU").entries(1)) == []


def test_json_batch_keys_are_the_base64_strings_it_carries():
    r = KVEventReader(DEFAULT)
    r.apply_batch({"ts": 0.0, "events": [stored(["aDE=", "aDM="], 32)]}, replica=0)
    assert r.residency("GPU").contains(0, "aDM=")  # opaque: the caller's chain must use the same encoding


def test_medium_case_is_ignored_and_unknown_media_are_errors():
    r = KVEventReader(DEFAULT)
    r.apply(stored([b"h0"], 16, group=1, medium="cpu"))  # Mooncake's store worker publishes "cpu"
    assert r.residency("CPU").contains(1, b"h0")
    with pytest.raises(KVEventError) as e:
        r.apply(stored([b"h0"], 16, group=1, medium="NVME"))
    assert e.value.code == "unknown_medium" and e.value.field == "medium"
    # a reader told about the medium accepts it
    r2 = KVEventReader(DEFAULT, media=("GPU", "CPU", "STORAGE", "NVME"))
    r2.apply(stored([b"h0"], 16, group=1, medium="NVME"))
    assert r2.residency("nvme").contains(1, b"h0")


def test_missing_group_idx_reads_only_on_a_single_group_geometry():
    single = kvgeom.resolve({"groups": [{"kind": "full_attention", "block_size": 16}]})
    r = KVEventReader(single)
    r.apply(stored([b"a"], 16, group=None))
    assert r.residency().contains(0, b"a")
    with pytest.raises(KVEventError) as e:
        KVEventReader(DEFAULT).apply(stored([b"a"], 32, group=None))
    assert e.value.code == "missing_group_idx" and e.value.values["num_groups"] == 2


def test_group_outside_the_geometry_is_an_error():
    with pytest.raises(KVEventError) as e:
        KVEventReader(DEFAULT).apply(removed([b"a"], group=2))
    assert (e.value.code, e.value.field, e.value.values["group_idx"]) == ("group_out_of_range", "group_idx", 2)


def test_per_rank_block_size_under_dcp_is_refused_not_misread():
    # Dynamo #9376's failure: 16 is the per-rank block; the group's blocks stand for 32 tokens.
    with pytest.raises(KVEventError) as e:
        KVEventReader(DEFAULT).apply(stored([b"h0", b"h1"], 16, group=0))
    assert e.value.code == "block_size_mismatch" and e.value.field == "block_size"
    assert e.value.values == {"block_size": 16, "span": 32, "hash_block_size": 16, "group_idx": 0}
    assert "per-rank" in str(e.value) and "kv_cache_report_mode" in str(e.value)


def test_partial_entry_is_one_hash_at_h():
    r = KVEventReader(DEFAULT)
    r.apply(stored([b"h2"], 16, group=0))  # cache_partial_block: block_size = H, one hash
    assert r.residency().contains(0, b"h2")
    with pytest.raises(KVEventError) as e:  # two hashes of H on a span-32 group: not a partial entry
        r.apply(stored([b"h0", b"h2"], 16, group=0))
    assert e.value.code == "block_size_mismatch" and "exactly one hash" in str(e.value)


def test_offload_placeholder_block_size_zero_only_off_gpu():
    r = KVEventReader(DEFAULT)
    r.apply(stored([b"h1"], 0, group=0, medium="CPU", token_ids=[]))  # offloading/events.py placeholder
    assert r.residency("CPU").contains(0, b"h1")
    with pytest.raises(KVEventError) as e:
        r.apply(stored([b"h1"], 0, group=0, medium="GPU", token_ids=[]))
    assert e.value.code == "block_size_mismatch"


def test_spec_kind_and_sliding_window_are_checked_when_present():
    r = KVEventReader(DEFAULT)
    r.apply(stored([b"h0"], 16, group=1, kv_cache_spec_kind="mamba"))
    r.apply(stored([b"h1"], 16, group=1, kv_cache_spec_kind="unknown"))
    with pytest.raises(KVEventError) as e:  # groups swapped in the geometry
        r.apply(stored([b"h0"], 16, group=1, kv_cache_spec_kind="full_attention"))
    assert e.value.code == "spec_kind_mismatch" and e.value.field == "kv_cache_spec_kind"
    swa = kvgeom.resolve({"groups": [{"kind": "full_attention", "block_size": 16},
                                     {"kind": "sliding_window", "block_size": 16, "sliding_window": 128}]})
    r2 = KVEventReader(swa)
    r2.apply(stored([b"a"], 16, group=1, kv_cache_spec_kind="sliding_window", kv_cache_spec_sliding_window=128))
    with pytest.raises(KVEventError) as e:
        r2.apply(stored([b"a"], 16, group=1, kv_cache_spec_sliding_window=4096))
    assert e.value.code == "sliding_window_mismatch"


def test_vllm_spec_kinds_of_uniform_and_mla_groups():
    g = kvgeom.resolve({"groups": [{"kind": "mla", "block_size": 64},
                                   {"kind": "uniform", "layers": [{"kind": "full_attention"},
                                                                  {"kind": "full_attention"}], "block_size": 64}]})
    assert vllm_spec_kinds(g.groups[0]) == {"mla_attention", "unknown"}
    assert vllm_spec_kinds(g.groups[1]) == {"full_attention", "unknown"}


def test_token_ids_must_cover_whole_blocks():
    with pytest.raises(KVEventError) as e:
        KVEventReader(DEFAULT).apply(stored([b"h1"], 32, group=0, token_ids=list(range(40))))
    assert e.value.code == "token_ids_mismatch" and e.value.values["num_token_ids"] == 40


def test_duplicates_need_as_many_removals_unless_told_otherwise():
    counted, plain = KVEventReader(DEFAULT), KVEventReader(DEFAULT, count_duplicates=False)
    for r in (counted, plain):
        r.apply(stored([b"h1"], 32))
        r.apply(stored([b"h1"], 32))  # a second block cached under the same hash
        r.apply(removed([b"h1"]))
    assert counted.residency().contains(0, b"h1")  # one copy left
    assert not plain.residency().contains(0, b"h1")
    counted.apply(removed([b"h1"]))
    assert not counted.residency().contains(0, b"h1")
    counted.apply(removed([b"h1"]))  # removing what is not held is a no-op
    assert not counted.residency().contains(0, b"h1")


def test_all_blocks_cleared_empties_only_that_replicas_gpu_tier():
    r = KVEventReader(DEFAULT)
    r.apply(stored([b"h1"], 32), replica=0)
    r.apply(stored([b"h1"], 32), replica=0)  # counted twice
    r.apply(stored([b"h1"], 32), replica=1)
    r.apply(stored([b"h1"], 32, medium="CPU"), replica=0)
    r.apply({"type": "AllBlocksCleared"}, replica=0)
    assert r.residency("GPU").holders(0, b"h1") == 0b10 and r.residency("CPU").holders(0, b"h1") == 0b1
    r.apply(stored([b"h1"], 32), replica=0)
    r.apply(removed([b"h1"]), replica=0)  # the pre-clear duplicate count is gone too
    assert r.residency("GPU").holders(0, b"h1") == 0b10


def test_a_bad_event_in_a_batch_applies_nothing_and_names_its_index():
    r = KVEventReader(DEFAULT)
    batch = [0.0, [stored([b"h1"], 32), stored([b"h3"], 64)]]
    with pytest.raises(KVEventError) as e:
        r.apply_batch(batch, replica=0)
    assert e.value.field == "events[1].block_size"
    assert len(r.residency()) == 0 and r.num_events == 0


def test_unknown_event_type_and_bad_shapes_are_errors():
    r = KVEventReader(DEFAULT)
    cases = [
        ({"type": "BlockPinned", "block_hashes": []}, "unknown_event_type"),  # not a vLLM 0.33 event
        ({"block_hashes": [b"a"]}, "unknown_event_type"),  # no type tag
        (stored([[1, 2]], 32), "bad_block_hash"),  # an unhashable hash
        ({"type": "BlockRemoved", "block_hashes": b"h1", "medium": None, "group_idx": 0}, "bad_block_hashes"),
        ({**stored([b"a"], 32), "block_size": "32"}, "bad_block_size"),
        (stored([True], 32), "bad_block_hash"),  # bool is not a hash
    ]
    for event, code in cases:
        with pytest.raises(KVEventError) as e:
            r.apply(event)
        assert e.value.code == code, event
    with pytest.raises(KVEventError) as e:
        r.apply_batch("not a batch")
    assert e.value.code == "bad_batch"
    with pytest.raises(KVEventError) as e:
        r.apply(stored([b"a"], 32), replica=-1)
    assert e.value.code == "bad_replica"


def test_several_problems_of_one_event_are_reported_together():
    with pytest.raises(KVEventError) as e:
        KVEventReader(DEFAULT).apply(stored([b"a"], 32, group=7, medium="DISK"))
    assert [p.code for p in e.value.problems] == ["unknown_medium", "group_out_of_range"]


def test_replica_names_get_stable_indices_and_stream_applies_pairs():
    r = KVEventReader(DEFAULT)
    a, b = r.replica(("10.0.0.1", 0)), r.replica(("10.0.0.1", 1))
    n = r.apply_stream([(a, [stored([b"h1"], 32)]), (b, [stored([b"h1"], 32), removed([b"h1"])])])
    assert n == 3 and r.residency().holders(0, b"h1") == 0b1
    assert r.replica_names == (("10.0.0.1", 0), ("10.0.0.1", 1))


def test_cleared_media_must_be_media():
    with pytest.raises(KVEventError) as e:
        KVEventReader(DEFAULT, media=("GPU",), cleared_media=("CPU",))
    assert e.value.code == "unknown_medium" and e.value.field == "cleared_media[0]"


def test_group_not_cacheable_is_refused():
    g = kvgeom.resolve({"groups": [{"kind": "full_attention", "block_size": 16},
                                   {"kind": "circular_buffer", "block_size": 16}]})
    with pytest.raises(KVEventError) as e:
        KVEventReader(g).apply(stored([b"a"], 16, group=1))
    assert e.value.code == "group_not_cacheable"
