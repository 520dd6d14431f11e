"""Can two layouts share offloaded keys? Per group, why not, and what would fix it.

A persistent KV tier (or a prefill node handing blocks to a decode node) can
reuse a key written by another deployment only if the key stands for the same
bytes on the same rank. :func:`compat` compares the two layouts' fingerprint
fields (:func:`kvgeom.fingerprint.layout_fields`) group by group, so

    ``compat(a, b).compatible`` is true exactly when ``fingerprint(a) == fingerprint(b)``,

and explains every difference: a different span, offload chunk or hash unit,
per-rank slicing from DCP, the interleave, PCP or TP, a different page layout,
Mamba mode or offloading. Each reason carries a remedy (re-chunking with
``blocks_per_chunk``, a common ``prefix_match_unit``, resharding, or making the
deployments agree). The typical cases: a prefill node at DCP 1 and a decode
node at DCP 2 (the attention group's keys differ, the replicated Mamba group's
do not); a TP change that moves the hybrid block size (#41037); an interleave
change that vLLM's file tier does not notice (vLLM 0.33 `v1/kv_offload/file_mapper.py`; ``docs/fingerprint.md``).
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kvgeom.config import KVGeomConfig
from kvgeom.fingerprint import as_geometry, fingerprint, layout_fields
from kvgeom.geometry import Geometry

__all__ = ["CompatReason", "CompatReport", "GroupCompat", "compat", "compat_main_text"]

Source = Geometry | KVGeomConfig | Mapping[str, Any] | str | os.PathLike[str]


@dataclass(frozen=True, slots=True)
class CompatReason:
    """One reason two layouts cannot share keys: a stable ``code``, what differs, and a remedy."""

    code: str
    message: str
    remedy: str

    def to_dict(self) -> dict[str, str]:
        return {"code": self.code, "message": self.message, "remedy": self.remedy}


@dataclass(frozen=True, slots=True)
class GroupCompat:
    """Whether group ``index`` of the two layouts can share offloaded keys."""

    index: int
    kind_a: str | None
    kind_b: str | None
    reasons: tuple[CompatReason, ...]

    @property
    def compatible(self) -> bool:
        return not self.reasons

    def to_dict(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "kind_a": self.kind_a,
            "kind_b": self.kind_b,
            "compatible": self.compatible,
            "reasons": [r.to_dict() for r in self.reasons],
        }


@dataclass(frozen=True, slots=True)
class CompatReport:
    """The comparison of layouts ``a`` and ``b``.

    ``reasons`` concern every group (hash unit, PP, offloading, group count);
    ``groups`` pairs the groups by index. ``compatible`` holds exactly when the
    two fingerprints are equal.
    """

    fingerprint_a: str
    fingerprint_b: str
    reasons: tuple[CompatReason, ...]
    groups: tuple[GroupCompat, ...]

    @property
    def compatible(self) -> bool:
        return self.fingerprint_a == self.fingerprint_b

    @property
    def exit_code(self) -> int:
        """0 when keys are interchangeable, 1 otherwise (for a CLI)."""
        return 0 if self.compatible else 1

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable form; the key set is a stable contract."""
        return {
            "compatible": self.compatible,
            "fingerprint_a": self.fingerprint_a,
            "fingerprint_b": self.fingerprint_b,
            "reasons": [r.to_dict() for r in self.reasons],
            "groups": [g.to_dict() for g in self.groups],
        }


def _slicing_words(s: dict[str, Any] | None) -> str:
    if s is None:
        return "not dealt across ranks"
    pcp = f", pcp={s['pcp']}" if s["pcp"] else ""
    return f"dealt over dcp={s['dcp']}{pcp} ranks with interleave {s['interleave']}"


def _layer_diffs(la: list[dict[str, Any]], lb: list[dict[str, Any]]) -> list[str]:
    if len(la) != len(lb):
        return [f"{len(la)} vs {len(lb)} layers"]
    out = []
    for j, (x, y) in enumerate(zip(la, lb, strict=True)):
        for key in sorted(set(x) | set(y)):
            if x.get(key) != y.get(key):
                where = f"layers[{j}]." if len(la) > 1 else ""
                out.append(f"{where}{key} {x.get(key)!r} vs {y.get(key)!r}")
    return out


