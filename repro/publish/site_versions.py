"""The index's verdicts by vLLM version: a grid of reuse paths (rows, the arms' titles as each report's
connector-vs-native table names them, grouped by device kind and model) by the vLLM versions the kit's reports
ran (columns, sorted as versions: 0.26.0 < 0.28.0 < 0.32.0 < 0.100.0, a report that records none under "version
unrecorded" last). A cell is the newest report's verdict for that path on that version, with its KV class where
the report audited KV, linked to the report's page; a cell no report fills is "not run", never a verdict.

Each report's facts come from the read model once, when its index row is built (version_facts, carried on
repro.publish.site_index.IndexRow, so a folder's rows keep the links the catalog gives them); the grid is built
from those rows. Pure: no file, clock or environment access; every date is the report's own.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

from repro.publish.headline import model_label, version_key
from repro.readmodel import DEVICE_UNRECORDED, Report

UNRECORDED = "version unrecorded"
NOT_RUN = "not run"
DEVICE_ORDER = ("GPU", "CPU")  # the groups' order; any other device after these, "device unrecorded" last


@dataclass(frozen=True)
class PathRun:
    """One reuse arm of one report as the grid reads it."""

    path: str  # the arm's title: a connector ('LMCacheConnectorV1', 'PlantedFault (PlantedFaultConnector)') or native
    native: bool  # vLLM's own prefix caching (a control): its rows follow the connectors'
    verdict: str
    kv: str = ""  # the worst KV verdict over its probes (repro.readmodel.Arm.kv_worst); "" when not audited
    kv_tally: str = ""  # 'CORRUPT×4 · EXACT×1'; "" when not audited
    divergences: str = ""  # a FAIL's divergences by class: 'decisive: 6'
    condition: str = ""  # what qualifies the verdict (intermittent, contention-dependent); "" when nothing does


@dataclass(frozen=True)
class VersionFacts:
    """What the grid needs of one report: its stack, when it ran and each reuse arm's verdict."""

    vllm: str | None  # None: the report records no vLLM version
    device: str  # 'GPU', 'CPU', 'device unrecorded'
    model: str
    model_digest: str | None
    hardware: str
    started: str
    lmcache: str  # 'LMCache 0.5.4' where an arm used LMCache; "" otherwise
    kv_audit: bool | None  # None: the report predates the KV audit
    paths: tuple[PathRun, ...]


@dataclass(frozen=True)
class VersionColumn:
    version: str  # '0.28.0', or UNRECORDED
    label: str  # 'vLLM 0.28.0'
    devices: str  # 'CPU · GPU': the device kinds its reports ran on
    title: str  # the hardware and how many reports, in words


@dataclass(frozen=True)
class VersionCell:
    verdict: str  # "" when no report ran this path on this version
    href: str = ""
    kv: str = ""  # 'KV CORRUPT'
    kv_class: str = ""  # the KV verdict alone, for its style; "" when not audited
    condition: str = ""
    date: str = ""  # the newest report's start date
    older: int = 0  # the other reports of this path on this version
    differ: int = 0  # those of them whose verdict or KV class is not the newest's: the cell does not hide them
    title: str = ""  # the cell in words: path, version, verdict, KV tally, report, stack


@dataclass(frozen=True)
class VersionRow:
    path: str
    cells: tuple[VersionCell, ...]
    note: str = ""  # the columns did not run the same model files: said, never compared silently


@dataclass(frozen=True)
class VersionGroup:
    title: str  # 'GPU · kvkit-tiny-qwen3-seed6'
    rows: tuple[VersionRow, ...]


@dataclass(frozen=True)
class VersionGrid:
    columns: tuple[VersionColumn, ...]
    groups: tuple[VersionGroup, ...]
    reports: int  # the reports it reads


def _is_lmcache(connector: object) -> bool:
    return "lmcache" in str(connector or "").lower()


def version_facts(report: Report) -> VersionFacts:
    """One report's facts for the grid, read from the read model once (repro.publish.site_index.build_index_row)."""
    audit = report.kv_audit_state
    lmcache = any(_is_lmcache(a.connector_name) for a in report.arms)
    return VersionFacts(
        vllm=report.vllm_version,
        device=report.device_kind,
        model=model_label(report),
        model_digest=report.model_digest,
        hardware=report.hardware_label,
        started=report.started_utc,
        lmcache=f"LMCache {report.package_version('lmcache')}" if lmcache else "",
        kv_audit=audit,
        paths=tuple(
            PathRun(
                path=a.title,
                native=a.mode == "native",
                verdict=str(a.verdict),
                kv=(a.kv_worst or "") if audit else "",
                kv_tally=a.kv_tally if audit and a.kv_worst else "",
                divergences=a.class_text,
                condition=a.conditions.finding_class_text if a.conditions.qualified else "",
            )
            for a in report.reuse_arms
        ),
    )


@dataclass(frozen=True)
class _Run:
    """One reuse arm of one report, with the row it is linked from."""

    facts: VersionFacts
    path: PathRun
    href: str
    stem: str

    @property
    def column(self) -> str:
        return self.facts.vllm or UNRECORDED

    @property
    def newness(self) -> tuple[str, str, str]:
        return (self.facts.started, self.stem, self.href)


