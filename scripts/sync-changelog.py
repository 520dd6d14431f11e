#!/usr/bin/env python3
"""Write docs/changelog.md, the docs site's copy of CHANGELOG.md (mkdocs reads only docs/).

The copy is CHANGELOG.md with links into docs/ made relative to docs/ and links to files outside docs/ pointed
at the repository; tests/test_release.py fails when the copy is stale. Usage: python scripts/sync-changelog.py
[--check]
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
REPO = "https://github.com/kvgeom/kvgeom/blob/main/"
HEADER = "<!-- Generated from CHANGELOG.md by scripts/sync-changelog.py: edit CHANGELOG.md, then run it. -->\n"


def docs_copy(text: str) -> str:
    """The docs site's copy of the changelog text ``text``."""

    def link(m: re.Match[str]) -> str:
        target = m.group(1)
        if "://" in target or target.startswith("#"):
            return m.group(0)
        if target.startswith("docs/"):
            return f"]({target[len('docs/'):]})"
        return f"]({REPO}{target})"

    return HEADER + re.sub(r"\]\(([^)\s]+)\)", link, text)


def main(argv: list[str]) -> int:
    want = docs_copy((ROOT / "CHANGELOG.md").read_text(encoding="utf-8"))
    out = ROOT / "docs" / "changelog.md"
    if argv[1:] == ["--check"]:
        if not out.exists() or out.read_text(encoding="utf-8") != want:
            print("docs/changelog.md is stale: run python scripts/sync-changelog.py", file=sys.stderr)
            return 1
        return 0
    out.write_text(want, encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
