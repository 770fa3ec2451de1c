"""Screenshots of the rendered site: the index and two report pages (the H200 LMCache 0.5.4 KV audit's finding and
the CPU self-test) at a desktop and a phone width, taken by a headless Chromium into docs/screenshots/
(`python -m repro screenshots`, `make screenshots`), one viewport each: what a maintainer sees before scrolling.

What they show: at 1280 px the index's picture of every stack and reuse path, and a report's headline with its
first KV heatmap; at 390 px the same without sideways scrolling of the page (the picture and a heatmap scroll in
their own boxes).
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

from repro.commands import ArgumentParser
from repro.errors import EXIT_OK, UsageError
from repro.publish.site import render_site

# (width, height) of each viewport: a laptop screen and a common phone (CSS pixels)
VIEWPORTS = {"1280": (1280, 900), "390": (390, 844)}
# name -> page, relative to the site: <name>-<width>.png each
DEFAULT_PAGES = {
    "index": "index.html",
    "report-kvaudit": "h200-kvaudit-lmcache-0.5.4.html",
    "report-selftest": "versions/cpu-vllm-0.32.0-selftest.html",
}
TIMEOUT_S = 120


def find_chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if found := shutil.which(name):
            return found
    raise UsageError("no chromium on PATH (Debian: apt-get install chromium)")


def take_screenshot(chromium: str, page: Path, png: Path, size: tuple[int, int]) -> None:
    """One PNG of page at size, scrollbars hidden, from a throw-away profile; nothing is fetched from elsewhere."""
    with tempfile.TemporaryDirectory(prefix="kvkit-chromium-") as profile:
        cmd = [
            chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-extensions",
            "--force-device-scale-factor=1", "--host-resolver-rules=MAP * ~NOTFOUND",
            f"--user-data-dir={profile}", f"--window-size={size[0]},{size[1]}", f"--screenshot={png}",
            page.resolve().as_uri(),
        ]  # fmt: skip
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S, check=False)
    if done.returncode != 0 or not png.is_file():
        raise RuntimeError(f"chromium exited {done.returncode} for {page}: {done.stderr[-1500:]}")


def take_screenshots(site: Path, out: Path, pages: dict[str, str], chromium: str) -> list[Path]:
    """<name>-<width>.png for every page and viewport, into out."""
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, rel in pages.items():
        page = site / rel
        if not page.is_file():
            raise UsageError(f"{page} is not in the rendered site")
        for width, size in VIEWPORTS.items():
            png = out / f"{name}-{width}.png"
            take_screenshot(chromium, page, png, size)
            written.append(png)
    return written


def main(argv: list[str]) -> int:
    """`python -m repro screenshots [--reports DIR] [--out DIR] [--report PAGE ...]`: render the site into a temporary
    folder and screenshot its index and report pages (by default the H200 KV audit's finding and the CPU self-test)
    at 1280 and 390 px wide."""
    parser = ArgumentParser(prog="python -m repro screenshots", description=main.__doc__)
    parser.add_argument("--reports", default="reports", help="directory of kvkit reports (default: reports)")
    parser.add_argument("--out", default="docs/screenshots", help="where the PNGs go (default: docs/screenshots)")
    parser.add_argument(
        "--report",
        action="append",
        help="a report page relative to the site, once per page (default: "
        + ", ".join(v for k, v in DEFAULT_PAGES.items() if k != "index")
        + "); its PNGs are named report-<page's name>",
    )
    args = parser.parse_args(argv)
    chromium = find_chromium()
    with tempfile.TemporaryDirectory(prefix="kvkit-site-") as site:
        render_site(Path(args.reports), Path(site), versions=True)  # as `python -m repro site` renders it
        pages = DEFAULT_PAGES
        if args.report:
            pages = {"index": "index.html", **{f"report-{Path(r).stem}": r for r in args.report}}
        for png in take_screenshots(Path(site), Path(args.out), pages, chromium):
            print(f"{png} ({png.stat().st_size} bytes)")
    return EXIT_OK
