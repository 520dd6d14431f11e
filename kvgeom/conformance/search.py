"""The search loop every ``kvgeom conform`` engine shares: find a new difference, shrink it, search again.

:func:`search_rounds` runs Hypothesis over ``strategy`` with ``check``. ``check`` raises :class:`NewFinding`
for a difference not seen before; Hypothesis shrinks it to a minimal case, ``on_found`` records it (and the
caller adds it to what ``check`` already knows), and the next round searches for the next one. The loop stops
after a round that finds nothing new, or after ``rounds`` rounds.

Invariants: every round uses the same seed and example budget (a run is reproducible from ``seed``); the
settings are explicit (no database, no deadline, not derandomized by a loaded profile), so a run answers the
same inside a test process and from the command line; at most ``rounds`` findings are reported.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Generic, TypeVar

from hypothesis import HealthCheck, Phase, Verbosity, given, settings
from hypothesis import seed as hypothesis_seed
from hypothesis import strategies as st

__all__ = ["NewFinding", "search_rounds"]

F = TypeVar("F")


class NewFinding(Exception, Generic[F]):
    """Raised by a check for a difference it has not seen: Hypothesis shrinks the case that raised it."""

    def __init__(self, finding: F, signature: Any) -> None:
        super().__init__(str(signature))
        self.finding = finding


def search_rounds(
    strategy: st.SearchStrategy[Any],
    check: Callable[[Any], None],
    on_found: Callable[[Any], None],
    *,
    seed: int,
    examples: int,
    rounds: int,
) -> None:
    """Search ``strategy`` with ``check`` until a round finds nothing new (at most ``rounds`` rounds);
    ``on_found`` receives each shrunk finding, in the order found."""
    for _ in range(rounds):

        @hypothesis_seed(seed)
        @settings(
            max_examples=examples,
            database=None,
            deadline=None,
            derandomize=False,
            phases=[Phase.generate, Phase.shrink],
            report_multiple_bugs=False,
            suppress_health_check=list(HealthCheck),
            verbosity=Verbosity.quiet,
        )
        @given(strategy)
        def search(case: Any) -> None:
            check(case)

        try:
            search()
        except NewFinding as e:
            on_found(e.finding)
            continue
        return
