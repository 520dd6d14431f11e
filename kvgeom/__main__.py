"""``python -m kvgeom``: the ``kvgeom`` command (see :mod:`kvgeom.cli`)."""

from __future__ import annotations

from kvgeom.cli import main

__all__ = ["main"]

if __name__ == "__main__":
    raise SystemExit(main())
