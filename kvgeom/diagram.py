"""An SVG picture of a geometry's token axis, one lane per cache group (``kvgeom diagram``).

Plain SVG text, no plotting dependency. Each lane is an SVG ``<g class="lane">``
with ``data-group`` and ``data-kind`` attributes and shows, for its group:

* the blocks: block-table column *c* covers positions ``[c*span, (c+1)*span)``
  (Mamba: state block *i* holds the state after ``(i+1)*block_size`` tokens);
* the offload keys (:meth:`kvgeom.Geometry.key_map`): a tick at each key's end
  token, labelled with its request-hash index;
* align-mode Mamba: a dot at each state boundary, filled when a hit may end
  there (:func:`kvgeom.boundaries.is_restorable`);
* DCP-sharded groups: the rank owning each interleave run
  (:func:`kvgeom.ranks.dcp_placement`), or a note when the runs are too fine.

Every number is read from the geometry or a kvgeom query function.
"""

from __future__ import annotations

from html import escape

from kvgeom._check import nonneg
from kvgeom._math import cdiv
from kvgeom.boundaries import is_restorable, state_block_for_boundary
from kvgeom.errors import QueryError
from kvgeom.geometry import Geometry, GroupGeometry
from kvgeom.keys import chunk_end_token, chunk_hash_index, num_keys
from kvgeom.ranks import dcp_placement, rank_lengths

__all__ = ["DEFAULT_WIDTH", "LABEL_WIDTH", "MIN_WIDTH", "default_prefix", "px", "render_svg", "svg_open", "token_x"]

_LEFT = 240
_PLOT = 900
_RIGHT = 40
_LANE = 86
_TOP = 74
_MAX_RUNS = 512
_MAX_LABELS = 48
#: Width in px of a diagram when none is asked for (the label column, 900 px of token axis, a margin).
DEFAULT_WIDTH = _LEFT + _PLOT + _RIGHT
#: The narrowest diagram :func:`render_svg` draws: a 400 px token axis beside the label column.
MIN_WIDTH = _LEFT + 400 + _RIGHT
_RANK_COLORS = ("#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#ff9da7")
_BLOCK_COLORS = ("#dfe7f2", "#c5d3e8")
#: Width in px of the label column left of the token axis (every kvgeom diagram has one).
LABEL_WIDTH = _LEFT


def default_prefix(geom: Geometry) -> int:
    """Tokens a diagram shows when none are asked for: two of the largest of L and the offload chunks.

    >>> import kvgeom
    >>> default_prefix(kvgeom.resolve(kvgeom.DEFAULT_CONFIG))
    64
    """
    chunks = [og.tokens_per_chunk for og in geom.offload.groups] if geom.offload is not None else []
    return 2 * max([geom.scheduler_block_size, *chunks])


#: The most shapes (blocks, state dots, key ticks, per-rank lengths) a diagram draws; past it
#: :func:`render_svg` refuses up front with ``result_too_large`` (only many groups dealt over many ranks
#: get there: a lane draws at most :data:`_MAX_PER_LANE` of each kind and notes the rest).
MAX_SHAPES = 1 << 15
#: Blocks, state dots or key ticks one lane draws; more are too fine to see at 900 px, so the lane says
#: how many there are instead.
_MAX_PER_LANE = 2048


