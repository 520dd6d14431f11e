"""Laws of kvgeom.compat: symmetry, reflexivity, agreement with the fingerprint."""

from __future__ import annotations

from _layout_strategies import layouts, mutate, relevant_mutations
from hypothesis import given
from hypothesis import strategies as st

import kvgeom
from kvgeom.compat import compat
from kvgeom.fingerprint import fingerprint


@given(cfg=layouts())
def test_geometry_is_compatible_with_itself(cfg):
    g = kvgeom.resolve(cfg)
    r = compat(g, cfg)
    assert r.compatible and r.exit_code == 0
    assert all(x.compatible for x in r.groups) and not r.reasons


@given(a=layouts(), b=layouts())
def test_compat_is_symmetric(a, b):
    ab, ba = compat(a, b), compat(b, a)
    assert ab.compatible == ba.compatible
    assert [r.code for r in ab.reasons] == [r.code for r in ba.reasons]
    assert [[r.code for r in g.reasons] for g in ab.groups] == [[r.code for r in g.reasons] for g in ba.groups]


@given(cfg=layouts(), choice=st.integers(0, 100))
def test_compat_agrees_with_fingerprint_and_explains_every_difference(cfg, choice):
    options = relevant_mutations(cfg)
    other = mutate(cfg, options[choice % len(options)])
    r = compat(cfg, other)
    assert r.compatible == (fingerprint(cfg) == fingerprint(other))
    assert not r.compatible
    explained = list(r.reasons) + [x for g in r.groups for x in g.reasons]
    assert explained and all(x.remedy for x in explained)
    assert all(x.code != "layout" for x in explained)  # every difference has a specific reason
