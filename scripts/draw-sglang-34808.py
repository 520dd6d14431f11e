"""Draw docs/cases/sglang-34808.svg: SGLang's tree pages and the Mamba checkpoints of the wrong (chunk) and
the right (lcm) grid, from kvgeom.engines.sglang's numbers. Run from the repository root:
``PYTHONPATH=. python scripts/draw-sglang-34808.py``."""

from __future__ import annotations

from pathlib import Path

from kvgeom.engines.sglang import checkpoint_grid, mamba_cache_chunk_size, tree_page

PAGE, DCP, MODEL_CHUNK, TOKENS = 64, 2, 192, 768
TREE = tree_page(PAGE, DCP)
CHUNK = mamba_cache_chunk_size(MODEL_CHUNK, PAGE)
LCM = checkpoint_grid(CHUNK, TREE)
W, LEFT, RIGHT = 760, 150, 20
SCALE = (W - LEFT - RIGHT) / TOKENS


def x(t: int) -> float:
    return LEFT + t * SCALE


def lane(y: int, label: str, marks: list[int], good: set[int], note: str) -> list[str]:
    out = [f'<g class="lane"><text x="10" y="{y + 18}" class="label">{label}</text>']
    for t in range(0, TOKENS, TREE):
        out.append(f'<rect x="{x(t):.1f}" y="{y}" width="{TREE * SCALE:.1f}" height="28" class="page"/>')
    for t in marks:
        cls = "ok" if t in good else "bad"
        out.append(f'<circle cx="{x(t):.1f}" cy="{y + 14}" r="8" class="{cls}"/>')
        out.append(f'<text x="{x(t):.1f}" y="{y + 48}" class="tick">{t}</text>')
    out.append(f'<text x="{LEFT}" y="{y + 66}" class="note">{note}</text></g>')
    return out


def main() -> None:
    pages = set(range(0, TOKENS + 1, TREE))
    body = [
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {W} 250" width="{W}" height="250" '
        'font-family="sans-serif">',
        "<style>.label{font-size:15px;font-weight:bold}.tick{font-size:13px;text-anchor:middle}"
        ".note{font-size:14px}.page{fill:#eef3fb;stroke:#5577aa}.ok{fill:#2a9d4b}.bad{fill:#d1342f}"
        ".title{font-size:16px}</style>",
        f'<text x="10" y="24" class="title">SGLang #34808: page_size {PAGE} x DCP {DCP} = tree page {TREE}; '
        f"Mamba chunk {CHUNK}</text>",
    ]
    body += lane(50, "wrong: chunk grid", list(range(CHUNK, TOKENS + 1, CHUNK)), pages,
                 f"checkpoints every {CHUNK}: {CHUNK} and {3 * CHUNK} fall inside a tree page (red): no node there")
    body += lane(170, "right: lcm grid", list(range(LCM, TOKENS + 1, LCM)), pages,
                 f"checkpoints every lcm({CHUNK}, {TREE}) = {LCM}: always on a tree-page end (green)")
    body.append("</svg>")
    Path("docs/cases/sglang-34808.svg").write_text("\n".join(body) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
