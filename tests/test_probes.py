"""Example table for kvgeom.probes and the lazy lookup: one comment per row."""

from __future__ import annotations

import numpy as np
import pytest

import kvgeom
from kvgeom.errors import QueryError
from kvgeom.hits import lookup_hit
from kvgeom.probes import as_probe
from kvgeom.residency import make_offload_key

SEED = kvgeom.resolve(kvgeom.DEFAULT_CONFIG)  # FA 16 + Mamba 16, TP 2 / DCP 2: C = 32 and 16, H = 16
SWA = kvgeom.resolve({
    "groups": [{"kind": "full_attention", "block_size": 16},
               {"kind": "sliding_window", "block_size": 16, "sliding_window": 40}],
    "cache": {"retention_interval": None},
    "offload": {},
})


class Untouchable(frozenset):
    """A set that may be asked about members but never walked as a whole."""

    def __iter__(self):
        raise AssertionError("the lookup walked the whole stored set")


def test_a_set_store_is_read_only_at_the_probed_keys():
    # 32k-token request, 75% stored: the lookup asks ~770 keys and never iterates either set
    n = 32768
    stored = {0: Untouchable(range(32, 24577, 32)), 1: Untouchable(range(16, 24577, 16))}
    assert lookup_hit(SEED, n, stored=stored).end_token == 24576


def test_probes_stop_at_the_first_full_attention_miss():
    # attention chunk 2 (end 96) missing: chunks 1, 2, 3 asked, then Mamba at the candidate 64 only
    asked = []

    def contains(g, e):
        asked.append((g, e))
        return e != 96

    assert lookup_hit(SEED, 1000, stored=contains).end_token == 64
    assert asked == [(0, 32), (0, 64), (0, 96), (1, 64)]


def test_a_long_request_with_few_keys_still_jumps_over_misses():
    # a set store is sorted only after a run of misses: an int64-sized request stays cheap
    assert lookup_hit(SWA, 2**62, stored={0: {16, 32, 48, 64}, 1: {16, 32, 48, 64}}).end_token == 64
    # a Residency is bounded by the request's chain: the scan starts at the chain's end
    chain = [b"h%d" % i for i in range(2**20)]
    r = kvgeom.Residency()
    for i in range(4):
        r.add(0, chain[i])
        r.add(1, chain[i])
    assert lookup_hit(SWA, 2**20 * 16, stored=r, block_hashes=chain).end_token == 64


def test_bool_chunk_masks():
    # entry j: the key ending at (j + 1) * C of the group; the Mamba key at 64 missing -> the one at 48
    masks = {0: np.array([True, True, True]), 1: np.array([True, True, True, False])}
    assert lookup_hit(SEED, 65, stored=masks).end_token == 48
    # and the same held keys as end tokens
    assert lookup_hit(SEED, 65, stored={0: [32, 64, 96], 1: [16, 32, 48]}).end_token == 48


STORE_ERRORS = [
    # a Residency without the request's hash chain
    (lambda: lookup_hit(SEED, 64, stored=kvgeom.Residency()), "missing_block_hashes"),
    # a hash chain given for a store that already names end tokens
    (lambda: lookup_hit(SEED, 64, stored={0: [32]}, block_hashes=[b"x"]), "unexpected_block_hashes"),
    # something that is no store at all
    (lambda: lookup_hit(SEED, 64, stored=42), "bad_stored"),
    # a two-dimensional bool array (that is the batch form)
    (lambda: lookup_hit(SEED, 64, stored={0: np.ones((1, 2), dtype=bool)}), "bad_stored"),
    # a list value is still checked in full: an end token off the hash grid
    (lambda: lookup_hit(SEED, 64, stored={1: [20]}), "not_on_hash_grid"),
    # a group that is not offloaded
    (lambda: lookup_hit(SEED, 64, stored={5: {16}}), "group_not_offloaded"),
]


@pytest.mark.parametrize(("call", "code"), STORE_ERRORS)
def test_bad_stores(call, code):
    with pytest.raises(QueryError) as info:
        call()
    assert info.value.code == code