def _group_reasons(
    fa: dict[str, Any], fb: dict[str, Any], ga: dict[str, Any], gb: dict[str, Any]
) -> list[CompatReason]:
    reasons: list[CompatReason] = []
    # layer lists are null when a side gives no page field (layout_fields); kinds then compare by representative
    la, lb = ga["layers"], gb["layers"]
    kinds_a = [x["kind"] for x in la] if la is not None else None
    kinds_b = [x["kind"] for x in lb] if lb is not None else None
    known_both = kinds_a is not None and kinds_b is not None
    if ga["kind"] != gb["kind"] or (known_both and kinds_a != kinds_b):
        reasons.append(
            CompatReason(
                "kind",
                f"the group is {ga['kind']} {kinds_a} in a and {gb['kind']} {kinds_b} in b",
                "the models (or their grouping) differ; keys of different cache kinds never mean the same bytes",
            )
        )
    if ga["offloaded"] != gb["offloaded"]:
        reasons.append(
            CompatReason(
                "offloaded",
                f"the group is {'offloaded' if ga['offloaded'] else 'not offloaded'} in a and "
                f"{'offloaded' if gb['offloaded'] else 'not offloaded'} in b",
                "configure offloading and prefix_cacheable the same way on both sides",
            )
        )
    if ga["mamba_mode"] != gb["mamba_mode"]:
        reasons.append(
            CompatReason(
                "mamba_mode",
                f"Mamba mode {ga['mamba_mode']!r} in a vs {gb['mamba_mode']!r} in b: a block holds different states",
                "use the same mamba_cache_mode (align) on both sides",
            )
        )
    sa, sb = ga["span"], gb["span"]
    ba, bb = ga["block_size"], gb["block_size"]
    ka, kb = fa["blocks_per_chunk"], fb["blocks_per_chunk"]
    if sa != sb:
        common = math.lcm(sa, sb)
        reasons.append(
            CompatReason(
                "span",
                f"one block id stands for {sa} positions in a (per-rank block {ba}) and {sb} in b "
                f"(per-rank block {bb})",
                f"re-chunk so one key covers the same tokens: blocks_per_chunk={common // sa} on a and "
                f"{common // sb} on b give {common}-token chunks"
                + (
                    "; the per-rank pages still differ, so also use the same per-rank block_size (for a hybrid "
                    f"resolved by vLLM, pass --block-size {max(ba, bb)} to both so neither is raised)"
                    if ba != bb
                    else ""
                ),
            )
        )
    elif ba != bb:
        reasons.append(
            CompatReason(
                "block_size",
                f"the span is {sa} on both sides but the per-rank block is {ba} in a and {bb} in b",
                "the ranks hold different slices of a span: use the same per-rank block_size and DCP size",
            )
        )
    if ka is not None and kb is not None and sa * ka != sb * kb:
        reasons.append(
            CompatReason(
                "chunk",
                f"an offload chunk is {sa}*{ka} = {sa * ka} tokens in a and {sb}*{kb} = {sb * kb} in b",
                f"set blocks_per_chunk so the chunks agree (e.g. {math.lcm(sa, sb) // sa} on a and "
                f"{math.lcm(sa, sb) // sb} on b)",
            )
        )
    xa, xb = ga["kv_slicing"], gb["kv_slicing"]
    if xa != xb:
        if (
            xa is not None
            and xb is not None
            and {k: v for k, v in xa.items() if k != "interleave"} == {k: v for k, v in xb.items() if k != "interleave"}
        ):
            reasons.append(
                CompatReason(
                    "interleave",
                    f"cp_interleave is {xa['interleave']} in a and {xb['interleave']} in b: rank r's slice of a key "
                    "holds different positions (vLLM's file tier does not namespace the interleave)",
                    f"use the same cp_interleave on both sides (e.g. {xa['interleave']}), or re-deal each chunk's "
                    "positions across the DCP ranks when moving it",
                )
            )
        else:
            reasons.append(
                CompatReason(
                    "dcp_slicing",
                    f"the group is {_slicing_words(xa)} in a and {_slicing_words(xb)} in b",
                    "reshard: gather each chunk's per-rank slices and re-deal them for the other layout (position p "
                    "lives on rank ((p mod B*D) div I) mod D), or run both sides with the same DCP size and "
                    "interleave",
                )
            )
    if ga["tp"] != gb["tp"]:
        reasons.append(
            CompatReason(
                "tp_slicing",
                f"TP splits this group's heads/state over {ga['tp'] or 1} ranks in a and {gb['tp'] or 1} in b",
                "reshard heads across TP ranks when moving a key, or use the same TP size",
            )
        )
    pa, pb = ga["page_bytes"], gb["page_bytes"]
    diffs = _layer_diffs(la, lb) if known_both and kinds_a == kinds_b else []
    if (pa is None) != (pb is None) or (la is None) != (lb is None):
        reasons.append(
            CompatReason(
                "page_layout_unknown",
                f"page bytes are {'unknown' if pa is None else pa} in a and {'unknown' if pb is None else pb} in b, "
                "so kvgeom cannot confirm the pages match",
                "give the page fields (num_kv_heads, head_size, dtype; Mamba shapes and dtypes) on both sides",
            )
        )
    elif pa != pb or diffs or ga["tokens_per_state"] != gb["tokens_per_state"]:
        if not diffs and ga["tokens_per_state"] != gb["tokens_per_state"]:
            diffs = [f"tokens_per_state {ga['tokens_per_state']!r} vs {gb['tokens_per_state']!r}"]
        detail = "; ".join(diffs) if diffs else f"page bytes {pa} vs {pb}"
        reasons.append(
            CompatReason(
                "page_layout",
                f"the pages differ: {detail}",
                "use the same cache dtype and the same per-rank heads/state shapes, or convert pages when moving them",
            )
        )
    return reasons


