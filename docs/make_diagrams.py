"""Regenerate the case-study diagrams in docs/cases/ with `kvgeom diagram`.

Run from the repository root:

    python docs/make_diagrams.py          # rewrite the SVGs
    python docs/make_diagrams.py --check  # exit 1 if a committed SVG differs from a fresh one

Each diagram is one `kvgeom diagram CONFIG --prefix N --title T --width 860 -o FILE` call; nothing is drawn
here. 860 px is what a page shows at a 1280 px window (docs/css/kvgeom.css), so the 11 px text is shown at
11 px, not scaled down (docs/check_pages.py checks it in a headless chromium).
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

DOCS = Path(__file__).resolve().parent
sys.path.insert(0, str(DOCS.parent))  # draw with this checkout's kvgeom, not whichever one is installed

from kvgeom.cli import main as kvgeom_main  # noqa: E402

CASES = DOCS / "cases"
CONFIGS = CASES / "configs"
#: Width the diagrams are drawn at: no wider than the text column of a page at a 1280 px window.
WIDTH = 860

# output file, CONFIG argument, prefix tokens, title
DIAGRAMS: list[tuple[str, str, int, str]] = [
    ("49964-right.svg", "preset:seed-hybrid", 64,
     "#49964 right: attention span 32 (dealt), Mamba span 16 (replicated), 64-token prefix"),
    ("49962-right.svg", "preset:seed-hybrid", 64,
     "#49962 right: a 64-token prefix stores 2 attention blocks and 4 Mamba state blocks"),
    ("50883-right.svg", "preset:glm52-dsa-dcp2", 256,
     "#50883 right: uniform MLA + indexer group under DCP 2, span 128"),
    ("50883-wrong.svg", str(CONFIGS / "50883-wrong.json"), 256,
     "#50883 as the buggy offload config saw it: the wrapper not sharded, span 64"),
    ("50287-right.svg", str(CONFIGS / "50287.json"), 257,
     "#50287: a 257-token request needs 9 attention columns and 17 Mamba state blocks"),
    ("44599-right.svg", "preset:falcon-mamba", 128,
     "#44599: Mamba chunk 64 (16 x k=4); a 128-token prompt restores at most the state after 64"),
    ("55168-right.svg", "preset:kimi-k3-dcp8", 73728,
     "#55168: Kimi-K3 at DCP 8, attention span 12288, KDA span 1536"),
    ("lmcache-4809-right.svg", "preset:glm5next-dcp4", 18432,
     "LMCache #4809 right: resolved 2304-token pages, attention span 9216, Mamba 2304"),
    ("lmcache-4809-wrong.svg", str(CONFIGS / "lmcache-4809-wrong.json"), 18432,
     "LMCache #4809 as the buggy connector saw it: CLI block 256, span 1024"),
    ("sglang-34808-diagram.svg", str(CONFIGS / "sglang-34808-right.json"), 1000,
     "SGLang 0.5.23, page 64 x DCP 2, Mamba chunk 192: a 1000-token prompt"),
]


def _config_arg(arg: str) -> str:
    # Paths are stored relative to the repository root so the SVG titles do not depend on the checkout.
    return arg if arg.startswith("preset:") else str(Path(arg).relative_to(DOCS.parent))


def render(out_dir: Path) -> int:
    """Write every diagram into ``out_dir``; return the first non-zero exit code of ``kvgeom diagram``."""
    for name, config, prefix, title in DIAGRAMS:
        path = config if config.startswith("preset:") else str(Path(config))
        args = ["diagram", path, "--prefix", str(prefix), "--title", title, "--width", str(WIDTH)]
        code = kvgeom_main([*args, "-o", str(out_dir / name)])
        if code:
            print(f"make_diagrams: kvgeom diagram {_config_arg(config)} failed with exit code {code}", file=sys.stderr)
            return code
    return 0


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args == ["--check"]:
        with tempfile.TemporaryDirectory() as tmp:
            code = render(Path(tmp))
            if code:
                return code
            stale = [
                name
                for name, *_ in DIAGRAMS
                if not (CASES / name).is_file()
                or (CASES / name).read_text(encoding="utf-8") != (Path(tmp) / name).read_text(encoding="utf-8")
            ]
        if stale:
            print(f"make_diagrams: out of date: {', '.join(stale)}; run python docs/make_diagrams.py", file=sys.stderr)
            return 1
        return 0
    if args:
        print("usage: python docs/make_diagrams.py [--check]", file=sys.stderr)
        return 2
    return render(CASES)


if __name__ == "__main__":
    raise SystemExit(main())