def test_a_pending_lookup_answer_is_refused_not_guessed():
    class Pending:
        name = "HIT_PENDING"

    class Manager:
        def lookup(self, key, req_context):
            return Pending()

    with pytest.raises(QueryError) as info:
        lookup_hit(SEED, 64, stored=Manager(), block_hashes=[b"a", b"b", b"c", b"d"])
    assert info.value.code == "lookup_not_ready"


def test_as_probe_returns_a_probe_unchanged():
    p = as_probe(SEED, {1: {16}})
    assert as_probe(SEED, p) is p


# The eagle pair probe (kvgeom.probes.eagle_pair_held): chunk end e is held iff the chunks ending at e and
# e + C are both held and e + C <= stop. FA 16 alone, offloaded: C = 16.
FA_ONLY = kvgeom.resolve({"groups": [{"kind": "full_attention", "block_size": 16}], "offload": {}})


@pytest.mark.parametrize(
    ("held", "stop", "pairs"),
    [
        ([16, 32, 64], 64, [16]),  # 16 pairs with 32; 32 has no 48; 64 has no 80
        ([16, 32, 48, 64], 64, [16, 32, 48]),  # every chunk pairs with the next, up to stop
        ([16, 32, 48, 64], 48, [16, 32]),  # 48's partner 64 is past stop 48
        ([16, 32], 32, [16]),  # the partner may end exactly at stop
        ([16, 32], 31, []),  # ... but not past it
        ([32, 64], 64, []),  # no two consecutive chunks held: no pair
    ],
)
def test_eagle_pair_held(held, stop, pairs):
    from kvgeom.probes import eagle_pair_held

    probe = eagle_pair_held(as_probe(FA_ONLY, {0: held}), 16, stop)
    assert [e for e in range(16, 81, 16) if probe.contains(0, e)] == pairs
    assert not probe.contains(0, 24)  # off the chunk grid: never held


# ------------------------------------------------ a tier that answers "pending" (issue 19, item 4)
# Rows run through vLLM 0.33's OffloadingConnectorScheduler.get_num_new_matched_tokens over a tier answering
# exactly these keys (kvgeom.conformance.vllm_pending): every key of the request held except the ones listed.
# None: vLLM defers the request (kvgeom: lookup_not_ready).
_SWA = kvgeom.resolve({"groups": [{"kind": "full_attention", "block_size": 16},
                                  {"kind": "sliding_window", "block_size": 16, "sliding_window": 32}],
                       "offload": {}, "cache": {"retention_interval": None}})
_TAIL = kvgeom.resolve({"groups": [{"kind": "full_attention", "block_size": 16}, {"kind": "mamba", "block_size": 16}],
                        "cache": {"prefix_match_unit": 8, "retention_interval": None}, "offload": {}})


class _Answer:
    def __init__(self, name):
        self.name = name


class _TriState:
    """An offload manager answering by (group, end token) of the request's chain; HIT where not listed."""

    def __init__(self, chain, H, answers):
        self.index = {h: (i + 1) * H for i, h in enumerate(chain)}
        self.answers = answers

    def lookup(self, key, req_context):
        from kvgeom.residency import split_offload_key

        block_hash, group = split_offload_key(key)
        return _Answer(self.answers.get(str(group), {}).get(self.index[block_hash], "HIT"))