def compat(a: Source, b: Source) -> CompatReport:
    """Compare two layouts (anything :func:`kvgeom.resolve` accepts, or a :class:`Geometry`).

    Contract: ``compat(a, b).compatible == (fingerprint(a) == fingerprint(b))``;
    the report is symmetric up to naming (``compat(b, a)`` has the same
    ``compatible`` and the same reason codes per group); a layout is compatible
    with itself. Every difference in the fingerprint fields yields at least one
    reason with a remedy.

    >>> a = {"groups": [{"kind": "full_attention", "block_size": 16}, {"kind": "mamba", "block_size": 16}],
    ...      "parallel": {"tp": 2, "dcp": 1}, "offload": {}}
    >>> b = {**a, "parallel": {"tp": 2, "dcp": 2}}
    >>> r = compat(a, b)
    >>> r.compatible, [g.compatible for g in r.groups], [x.code for x in r.groups[0].reasons]
    (False, [False, True], ['span', 'chunk', 'dcp_slicing'])
    """
    geo_a, geo_b = as_geometry(a), as_geometry(b)
    fa, fb = layout_fields(geo_a), layout_fields(geo_b)
    reasons: list[CompatReason] = []
    if fa["hash_block_size"] != fb["hash_block_size"]:
        ha, hb = fa["hash_block_size"], fb["hash_block_size"]
        reasons.append(
            CompatReason(
                "hash_unit",
                f"request hashes are chained every H={ha} tokens in a and H={hb} in b, so the same prefix gets "
                "different keys",
                f"set cache.prefix_match_unit={math.gcd(ha, hb)} on both sides (it divides every span of both)",
            )
        )
    if (fa["blocks_per_chunk"] is None) != (fb["blocks_per_chunk"] is None):
        reasons.append(
            CompatReason(
                "offload_missing",
                f"offloading is {'off' if fa['blocks_per_chunk'] is None else 'on'} in a and "
                f"{'off' if fb['blocks_per_chunk'] is None else 'on'} in b",
                "add an offload section on both sides",
            )
        )
    if fa["pp"] != fb["pp"]:
        reasons.append(
            CompatReason(
                "pp",
                f"pipeline parallel size {fa['pp'] or 1} in a vs {fb['pp'] or 1} in b: a rank's page holds the "
                "layers of its stage",
                "use the same pipeline_parallel_size",
            )
        )
    na, nb = len(fa["groups"]), len(fb["groups"])
    if na != nb:
        reasons.append(
            CompatReason(
                "group_count",
                f"a has {na} groups and b has {nb}; a key carries its group index",
                "the models or their grouping differ: keys cannot be shared",
            )
        )
    groups = []
    for i in range(max(na, nb)):
        ga = fa["groups"][i] if i < na else None
        gb = fb["groups"][i] if i < nb else None
        if ga is None or gb is None:
            missing = "a" if ga is None else "b"
            rs = [CompatReason("missing_group", f"group {i} does not exist in {missing}", "keys cannot be shared")]
        else:
            rs = _group_reasons(fa, fb, ga, gb)
        groups.append(GroupCompat(i, None if ga is None else ga["kind"], None if gb is None else gb["kind"], tuple(rs)))
    fp_a, fp_b = fingerprint(geo_a), fingerprint(geo_b)
    if fp_a != fp_b and not reasons and all(g.compatible for g in groups):
        reasons.append(  # every field is covered above; this guards a future field nobody explained
            CompatReason("layout", "the layout fields differ", "compare kvgeom.fingerprint.layout_fields(a) and (b)")
        )
    if fp_a == fp_b:  # identical fields cannot differ anywhere
        reasons, groups = [], [GroupCompat(g.index, g.kind_a, g.kind_b, ()) for g in groups]
    return CompatReport(fp_a, fp_b, tuple(reasons), tuple(groups))


def compat_main_text(report: CompatReport) -> str:
    """Human-readable text of a :class:`CompatReport` for a CLI (``report.exit_code`` is its exit status).

    >>> cfg = {"groups": [{"kind": "mla", "block_size": 64}]}
    >>> print(compat_main_text(compat(cfg, cfg)).splitlines()[0])  # doctest: +ELLIPSIS
    compatible: offloaded keys are interchangeable (fingerprint kvg2-...)
    """
    fa, fb = report.fingerprint_a, report.fingerprint_b
    lines = []
    if report.compatible:
        lines.append(f"compatible: offloaded keys are interchangeable (fingerprint {fa})")
    else:
        lines.append(f"NOT compatible: a={fa} b={fb}")
    for r in report.reasons:
        lines.append(f"  all groups: [{r.code}] {r.message}")
        lines.append(f"    fix: {r.remedy}")
    for g in report.groups:
        kinds = g.kind_a if g.kind_a == g.kind_b else f"{g.kind_a} / {g.kind_b}"
        lines.append(f"  group {g.index} ({kinds}): {'compatible' if g.compatible else 'incompatible'}")
        for r in g.reasons:
            lines.append(f"    - [{r.code}] {r.message}")
            lines.append(f"      fix: {r.remedy}")
    return "\n".join(lines)
