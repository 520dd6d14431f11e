"""Batch twins of the speculative-decoding query rules, by their former name (a face).

The twins now sit beside the batch twin of the rule they serve: :func:`eagle_pair_held` (the eagle pair
probe) in :mod:`kvgeom.batch.probes`, :func:`store_holdback` (the eagle store hold-back) in
:mod:`kvgeom.batch.hits`, :func:`partial_tail_top` (the highest partial-tail boundary) in
:mod:`kvgeom.batch.handoff`. This module re-exports them so ``kvgeom.batch.speculative.X`` keeps
working; ``tests/property/test_batch_agrees_with_scalar.py`` checks the batch and scalar answers
agree element by element under speculation.
"""

from __future__ import annotations

from kvgeom.batch.handoff import partial_tail_top
from kvgeom.batch.hits import store_holdback
from kvgeom.batch.probes import eagle_pair_held

__all__ = ["eagle_pair_held", "partial_tail_top", "store_holdback"]