PENDING_ROWS = [
    # a miss below a pending key cancels it: the window scan goes on and loads the run 144-160
    ("swa-cancelled", _SWA, 200, {"1": {192: "HIT_PENDING", 176: "MISS"}}, 160),
    # a pending key inside the run the scan returns: deferred
    ("swa-in-run", _SWA, 200, {"1": {176: "HIT_PENDING"}}, None),
    ("swa-in-later-run", _SWA, 200, {"1": {192: "MISS", 160: "HIT_PENDING"}}, None),
    # RETRY breaks the run but defers whatever the scan finds
    ("swa-retry", _SWA, 200, {"1": {192: "RETRY"}}, None),
    # full attention: a pending or retried key before the first miss defers (and does not lower the candidate)
    ("fa-pending", _SWA, 200, {"0": {32: "HIT_PENDING"}}, None),
    ("fa-pending-then-miss", _SWA, 200, {"0": {32: "HIT_PENDING", 64: "MISS"}}, None),
    # ... one past the first miss is never asked
    ("fa-retry-past-miss", _SWA, 200, {"0": {48: "RETRY", 32: "MISS"}}, 16),
    # the window group's misses lower the candidate below the pending key: every group is asked again, and
    # full attention no longer reaches it (pending 176, candidate 160); a pending 160 is still inside
    ("fa-cancelled-by-window", _SWA, 200, {"0": {176: "HIT_PENDING"}, "1": {192: "MISS", 176: "MISS"}}, 160),
    ("fa-retry-cancelled", _SWA, 200, {"0": {176: "RETRY"}, "1": {192: "MISS", 176: "MISS"}}, 160),
    ("fa-still-inside", _SWA, 200, {"0": {160: "HIT_PENDING"}, "1": {192: "MISS", 176: "MISS"}}, None),
    # partial tails (H = 8): a pending boundary key is no tail; the complete hit stands ...
    ("tail-pending", _TAIL, 100, {"0": {96: "MISS"}, "1": {88: "HIT_PENDING"}}, 80),
    # ... and defers only when the complete-chunk hit is 0 or the complete hit itself is pending
    ("tail-all-pending", _TAIL, 100, {"1": {88: "HIT_PENDING", 96: "HIT_PENDING"}}, None),
    ("tail-complete-pending", _TAIL, 100, {"0": {80: "MISS"}, "1": {64: "HIT_PENDING", 72: "HIT_PENDING"}}, None),
]


