"""Query argument checks (``kvgeom._check``): group keys of ``kvgeom hit`` scenarios, wrong-typed arguments."""

from __future__ import annotations

import numpy as np
import pytest

import kvgeom
from kvgeom import ranks
from kvgeom._check import group_key

SEED = kvgeom.resolve(kvgeom.DEFAULT_CONFIG)

KEY_ROWS = [
    ("0", 0),  # the canonical string JSON writes
    ("12", 12),  # more than one digit
    (1, 1),  # an int (a Python dict)
    (np.int64(1), 1),  # a numpy integer
    ("0_1", None),  # int() reads it as 1: refused
    (" 1 ", None),  # int() strips the spaces: refused
    ("\u0661", None),  # ARABIC-INDIC DIGIT ONE, int() reads 1: refused
    ("01", None),  # a leading zero
    ("+1", None),  # a sign
    ("-1", None),  # negative
    (1.9, None),  # int() truncates to 1: refused
    (1.0, None),  # a float, even a whole one
    (True, None),  # a bool is not an index
    ("", None),  # empty
    ("9" * 30, None),  # past int64
    (2**63, None),  # past int64, as an int
]


@pytest.mark.parametrize(("key", "index"), KEY_ROWS)
def test_group_key(key, index):
    if index is not None:
        assert group_key("stored", key) == index
        return
    with pytest.raises(kvgeom.QueryError) as info:
        group_key("stored", key)
    assert info.value.code == "bad_group_key" and type(key).__name__ in str(info.value)


@pytest.mark.parametrize(("stored", "code"), [
    ({"0_1": [32]}, "bad_group_key"),  # read as group 1 before
    ({1.9: [16]}, "bad_group_key"),  # read as group 1 before
    ({"0": [float("inf")]}, "not_an_integer"),  # an infinite end token
    ({"0": np.array(32)}, "bad_stored"),  # a 0-d array of ends: TypeError before
    ({"0": {"32": 1}}, "bad_stored"),  # a mapping is not a list of ends
])
def test_bad_stored_in_a_scenario(stored, code):
    with pytest.raises(kvgeom.QueryError) as info:
        SEED.plan_hit({"num_tokens": 64, "stored": stored})
    assert info.value.code == code


@pytest.mark.parametrize(("position", "row", "code"), [
    ("37", [7, 9, 11], "not_an_integer"),  # a string position
    (37.0, [7, 9, 11], "not_an_integer"),  # a float position
    (37, 7, "bad_block_row"),  # an int where the row belongs: TypeError before
    (37, {"1": 9}, "bad_block_row"),  # a mapping: KeyError before
    (37, np.zeros((2, 2), dtype=np.int64), "bad_block_row"),  # a 2-D table, not one row
    (37, [7, 9.5, 11], "not_an_integer"),  # a float entry
])
def test_dcp_slot_wrong_types(position, row, code):
    with pytest.raises(kvgeom.QueryError) as info:
        ranks.dcp_slot(SEED, 0, position, row)
    assert info.value.code == code


def test_dcp_slot_takes_a_numpy_row():
    assert ranks.dcp_slot(SEED, 0, 37, np.array([7, 9, 11])) == ranks.dcp_slot(SEED, 0, 37, [7, 9, 11])
