"""Open a bench report in headless Chromium and check that its tables and images render.

    python bench/report_render_check.py RESULTS_DIR     # e.g. results/q (holds report.html)
    python bench/report_render_check.py                 # builds a small synthetic report first

Needs the Debian package ``chromium`` (``apt-get install -y chromium``). Chromium runs
with networking disabled (every host resolves to nothing), so a report that needed the
network would show broken images. The check loads a copy of ``report.html`` at 1280 px
with a small probe script appended (the report itself has no scripts), dumps the DOM, and
reads back: the number of tables and their rows, the tables that are clipped (wider than
their box while the box does not scroll, or a box running off the page), the number of
images and how many decoded to a non-zero size. It also takes a screenshot and checks
that it is not blank.

Prints one JSON line (``"ok": true`` on success) and exits 0, or 1 on failure.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

PROBE = """
<script>
window.addEventListener('load', function () {
  var imgs = Array.from(document.images);
  var ok = imgs.filter(function (i) { return i.complete && i.naturalWidth > 0; }).length;
  var tables = Array.from(document.querySelectorAll('table'));
  var rows = tables.map(function (t) { return t.tBodies.length ? t.tBodies[0].rows.length : 0; });
  var visible = tables.filter(function (t) { return t.getBoundingClientRect().height > 0; }).length;
  // a table is clipped when its columns run past its box and the box does not scroll, or
  // when the box itself runs off the right edge of the page
  var page = document.documentElement.clientWidth;
  var clipped = tables.filter(function (t) {
    var box = t.parentElement;
    var scrolls = ['auto', 'scroll'].indexOf(getComputedStyle(box).overflowX) >= 0;
    var overflows = t.getBoundingClientRect().width > box.clientWidth + 1;
    return (overflows && !scrolls) || box.getBoundingClientRect().right > page + 1;
  }).map(function (t) { return t.id; });
  var pre = document.createElement('pre');
  pre.id = 'render-check';
  pre.textContent = JSON.stringify({images: imgs.length, images_rendered: ok,
    tables: tables.length, tables_visible: visible, table_rows: rows, tables_clipped: clipped,
    page_width: page,
    height: document.body.scrollHeight});
  document.body.appendChild(pre);
});
</script>
"""

FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
    "--disable-extensions",
    "--host-resolver-rules=MAP * ~NOTFOUND",
    "--virtual-time-budget=10000",
    "--window-size=1280,2400",  # as a reader opens it: 1280 px wide
]


def _chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    raise SystemExit("Chromium not found: install it with `apt-get install -y chromium`.")


def _run(args: list[str], timeout: int = 90) -> subprocess.CompletedProcess:
    with tempfile.TemporaryDirectory() as profile:
        return subprocess.run(
            [_chromium(), *FLAGS, f"--user-data-dir={profile}", *args],
            capture_output=True,
            text=True,
            timeout=timeout,
        )


def _synthetic(where: Path) -> Path:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from cogcal.report.build import build_report
    from test_report_render import make_bench_dir  # a small synthetic bench folder

    out = make_bench_dir(where / "bench")
    build_report(out)
    return out


def _blank(png: Path) -> bool:
    import matplotlib.image as mpimg

    img = mpimg.imread(png)
    return float(img[..., :3].std()) < 1e-3


def check(results_dir: Path, screenshot: Path | None = None) -> dict:
    """Render ``results_dir/report.html``; return the probe's findings and ``ok``."""
    report = results_dir / "report.html"
    if not report.is_file():
        raise SystemExit(f"{report} does not exist: run `cogcal report {results_dir}` first.")
    page = report.read_text(encoding="utf-8")
    external = re.findall(r'(?:src|href)="(https?:|//)[^"]*"', page)
    with tempfile.TemporaryDirectory() as tmp:
        probe = Path(tmp) / "probe.html"
        probe.write_text(page.replace("</body>", PROBE + "</body>"), encoding="utf-8")
        dom = _run(["--dump-dom", probe.as_uri()])
        match = re.search(r'<pre id="render-check">(.*?)</pre>', dom.stdout, re.S)
        if not match:
            return {"ok": False, "error": "probe did not run", "stderr": dom.stderr[-2000:]}
        import html

        found = json.loads(html.unescape(match.group(1)))
        shot = screenshot or Path(tmp) / "shot.png"
        _run([f"--screenshot={shot}", report.as_uri()])
        blank = not shot.is_file() or _blank(shot)
    found["external_urls"] = len(external)
    found["screenshot_blank"] = blank
    found["ok"] = (
        found["tables"] > 0
        and found["tables_visible"] == found["tables"]
        and all(r > 0 for r in found["table_rows"])
        and not found["tables_clipped"]
        and found["images"] > 0
        and found["images_rendered"] == found["images"]
        and not external
        and not blank
    )
    found["report"] = str(report)
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("results_dir", nargs="?", type=Path, help="folder with report.html")
    parser.add_argument("--screenshot", type=Path, help="keep the screenshot here")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        results_dir = args.results_dir or _synthetic(Path(tmp))
        found = check(results_dir, args.screenshot)
    found.pop("table_rows", None)
    print(json.dumps(found))
    return 0 if found["ok"] else 1


if __name__ == "__main__":
    os.environ.setdefault("MPLBACKEND", "Agg")
    sys.exit(main())
