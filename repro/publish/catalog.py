"""The site's other pages: every matrix, the detection study and every folder of reports found under the
reports directory, rendered into the site beside the report pages, and a one-line entry each for the index.

Layout (relative links work from file:// as from a server): a matrix `reports/<dir>/<name>.json` becomes
`<dir>/<name>.html` with its cells' pages in `<dir>/<name>/site/` (as `make matrix` lays them out beside
the summary); the detection matrix `reports/<dir>/<stem>.json` becomes `<dir>/<stem>.html`; any other
folder of reports `reports/<dir>/` becomes a site of its own in `<dir>/` (its own index.html)."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from urllib.parse import quote

from repro.judge.verdict import KV_FINDINGS
from repro.readmodel.files import json_files, kind_of

MATRIX_KIND = "kvkit-matrix"  # repro.matrix.status.MATRIX_KIND
CELLS_DIR = "site"  # repro.matrix.commands.SITE_DIR: a matrix's cell pages, beside its summary


@dataclass(frozen=True)
class Entry:
    """One page the index links, with its one-line summary."""

    section: str  # "matrix", "detection", "reports"
    href: str
    title: str
    summary: str
    row: object = None  # a report's index row (repro.publish.site_index.IndexRow), linked from the site's root


def render_catalog(
    reports_dir: Path, out_dir: Path, write: Callable[[Path, bytes], None], render_folder: Callable
) -> list[Entry]:
    """Render every matrix, detection study and folder of reports one level under reports_dir into
    out_dir; write(path, data) writes one file, render_folder(src, dest) renders a folder of reports
    (repro.publish.site.render_site) and returns the entries of its report pages. Sorted by path."""
    entries: list[Entry] = []
    for folder in sorted(p for p in reports_dir.iterdir() if p.is_dir() and not p.name.startswith(".")):
        jsons = json_files(folder)  # NAME.json and NAME.json.xz (a report committed compressed)
        kinds = {p: kind_of(p) for p in jsons}
        matrices = [p for p in jsons if kinds[p] == MATRIX_KIND]
        for path in matrices:
            entries.append(_matrix(path, out_dir / folder.name, write, render_folder))
        for path in jsons:
            if _is_detection(kinds[path]):
                entries.append(_detection(path, out_dir / folder.name, write))
            elif _is_detection_scenarios(kinds[path]):
                entries.append(_detection_scenarios(path, out_dir / folder.name, write))
            elif _is_pd(kinds[path]):
                entries.append(_pd(path, out_dir / folder.name, write))
        if jsons and all(kinds[p] == "kvkit-report" for p in jsons):  # a folder of reports: a site of its own
            for e in render_folder(folder, out_dir / folder.name):
                href, title = f"{quote(folder.name)}/{e.href}", f"{folder.name}/{e.title}"
                row = replace(e.row, href=href, stem=title) if e.row is not None else None
                entries.append(Entry("reports", href, title, e.summary, row))
    return entries


def _is_detection(kind: str | None) -> bool:
    from repro.detection.plan import KIND

    return kind == KIND


def _is_detection_scenarios(kind: str | None) -> bool:
    from repro.detection.scenario_cells import KIND

    return kind == KIND


def _is_pd(kind: str | None) -> bool:
    from repro.disagg.report import KIND

    return kind == KIND


def _pd(path: Path, out: Path, write: Callable) -> Entry:
    """A P→D report (python -m repro pd): its page, with the writeup beside it, and one line."""
    from repro.disagg.page import index_row, load_report, page_model, render_page

    report = load_report(path)
    md = path.with_suffix(".md")
    write(
        out / f"{path.stem}.html",
        render_page(report, md.read_text(encoding="utf-8") if md.is_file() else None).encode("utf-8"),
    )
    m = page_model(report)
    summary = f"{m.verdict} · probe requests {m.counts} · controls {m.controls} · {m.started[:10]}"
    href, title = f"{quote(out.name)}/{quote(path.stem)}.html", f"{out.name}/{path.stem}"
    return Entry("reports", href, title, summary, index_row(report, stem=title, href=href))


def _matrix(path: Path, out: Path, write: Callable, render_folder: Callable) -> Entry:
    from repro.matrix.page import build_matrix_page, render_matrix_page  # it imports the site: at call time

    summary = json.loads(path.read_text(encoding="utf-8"))
    name = summary["name"]
    cells = path.parent / name
    if cells.is_dir():
        render_folder(cells, out / name / CELLS_DIR)
    md = path.with_suffix(".md")
    writeup = md.read_text(encoding="utf-8") if md.is_file() else None
    cells_dir = f"{name}/{CELLS_DIR}"
    write(out / f"{path.stem}.html", render_matrix_page(summary, cells_dir, writeup).encode("utf-8"))
    page = build_matrix_page(summary, cells_dir)
    return Entry("matrix", f"{quote(out.name)}/{quote(path.stem)}.html", name, f"{page.headline} · {_tally(page)}")


def _tally(page) -> str:
    """'16 FAIL · 12 PASS, KV CORRUPT ×4, KV MISPLACED ×2' over every reuse arm's probe of every cell: each KV
    finding by its class, worst first."""
    verdicts: dict[str, int] = {}
    kv = dict.fromkeys(KV_FINDINGS, 0)
    for row in page.rows:
        for marks in row.marks:
            for m in marks:
                verdicts[m.verdict] = verdicts.get(m.verdict, 0) + 1
                if m.kv in kv:
                    kv[m.kv] += 1
    text = " · ".join(f"{n} {v}" for v, n in sorted(verdicts.items())) or "no verdicts"
    return text + "".join(f", KV {v} ×{n}" for v, n in kv.items() if n) + " (reuse arm × probe)"


def _detection(path: Path, out: Path, write: Callable) -> Entry:
    from repro.detection.page import load_matrix, page_model, render_page

    report = load_matrix(path)
    write(out / f"{path.stem}.html", render_page(report).encode("utf-8"))
    m = page_model(report)
    kv = f"KV audit blamed {m.kv_blamed_exactly}/{m.kv_fault_probes} exactly" if m.kv_present else "no KV audit"
    summary = (
        f"{len(m.rows)} planted faults, {len(m.controls)} controls · every fault kind detected: "
        f"{'yes' if m.every_fault_detected else 'no'} · false positives {m.false_positives} · {kv} · {m.started[:10]}"
    )
    title = f"detection study ({m.model})" if m.model else "detection study"
    return Entry("detection", f"{quote(out.name)}/{quote(path.stem)}.html", title, summary)


def _detection_scenarios(path: Path, out: Path, write: Callable) -> Entry:
    """The detection study's scenario table (python -m repro detection --scenarios): its page and one line."""
    from repro.detection.scenario_page import load_report, page_model, render_page

    report = load_report(path)
    write(out / f"{path.stem}.html", render_page(report).encode("utf-8"))
    m = page_model(report)
    rows, columns = len(m.rows), len(m.columns)
    summary = (
        f"{rows} gated planted faults × {columns} columns (plain probes and scenarios) · hypothesis held in "
        f"{m.held}/{m.cells} cells at {m.top_window} tokens · {m.started[:10]}"
    )
    return Entry("detection", f"{quote(out.name)}/{quote(path.stem)}.html", "detection study × scenarios", summary)
