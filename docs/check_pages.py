"""Check that the docs site fits a laptop screen, in a headless chromium (issue 22: "a site people can read").

Run from the repository root:

    python docs/check_pages.py                       # build the site, check the pages at 1280 px
    python docs/check_pages.py --width 1440          # another window width
    python docs/check_pages.py --screenshots /tmp/shots   # also write a full-page PNG of each page
    python docs/check_pages.py --site /tmp/site      # check an already built site

For each page of :data:`PAGES` it loads the built HTML in ``chromium --headless`` with a small script
added at the end of the page, reads what the script measured back from ``--dump-dom``, and fails when:

* the main content is wider than its frame (``scrollWidth > clientWidth``), or the page scrolls sideways;
* a table is wider than its frame (a column would be cut off or hidden behind a scroll bar);
* a diagram's text is drawn smaller than :data:`MIN_TEXT_PX` on screen (the SVG's ``font-size``
  times the scale the page shows it at).

* a code block hides part of a line (long lines wrap inside the box, docs/css/kvgeom.css).

Exit 0 when every page
fits, 1 when one does not, 77 (skipped) when no chromium is installed. ``tests/test_docs.py`` runs
:func:`check` the same way.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent

#: The pages issue 22 names (the widest tables and the diagrams), as built paths.
PAGES = ("glossary/index.html", "routing/index.html", "speculative/index.html", "cases/lmcache-4809/index.html")
#: Smallest legible diagram text on screen, in CSS px.
MIN_TEXT_PX = 11.0
SKIPPED = 77

_MARK = "kvgeom-check"
# Runs after the theme's own scripts (which wrap tables in .wy-table-responsive) and after layout.
_SCRIPT = (
    """<script>
window.addEventListener('load', function () { setTimeout(function () {
  var main = document.querySelector('.wy-nav-content');
  var style = getComputedStyle(main);
  var box = main.getBoundingClientRect();
  // The text column: the frame minus its padding; nothing may reach past its right edge.
  var inner = main.clientWidth - parseFloat(style.paddingLeft) - parseFloat(style.paddingRight);
  var out = {
    page: [document.documentElement.scrollWidth, window.innerWidth],
    main: [main.scrollWidth, main.clientWidth],
    height: document.documentElement.scrollHeight,
    tables: [], images: [], pre: []
  };
  main.querySelectorAll('table').forEach(function (t) {
    var wrap = t.closest('.wy-table-responsive');
    var reach = t.getBoundingClientRect().right;
    t.querySelectorAll('td, th, td *, th *').forEach(function (c) {
      reach = Math.max(reach, c.getBoundingClientRect().right);
    });
    var hidden = Math.max(wrap ? wrap.scrollWidth - wrap.clientWidth : 0, t.scrollWidth - t.clientWidth);
    var head = (t.querySelector('th') || t).textContent.trim();
    out.tables.push([reach - box.left - parseFloat(style.paddingLeft), inner, hidden, head]);
  });
  main.querySelectorAll('img').forEach(function (img) {
    out.images.push([img.getAttribute('src'), img.getBoundingClientRect().width, img.naturalWidth]);
  });
  main.querySelectorAll('pre').forEach(function (p) {
    var c = p.querySelector('code') || p;
    out.pre.push([Math.max(p.scrollWidth - p.clientWidth, c.scrollWidth - c.clientWidth), c.textContent.slice(0, 50)]);
  });
  var res = document.createElement('pre');
  res.id = '__MARK__';
  res.textContent = JSON.stringify(out);
  document.body.appendChild(res);
}, 200); });
</script>"""
).replace("__MARK__", _MARK)


def chromium() -> str | None:
    """The chromium executable on PATH, or None."""
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        if found := shutil.which(name):
            return found
    return None


def build_site(site: Path) -> None:
    """``mkdocs build --strict`` into ``site``; raises CalledProcessError with mkdocs' output on failure."""
    subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "--site-dir", str(site)],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
    )


@dataclass
class PageReport:
    page: str
    problems: list[str] = field(default_factory=list)
    tables: int = 0
    diagrams: int = 0
    height: int = 0


def _svg_font_px(path: Path) -> float:
    """The base font size an SVG of ``kvgeom diagram`` is drawn with (its root ``font-size``)."""
    head = path.read_text(encoding="utf-8")[:1000]
    found = re.search(r'<svg[^>]*\sfont-size="([0-9.]+)"', head)
    return float(found.group(1)) if found else 16.0