def _fits(geom: Geometry, total: int) -> None:
    shapes = 0
    for g in geom.groups:
        shapes += min(cdiv(total, g.span), _MAX_PER_LANE)
        if g.is_align_mamba:
            shapes += min(total // g.span, _MAX_PER_LANE)
        if g.dealt:  # the owner runs drawn, or the per-rank lengths written instead
            runs = cdiv(total, geom.config.parallel.cp_interleave)
            shapes += runs if runs <= _MAX_RUNS else geom.kv_shards
        og = geom.offload.get(g.index) if geom.offload is not None else None
        if og is not None:
            shapes += min((total // geom.hash_block_size) // og.hashes_per_chunk, _MAX_PER_LANE)
        if shapes > MAX_SHAPES:
            raise QueryError.single(
                "result_too_large",
                f"a diagram of the first {total} tokens would draw more than {MAX_SHAPES} blocks, state dots and "
                "key ticks; pass a shorter --prefix (a few scheduler blocks show the pattern)",
                "prefix_tokens",
                prefix_tokens=total,
                limit=MAX_SHAPES,
            )


def _x(t: int, total: int, plot: int) -> float:
    return _LEFT + plot * t / total


def _f(v: float) -> str:
    return f"{v:.2f}".rstrip("0").rstrip(".")


def render_svg(geom: Geometry, prefix_tokens: int | None = None, *, title: str = "", width: int | None = None) -> str:
    """An SVG document of the first ``prefix_tokens`` tokens (default :func:`default_prefix`).

    ``width`` is the picture's width in px (default :data:`DEFAULT_WIDTH`, at least :data:`MIN_WIDTH`):
    the token axis takes what the label column leaves, the text stays 11 px. Draw a page's diagram for the
    width the page shows it at, so that its text is not scaled down (``docs/make_diagrams.py`` does).

    Postcondition: the document parses as XML and has exactly one
    ``<g class="lane">`` per cache group, in group order. A picture past :data:`MAX_SHAPES` shapes is
    refused up front (:class:`kvgeom.QueryError` ``result_too_large``).

    >>> import kvgeom, xml.etree.ElementTree as ET
    >>> svg = render_svg(kvgeom.resolve(kvgeom.DEFAULT_CONFIG), 64)
    >>> root = ET.fromstring(svg)
    >>> [g.get("data-kind") for g in root.iter("{http://www.w3.org/2000/svg}g") if g.get("class") == "lane"]
    ['full_attention', 'mamba']
    """
    if not isinstance(title, str):
        raise QueryError.single("bad_title", f"title must be a string, got {type(title).__name__}", "title")
    total = default_prefix(geom) if prefix_tokens is None else nonneg("prefix_tokens", prefix_tokens)
    total = max(total, 1)
    width = DEFAULT_WIDTH if width is None else nonneg("width", width)
    if width < MIN_WIDTH:
        raise QueryError.single(
            "too_narrow",
            f"width={width} px leaves the token axis less than 400 px beside the {_LEFT} px label column; "
            f"pass width >= {MIN_WIDTH}",
            "width",
            width=width,
            min_width=MIN_WIDTH,
        )
    plot = width - _LEFT - _RIGHT
    _fits(geom, total)
    keys: dict[int, list[dict[str, int]]] = {}
    too_many: dict[int, int] = {}
    if geom.offload is not None:
        for og in geom.offload.groups:
            count = num_keys(geom, og.index, total)
            if count > _MAX_PER_LANE:
                keys[og.index], too_many[og.index] = [], count
            else:
                keys[og.index] = [
                    {"end_token": chunk_end_token(geom, og.index, j), "hash_index": chunk_hash_index(geom, og.index, j)}
                    for j in range(count)
                ]
    legend = [
        "boxes: blocks (number = block-table column, or Mamba state block); red tick: end of an offload key "
        "(hN = request hash N); dot: Mamba state boundary, filled when a hit may end there"
    ]
    if width < DEFAULT_WIDTH:  # two lines, each shorter than the narrowest picture
        legend = [legend[0][: legend[0].index(" red tick")], legend[0][legend[0].index("red tick") :]]
    height = _TOP + _LANE * len(geom.groups) + 24 + 14 * (len(legend) - 1)
    par = geom.config.parallel
    off = geom.offload
    summary = (
        f"L={geom.scheduler_block_size}  H={geom.hash_block_size}  A={geom.hit_alignment_tokens}  "
        f"tp={par.tp} dcp={par.dcp} cp_interleave={par.cp_interleave}  "
        + (f"offload k={off.blocks_per_chunk}" if off is not None else "no offload (no keys)")
        + f"  first {total} tokens"
    )
    out = svg_open(width, height, title or "kvgeom geometry", summary)
    out.extend(_axis(geom, total, plot))
    for lane, g in enumerate(geom.groups):
        out.extend(_lane(geom, g, total, _TOP + lane * _LANE, keys.get(g.index), too_many.get(g.index), plot))
    for i, line in enumerate(legend):
        out.append(f'<text x="10" y="{height - 10 - 14 * (len(legend) - 1 - i)}" fill="#555">{escape(line)}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def svg_open(width: int, height: int, title: str, summary: str) -> list[str]:
    """The opening lines every kvgeom diagram shares: the ``<svg>`` element (11 px sans-serif), a white
    background, a bold title and a summary line, both escaped.

    >>> svg_open(680, 100, "a <b>", "c")[2]
    '<text x="10" y="18" font-size="14" font-weight="bold">a &lt;b&gt;</text>'
    """
    return [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="11">',
        f'<rect width="{width}" height="{height}" fill="white"/>',
        f'<text x="10" y="18" font-size="14" font-weight="bold">{escape(title)}</text>',
        f'<text x="10" y="36">{escape(summary)}</text>',
    ]


def token_x(t: int, total: int, plot: int) -> float:
    """The x position in px of token ``t`` on a ``plot`` px axis of ``total`` tokens, right of the label
    column. Invariant: ``token_x(0) == LABEL_WIDTH`` and ``token_x(total) == LABEL_WIDTH + plot``.

    >>> token_x(0, 64, 900), token_x(64, 64, 900)
    (240.0, 1140.0)
    """
    return _x(t, total, plot)


def px(v: float) -> str:
    """A coordinate as SVG text: two decimals at most, no trailing zeros.

    >>> px(12.5), px(3.0), px(1 / 3)
    ('12.5', '3', '0.33')
    """
    return _f(v)


def _axis(geom: Geometry, total: int, plot: int) -> list[str]:
    """Ticks at multiples of the scheduler block L (thinned to at most 16 labels)."""
    L = geom.scheduler_block_size
    n = total // L
    step = max(1, cdiv(n, 16))
    y = _TOP - 14
    parts = [f'<line x1="{_LEFT}" y1="{y}" x2="{_LEFT + plot}" y2="{y}" stroke="#444"/>']
    for i in range(0, n + 1, step):
        x = _f(_x(i * L, total, plot))
        parts.append(f'<line x1="{x}" y1="{y - 4}" x2="{x}" y2="{y + 4}" stroke="#444"/>')
        parts.append(f'<text x="{x}" y="{y - 7}" text-anchor="middle">{i * L}</text>')
    parts.append(f'<text x="10" y="{y + 4}">token (ticks: L = {L})</text>')
    return parts


def _lane(
    geom: Geometry,
    g: GroupGeometry,
    total: int,
    top: int,
    keys: list[dict[str, int]] | None,
    more_keys: int | None,
    plot: int,
) -> list[str]:
    sharded = g.dealt
    dealing = f"dealt over {geom.kv_shards} ranks" if sharded else "replicated" if geom.kv_shards > 1 else "dcp=1"
    desc = f"block {g.block_size}, span {g.span}, {dealing}"
    parts = [
        f'<g class="lane" data-group="{g.index}" data-kind="{escape(g.kind)}">',
        f'<text x="10" y="{top + 16}" font-weight="bold">group {g.index}: {escape(g.kind)}</text>',
        f'<text x="10" y="{top + 30}">{escape(desc)}</text>',
    ]
    if off_g := (geom.offload.group(g.index) if keys is not None and geom.offload is not None else None):
        parts.append(f'<text x="10" y="{top + 44}">chunk {off_g.tokens_per_chunk} tokens</text>')
    # Blocks: block-table columns (positional) or state blocks (Mamba), each one span wide.
    by = top + 4
    ncols = cdiv(total, g.span)
    if ncols > _MAX_PER_LANE:
        parts.append(
            f'<rect class="blocks" x="{_LEFT}" y="{by}" width="{plot}" height="22" fill="{_BLOCK_COLORS[0]}" '
            'stroke="#6b7b93" stroke-width="0.5"/>'
        )
        parts.append(f'<text x="{_LEFT + 6}" y="{by + 15}">{ncols} blocks of {g.span} tokens (too fine to draw)</text>')
    for c in range(ncols if ncols <= _MAX_PER_LANE else 0):
        start = dcp_placement(geom, g.index, c * g.span).column * g.span
        stop = min(start + g.span, total)
        x0, x1 = _x(start, total, plot), _x(stop, total, plot)
        parts.append(
            f'<rect class="block" x="{_f(x0)}" y="{by}" width="{_f(x1 - x0)}" height="22" '
            f'fill="{_BLOCK_COLORS[c % 2]}" stroke="#6b7b93" stroke-width="0.5"/>'
        )
        if ncols <= _MAX_LABELS and x1 - x0 >= 14:
            parts.append(f'<text x="{_f((x0 + x1) / 2)}" y="{by + 15}" text-anchor="middle">{c}</text>')
    # Mamba state boundaries: the state after exactly b tokens lives in block b/B_m - 1.
    if g.is_align_mamba and total // g.span <= _MAX_PER_LANE:
        for c in range(1, total // g.span + 1):
            b = c * g.span
            block = state_block_for_boundary(geom, g.index, b)
            # a group outside prefix caching (prefix_cacheable false, not offloaded) restores no state
            fill = "#222" if g.prefix_cacheable and is_restorable(geom, g.index, b) else "white"
            parts.append(
                f'<circle class="state" data-block="{block}" cx="{_f(_x(b, total, plot))}" cy="{by + 28}" r="3" '
                f'fill="{fill}" stroke="#222"/>'
            )
    # Offload keys: a tick at each key's end token.
    ky = top + 40
    if more_keys is not None:
        parts.append(f'<text x="{_LEFT}" y="{ky + 10}" fill="#b22">{more_keys} keys (too many to draw)</text>')
    if keys is not None:
        for k in keys:
            x = _f(_x(k["end_token"], total, plot))
            parts.append(
                f'<line class="key" x1="{x}" y1="{ky}" x2="{x}" y2="{ky + 12}" stroke="#b22" stroke-width="2"/>'
            )
            if len(keys) <= _MAX_LABELS:
                parts.append(f'<text x="{x}" y="{ky + 22}" text-anchor="end" fill="#b22">h{k["hash_index"]}</text>')
    # DCP ownership of a sharded group: who holds each interleave run.
    if sharded:
        ry = top + 66
        interleave = geom.config.parallel.cp_interleave
        runs = cdiv(total, interleave)
        if runs <= _MAX_RUNS:
            for r in range(runs):
                start = r * interleave
                stop = min(start + interleave, total)
                rank = dcp_placement(geom, g.index, start).rank or 0
                x0, x1 = _x(start, total, plot), _x(stop, total, plot)
                parts.append(
                    f'<rect class="rank" data-rank="{rank}" x="{_f(x0)}" y="{ry}" width="{_f(x1 - x0)}" height="8" '
                    f'fill="{_RANK_COLORS[rank % len(_RANK_COLORS)]}"/>'
                )
            parts.append(f'<text x="10" y="{ry + 8}">DCP ranks (colour = owner)</text>')
        else:
            lengths = rank_lengths(geom, g.index, total)
            parts.append(
                f'<text x="{_LEFT}" y="{ry + 8}">dealt to {geom.kv_shards} ranks in runs of {interleave} '
                f"tokens (too fine to draw); per-rank lengths {list(lengths)}</text>"
            )
    parts.append("</g>")
    return parts
