"""Teeth: the geometry laws catch the historical bugs when the rule is broken on purpose.

Each test swaps one module-level function of kvgeom for a deliberately broken variant
(pytest's ``monkeypatch``: a test-only seam, nothing a user can set), then checks that

1. the law fails on the historical row of that bug (docs/cases/),
2. Hypothesis finds a counterexample from the generated configs, shrunk with
   :func:`kvgeom.strategies.minimal` and recorded in the docstring (the test asserts the features
   that make it a counterexample, not the exact dict: Hypothesis also seeds generation with
   constants from the loaded modules, so a full-suite run may stop at a sibling), and
3. the same counterexample passes the law once the correct rule is back.

Seams: ``kvgeom.specs._sharded_by_kind`` (the kind rule behind ``is_dcp_sharded``),
``kvgeom._resolve.groups.row_width`` and ``kvgeom._resolve.units.scheduler_block_size``.
"""

from __future__ import annotations

from typing import Any

import _laws as laws
from _laws import H49964, H50287, H50883_D2, H50883_D8, LMC4809

import kvgeom
from kvgeom import specs
from kvgeom._math import cdiv
from kvgeom._resolve import groups as resolve_groups
from kvgeom._resolve import units as resolve_units
from kvgeom.strategies import configs, minimal

# The kinds the corresponding laws draw (tests/property/test_geometry_laws.py).
UNIFORM_LAW_KINDS = ["uniform", "full_attention", "mamba"]
ROW_LAW_KINDS = ["full_attention", "mamba", "uniform", "mla"]


def fails(check):
    """A find() condition: the law raises (an assertion, or kvgeom refusing its own output)."""

    def condition(cfg: Any) -> bool:
        try:
            check(cfg)
        except (AssertionError, kvgeom.KVGeomError):
            return True
        return False

    return condition


def test_span_law_catches_49964_mamba_span_scaled_by_dcp(monkeypatch):
    """vLLM #49964: every group, Mamba included, got the DCP factor (tokens_per_block (32, 32)).

    Caught by ``test_span_is_block_times_shards_for_sharded_groups`` and
    ``test_mamba_span_is_never_scaled_by_dcp``. Minimal counterexample:
    ``{'groups': [{'block_size': 1, 'kind': 'mamba', 'num_speculative_blocks': 0}],
    'parallel': {'dcp': 2, 'tp': 2, 'cp_interleave': 1}, 'cache': {'prefix_caching': True,
    'max_model_len': 1}}`` -- one Mamba group of block 1 under DCP 2 spans 2 instead of 1.
    """
    correct = specs._sharded_by_kind

    def every_group_scaled(spec):
        return True if spec.kind == "mamba" else correct(spec)

    monkeypatch.setattr(specs, "_sharded_by_kind", every_group_scaled)
    assert [g.span for g in kvgeom.resolve(H49964).groups] == [32, 32]  # the bug's numbers
    assert fails(laws.check_span)(H49964)
    assert fails(laws.check_mamba_span)(H49964)
    cex = minimal(configs(), fails(laws.check_span))
    assert "mamba" in [g["kind"] for g in cex["groups"]] and cex["parallel"]["dcp"] >= 2
    assert fails(laws.check_mamba_span)(cex)
    monkeypatch.undo()
    laws.check_span(cex)
    laws.check_mamba_span(cex)


def test_uniform_law_catches_50883_container_not_unwrapped(monkeypatch):
    """vLLM #50883 / #53889: ``isinstance(wrapper, AttentionSpec)`` is false for the DSA wrapper, so
    the MLA + indexer container was treated as replicated (tokens_per_block 64 vs tokens_per_hash 128).

    Caught by ``test_uniform_container_span_equals_its_leaves_span`` and the span law. Minimal
    counterexample: ``{'groups': [{'block_size': 1, 'kind': 'uniform', 'layers': [{'block_size': 1,
    'kind': 'mla'}, {'block_size': 1, 'kind': 'mla', 'cache_role': 'indexer'}]}], 'parallel':
    {'dcp': 2, 'tp': 2}, ...}`` -- the container spans 1, its MLA layer alone 2.
    """
    correct = specs._sharded_by_kind

    def wrapper_not_unwrapped(spec):
        return False if spec.kind == "uniform" else correct(spec)

    monkeypatch.setattr(specs, "_sharded_by_kind", wrapper_not_unwrapped)
    assert kvgeom.resolve(H50883_D2).groups[0].span == 64
    assert kvgeom.resolve(H50883_D8).groups[0].span == 64
    for row in (H50883_D2, H50883_D8):
        assert fails(laws.check_uniform_span_equals_leaves)(row)
        assert fails(laws.check_span)(row)
    cex = minimal(configs(kinds=UNIFORM_LAW_KINDS), fails(laws.check_uniform_span_equals_leaves))
    assert "uniform" in [g["kind"] for g in cex["groups"]] and cex["parallel"]["dcp"] >= 2
    monkeypatch.undo()
    laws.check_uniform_span_equals_leaves(cex)