def _column_order(version: str) -> tuple:
    return (version == UNRECORDED, version_key(version), version)


def _device_order(device: str) -> tuple:
    known = DEVICE_ORDER.index(device) if device in DEVICE_ORDER else len(DEVICE_ORDER)
    return (device == DEVICE_UNRECORDED, known, device)


def _kv_words(facts: VersionFacts, path: PathRun) -> str:
    if facts.kv_audit is None:
        return "KV not audited (the report predates the audit)"
    if not facts.kv_audit:
        return "KV audit off"
    return f"KV {path.kv_tally}" if path.kv_tally else "no probe's KV audited"


def _said(path: PathRun) -> str:
    """'FAIL · KV CORRUPT': what a cell says of one run."""
    return path.verdict + (f" · KV {path.kv}" if path.kv else "")


def _differs(older: PathRun, newest: PathRun) -> bool:
    """Another verdict, or another KV class where both were audited (a run without the audit says nothing of KV)."""
    return older.verdict != newest.verdict or bool(older.kv and newest.kv and older.kv != newest.kv)


def _most_first(item: tuple[str, int]) -> tuple[int, str]:
    return (-item[1], item[0])


def _cell(runs: list[_Run]) -> VersionCell:
    """The newest run's verdict, its KV class where audited, and the cell in words."""
    if not runs:
        return VersionCell("")
    run = max(runs, key=lambda r: r.newness)
    f, p = run.facts, run.path
    verdict = p.verdict + (f" ({p.divergences})" if p.divergences else "")
    stack = ", ".join(s for s in (f"vLLM {f.vllm}" if f.vllm else f"vLLM {UNRECORDED}", f.lmcache, f.hardware) if s)
    words = [f"{p.path} on {stack}: {verdict}", _kv_words(f, p)] + ([p.condition] if p.condition else [])
    newest = f"newest of {len(runs)} reports" if len(runs) > 1 else "the only report"
    words.append(f"{newest}: {run.stem}, {f.started[:10] or 'date unrecorded'}")
    older = [r for r in runs if r is not run]
    tally = Counter(_said(r.path) for r in older)  # most first, then by name: the same text on every render
    if older:
        words.append("the older: " + ", ".join(f"{n} {v}" for v, n in sorted(tally.items(), key=_most_first)))
    return VersionCell(
        verdict=p.verdict,
        href=run.href,
        kv=f"KV {p.kv}" if p.kv else "",
        kv_class=p.kv,
        condition=p.condition,
        date=f.started[:10],
        older=len(older),
        differ=sum(_differs(r.path, p) for r in older),
        title="; ".join(words),
    )


def _row(path: str, runs: list[_Run], columns: tuple[str, ...]) -> VersionRow:
    by_column: dict[str, list[_Run]] = {c: [] for c in columns}
    for run in runs:
        by_column[run.column].append(run)
    cells = tuple(_cell(by_column[c]) for c in columns)
    shown = [max(rs, key=lambda r: r.newness) for rs in by_column.values() if rs]
    digests = sorted({r.facts.model_digest or "unrecorded" for r in shown})
    note = f"model files differ between its columns (sha256 {', '.join(d[:12] for d in digests)})"
    return VersionRow(path, cells, note if len(digests) > 1 else "")


def _column(version: str, runs: list[_Run]) -> VersionColumn:
    mine = [r for r in runs if r.column == version]
    devices = sorted({r.facts.device for r in mine}, key=_device_order)
    hardware = ", ".join(sorted({r.facts.hardware for r in mine}))
    reports = len({r.stem for r in mine})
    what = "reports that record no vLLM version" if version == UNRECORDED else f"vLLM {version}"
    return VersionColumn(
        version=version,
        label=UNRECORDED if version == UNRECORDED else f"vLLM {version}",
        devices=" · ".join(devices),
        title=f"{what}: {reports} report{'' if reports == 1 else 's'} on {hardware}",
    )


def build_version_grid(rows: Iterable) -> VersionGrid | None:
    """The grid of the index's rows (repro.publish.site_index.IndexRow) that carry version facts; None when none
    does (the index then has no grid)."""
    runs = [
        _Run(row.versions, path, row.href, row.stem)
        for row in sorted(rows, key=lambda r: (r.stem, r.href))
        if row.versions is not None
        for path in row.versions.paths
    ]
    if not runs:
        return None
    columns = tuple(sorted({r.column for r in runs}, key=_column_order))
    groups: dict[tuple[str, str], dict[tuple[bool, str], list[_Run]]] = {}
    for run in runs:
        group = groups.setdefault((run.facts.device, run.facts.model), {})
        group.setdefault((run.path.native, run.path.path), []).append(run)
    return VersionGrid(
        columns=tuple(_column(c, runs) for c in columns),
        groups=tuple(
            VersionGroup(
                f"{device} · {model}",
                tuple(
                    _row(path, group[(native, path)], columns)
                    for native, path in sorted(group, key=lambda k: (k[0], k[1].casefold(), k[1]))
                ),
            )
            for (device, model), group in sorted(groups.items(), key=lambda g: (_device_order(g[0][0]), g[0][1]))
        ),
        reports=len({(r.href, r.stem) for r in runs}),
    )
