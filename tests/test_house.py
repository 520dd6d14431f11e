"""The house guards itself: kvgeom's import graph keeps the 0.3 layout (``docs/architecture.md``).

The test parses every ``kvgeom/**/*.py`` (no import is executed) and collects each import arrow, at module
level, under ``TYPE_CHECKING`` and inside functions alike. It fails on:

* a module missing from :data:`FLOORS` (a new module must be given its floor on purpose);
* an arrow that climbs to a higher floor (imports point down or sideways);
* an import circle;
* a private name (``_x``) imported from another module (a private name used elsewhere is a public concept
  without a home: give it one);

except for :data:`DOOR`, the one documented door: ``Geometry``'s query methods (and the old spelling
``kvgeom.geometry.resolve``) import their implementations at call time. Run it alone with
``python -m pytest -q tests/test_house.py``; each failure names the file, the line and the arrow.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "kvgeom"

def _floor(floor: int, *names: str) -> dict[str, int]:
    return {("kvgeom." + n if n else "kvgeom"): floor for n in names}


#: Floor of every module, bottom (1) to top (docs/architecture.md draws the same table). A module imports
#: only from its own floor or below; within a floor, without a circle.
FLOORS: dict[str, int] = {
    # the vocabulary: arithmetic, text, errors, registries
    **_floor(1, "_math", "_format", "errors", "deviations", "glossary"),
    # input checking and parsing helpers
    **_floor(2, "_check", "_pydantic", "_toml"),
    # the input: specs, parallelism, the speculative section, the whole config
    **_floor(3, "specs", "parallel", "speculative_config", "config"),
    # the resolved values (and nothing else)
    **_floor(4, "geometry"),
    # every resolve-time decision, and the rules that read resolved values
    **_floor(5, "_resolve", "_resolve.problems", "_resolve.groups", "_resolve.units", "_resolve.speculative",
             "_resolve.offload", "_resolve.warnings"),
    **_floor(5, "prefill", "ranks", "boundaries", "masks", "keys", "residency", "prefix"),
    # packed holder rows, the read-optimised twin of a residency (a router's index)
    **_floor(5, "holders"),
    # a request's block hashes as vLLM computes them: reads only the geometry's H (and look-ahead)
    **_floor(5, "hashing"),
    **_floor(6, "probes", "handoff"),
    **_floor(7, "hits"),
    **_floor(8, "request"),
    # numpy twins, one per scalar module, and their face
    **_floor(9, "batch", "batch._arrays", "batch.ranks", "batch.keys", "batch.boundaries", "batch.masks",
             "batch.probes", "batch.handoff", "batch.hits", "batch.prefix", "batch.lookup", "batch.speculative"),
    # consumers of the rules
    **_floor(10, "fingerprint", "compat", "pages", "resolution", "diagram", "presets", "events", "sim", "router",
             "report"),
    # the edges: engine adapters, conformance harnesses, Hypothesis strategies
    **_floor(11, "adapters", "adapters.vllm", "strategies", "conformance", "conformance.answers",
             "conformance.command", "conformance.engines", "conformance.findings", "conformance.gpu_prefix",
             "conformance.run", "conformance.search", "conformance.vllm_engine", "conformance.vllm_objects",
             "conformance.vllm_prefix",
             "conformance.vllm_scheduler", "conformance.vllm_stores", "conformance.vllm_pending",
             "conformance.vllm_grouping", "conformance.vllm_rswa"),
    # engine homes (docs/architecture.md, "Where a new engine goes")
    **_floor(11, "engines", "engines.sglang", "engines.sglang_diagram", "conformance.sglang_engine",
             "conformance.sglang_radix"),
    **_floor(11, "engines", "engines.lmcache", "conformance.lmcache_engine", "conformance.lmcache_transfer"),
    # thin faces and the command line
    **_floor(12, "", "__main__", "cli", "speculative"),
}

#: The one documented door upward (geometry.py's module docstring): ``Geometry``'s query methods forward to
#: :mod:`kvgeom.report`, and the old spelling ``kvgeom.geometry.resolve`` is served from :mod:`kvgeom._resolve`,
#: both through imports at call time.
DOOR: set[tuple[str, str]] = {("kvgeom.geometry", "kvgeom.report"), ("kvgeom.geometry", "kvgeom._resolve")}


def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


MODULES = _modules()


def _arrows() -> list[tuple[str, str, int, str | None]]:
    """``(importer, imported module, line, imported name or None)`` for every kvgeom import."""
    arrows = []
    for name, path in MODULES.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets: list[tuple[str, str | None]] = []
            if isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(up + ([node.module] if node.module else []))
                if not base.startswith("kvgeom"):
                    continue
                for alias in node.names:
                    sub = f"{base}.{alias.name}"
                    targets.append((sub, None) if sub in MODULES else (base, alias.name))
            elif isinstance(node, ast.Import):
                targets = [(a.name, None) for a in node.names if a.name.startswith("kvgeom")]
            for target, imported in targets:
                while target not in MODULES and "." in target:
                    target = target.rpartition(".")[0]
                if target != name:
                    arrows.append((name, target, node.lineno, imported))
    return arrows


ARROWS = _arrows()


def test_every_module_has_a_floor():
    missing = sorted(set(MODULES) - set(FLOORS))
    stale = sorted(set(FLOORS) - set(MODULES))
    assert not missing, f"modules without a floor (add them to FLOORS and docs/architecture.md): {missing}"
    assert not stale, f"FLOORS names modules that do not exist: {stale}"


def test_imports_point_down_or_sideways():
    up = [
        f"{MODULES[a].relative_to(PACKAGE.parent)}:{line}: {a} (floor {FLOORS[a]}) imports {b} (floor {FLOORS[b]})"
        for a, b, line, _ in ARROWS
        if a in FLOORS and b in FLOORS and FLOORS[b] > FLOORS[a] and (a, b) not in DOOR
    ]
    assert not up, "upward imports:\n" + "\n".join(up)


def test_no_import_circle():
    edges: dict[str, set[str]] = defaultdict(set)
    for a, b, _, _ in ARROWS:
        if (a, b) not in DOOR:
            edges[a].add(b)
    cycles = _cycles(edges)
    assert not cycles, "import circles (modules that reach each other): " + "; ".join(", ".join(c) for c in cycles)


def test_no_private_name_crosses_modules():
    crossing = [
        f"{MODULES[a].relative_to(PACKAGE.parent)}:{line}: {a} imports {b}.{name}"
        for a, b, line, name in ARROWS
        if name is not None and name.startswith("_") and not name.startswith("__")
    ]
    assert not crossing, "private names imported across modules:\n" + "\n".join(crossing)


def test_the_door_is_used_only_at_call_time():
    """Every door arrow is an import inside a function body (never at module level)."""
    for a, b in DOOR:
        tree = ast.parse(MODULES[a].read_text())
        top = [n for n in tree.body if isinstance(n, ast.Import | ast.ImportFrom)]
        top_targets = {n.module for n in top if isinstance(n, ast.ImportFrom)}
        assert b not in top_targets, f"{a} imports {b} at module level: the door is for call-time imports only"


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan), each as a member list."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


@pytest.mark.parametrize(
    ("edges", "expected"),
    [
        ({"a": {"b"}, "b": set()}, []),  # a line: no circle
        ({"a": {"b"}, "b": {"a"}}, [["a", "b"]]),  # two modules importing each other
        ({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}, [["a", "b", "c"]]),  # a ring of three, d outside
    ],
)
def test_the_circle_finder_finds_circles(edges, expected):
    assert _cycles(edges) == expected
