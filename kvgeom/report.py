"""What a resolved geometry reports: ``to_report``, the query methods' result dicts and the explain text.

A consumer of the rule modules: every number here is read from a resolved :class:`kvgeom.Geometry` or
asked of the module that owns the rule (:mod:`kvgeom.keys`, :mod:`kvgeom.hits`, :mod:`kvgeom.prefix`,
:mod:`kvgeom.request`, :mod:`kvgeom.fingerprint`, :mod:`kvgeom.ranks`); nothing here derives a span, a
chunk or a boundary. ``Geometry``'s query methods (``key_map``, ``plan_hit``, ``prefix_hit``,
``plan_request``, ``fingerprint``, ``to_report``) forward to the functions below through one call-time
import, the one documented door upward (see :mod:`kvgeom.geometry`); ``kvgeom explain`` prints
:func:`explain_text`.

Invariants (``tests/test_golden_api.py`` holds every answer of 0.2 byte for byte):

* :func:`to_report`'s key set is a stable contract; ``vllm_names=True`` only adds keys
  (:mod:`kvgeom.glossary`), it never renames or removes one;
* each ``*_dict`` function is exactly the ``to_dict()`` of its rule module's answer;
* the explain text is pure text from the geometry: the same geometry prints the same text.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, assert_never

from kvgeom._format import show
from kvgeom._math import cdiv
from kvgeom.fingerprint import fingerprint
from kvgeom.geometry import Geometry, GroupGeometry
from kvgeom.glossary import add_vllm_names
from kvgeom.hits import plan_hit
from kvgeom.keys import key_map
from kvgeom.prefix import prefix_hit_from_scenario
from kvgeom.ranks import dcp_placement, rank_lengths
from kvgeom.request import plan_request
from kvgeom.specs import is_drafter_group, iter_leaves

__all__ = [
    "explain_lines",
    "explain_text",
    "fingerprint",
    "hit_landing_lines",
    "key_map_dict",
    "plan_hit_dict",
    "plan_request_dict",
    "prefix_hit_dict",
    "to_report",
]


# ------------------------------------------------------------------- the report and the query dicts


def to_report(geom: Geometry, *, vllm_names: bool = False) -> dict[str, Any]:
    """A JSON-serialisable summary of ``geom`` (``Geometry.to_report``); the key set is a stable contract.

    ``vllm_names=True`` adds vLLM's name next to some keys (same values; nothing renamed or
    removed): :mod:`kvgeom.glossary`, ``docs/glossary.md``.

    >>> import kvgeom
    >>> r = to_report(kvgeom.resolve(kvgeom.DEFAULT_CONFIG))
    >>> [g["span"] for g in r["groups"]], r["scheduler_block_size"], r["hash_block_size"]
    ([32, 16], 32, 16)
    """
    if vllm_names:
        return add_vllm_names(to_report(geom))
    off = geom.offload
    return {
        "groups": [
            {
                "index": g.index,
                "kind": g.kind,
                "block_size": g.block_size,
                "dcp_sharded": g.dcp_sharded,
                "prefix_cacheable": g.prefix_cacheable,
                "span": g.span,
                "row_width": g.row_width,
                "eagle_group": g.eagle_group,
                "proof_margin": g.proof_margin,
            }
            for g in geom.groups
        ],
        "scheduler_block_size": geom.scheduler_block_size,
        "hash_block_size": geom.hash_block_size,
        "hit_alignment_tokens": geom.hit_alignment_tokens,
        "partial_hash_hits": geom.partial_hash_hits,
        "offload": None
        if off is None
        else {
            "blocks_per_chunk": off.blocks_per_chunk,
            "tokens_per_hash": off.tokens_per_hash,
            "alignment_tokens": off.alignment_tokens,
            "mamba_align_size": off.mamba_align_size,
            "retention_interval": off.retention_interval,
            "supports_partial_tail": off.supports_partial_tail,
            "groups": [
                {
                    "index": og.index,
                    "tokens_per_block": og.tokens_per_block,
                    "tokens_per_chunk": og.tokens_per_chunk,
                    "hashes_per_chunk": og.hashes_per_chunk,
                    "window_chunks": og.window_chunks,
                    "eagle_group": og.eagle_group,
                    "proof_margin": og.proof_margin,
                }
                for og in off.groups
            ],
        },
        "speculative": None
        if geom.speculative is None
        else {
            "method": geom.speculative.method,
            "num_speculative_tokens": geom.speculative.num_speculative_tokens,
            "block_drop": geom.speculative.block_drop,
            "lookahead_hashes": geom.speculative.lookahead_hashes,
            "gpu_drop": geom.speculative.gpu_drop,
            "prefill_lookahead_tokens": geom.speculative.prefill_lookahead_tokens,
        },
        "warnings": [{"code": w.code, "message": w.message} for w in geom.warnings],
        "fingerprint": fingerprint(geom),
    }


def key_map_dict(geom: Geometry, prefix_tokens: int) -> dict[str, Any]:
    """``Geometry.key_map``: :func:`kvgeom.keys.key_map` (already the contract dict).

    >>> import kvgeom
    >>> key_map_dict(kvgeom.resolve(kvgeom.DEFAULT_CONFIG), 64)["groups"][0]["keys"][0]["end_token"]
    32
    """
    return key_map(geom, prefix_tokens)


def plan_hit_dict(geom: Geometry, scenario: Mapping[str, Any]) -> dict[str, Any]:
    """``Geometry.plan_hit``: :func:`kvgeom.hits.plan_hit` as its contract dict.

    >>> import kvgeom
    >>> scenario = {"num_tokens": 64, "stored": {"0": [32, 64], "1": [16, 32, 48]}}
    >>> plan_hit_dict(kvgeom.resolve(kvgeom.DEFAULT_CONFIG), scenario)["hit_tokens"]
    48
    """
    return plan_hit(geom, scenario).to_dict()


def prefix_hit_dict(geom: Geometry, scenario: Mapping[str, Any]) -> dict[str, Any]:
    """``Geometry.prefix_hit``: :func:`kvgeom.prefix.prefix_hit_from_scenario` as its contract dict.

    >>> import kvgeom
    >>> scenario = {"num_tokens": 65, "resident": {"0": [32, 64], "1": [48]}}
    >>> prefix_hit_dict(kvgeom.resolve(kvgeom.DEFAULT_CONFIG), scenario)["hit_tokens"]
    48
    """
    return prefix_hit_from_scenario(geom, scenario).to_dict()


def plan_request_dict(geom: Geometry, scenario: Mapping[str, Any]) -> dict[str, Any]:
    """``Geometry.plan_request``: :func:`kvgeom.request.plan_request` as its contract dict.

    >>> import kvgeom
    >>> sc = {"num_tokens": 100, "resident": {"0": [32, 64], "1": [48]}, "stored": {"0": [32, 64], "1": [48]}}
    >>> p = plan_request_dict(kvgeom.resolve(kvgeom.DEFAULT_CONFIG), sc); p["local_hit_tokens"]
    48
    """
    return plan_request(geom, scenario).to_dict()


# ------------------------------------------------------------------- explain


def _kind_label(g: GroupGeometry) -> str:
    leaves = list(iter_leaves(g.spec))
    if g.kind != "uniform":
        return g.kind
    names = []
    for leaf in leaves:
        role = getattr(leaf, "cache_role", None)
        names.append(f"{leaf.kind}:{role}" if role else leaf.kind)
    return f"uniform({', '.join(names)})"


def _window_label(g: GroupGeometry) -> str:
    need = g.gpu_window_need  # the window (or attention chunk) is gpu_window_need + 1
    if g.family == "sliding" and need is not None:
        return f"{need + 1} tokens"
    if g.family == "chunked" and need is not None:
        return f"chunks of {need + 1}"
    match g.family:
        case "full" | "sliding" | "chunked":
            return "full"
        case "cross":
            return "encoder"
        case "mamba":
            return f"state ({g.mamba_mode})"
        case "circular":
            return "ring"
        case "hisparse":
            return "hisparse"
        case "encoder":
            return "none (encoder-only)"
        case _:
            assert_never(g.family)


def _table(rows: list[list[str]], right: set[int]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = []
    for r in rows:
        cells = [c.rjust(widths[i]) if i in right else c.ljust(widths[i]) for i, c in enumerate(r)]
        lines.append("  " + "  ".join(cells).rstrip())
    return lines


def _onoff(flag: bool) -> str:
    return "on" if flag else "off"


def explain_text(geom: Geometry, label: str, prefix: int | None = None) -> str:
    """The ``kvgeom explain`` text for a resolved geometry (and the keys of a ``prefix``-token prompt).

    >>> import kvgeom
    >>> text = explain_text(kvgeom.resolve(kvgeom.DEFAULT_CONFIG), "default")
    >>> "L  scheduler block  32 tokens  (lcm of the spans)" in text
    True
    """
    cfg = geom.config
    par = cfg.parallel
    off = geom.offload
    lines = [f"kvgeom geometry of {label}", ""]
    lines.append(
        f"parallel: tp={par.tp} dcp={par.dcp} pcp={par.pcp} pp={par.pp} cp_interleave={par.cp_interleave}"
        + (" pcp_shards_kv=true" if par.pcp_shards_kv else "")
        + f"  (sharded groups are dealt over {geom.kv_shards} rank{'s' if geom.kv_shards != 1 else ''})"
    )
    cache = cfg.cache
    retention = "dense" if cache.retention_interval is None else str(cache.retention_interval)
    lines.append(
        f"cache: prefix_caching={_onoff(cache.prefix_caching)} retention_interval={retention} "
        f"max_model_len={cache.max_model_len if cache.max_model_len is not None else '-'}"
    )
    lines.append("")
    chunks = {og.index: og.tokens_per_chunk for og in off.groups} if off is not None else {}
    show_rows = any(g.row_width is not None for g in geom.groups)
    header = ["group", "kind", "block", "sharded", "span", "chunk", "window", "cacheable"]
    if show_rows:
        header.append("row")
    rows = [header]
    for g in geom.groups:
        row = [
            str(g.index),
            _kind_label(g),
            str(g.block_size),
            "yes" if g.dcp_sharded else "no",
            str(g.span),
            str(chunks[g.index]) if g.index in chunks else "-",
            _window_label(g),
            "yes" if g.prefix_cacheable else "no",
        ]
        if show_rows:
            row.append(str(g.row_width) if g.row_width is not None else "-")
        rows.append(row)
    lines.extend(_table(rows, right={2, 4, 5, 8}))
    lines.append("")
    if geom.speculative is not None:
        lines.extend([*explain_lines(geom), ""])
    lines.extend(
        _table(
            [
                ["L", "scheduler block", f"{geom.scheduler_block_size} tokens", "(lcm of the spans)"],
                ["H", "hash unit", f"{geom.hash_block_size} tokens", "(request hashes chain every H tokens)"],
                [
                    "A",
                    "hit alignment",
                    f"{geom.hit_alignment_tokens} tokens",
                    f"(prefix hits land on multiples of A; partial hash hits {_onoff(geom.partial_hash_hits)})",
                ],
            ],
            right={2},
        )
    )
    lines.append("")
    lines.extend(hit_landing_lines(geom))
    lines.append("")
    lines.append(f"layout fingerprint: {fingerprint(geom)}  (equal fingerprints: offloaded keys are interchangeable)")
    lines.append("")
    if off is None:
        lines.append('offload: none (no offloading connector; add an "offload" section, {} means k = 1)')
    else:
        lines.append(
            f"offload: blocks_per_chunk={off.blocks_per_chunk} tokens_per_hash={off.tokens_per_hash} "
            f"alignment_tokens={off.alignment_tokens if off.alignment_tokens is not None else '-'} "
            f"mamba_align_size={off.mamba_align_size if off.mamba_align_size is not None else '-'} "
            f"partial tails {_onoff(off.supports_partial_tail)}"
        )
        orows = [["group", "tokens_per_block", "tokens_per_chunk", "hashes_per_chunk", "window_chunks"]]
        for og in off.groups:
            orows.append(
                [
                    str(og.index),
                    str(og.tokens_per_block),
                    str(og.tokens_per_chunk),
                    str(og.hashes_per_chunk),
                    str(og.window_chunks) if og.window_chunks is not None else "-",
                ]
            )
        lines.extend(_table(orows, right={1, 2, 3, 4}))
    lines.append("")
    if geom.warnings:
        lines.append("warnings:")
        lines.extend(f"  [{w.code}] {w.message}" for w in geom.warnings)
    else:
        lines.append("warnings: none")
    if prefix is not None:
        lines.append("")
        lines.extend(_keys_text(geom, prefix))
        lines.append("")
        lines.extend(_axis_text(geom, prefix))
    return "\n".join(lines) + "\n"


def _keys_text(geom: Geometry, prefix: int) -> list[str]:
    if geom.offload is None:
        return [
            f"keys: none for the {prefix}-token prefix: this config has no offload section, so it has no "
            'offload keys; add "offload": {} (k = 1) to see them'
        ]
    km = key_map_dict(geom, prefix)
    lines = [f"keys of the complete offload chunks within the first {prefix} tokens:"]
    for item in km["groups"][:_MAX_GROUPS_DRAWN]:
        g = geom.groups[item["index"]]
        if "rank_lengths" in item:
            ranks = f"dealt over {geom.kv_shards} DCP ranks, per-rank lengths {show(item['rank_lengths'])}"
        else:
            lengths = rank_lengths(geom, g.index, prefix)
            ranks = f"replicated, every rank holds {lengths[0]} tokens" if len(lengths) > 1 else f"{lengths[0]} tokens"
        lines.append(
            f"  group {g.index} ({g.kind}), {geom.offload.group(g.index).tokens_per_chunk}-token chunks, {ranks}:"
        )
        if not item["keys"]:
            lines.append("    (no complete chunk yet)")
        shown = item["keys"][:_MAX_KEYS_SHOWN]
        for k in shown:
            where = f"state block {k['state_block']}" if "state_block" in k else f"block entries {k['block_entries']}"
            lines.append(f"    chunk {k['chunk']:>3}  key h{k['hash_index']:<5} prefix [0, {k['end_token']})  {where}")
        if len(item["keys"]) > len(shown):
            lines.append(f"    ... and {len(item['keys']) - len(shown)} more keys (kvgeom explain --json lists all)")
    if len(km["groups"]) > _MAX_GROUPS_DRAWN:
        lines.append(f"  ... and {len(km['groups']) - _MAX_GROUPS_DRAWN} more groups (kvgeom explain --json lists all)")
    return lines


_AXIS_WIDTH = 64
_DIVISOR_SEARCH = 1 << 16
_MAX_KEYS_SHOWN = 24
#: Groups whose keys and token axis ``explain --prefix`` shows (the group table lists every group).
_MAX_GROUPS_DRAWN = 64


def _tokens_per_cell(unit: int, total: int, max_cells: int) -> int:
    """The smallest divisor or multiple of ``unit`` that draws ``total`` tokens in at most ``max_cells`` cells,
    so that cells line up with the hash grid."""
    small: set[int] = {unit}
    d = 1
    while d * d <= unit and d <= _DIVISOR_SEARCH:  # bounded: H may be near 2**63; `unit` is always a candidate
        if unit % d == 0:
            small.update((d, unit // d))
        d += 1
    for p in sorted(small):
        if cdiv(total, p) <= max_cells:
            return p
    return int(cdiv(cdiv(total, max_cells), unit)) * unit


def _axis_text(geom: Geometry, prefix: int) -> list[str]:
    """A text picture of the token axis: blocks, key ends and DCP owners per group."""
    if prefix == 0:
        return ["token axis: empty prefix"]
    per_char = _tokens_per_cell(geom.hash_block_size, prefix, _AXIS_WIDTH)
    cells = cdiv(prefix, per_char)
    lines = [
        f"token axis, 1 char = {per_char} token{'s' if per_char > 1 else ''}; "
        "| starts a block (= and - alternate), ^ ends a key, digits: owning DCP rank"
    ]
    pad = 16
    lines.append(" " * pad + "0".ljust(cells - len(str(prefix))) + str(prefix))
    ends: dict[int, list[int]] = {}
    if geom.offload is not None:
        for item in key_map_dict(geom, prefix)["groups"]:
            ends[item["index"]] = [k["end_token"] for k in item["keys"]]
    interleave = geom.config.parallel.cp_interleave
    for g in geom.groups[:_MAX_GROUPS_DRAWN]:
        blocks = []
        prev = None
        for c in range(cells):
            col = dcp_placement(geom, g.index, c * per_char).column
            blocks.append("|" if col != prev else ("=" if col % 2 == 0 else "-"))
            prev = col
        lines.append(f"  g{g.index} blocks".ljust(pad) + "".join(blocks))
        if g.index in ends:
            marks = [" "] * cells
            for e in ends[g.index]:
                marks[(e - 1) // per_char] = "^"
            lines.append(f"  g{g.index} keys".ljust(pad) + "".join(marks).rstrip())
        if g.dealt:
            if interleave % per_char == 0:
                owners = "".join(str(dcp_placement(geom, g.index, c * per_char).rank) for c in range(cells))
                lines.append(f"  g{g.index} ranks".ljust(pad) + owners)
            else:
                lines.append(
                    f"  g{g.index} ranks".ljust(pad)
                    + f"(dealt in runs of {interleave} over {geom.kv_shards} ranks; too fine to draw here)"
                )
    if len(geom.groups) > _MAX_GROUPS_DRAWN:
        lines.append(f"  ... and {len(geom.groups) - _MAX_GROUPS_DRAWN} more groups (not drawn)")
    return lines


def explain_lines(geom: Geometry) -> list[str]:
    """The ``kvgeom explain`` section of a drafter: effective settings, each group's lane (target or drafter,
    eagle or not), the GPU proof margins, the connector's pop and tail margins, and the Mamba checkpoint shift.
    Empty without a ``speculative`` section.

    >>> import kvgeom
    >>> cfg = {"groups": [{"kind": "full_attention", "block_size": 16, "drafter": True}], "offload": {},
    ...        "speculative": {"method": "eagle", "num_speculative_tokens": 2}}
    >>> explain_lines(kvgeom.resolve(cfg))[0]
    'speculative: method=eagle K=2 block_drop=on lookahead_hashes=off gpu_drop=on P=1'
    """
    # at call time: the drafter-flag question is decided with the resolve-time rules (kvgeom.speculative
    # re-exports this function), so this is the one arrow from here to them

    sg = geom.speculative
    if sg is None:
        return []

    def onoff(flag: bool) -> str:
        return "on" if flag else "off"

    lines = [
        f"speculative: method={sg.method} K={sg.num_speculative_tokens} block_drop={onoff(sg.block_drop)} "
        f"lookahead_hashes={onoff(sg.lookahead_hashes)} gpu_drop={onoff(sg.gpu_drop)} P={sg.prefill_lookahead_tokens}"
    ]
    off = geom.offload
    for g in geom.groups:
        lane = "drafter" if is_drafter_group(g.spec) else "target"
        notes = [f"{lane} lane"]
        if g.eagle_group:
            notes.append("eagle group")
        if g.proof_margin is not None:
            notes.append(f"GPU lookup matches {g.proof_margin} tokens past a hit and drops them")
        elif g.is_align_mamba and sg.gpu_drop:
            notes.append(f"no drop; its prefill checkpoint moves down one A={geom.hit_alignment_tokens}")
        if off is not None and g.index in {og.index for og in off.groups}:
            og = off.group(g.index)
            if og.eagle_group:
                notes.append(f"offload: queries one extra chunk of {og.tokens_per_chunk} and pops it")
            if og.proof_margin is not None:
                notes.append(f"offload tail key at boundary + {og.proof_margin}")
        lines.append(f"  group {g.index} ({g.kind}): " + "; ".join(notes))
    if sg.block_drop and not any(g.eagle_group for g in geom.groups):
        lines.append(
            "  no group is marked drafter: the GPU prefix cache drops for every group, the offload connector for none"
            if sg.gpu_drop
            else "  no group is marked drafter"
        )
    return lines


def hit_landing_lines(geom: Geometry) -> list[str]:
    """Where a GPU prefix-cache hit can land, per group (the ``kvgeom explain`` section).

    >>> import kvgeom
    >>> print("\\n".join(hit_landing_lines(kvgeom.resolve(kvgeom.DEFAULT_CONFIG))))
    GPU prefix hits: multiples of A = 16 below num_tokens where every cacheable group holds:
      group 0 (full_attention): every 32-token block before the hit, partial entries on H = 16
      group 1 (mamba): the state at exactly the hit (states every 16 tokens)
    """
    if not geom.config.cache.prefix_caching:
        return ["GPU prefix hits: none (prefix caching is off)"]
    A, H = geom.hit_alignment_tokens, geom.hash_block_size
    single = len(geom.groups) == 1
    unit = geom.groups[0].span if single else A
    lines = [f"GPU prefix hits: multiples of {'the span' if single else 'A'} = {unit} below num_tokens "
             "where every cacheable group holds:"]
    for g in geom.groups:
        S = g.span
        head = f"  group {g.index} ({g.kind}): "
        if not g.prefix_cacheable:
            lines.append(head + "not prefix-cacheable, never limits a hit")
            continue
        fine = not single and A < S and S % A == 0
        match g.family:
            case "full":
                tail = f", partial entries on H = {H}" if fine else ""
                lines.append(head + f"every {S}-token block before the hit{tail}")
            case "sliding":
                need = cdiv(g.gpu_window_need or 0, S)
                lines.append(head + f"the {need} block(s) of {S} tokens before the hit (its window)")
            case "chunked":
                size = (g.gpu_window_need or 0) + 1
                lines.append(head + f"the blocks of the hit's {size}-token attention chunk")
            case "mamba":
                grid = f"states on every H = {H}" if fine else f"states every {S} tokens"
                lines.append(head + f"the state at exactly the hit ({grid})")
            case "cross":
                lines.append(head + "no prefix-cache lookup in vLLM 0.33 (mark it prefix_cacheable=false)")
            case "circular" | "hisparse" | "encoder":
                lines.append(head + "not prefix-cacheable")
            case _:
                assert_never(g.family)
    return lines