@pytest.mark.parametrize(("name", "geom", "n", "answers", "hit"), PENDING_ROWS, ids=[r[0] for r in PENDING_ROWS])
def test_a_tier_that_answers_pending_is_read_as_vllm_reads_it(name, geom, n, answers, hit):
    chain = [b"p%015d" % i for i in range(n // geom.hash_block_size)]
    tier = _TriState(chain, geom.hash_block_size, answers)
    if hit is None:
        with pytest.raises(QueryError) as info:
            lookup_hit(geom, n, stored=tier, block_hashes=chain)
        assert info.value.code == "lookup_not_ready"
    else:
        assert lookup_hit(geom, n, stored=tier, block_hashes=chain).hit_tokens == hit


class _Asked(_TriState):
    """:class:`_TriState` recording each call's group, end token and req_context."""

    def __init__(self, chain, H, answers):
        super().__init__(chain, H, answers)
        self.calls = []

    def lookup(self, key, req_context):
        from kvgeom.residency import split_offload_key

        block_hash, group = split_offload_key(key)
        self.calls.append((group, self.index[block_hash], req_context))
        return super().lookup(key, req_context)


def test_a_tape_replays_its_record_while_the_keys_match_then_asks_the_tier():
    """kvgeom.probes.Tape's contract (its docstring): recorded answers come back, without a call, while the
    keys asked are the recorded ones in order; from the first call that differs, every call goes to the tier,
    with the request's req_context, even where a later recorded key comes up again."""
    from kvgeom.probes import Tape, arm

    chain = [b"t%015d" % i for i in range(8)]
    tier = _Asked(chain, 16, {"0": {32: "MISS"}})
    probe = as_probe(_SWA, tier, block_hashes=chain, req_context="ctx")
    tape = arm(probe)
    assert isinstance(tape, Tape)
    assert (probe.contains(0, 16), probe.contains(0, 32), probe.contains(0, 48)) == (True, False, True)
    tape.replaying()
    tier.calls.clear()
    assert (probe.state(0, 16), probe.state(0, 32)) == ("hit", "miss")  # replayed: the tier is not asked
    assert tier.calls == []
    assert probe.state(1, 48) == "hit"  # the recorded third call was (0, 48): the tier is asked from here
    assert probe.state(0, 48) == "hit"  # ... and stays asked, though (0, 48) was recorded
    assert tier.calls == [(1, 48, "ctx"), (0, 48, "ctx")]


def _passed_in(form, tier, chain):
    """A probe over ``tier`` built by the caller: by hash chain, by per-group offload keys (with the chain for the
    partial-tail keys), or a RecordingProbe around the chain form."""
    from kvgeom.probes import RecordingProbe

    if form == "chain":
        return as_probe(_TAIL, tier, block_hashes=chain, req_context=7)
    if form == "keys":
        keys = [[make_offload_key(chain[2 * j + 1], g) for j in range(len(chain) // 2)] for g in (0, 1)]
        return as_probe(_TAIL, tier, offload_keys=keys, block_hashes=chain, req_context=7)
    return RecordingProbe(as_probe(_TAIL, tier, block_hashes=chain, req_context=7))


@pytest.mark.parametrize("form", ["chain", "keys", "recording"])
def test_a_probe_passed_in_is_given_back_untaped(form):
    """A probe a caller built over a manager and passed to lookup_hit answers as before afterwards (the lookup
    tapes it and unsettles it only inside its own walks): a pending key read through contains() counts as held
    and marks the probe unsettled (no exception), a partial-tail key too, state() asks the tier with the
    request's req_context, and a second lookup over it gives the same answer as the first."""
    chain = [b"u%015d" % i for i in range(12)]
    # the PENDING_ROWS row tail-pending (run on vLLM 0.33): the complete-chunk hit 80 stands
    tier = _Asked(chain, 8, {"0": {96: "MISS"}, "1": {88: "HIT_PENDING"}})
    probe = _passed_in(form, tier, chain)
    first = lookup_hit(_TAIL, 100, stored=probe, block_hashes=chain)
    assert first.hit_tokens == 80
    assert lookup_hit(_TAIL, 100, stored=probe, block_hashes=chain) == first
    assert probe.contains(1, 88) is True and probe.unsettled  # an off-grid (partial-tail) key: the tail probe
    assert probe.contains(1, 96) is True
    tier.calls.clear()
    assert probe.state(1, 88) == "pending" and tier.calls == [(1, 88, 7)]
    assert {ctx for *_, ctx in tier.calls} == {7}


def test_an_unsettled_answer_read_directly_marks_a_keys_probe_unsettled():
    """Probe.unsettled (its docstring): whether the tier answered HIT_PENDING or RETRY for a key asked so far,
    through contains() as through state(), per-group keys (_KeysProbe) as the chain form."""
    chain = [b"v%015d" % i for i in range(8)]
    keys = [[make_offload_key(chain[2 * j + 1], g) for j in range(4)] for g in (0, 1)]
    for ask in ("contains", "forward"):
        probe = as_probe(_TAIL, _Asked(chain, 8, {"0": {32: "RETRY"}}), offload_keys=keys, block_hashes=chain)
        assert not probe.unsettled
        if ask == "contains":
            assert probe.contains(0, 32) is True  # counts as held outside a lookup's walks
        else:
            assert probe.forward(0, 16, 0, 64) == 4  # the scan goes on past it
        assert probe.unsettled


@pytest.mark.parametrize("form", ["chain", "keys"])
@pytest.mark.parametrize("walk", ["settled", "pending", "mamba"])
def test_an_unknown_answer_is_refused_naming_the_key(form, walk):
    """An answer that is none of HIT, MISS, HIT_PENDING, RETRY is refused (lookup_not_ready) with the offload key
    it answered named, in the settled walk (the attention prefix scan, or the Mamba key asked alone) and in the
    walk by vLLM's rules (after a RETRY), either key form."""
    chain = [b"w%015d" % i for i in range(12)]
    answers = {"settled": {"0": {48: "MAYBE"}}, "pending": {"0": {16: "RETRY", 48: "MAYBE"}},
               # attention held to 96; the Mamba key at the candidate 96 is the first of group 1 asked
               "mamba": {"1": {96: "MAYBE"}}}[walk]
    tier = _Asked(chain, 8, answers)
    if form == "chain":
        stored = {"stored": tier}
    else:
        keys = [[make_offload_key(chain[2 * j + 1], g) for j in range(6)] for g in (0, 1)]
        stored = {"stored": tier, "offload_keys": keys}
    with pytest.raises(QueryError) as info:
        lookup_hit(_TAIL, 100, block_hashes=chain, **stored)
    assert info.value.code == "lookup_not_ready"
    key = make_offload_key(chain[11], 1) if walk == "mamba" else make_offload_key(chain[5], 0)
    assert repr(key) in info.value.problems[0].message


def test_a_partial_tail_key_without_a_chain_names_the_group_end_and_chunk():
    """A per-group-keys probe built without block_hashes (a geometry without partial tails) asked directly for a
    key off a group's chunk grid refuses it (missing_block_hashes), naming the group, the end token and C."""
    probe = as_probe(SEED, KeyTier(), offload_keys=SEED_KEYS)
    for ask in (probe.contains, probe.state):
        with pytest.raises(QueryError) as info:
            ask(1, 8)
        assert info.value.code == "missing_block_hashes"
        message = info.value.problems[0].message
        assert "group 1 ending at token 8" in message and "C=16" in message


class _TwoHits:
    """A manager answering with two distinct objects named HIT (first for the first key asked, the second after),
    RETRY or MISS as listed by offload key, recording each call."""

    MISS = _Answer("MISS")  # one object: once read by name, later misses take the remembered-object path

    def __init__(self, answers):
        self.answers, self.asked, self.contexts = answers, [], set()
        self.hits = (_Answer("HIT"), _Answer("HIT"))

    def lookup(self, key, req_context):
        self.asked.append(key)
        self.contexts.add(req_context)
        name = self.answers.get(key, "HIT")
        if name == "MISS":
            return self.MISS
        return self.hits[len(self.asked) > 1] if name == "HIT" else _Answer(name)


@pytest.mark.parametrize("case", ["runs-after-a-slow-hit", "miss-then-retry", "miss-right-after-a-slow-hit"])
def test_a_taped_prefix_scan_over_per_group_keys_replays_every_key(case):
    """The tape records a prefix scan's run of HIT answers as one entry: after an answer read by name (a new HIT
    object), the run restarts at the next key, and the answer that ends a scan is recorded too, so the walk by
    vLLM's rules replays every key and the tier is asked each key of it once (the keys the chain form asks, the
    one pinned on vLLM by the pending-trace rows)."""
    chain = [b"x%015d" % i for i in range(12)]
    keys = [[make_offload_key(chain[2 * j + 1], g) for j in range(6)] for g in (0, 1)]
    if case == "runs-after-a-slow-hit":
        listed = {keys[0][4]: "RETRY"}  # attention chunks 0-3 held (one HIT object, then another), chunk 4 retried
    elif case == "miss-then-retry":
        listed = {keys[0][3]: "MISS", keys[1][2]: "RETRY"}  # the attention scan ends on a miss; Mamba retried later
    else:  # the miss comes right after the second HIT object's first answer (an empty run before it)
        listed = {keys[0][2]: "MISS", **{k: "RETRY" for k in keys[1]}}
    for _ in range(2):  # the second time, the miss that ends the attention scan is the remembered MISS object
        by_chain, by_keys = _TwoHits(listed), _TwoHits(listed)
        outcomes = []
        for tier, form in ((by_chain, {}), (by_keys, {"offload_keys": keys})):
            try:
                outcomes.append(lookup_hit(_TAIL, 100, stored=tier, block_hashes=chain, req_context=3, **form))
            except QueryError as e:
                outcomes.append(e.code)
        assert outcomes[0] == outcomes[1]
        assert by_keys.asked == by_chain.asked
        assert by_keys.contexts == by_chain.contexts == {3}


def test_an_unknown_lookup_answer_is_refused():
    chain = [b"p%015d" % i for i in range(4)]
    with pytest.raises(QueryError) as info:
        lookup_hit(SEED, 64, stored=_TriState(chain, 16, {"0": {32: "MAYBE"}}), block_hashes=chain)
    assert info.value.code == "lookup_not_ready" and "HIT_PENDING" in info.value.problems[0].message


@pytest.mark.parametrize(("name", "geom", "n", "answers", "hit"), PENDING_ROWS, ids=[r[0] for r in PENDING_ROWS])
def test_a_lookup_trace_over_a_pending_tier_answers_as_lookup_hit(name, geom, n, answers, hit):
    """The trace's recording probe forwards the tier's pending/retry answers, so it defers or loads exactly as
    :func:`lookup_hit` does (a recorder that hid them would count a pending key as held and never re-ask)."""
    from kvgeom.hits import lookup_trace

    chain = [b"p%015d" % i for i in range(n // geom.hash_block_size)]
    tier = _TriState(chain, geom.hash_block_size, answers)
    if hit is None:
        with pytest.raises(QueryError) as info:
            lookup_trace(geom, n, stored=tier, block_hashes=chain)
        assert info.value.code == "lookup_not_ready"
        probes = info.value.probes  # a deferred trace travels with the error
    else:
        trace = lookup_trace(geom, n, stored=tier, block_hashes=chain)
        assert trace.hit.hit_tokens == hit
        probes = trace.probes
    unsettled = {(int(g), e) for g, row in answers.items() for e, a in row.items() if a != "MISS"}
    # the trace is the walk by vLLM's rules for pending answers (asked through state()): an unsettled key is
    # listed as not held, never as the held key the settled walk before it counted it as
    met = [p for p in probes if (p.group, p.end_token) in unsettled]
    assert not any(p.held for p in met), probes


class KeyTier:
    """An offload manager's lookup(key, req_context) over a set of keys; records what it is asked."""

    def __init__(self, keys=()):
        self.keys, self.asked = set(keys), []

    def lookup(self, key, req_context):
        self.asked.append(key)
        return key in self.keys


# vLLM's per-group offload keys of a 128-token request on the seed: group 0 C = 32 (4 keys), group 1 C = 16 (8)
SEED_KEYS = [[b"a%d" % j for j in range(4)], [b"m%d" % j for j in range(8)]]
# a geometry whose first group's chunk (2048) no 1k request fills: the lookup exits before any probe
BIG = kvgeom.resolve({"groups": [{"kind": "full_attention", "block_size": 64}] * 3
                      + [{"kind": "mamba", "block_size": 2048}], "parallel": {"tp": 8, "dcp": 8}, "offload": {}})
TAIL = kvgeom.resolve({"groups": [{"kind": "full_attention", "block_size": 16}, {"kind": "mamba", "block_size": 16}],
                       "cache": {"prefix_match_unit": 8, "retention_interval": None}, "offload": {}})


def test_per_group_offload_keys_are_read_not_built():
    # attention chunks 0-2 held (ends 32, 64, 96), Mamba state at 96: hit 96 of a 128-token request
    tier = KeyTier({b"a0", b"a1", b"a2", b"m5"})
    assert lookup_hit(SEED, 128, stored=tier, offload_keys=SEED_KEYS).end_token == 96
    # the keys asked are the caller's own objects, in vLLM's order: the attention prefix to its first miss
    # (a3, the chunk covering the candidate 112), then the Mamba key at the new candidate 96
    assert tier.asked == [b"a0", b"a1", b"a2", b"a3", b"m5"]
    assert all(any(k is own for keys in SEED_KEYS for own in keys) for k in tier.asked)
    # a mapping {group: keys} and a tuple answer the same
    assert lookup_hit(SEED, 128, stored=tier, offload_keys={0: SEED_KEYS[0], 1: SEED_KEYS[1]}).end_token == 96
    assert lookup_hit(SEED, 128, stored=tier, offload_keys=tuple(SEED_KEYS)).end_token == 96
    # keys past a group's list are not held (a request whose lists stop at 64 tokens)
    short = [SEED_KEYS[0][:2], SEED_KEYS[1][:4]]
    assert lookup_hit(SEED, 128, stored=tier, offload_keys=short).end_token == 0  # no Mamba state at or before 64


KEYS_ERRORS = [
    # offload_keys with a store that has no lookup(key, req_context)
    (lambda: lookup_hit(SEED, 128, stored=kvgeom.Residency(), offload_keys=SEED_KEYS), "unexpected_offload_keys"),
    # not a per-group collection
    (lambda: lookup_hit(SEED, 128, stored=KeyTier(), offload_keys=42), "bad_offload_keys"),
    (lambda: lookup_hit(SEED, 128, stored=KeyTier(), offload_keys=b"a0"), "bad_offload_keys"),
    # no entry for group 1
    (lambda: lookup_hit(SEED, 128, stored=KeyTier(), offload_keys=[SEED_KEYS[0]]), "bad_offload_keys"),
    (lambda: lookup_hit(SEED, 128, stored=KeyTier(), offload_keys={0: SEED_KEYS[0]}), "bad_offload_keys"),
    # a group's entry is not a list of keys (read when the lookup reaches it)
    (lambda: lookup_hit(SEED, 128, stored=KeyTier({b"a0"}), offload_keys=[SEED_KEYS[0], 7]), "bad_offload_keys"),
    # ... refused even when the request is too short for any hit (the early exit still checks the store)
    (lambda: lookup_hit(BIG, 1024, stored=KeyTier(), offload_keys=[[]] * 3), "bad_offload_keys"),
    (lambda: lookup_hit(BIG, 1024, stored=object(), offload_keys=[[]] * 4), "unexpected_offload_keys"),
    (lambda: lookup_hit(BIG, 1024, stored=kvgeom.Residency()), "missing_block_hashes"),
    # partial tails end off the chunk grid: that key needs the hash chain as well
    (lambda: lookup_hit(TAIL, 40, stored=KeyTier(), offload_keys=[[b"x"], [b"y"]]), "missing_block_hashes"),
]


@pytest.mark.parametrize(("call", "code"), KEYS_ERRORS)
def test_bad_offload_keys(call, code):
    with pytest.raises(QueryError) as info:
        call()
    assert info.value.code == code


def test_a_pending_answer_is_refused_through_per_group_keys_too():
    class Pending:
        name = "HIT_PENDING"

    class Tier:
        def lookup(self, key, req_context):
            return Pending()

    with pytest.raises(QueryError) as info:
        lookup_hit(SEED, 128, stored=Tier(), offload_keys=SEED_KEYS)
    assert info.value.code == "lookup_not_ready"




@pytest.mark.parametrize(("name", "geom", "n", "answers", "hit"), PENDING_ROWS, ids=[r[0] for r in PENDING_ROWS])
def test_a_pending_tier_reads_the_same_through_per_group_keys(name, geom, n, answers, hit):
    """The vLLM pending rows through a connector's own per-group keys (``offload_keys=``) defer or load as
    through the hash chain: the keys probe reads HIT_PENDING / RETRY by vLLM's rules too."""
    H = geom.hash_block_size
    chain = [b"p%015d" % i for i in range(n // H)]
    keys = [[] for _ in range(max(og.index for og in geom.offload.groups) + 1)]
    for og in geom.offload.groups:
        hpc = og.hashes_per_chunk
        keys[og.index] = [make_offload_key(chain[(j + 1) * hpc - 1], og.index) for j in range(len(chain) // hpc)]
    tail = {"block_hashes": chain} if geom.offload.supports_partial_tail else {}
    tier = _TriState(chain, H, answers)
    if hit is None:
        with pytest.raises(QueryError) as info:
            lookup_hit(geom, n, stored=tier, offload_keys=keys, **tail)
        assert info.value.code == "lookup_not_ready"
    else:
        assert lookup_hit(geom, n, stored=tier, offload_keys=keys, **tail).hit_tokens == hit


# Rows for the mutation run of kvgeom.probes (issue 19, docs/mutation.md): what each check names.
STORE_PROBLEMS = [
    # an end token off the H grid: the problem names the group's key, its end token and H
    (lambda: lookup_hit(SEED, 64, stored={1: [20]}), "not_on_hash_grid", "stored.1",
     {"end_token": 20, "hash_block_size": 16}),
    # a key that is not a group index: the problem names the stored mapping
    (lambda: lookup_hit(SEED, 64, stored={"x": [16]}), "bad_group_key", "stored", {}),
    # a 2-D integer array is not a list of end tokens (the batch form is a bool matrix)
    (lambda: lookup_hit(SEED, 64, stored={1: np.array([[16, 32]])}), "bad_stored", "stored.1", {}),
    # a Residency with a string (not a sequence of hashes) for a chain
    (lambda: lookup_hit(SEED, 64, stored=kvgeom.Residency(), block_hashes="abcd"), "bad_block_hashes",
     "block_hashes", {}),
    # ... or an int
    (lambda: lookup_hit(SEED, 64, stored=kvgeom.Residency(), block_hashes=5), "bad_block_hashes", "block_hashes", {}),
    # a stored range past sys.maxsize: refused by its size, shown as "more than" int64
    (lambda: lookup_hit(SEED, 64, stored={1: range(16, 2**70, 16)}), "too_many_stored", "stored.1",
     {"count": 2**63, "limit": 1 << 20}),
    # one end token past the bound
    (lambda: lookup_hit(SEED, 64, stored={1: range(16, 16 * ((1 << 20) + 2), 16)}), "too_many_stored", "stored.1",
     {"count": (1 << 20) + 1, "limit": 1 << 20}),
    # an end token that is not an int: the problem names the group's end tokens
    (lambda: lookup_hit(SEED, 64, stored={1: [16, "32"]}), "not_an_integer", "stored.1 end token", {}),
    # 0 is no key's end token (keys end on positive multiples of H)
    (lambda: lookup_hit(SEED, 64, stored={1: [0, 16]}), "not_on_hash_grid", "stored.1", {"end_token": 0}),
    # a range of exactly int64-max end tokens is counted, not described
    (lambda: lookup_hit(SEED, 64, stored={1: range(2**63 - 1)}), "too_many_stored", "stored.1",
     {"count": 2**63 - 1}),
    # a geometry without offloading has no tier to ask, whatever the store form
    (lambda: as_probe(kvgeom.resolve({"groups": [{"kind": "mla", "block_size": 64}]}), {0: [64]}),
     "no_offload", "offload", {}),
    (lambda: as_probe(kvgeom.resolve({"groups": [{"kind": "mla", "block_size": 64}]}), lambda g, e: True),
     "no_offload", "offload", {}),
    # a hash chain shorter than the request: 1 hash for 64 tokens of H = 16
    (lambda: lookup_hit(SEED, 64, stored=kvgeom.Residency(), block_hashes=[b"a"]), "block_hashes_too_short",
     "block_hashes", {"num_hashes": 1, "needed": 4}),
]


@pytest.mark.parametrize(("call", "code", "field", "values"), STORE_PROBLEMS)
def test_store_problems_name_the_field_and_numbers(call, code, field, values):
    with pytest.raises(QueryError) as info:
        call()
    (problem,) = info.value.problems
    assert (problem.code, problem.field) == (code, field)
    assert {k: problem.values.get(k) for k in values} == values


def test_stored_bounds_and_array_forms():
    from kvgeom.probes import MAX_STORED_ENDS

    # exactly MAX_STORED_ENDS end tokens are checked and read
    ends = range(16, 16 * (MAX_STORED_ENDS + 1), 16)
    assert lookup_hit(SEED, 65, stored={0: [32, 64], 1: ends}).end_token == 64
    # a 1-D integer array is a list of end tokens
    assert lookup_hit(SEED, 65, stored={0: np.array([32, 64]), 1: np.array([16, 32, 48])}).end_token == 48
    # a range past sys.maxsize is described, not printed
    with pytest.raises(QueryError) as info:
        lookup_hit(SEED, 64, stored={1: range(16, 2**70, 16)})
    assert "more than 9223372036854775807 end tokens" in str(info.value)
    with pytest.raises(QueryError) as info:
        lookup_hit(SEED, 64, stored={1: range(2**63 - 1)})
    assert "lists 9223372036854775807 end tokens" in str(info.value)
    with pytest.raises(QueryError) as info:
        lookup_hit(SEED, 64, stored={1: range(16, 16 * ((MAX_STORED_ENDS) + 2), 16)})
    assert f"lists {MAX_STORED_ENDS + 1} end tokens" in str(info.value)
    # every checked end token is read, a plain or numpy int alike (the fast path and the loop agree)
    assert lookup_hit(SEED, 65, stored={0: [32, np.int64(64)], 1: [16, 32, 48]}).end_token == 48


def test_an_event_of_keys_refuses_a_key_vllm_could_not_emit_as_one_key_does():
    """Residency.add_keys (one pass per event) and add_key refuse the same keys: a 5-byte key (a 1-byte hash)
    is no vLLM 0.33 offload key (issue 19), whichever way it arrives."""
    good = make_offload_key(b"h" * 16, 0)
    for call in (lambda r: r.add_key(b"h" + bytes(4)), lambda r: r.add_keys([good, b"h" + bytes(4)]),
                 lambda r: r.discard_keys([b"h" + bytes(4)])):
        with pytest.raises(QueryError) as info:
            call(kvgeom.Residency())
        assert info.value.code == "bad_offload_key"
