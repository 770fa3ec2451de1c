"""The static report site: `reports/*.json` and `reports/*.json.xz` (and writeups `reports/<stem>.md`) rendered
into `site/`, the index opening with a picture of every stack and reuse path (repro.publish.site_overview).

A pure function of the reports: sorted inputs, dates from the reports, byte-identical output for
unchanged inputs; report pages are written first and `index.html` last. Pages are self-contained
(inline CSS, no scripts, no external resources) so they work from file:// and offline.
"""

from __future__ import annotations

from pathlib import Path, PurePosixPath
from urllib.parse import quote

import jinja2
from markupsafe import Markup

from repro.commands import ArgumentParser
from repro.errors import EXIT_OK, UsageError
from repro.judge.verdict import PASS
from repro.paths import RAW_DIR
from repro.publish.catalog import Entry, render_catalog
from repro.publish.environment import GENERATOR, make_environment
from repro.publish.headline import ACCEPTANCE_MEANS
from repro.publish.site_index import EXPLORATORY, build_index_row, sort_rows
from repro.publish.site_model import build_report_page
from repro.publish.site_overview import build_picture
from repro.publish.site_versions import NOT_RUN, build_version_grid
from repro.publish.writeup import render_writeup
from repro.readmodel import Report, read_report
from repro.readmodel.files import json_files, kind_of, stem_of
from repro.record.atomic import write_bytes_atomic
from repro.record.report import REPORT_KIND


def _relative_log(log: object) -> PurePosixPath | None:
    """An arm's log path, only if it stays inside the report's directory."""
    if not isinstance(log, str) or not log:
        return None
    path = PurePosixPath(log)
    return None if path.is_absolute() or ".." in path.parts else path


def render_report_page(
    report: Report | dict,
    *,
    stem: str,
    writeup: Markup | None = None,
    log_hrefs: dict[str, str | None] | None = None,
    raw_href: str | None = None,
    env: jinja2.Environment | None = None,
    raw_name: str = "",
) -> str:
    """One report's page as HTML text (links relative to the site root); raw_name: the raw report's file name
    (NAME.json unless given, NAME.json.xz for a compressed one)."""
    env = env or make_environment()
    raw_name = raw_name or f"{stem}.json"
    page = build_report_page(
        report,
        stem=stem,
        raw_href=raw_href or f"{RAW_DIR}/{quote(raw_name)}",
        log_hrefs=log_hrefs or {},
        raw_name=raw_name,
    )
    return env.get_template("report.html.j2").render(page=page, writeup=writeup, generator=GENERATOR)


def render_index(
    rows: list, env: jinja2.Environment | None = None, entries: list[Entry] | None = None, grid: bool = True
) -> str:
    """The site's one entrance: the report pages' table, with grid the verdicts by vLLM version
    (repro.publish.site_versions), then every matrix, the detection study and the reports of each folder
    (repro.publish.catalog), each with a one-line summary."""
    env = env or make_environment()
    # every report, in this folder and one level down, in one table, newest stack first, each led by its headline
    rows = sort_rows([*rows, *(e.row for e in entries or () if e.section == "reports" and e.row is not None)])
    picture = build_picture(rows) if grid else None  # the root's index opens with it (a folder's index goes without)
    kv_column = any(row.kv is not None for row in rows)  # a KV column once any report has the KV audit
    conditions = any(v.condition for row in rows for v in row.verdicts)
    sections = tuple(
        (title, tuple(e for e in entries or () if e.section == key and e.row is None))
        for key, title in (("matrix", "Matrices"), ("detection", "Detection study"), ("reports", "More reports"))
    )
    return env.get_template("index.html.j2").render(
        acceptance_means=ACCEPTANCE_MEANS,
        exploratory=EXPLORATORY,
        picture=picture,
        passed=PASS,
        rows=rows,
        kv_column=kv_column,
        conditions=conditions,
        sections=tuple((t, es) for t, es in sections if es),
        versions=build_version_grid(rows) if grid else None,
        not_run=NOT_RUN,
        generator=GENERATOR,
    )


def index_entry(row) -> Entry:
    """A report page as one line: 'NVIDIA H200 · 2026-12-01 · LMCacheConnectorV1 FAIL (decisive: 6), …; scenarios:
    preemption · LMCacheMPConnector ERROR (1 of 2 trials ERROR)', with its row for the index's table."""
    verdicts = ", ".join(
        f"{v.arm} {v.verdict}" + (f" ({v.divergences})" if v.divergences else "") for v in row.verdicts
    )
    scenarios = ", ".join(f"{label} {v}" + (f" ({note})" if note else "") for label, v, note in row.scenarios)
    summary = f"{row.hardware} · {row.date} · {verdicts}" + (f"; scenarios: {scenarios}" if scenarios else "")
    return Entry("reports", row.href, row.stem, summary, row)


