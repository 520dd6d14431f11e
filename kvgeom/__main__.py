"""``python -m kvgeom``: until the CLI lands, print the bundled default's report."""

from __future__ import annotations

import json
import sys

from kvgeom.config import DEFAULT_CONFIG
from kvgeom.errors import KVGeomError
from kvgeom.geometry import resolve


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    try:
        geometry = resolve(args[0] if args else DEFAULT_CONFIG)
    except KVGeomError as e:
        print(f"kvgeom: {e}", file=sys.stderr)
        return 1
    print(json.dumps(geometry.to_report(), indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
