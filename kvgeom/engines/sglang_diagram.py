"""An SVG picture of an SGLang deployment's token axis (``kvgeom diagram`` on a file with an ``sglang`` table).

Plain SVG text in the style of :mod:`kvgeom.diagram` (its frame, its axis scale). Each lane is a
``<g class="lane">`` with a ``data-lane`` attribute:

* ``tree-page``: the radix tree's pages, ``page_size * dcp_size`` tokens each (boxes, numbered);
* ``mamba-chunk``: the Mamba cache chunk (a tick at each chunk end; Mamba pool only);
* ``checkpoint-grid``: where prefill checkpoints can sit, a dot at each grid point (Mamba pool only; each
  is a tree-page end: a grid that is not is refused by :func:`~kvgeom.engines.sglang.resolve_sglang`,
  SGLang #34808);
* ``track-grid``: where decode-tracked checkpoints can sit (Mamba pool only);
* ``prompt``: one prompt of ``prompt_tokens`` tokens, a dot where it leaves a checkpoint
  (:func:`kvgeom.engines.sglang.checkpoint_positions`), a bar for what a repeat of it reuses
  (:func:`kvgeom.engines.sglang.prefix_hit`) and, with a sliding-window pool, the window the tree keeps.

Every number is read from the :class:`~kvgeom.engines.sglang.SGLangGeometry` or a query on it.
"""

from __future__ import annotations

from html import escape

from kvgeom.diagram import DEFAULT_WIDTH, LABEL_WIDTH, MIN_WIDTH, px, svg_open, token_x
from kvgeom.engines.sglang import SGLangGeometry, checkpoint_positions, prefix_hit
from kvgeom.errors import QueryError

__all__ = ["MAX_MARKS", "default_prompt", "render_sglang_svg"]

MAX_MARKS = 1 << 14
"""The most pages, ticks or dots one diagram draws (prompts past it are refused: ``result_too_large``)."""
_MAX_LABELS = 48
_LANE = 58
_TOP = 74
_RIGHT = 40
_OK, _PAGE = "#2a9d4b", ("#dfe7f2", "#c5d3e8")


def default_prompt(geom: SGLangGeometry) -> int:
    """Tokens a diagram shows when none are asked for: two track grids (Mamba), else four tree pages.

    >>> from kvgeom.engines.sglang import resolve_sglang
    >>> default_prompt(resolve_sglang({"page_size": 64, "dcp_size": 2, "tp_size": 2, "pools": ["full", "mamba"],
    ...                                "mamba_chunk_size": 192}))
    1536
    >>> default_prompt(resolve_sglang({"page_size": 16}))
    64
    """
    return 2 * geom.track_grid if geom.track_grid is not None else 4 * geom.tree_page


def _count(total: int, step: int | None) -> int:
    return 0 if step is None else total // step