def _write(path: Path, data: bytes, written: list[Path]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if not (path.is_file() and path.read_bytes() == data):  # unchanged files keep their mtime
        write_bytes_atomic(path, data)
    written.append(path)


def _copy_logs(report: Report, reports_dir: Path, out_dir: Path, written: list[Path]) -> dict[str, str | None]:
    hrefs: dict[str, str | None] = {}
    for arm in report.arms:
        rel = _relative_log(arm.log)
        src = reports_dir / rel if rel else None
        if src is None or not src.is_file():
            hrefs[arm.name] = None
            continue
        _write(out_dir / RAW_DIR / rel, src.read_bytes(), written)
        hrefs[arm.name] = f"{RAW_DIR}/{quote(rel.as_posix())}"
    return hrefs


def _prune(out_dir: Path, keep: set[Path]) -> None:
    """Drop pages and raw copies of reports that are gone; never touch files this module did not write."""
    for page in out_dir.glob("*.html"):
        if page not in keep and f'name="generator" content="{GENERATOR}"' in page.read_text(
            encoding="utf-8", errors="replace"
        ):
            page.unlink()
    raw = out_dir / RAW_DIR
    if raw.is_dir():
        for path in sorted(raw.rglob("*"), reverse=True):
            if path.is_file() and path not in keep:
                path.unlink()
            elif path.is_dir() and not any(path.iterdir()):
                path.rmdir()
        if not any(raw.iterdir()):
            raw.rmdir()


def render_site(reports_dir: Path, out_dir: Path, catalog: bool = True, versions: bool = False) -> list[Path]:
    """Render every `reports_dir/*.json` and `*.json.xz` report into `out_dir` and, with catalog, every matrix, detection
    study and folder of reports one level down (repro.publish.catalog); returns the files written,
    index.html last. With versions (and catalog) the index has the verdicts by vLLM version as well: the site's
    root as `python -m repro site` renders it; a folder's own index and a matrix's cell pages go without, so
    they read the same whoever renders them."""
    reports_dir, out_dir = Path(reports_dir), Path(out_dir)
    if not reports_dir.is_dir():
        raise UsageError(f"reports directory {reports_dir} does not exist")
    sources = json_files(reports_dir)
    env = make_environment()
    written: list[Path] = []
    rows = []
    for src in sources:
        report, raw = read_report(src), src.read_bytes()
        stem = stem_of(src)
        _write(out_dir / RAW_DIR / src.name, raw, written)
        hrefs = _copy_logs(report, reports_dir, out_dir, written)
        md = reports_dir / f"{stem}.md"
        writeup = render_writeup(md.read_text(encoding="utf-8")) if md.is_file() else None
        html = render_report_page(report, stem=stem, writeup=writeup, log_hrefs=hrefs, env=env, raw_name=src.name)
        _write(out_dir / f"{stem}.html", html.encode("utf-8"), written)
        rows.append(build_index_row(report, stem=stem, href=quote(f"{stem}.html")))
    entries = []
    if catalog:

        def render_folder(src: Path, dest: Path) -> list[Entry]:
            written.extend(render_site(src, dest, catalog=False))
            return [index_entry(build_index_row(read_report(p), stem=stem_of(p), href=quote(f"{stem_of(p)}.html")))
                    for p in json_files(src) if kind_of(p) == REPORT_KIND]  # fmt: skip

        entries = render_catalog(reports_dir, out_dir, lambda path, data: _write(path, data, written), render_folder)
    grid = versions and catalog  # it spans every folder: on the root's index only
    _write(out_dir / "index.html", render_index(rows, env, entries, grid=grid).encode("utf-8"), written)
    _prune(out_dir, set(written))
    return written


def main(argv: list[str]) -> int:
    """`python -m repro site [--reports DIR] [--out DIR]`: render the static report site."""
    parser = ArgumentParser(prog="python -m repro site", description=main.__doc__)
    parser.add_argument("--reports", default="reports", help="directory of kvkit-report JSON files (default: reports)")
    parser.add_argument("--out", default="site", help="output directory (default: site)")
    args = parser.parse_args(argv)
    written = render_site(Path(args.reports), Path(args.out), versions=True)
    pages = sum(1 for p in written if p.suffix == ".html" and p.name != "index.html")
    print(f"{Path(args.out) / 'index.html'}: {pages} page(s), {len(written)} file(s)")
    return EXIT_OK