def _row_width_divided_by_dcp(correct, shards):
    """Model Runner V2 before #50287: every row, Mamba included, sized as cdiv(max_len, B * D)."""

    def broken(spec, span_factor, max_len, mode):
        if laws.is_mamba_group(spec) and mode != "none":
            leaves = spec.layers if spec.kind == "uniform" else [spec]
            return cdiv(max_len, spec.block_size * shards) + max(x.num_speculative_blocks for x in leaves)
        return correct(spec, span_factor, max_len, mode)

    return broken


def test_row_width_law_catches_50287_mamba_row_divided_by_dcp(monkeypatch):
    """vLLM #50287: the Mamba block-table row was cdiv(512, 32) = 16 while the scheduler hands a
    257-token request 17 Mamba blocks.

    Caught by ``test_row_widths_hold_every_block_the_scheduler_can_allocate`` and
    ``test_mamba_row_width_never_divided_by_dcp``. Minimal counterexample:
    ``{'groups': [{'block_size': 1, 'kind': 'mamba', 'num_speculative_blocks': 0}], 'parallel':
    {'dcp': 2, 'tp': 2}, 'cache': {'prefix_caching': True, 'max_model_len': 2}}`` -- Mamba row
    cdiv(2, 2) = 1 where the scheduler can allocate cdiv(2, 1) = 2 blocks.
    """
    correct = resolve_groups.row_width

    def with_broken_rows(check):
        def run(cfg):
            shards = kvgeom.load_config(cfg).parallel.kv_shards
            with monkeypatch.context() as m:
                m.setattr(resolve_groups, "row_width", _row_width_divided_by_dcp(correct, shards))
                check(cfg)

        return run

    with monkeypatch.context() as m:
        m.setattr(resolve_groups, "row_width", _row_width_divided_by_dcp(correct, 2))
        assert [x.row_width for x in kvgeom.resolve(H50287).groups] == [16, 16]  # the bug's numbers
    assert fails(with_broken_rows(laws.check_row_width_holds_scheduler_blocks))(H50287)
    assert fails(with_broken_rows(laws.check_mamba_row_width))(H50287)
    cex = minimal(configs(kinds=ROW_LAW_KINDS), fails(with_broken_rows(laws.check_row_width_holds_scheduler_blocks)))
    assert "mamba" in [g["kind"] for g in cex["groups"]] and cex["parallel"]["dcp"] >= 2
    laws.check_row_width_holds_scheduler_blocks(cex)
    laws.check_mamba_row_width(cex)


def test_scheduler_block_law_catches_lmcache_4809_cli_block_size(monkeypatch):
    """LMCache #4809: the scheduler page was the CLI ``--block-size 256`` times DCP (1024) instead of
    the lcm of the resolved spans (9216 for 2304-token pages under DCP 4).

    Caught by ``test_scheduler_block_is_lcm_and_hash_unit_divides_cacheable_spans``. Minimal
    counterexample: ``{'groups': [{'block_size': 1, 'kind': 'full_attention'}], 'parallel':
    {'dcp': 1, 'tp': 1}, ...}`` -- L = 256 where the only span is 1.
    """
    cli_block_size = 256

    def from_cli_block(groups):
        return cli_block_size * max(g.span // g.block_size for g in groups)

    monkeypatch.setattr(resolve_units, "scheduler_block_size", from_cli_block)
    assert kvgeom.resolve(LMC4809).scheduler_block_size == 1024  # the bug's number
    assert fails(laws.check_scheduler_block_and_hash_unit)(LMC4809)
    cex = minimal(configs(), fails(laws.check_scheduler_block_and_hash_unit))
    monkeypatch.undo()
    fixed = kvgeom.resolve(cex)
    assert fixed.scheduler_block_size != from_cli_block(list(fixed.groups))  # the CLI block is the difference
    laws.check_scheduler_block_and_hash_unit(cex)