def render_sglang_svg(
    geom: SGLangGeometry, prompt_tokens: int | None = None, *, title: str = "", width: int | None = None
) -> str:
    """An SVG document of one ``prompt_tokens``-token prompt (default :func:`default_prompt`) on the
    deployment's grids. ``width`` as in :func:`kvgeom.diagram.render_svg` (default 1180 px, at least 680).

    Postconditions: the document parses as XML; its lanes are ``tree-page``, then, with a Mamba pool,
    ``mamba-chunk``, ``checkpoint-grid`` and ``track-grid``, then ``prompt``; the prompt lane has one
    ``checkpoint`` dot per :func:`~kvgeom.engines.sglang.checkpoint_positions`. Bad numbers are a
    :class:`kvgeom.QueryError` (``bad_num_tokens``, ``too_narrow``, ``result_too_large``).

    >>> import xml.etree.ElementTree as ET
    >>> from kvgeom.engines.sglang import resolve_sglang
    >>> g = resolve_sglang({"page_size": 64, "dcp_size": 2, "tp_size": 2, "pools": ["full", "mamba"],
    ...                     "mamba_chunk_size": 192})
    >>> root = ET.fromstring(render_sglang_svg(g, 800))
    >>> [e.get("data-lane") for e in root.iter("{http://www.w3.org/2000/svg}g")]
    ['tree-page', 'mamba-chunk', 'checkpoint-grid', 'track-grid', 'prompt']
    >>> [e.get("data-token") for e in root.iter("{http://www.w3.org/2000/svg}circle") if e.get("class") == "checkpoint"]
    ['384', '768']
    """
    total = default_prompt(geom) if prompt_tokens is None else prompt_tokens
    if type(total) is not int or total < 1:
        raise QueryError.single("bad_num_tokens", f"prompt_tokens must be an int >= 1, got {total!r}",
                                "prompt_tokens", prompt_tokens=total)
    width = DEFAULT_WIDTH if width is None else width
    if type(width) is not int or width < MIN_WIDTH:
        raise QueryError.single("too_narrow", f"width={width!r} px leaves the token axis less than 400 px beside "
                                f"the {LABEL_WIDTH} px label column; pass width >= {MIN_WIDTH}", "width",
                                width=width, min_width=MIN_WIDTH)
    steps = [s for s in (geom.tree_page, geom.mamba_chunk, geom.checkpoint_grid, geom.track_grid) if s is not None]
    marks = sum(_count(total, s) for s in steps)
    if marks > MAX_MARKS:
        raise QueryError.single(
            "result_too_large", f"prompt_tokens={total} draws {marks} pages, ticks and dots, more than {MAX_MARKS}; "
            f"draw at most {MAX_MARKS * min(steps) // len(steps)} tokens", "prompt_tokens",
            prompt_tokens=total, limit=MAX_MARKS)
    plot = width - LABEL_WIDTH - _RIGHT
    c = geom.config
    lanes = 5 if geom.checkpoint_grid is not None else 2
    height = _TOP + _LANE * lanes + 30
    summary = (f"SGLang page_size={c.page_size} dcp={c.dcp_size} tp={c.tp_size}; pools: {', '.join(c.pools)}"
               + (f"; Mamba radix cache {c.mamba_radix_cache_strategy}" if geom.checkpoint_grid is not None else "")
               + f"; one prompt of {total} tokens")
    out = svg_open(width, height, title or "SGLang deployment", summary)

    def x(t: int) -> str:
        return px(token_x(min(t, total), total, plot))

    def lane(name: str, top: int, label: str, note: str) -> list[str]:
        return [f'<g class="lane" data-lane="{name}">',
                f'<text x="10" y="{top + 14}" font-weight="bold">{escape(label)}</text>',
                f'<text x="10" y="{top + 28}">{escape(note)}</text>']

    def dots(cls: str, top: int, positions: list[int], fill: str) -> list[str]:
        parts = []
        for t in positions:
            parts.append(f'<circle class="{cls}" data-token="{t}" cx="{x(t)}" cy="{top + 12}" r="4" fill="{fill}"/>')
            if len(positions) <= _MAX_LABELS // 2:
                parts.append(f'<text x="{x(t)}" y="{top + 32}" text-anchor="middle">{t}</text>')
        return parts

    top = _TOP
    page = geom.tree_page
    out += lane("tree-page", top, "tree page", f"{page} tokens = page_size {c.page_size} x dcp {c.dcp_size}")
    npages = -(-total // page)
    for i in range(npages):
        x0, x1 = token_x(i * page, total, plot), token_x(min((i + 1) * page, total), total, plot)
        out.append(f'<rect class="page" x="{px(x0)}" y="{top + 2}" width="{px(x1 - x0)}" height="22" '
                   f'fill="{_PAGE[i % 2]}" stroke="#6b7b93" stroke-width="0.5"/>')
        if npages <= _MAX_LABELS and x1 - x0 >= 14:
            out.append(f'<text x="{px((x0 + x1) / 2)}" y="{top + 17}" text-anchor="middle">{i}</text>')
    out.append("</g>")
    if geom.checkpoint_grid is not None and geom.mamba_chunk is not None and geom.track_grid is not None:
        chunk, grid, tgrid = geom.mamba_chunk, geom.checkpoint_grid, geom.track_grid
        top += _LANE
        out += lane("mamba-chunk", top, "Mamba chunk", f"every {chunk} tokens")
        for t in range(chunk, total + 1, chunk):
            out.append(f'<line class="chunk" x1="{x(t)}" y1="{top + 2}" x2="{x(t)}" y2="{top + 22}" '
                       'stroke="#555" stroke-width="2"/>')
        out.append("</g>")
        top += _LANE
        how = "lcm(chunk, tree page)" if c.checkpoint_grid == "lcm" else "the chunk (a pre-#34808 build)"
        out += lane("checkpoint-grid", top, "checkpoint grid", f"every {grid} tokens, {how}")
        out += dots("grid", top, list(range(grid, total + 1, grid)), _OK)
        out.append("</g>")
        top += _LANE
        out += lane("track-grid", top, "track grid",
                    f"every {tgrid} = lcm(grid, track interval {c.mamba_track_interval})")
        out += dots("track", top, list(range(tgrid, total + 1, tgrid)), "#4e79a7")
        out.append("</g>")
    top += _LANE
    positions = list(checkpoint_positions(geom, total))
    hit = prefix_hit(geom, total, positions)
    where = ("dots: its checkpoints (where it ends)" if c.mamba_radix_cache_strategy == "no_buffer" and positions
             else "dots: its checkpoints" if positions else "no checkpoint" if geom.checkpoint_grid
             else "no Mamba pool")
    out += lane("prompt", top, f"a {total}-token prompt", where)
    out.append(f'<text x="10" y="{top + 42}">a repeat reuses {hit.device_prefix}</text>')
    out.append(f'<rect class="prompt" x="{x(0)}" y="{top + 4}" width="{px(token_x(total, total, plot) - LABEL_WIDTH)}" '
               'height="6" fill="#c5d3e8"/>')
    out.append(f'<rect class="hit" data-tokens="{hit.device_prefix}" x="{x(0)}" y="{top + 34}" '
               f'width="{px(token_x(hit.device_prefix, total, plot) - LABEL_WIDTH)}" height="8" fill="{_OK}"/>')
    if geom.swa_window is not None:
        start = max(0, hit.device_prefix - geom.swa_window)
        out.append(f'<rect class="swa-window" data-tokens="{geom.swa_window}" x="{x(start)}" y="{top + 44}" '
                   f'width="{px(token_x(hit.device_prefix, total, plot) - token_x(start, total, plot))}" height="5" '
                   'fill="#f28e2b"/>')
    out += dots("checkpoint", top - 5, positions, "#222")
    out.append("</g>")
    legend = ("green bar: the prefix a repeat of the prompt reuses; orange: the sliding window it keeps"
              if geom.swa_window is not None else "green bar: the prefix a repeat of the prompt reuses")
    out.append(f'<text x="10" y="{height - 10}" fill="#555">{escape(legend)}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"