def _run(browser: str, args: list[str]) -> str:
    out = subprocess.run(
        [browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )
    return out.stdout


def measure(browser: str, site: Path, page: str, width: int) -> dict[str, object]:
    """What the page's own layout says at a ``width`` px wide window (see the module docstring)."""
    html = site / page
    probe = html.with_name(f"{_MARK}.html")  # beside the page, so its relative links resolve
    probe.write_text(html.read_text(encoding="utf-8").replace("</body>", _SCRIPT + "</body>"), encoding="utf-8")
    try:
        dom = _run(
            browser,
            [f"--window-size={width},900", "--virtual-time-budget=5000", "--dump-dom", probe.as_uri()],
        )
    finally:
        probe.unlink()
    found = re.search(rf'<pre id="{_MARK}">(.*?)</pre>', dom, flags=re.S)
    if found is None:
        raise RuntimeError(f"{page}: chromium returned no measurement (is {browser} working?)")
    result: dict[str, object] = json.loads(found.group(1).replace("&quot;", '"').replace("&amp;", "&"))
    return result


def check(
    site: Path, *, width: int = 1280, pages: tuple[str, ...] = PAGES, screenshots: Path | None = None
) -> list[PageReport]:
    """Measure each page at ``width`` px; a report per page, with its problems (empty when it fits)."""
    browser = chromium()
    if browser is None:
        raise FileNotFoundError("no chromium on PATH")
    reports = []
    for page in pages:
        m = measure(browser, site, page, width)
        report = PageReport(page)
        page_w, window_w = m["page"]  # type: ignore[misc]
        if page_w > window_w:
            report.problems.append(f"the page scrolls sideways: {page_w} px in a {window_w} px window")
        main_scroll, main_client = m["main"]  # type: ignore[misc]
        if main_scroll > main_client:
            report.problems.append(f"main content is {main_scroll} px wide in a {main_client} px frame")
        for reach, text_w, hidden, head in m["tables"]:  # type: ignore[attr-defined]
            report.tables += 1
            if reach > text_w + 1 or hidden > 0:
                report.problems.append(
                    f"table '{head[:40]}' reaches {reach:.0f} px in a {text_w} px text column"
                    + (f" ({hidden} px hidden behind a scroll bar)" if hidden > 0 else "")
                )
        for src, shown, natural in m["images"]:  # type: ignore[attr-defined]
            if not src.endswith(".svg") or not natural:
                continue
            report.diagrams += 1
            text_px = _svg_font_px((site / page).parent / src) * shown / natural
            if text_px < MIN_TEXT_PX - 0.05:
                report.problems.append(
                    f"diagram {src}: {natural} px drawn at {shown:.0f} px, so its text is {text_px:.1f} px "
                    f"(under {MIN_TEXT_PX} px)"
                )
        for hidden, start in m["pre"]:  # type: ignore[attr-defined]
            if hidden > 0:
                report.problems.append(f"code block '{start.splitlines()[0][:40]}' hides {hidden} px of a long line")
        report.height = int(m["height"])  # type: ignore[call-overload]
        if screenshots is not None:
            screenshots.mkdir(parents=True, exist_ok=True)
            shot = screenshots / (page.replace("/index.html", "").replace("/", "-") + f"-{width}.png")
            _run(
                browser,
                [f"--window-size={width},{min(report.height, 16000)}", f"--screenshot={shot}", (site / page).as_uri()],
            )
        reports.append(report)
    return reports


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--site", type=Path, help="an already built site (default: build one in a temp dir)")
    parser.add_argument("--width", type=int, default=1280, help="window width in px (default 1280)")
    parser.add_argument("--screenshots", type=Path, help="write a full-page PNG of each page into this directory")
    parser.add_argument("pages", nargs="*", default=list(PAGES), help="built pages to check (default: %(default)s)")
    args = parser.parse_args(argv)
    if chromium() is None:
        print("check_pages: skipped, no chromium on PATH", file=sys.stderr)
        return SKIPPED
    with tempfile.TemporaryDirectory() as tmp:
        site = args.site
        if site is None:
            site = Path(tmp) / "site"
            build_site(site)
        reports = check(site, width=args.width, pages=tuple(args.pages), screenshots=args.screenshots)
    bad = 0
    for r in reports:
        status = "ok" if not r.problems else "FAILS"
        print(f"{status:5} {r.page}: {r.tables} tables, {r.diagrams} diagrams")
        for p in r.problems:
            print(f"      {p}")
        bad += bool(r.problems)
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
