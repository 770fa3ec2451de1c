"""The detection matrix's page: load the matrix, build its view model, render it with the site's environment."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from repro.detection.expected import check_row
from repro.detection.matrix import replay_tally, summarize
from repro.detection.plan import KIND, READABLE_VERSIONS, SCHEMA_VERSION
from repro.errors import UsageError
from repro.judge.kv_verdict import CELL_FOREIGN, CELL_MISPLACED
from repro.judge.replays import MIN_REPLAY_TOKENS
from repro.judge.verdict import CORRUPT, FOREIGN, MISPLACED
from repro.publish.environment import make_environment
from repro.readmodel import Replay
from repro.record.atomic import write_bytes_atomic

TEMPLATE = "detection.html.j2"
GENERATOR = "kvkit-detection"  # not the site's marker: the report site never prunes this page


@dataclass(frozen=True)
class CellView:
    status: str
    text: str


@dataclass(frozen=True)
class FaultRow:
    fault: str
    position: str
    params: str
    cells: tuple[CellView, ...]
    kv: CellView  # the KV audit column (status "absent" for a matrix made before the audit)
    kv_notes: tuple[str, ...]  # the probes it did not blame exactly, and those whose tokens never changed
    error: str
    kv_changed: str
    min_margin: str
    replays: CellView  # reuses replaying another prompt's answer, of those that diverged (absent: not counted)
    replay_notes: tuple[str, ...]  # each such reuse and what it replays


@dataclass(frozen=True)
class ExpectedRow:
    """A catalogue row (repro.detection.catalogue): its fault row, what it expected (written before the run), what
    each probe showed, and whether that held."""

    row: FaultRow
    what: str
    expected: str
    why: str
    measured: tuple[str, ...]  # per probe: its token verdict at the largest window, its KV verdict and blame
    held: CellView
    misses: tuple[str, ...]
    restated: str = ""  # an expectation changed after the row first ran: what it said and why (catalogue.Expectation)


@dataclass(frozen=True)
class ControlRow:
    arm: str
    seed: str  # "tiny, seed N", or a packaged model's name (it has no seed)
    compared: int
    exercised: int
    false_positives: tuple[tuple[int, str], ...]  # (count, cell class): none is good news, any is bad
    inconclusive: tuple[int, ...]
    false_blames: CellView  # KV audit: probes with a KV finding, CORRUPT, FOREIGN or MISPLACED ("absent" before it)
    kv_unavailable: str  # probes the audit could not judge, and why
    error: str


@dataclass(frozen=True)
class KindLine:
    fault: str
    detected: bool
    reliable: bool


@dataclass(frozen=True)
class DetectionPage:
    """What the template prints: strings, numbers and flags, no logic left for the template."""

    tool_version: str
    commit: str
    model: str | None  # a packaged model's name (python -m repro detection --model); None: the tiny models
    started: str
    method: str
    windows: tuple[str, ...]
    rows: tuple[FaultRow, ...]
    controls: tuple[ControlRow, ...]
    control_span: int
    kinds: tuple[KindLine, ...]
    every_fault_detected: bool
    false_positives: int
    false_positives_by_window: tuple[tuple[str, int], ...]
    control_reuses_exercised: int
    prefix_window: int
    prefix_requests: int
    prefix_ok: bool
    arm_errors: tuple[str, ...]
    kv_present: bool
    kv_blamed_exactly: int
    kv_fault_probes: int
    kv_tokens_unchanged: int
    kv_tokens_unchanged_blamed: int
    kv_false_blames: int
    kv_control_unavailable: int
    kv_floor: str  # the arms' measured floors, in one line
    schema_version: int
    replays_present: bool
    replaying_another: int
    naming_the_served_prompt: int
    replaying_own_earlier: int
    divergent_reuses: int
    control_replaying: int
    replay_min: int = MIN_REPLAY_TOKENS
    # some probe's KV is FOREIGN or MISPLACED, or some blamed cell is: the page then says a block is blamed for
    # any finding cell (a matrix made before those classes never has one, and its page reads as it always did)
    kv_finer: bool = False
    expected_rows: tuple[ExpectedRow, ...] = ()  # the catalogue's rows, apart from the detection rows
    expectations_held: int = 0


def load_matrix(path: Path) -> dict:
    """The matrix report at `path`; a file that is not one this kit reads is a one-line UsageError."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except ValueError as exc:  # invalid JSON or UTF-8
        raise UsageError(f"{path} is not valid JSON ({exc})") from None
    if not isinstance(data, dict) or data.get("kind") != KIND:
        raise UsageError(f"{path} is not a {KIND} report")
    version = data.get("schema_version")
    if type(version) is not int or version not in READABLE_VERSIONS:
        newer = type(version) is int and version > SCHEMA_VERSION
        raise UsageError(
            f"{path} has schema_version {version!r}; this kit reads {', '.join(map(str, READABLE_VERSIONS))}"
            + (" (upgrade the kit)" if newer else "")
        )
    return data


ABSENT = CellView("absent", "absent: made before the KV audit")
NOT_COUNTED = CellView("absent", "not counted: made before replays were counted")


def _replay_cell(f: dict) -> tuple[CellView, tuple[str, ...]]:
    """A fault's replays column: reuses that replay another prompt's answer, of those that diverged."""
    tally = replay_tally(f["probes"])
    if tally is None:
        return NOT_COUNTED, ()
    named = tally["replaying_another"]
    served = sum(r["served"] is True for r in named)
    text = f"{len(named)}/{tally['divergent_reuses']} reuses" + (
        f", {served} naming the served prompt" if named else ""
    )
    notes = [f"{r['name']} reuse {r['reuse']}: {Replay.from_json(r).text}; {_served_text(r)}" for r in named]
    if tally["replaying_own_earlier"]:
        notes.append(f"{tally['replaying_own_earlier']} replay only an earlier request of their own prompt")
    return CellView("partial" if named else "none", text), tuple(notes)


def _served_text(replay: dict) -> str:
    """Whether the KV audit found the named prompt's blocks in the reuse (the truth the replay is checked against)."""
    truth = replay.get("served_from")
    if truth is None:
        return "not audited"
    if replay["served"]:
        return f"the KV audit found {replay['probe']}'s blocks in it"
    if not truth:
        return "the KV audit found no other prompt's blocks in it: a match by chance"
    found = " and ".join(f"{p}'s" for p in truth)
    return f"the KV audit found {found} blocks in it, not {replay['probe']}'s: a match by chance"


def _finer(report: dict) -> bool:
    """Some probe's KV verdict is FOREIGN or MISPLACED, or some reuse's blamed cells are foreign or misplaced."""
    kvs = [p.get("kv") or {} for e in report["faults"] + report["controls"] for p in e.get("probes") or []]
    classes = {c for kv in kvs for per_reuse in kv.get("blamed_classes") or [] for c in per_reuse or []}
    return any(kv.get("verdict") in (FOREIGN, MISPLACED) for kv in kvs) or bool(
        classes & {CELL_FOREIGN, CELL_MISPLACED}
    )


def _kv_class(verdict: object) -> str:
    """' (MISPLACED)' after a probe whose KV finding is FOREIGN or MISPLACED; '' for CORRUPT and the rest (a
    matrix made before those classes blamed CORRUPT cells only)."""
    return f" ({verdict})" if verdict in (FOREIGN, MISPLACED) else ""


def _span(blocks: list[int]) -> str:
    return ",".join(map(str, blocks)) or "none"


def _kv_cell(f: dict) -> tuple[CellView, tuple[str, ...]]:
    """A fault's audit column: probes blamed exactly, and a line per probe it did not."""
    kv = f.get("kv_blame")
    if kv is None:
        return ABSENT, ()
    cell = CellView(kv["cell"], f"{kv['blamed_exactly']}/{kv['probes']} blamed exactly")
    notes = []
    for p in f["probes"]:
        b = p["kv"]
        if b["outcome"] in ("over", "under", "other"):
            blamed = "; ".join(_span(x) for x in b["blamed_blocks"])
            planted = "; ".join(_span(x) for x in b["planted_blocks"])
            notes.append(
                f"{p['name']}{_kv_class(b.get('verdict'))}: {b['outcome']} (blamed {blamed}, planted {planted})"
            )
    notes += [f"{u['probe']}: unavailable ({u['reason']})" for u in kv["unavailable"]]
    if kv["tokens_unchanged_blamed_exactly"]:
        notes.append("tokens never changed, blamed exactly: " + ", ".join(kv["tokens_unchanged_blamed_exactly"]))
    if kv["reason"]:
        notes.append(kv["reason"])
    return cell, tuple(notes)


def _fault_row(f: dict, windows: tuple[str, ...]) -> FaultRow:
    audits = [p["kv_audit"] for p in f["probes"] if p.get("kv_audit")]
    diffs = [d for a in audits for _, d in a["faulted_max_abs_diff"]]
    cells = []
    for w in windows:
        c = f["windows"][w]
        shown = ",".join(str(d) for d in c.get("first_diffs", []) if d is not None)
        cells.append(CellView(c["status"], f"{c['detected']}/{c['probes']}" + (f" @{shown}" if shown else "")))
    margins = [
        p["margin"]["baseline_margin"]
        for p in f["probes"]
        if p.get("margin") and p["margin"]["baseline_margin"] is not None
    ]
    kv, kv_notes = _kv_cell(f)
    replays, replay_notes = _replay_cell(f)
    return FaultRow(
        fault=f["fault"],
        position=f["position"],
        params=", ".join(f"{k}={v}" for k, v in sorted(f["params"].items()) if k != "fault"),
        cells=tuple(cells),
        kv=kv,
        kv_notes=kv_notes,
        error=f"{f['error']['kind']}: {f['error']['detail']}" if f["error"] else "",
        kv_changed=f"{sum(1 for d in diffs if d > 0)}/{len(diffs)} blocks, min max|Δ| {min(diffs):.3g}"
        if diffs
        else "no faulted block",
        min_margin=f"{min(margins):.3f}" if margins else "–",
        replays=replays,
        replay_notes=replay_notes,
    )


def _expected_text(exp: dict) -> str:
    parts = [" or ".join(exp["verdict"])]
    if exp.get("finding"):
        parts[0] += f" with the finding {exp['finding']}"
    parts.append("KV " + (" or ".join(exp["kv"]) if exp["kv"] is not None else "not stated"))
    parts.append("blame " + (exp["blame"] or "not stated"))
    return "; ".join(parts)


def _unchanged_text(kv: dict) -> str:
    """The faulted blocks the planted connector measured left right (repro.detection.blame.unchanged_of), if any."""
    blocks = [b for per in kv.get("unchanged_blocks") or () for b in per]
    if not blocks:
        return ""
    return (
        f" (faulted yet right: block{'s' if len(blocks) > 1 else ''} {', '.join(map(str, blocks))}, not owed a blame)"
    )


def _expected_row(f: dict, windows: tuple[str, ...], rows: dict) -> ExpectedRow:
    """One catalogue row's view: its fault row, the expectation it carried and how each probe measured."""
    exp, check = f["expectation"], check_row(f)
    last = windows[-1]
    measured = tuple(
        f"{p['name']}: {p['verdicts'][last]}, KV {(p.get('kv') or {}).get('verdict', 'not audited')}, "
        f"blame {(p.get('kv') or {}).get('outcome', 'not audited')}{_unchanged_text(p.get('kv') or {})}, cached "
        "tokens " + ",".join(str(c) for c in p["reuse_cached_tokens"])
        for p in f["probes"]
    )
    pool = f" (a {f['kv_cache_tokens']}-token KV pool)" if f.get("kv_cache_tokens") else ""
    if f.get("between"):
        pool += " (sent between: " + ", ".join(f"{p}'s reuse after {b}" for p, b in f["between"].items()) + ")"
    return ExpectedRow(
        row=_fault_row(f, windows),
        what=(rows.get((f["fault"], f["position"])) or {}).get("what", "") + pool,
        expected=_expected_text(exp),
        why=exp["why"],
        measured=measured,
        held=CellView("detected", "held") if check["held"] else CellView("missed", "did not hold"),
        misses=tuple(check["misses"]),
        restated=exp.get("restated") or "",
    )


def _control_row(c: dict, windows: tuple[str, ...]) -> ControlRow:
    kv = c.get("kv_blame")
    if kv is None:
        false_blames, unavailable = ABSENT, ""
    else:
        n = len(kv["false_blames"])
        false_blames = CellView(
            "detected" if n == 0 else "missed",
            f"{n}/{kv['probes']}"
            + "".join(
                f"; {b['probe']}: "
                + (f"{b['verdict']}: " if b.get("verdict", CORRUPT) != CORRUPT else "")
                + f"{b['blame']}"
                for b in kv["false_blames"]
            ),
        )
        unavailable = "; ".join(f"{u['probe']}: {u['reason']}" for u in kv["unavailable"]) or "none"
        if kv["reason"]:
            unavailable = f"{kv['reason']} ({unavailable})"
    return ControlRow(
        arm=c["arm"],
        seed=f"tiny, seed {c['model_seed']}" if c.get("model_seed") is not None else c.get("model", "–"),
        compared=c["reuses_compared"],
        exercised=c["reuses_exercised"],
        false_positives=tuple(
            (n, "detected" if n == 0 else "missed") for n in (c["false_positives"][w] for w in windows)
        ),
        inconclusive=tuple(c["inconclusive"][w] for w in windows),
        false_blames=false_blames,
        kv_unavailable=unavailable,
        error=f"{c['error']['kind']}: {c['error']['detail']}" if c["error"] else "",
    )


def floor_line(entries: list[dict]) -> str:
    """The audited arms' floors (each arm's own cold prefills' KV against its baseline's), in one line."""
    floors = [e["kv_blame"]["floor"] for e in entries if (e.get("kv_blame") or {}).get("floor")]
    if not floors:
        return "not measured"
    rels = [f["rel"] for f in floors]
    worst = "not finite" if None in rels else f"{max(rels):.3g}"
    same = sum(1 for f in floors if f["identical"])
    return (
        f"largest relative error {worst} over {len(floors)} arms; "
        f"{same} of them computed cold prefill KV bit-identical to their baseline's"
    )


def page_model(report: dict) -> DetectionPage:
    """The page's view model. The summary is recomputed from the entries (the per-window counts),
    never taken from the report's stored `summary`, which older runs computed differently."""
    windows = tuple(str(w) for w in report["config"]["windows"])
    prefix = report["prefix_check"]
    s = summarize(report["faults"], report["controls"], bool(prefix.get("ok")))
    kv = s["kv_audit"]
    rows = {(r["fault"], r["position"]): r for r in report["config"].get("fault_rows") or []}
    return DetectionPage(
        tool_version=report["tool_version"],
        commit=report["provenance"]["kit"].get("commit", "unavailable")[:12],
        model=report["config"].get("model"),
        started=report["provenance"]["started_utc"],
        method=report["method"],
        windows=windows,
        rows=tuple(_fault_row(f, windows) for f in report["faults"] if "expectation" not in f),
        controls=tuple(_control_row(c, windows) for c in report["controls"]),
        control_span=4 + 2 * len(windows),
        kinds=tuple(
            KindLine(k, v, s["fault_kinds_reliably_detected"][k]) for k, v in sorted(s["fault_kinds_detected"].items())
        ),
        every_fault_detected=s["every_fault_detected"],
        false_positives=s["false_positives"],
        false_positives_by_window=tuple(s["false_positives_by_window"].items()),
        control_reuses_exercised=s["control_reuses_exercised"],
        prefix_window=prefix["window"],
        prefix_requests=prefix["requests_compared"],
        prefix_ok=s["prefix_check_ok"],
        arm_errors=tuple(s["arm_errors"]),
        kv_present=kv["present"],
        kv_blamed_exactly=kv.get("blamed_exactly", 0),
        kv_fault_probes=kv.get("fault_probes", 0),
        kv_tokens_unchanged=kv.get("tokens_unchanged", 0),
        kv_tokens_unchanged_blamed=kv.get("tokens_unchanged_blamed_exactly", 0),
        kv_false_blames=kv.get("false_blames", 0),
        kv_control_unavailable=kv.get("control_unavailable", 0),
        kv_floor=floor_line(report["faults"] + report["controls"]),
        schema_version=report["schema_version"],
        replays_present=s["replays"]["present"],
        replaying_another=s["replays"].get("replaying_another", 0),
        naming_the_served_prompt=s["replays"].get("naming_the_served_prompt", 0),
        replaying_own_earlier=s["replays"].get("replaying_own_earlier", 0),
        divergent_reuses=s["replays"].get("divergent_reuses", 0),
        control_replaying=s["replays"].get("control_replaying", 0),
        kv_finer=_finer(report),
        expected_rows=tuple(_expected_row(f, windows, rows) for f in report["faults"] if "expectation" in f),
        expectations_held=s.get("expectations", {}).get("held", 0),
    )


def render_page(report: dict) -> str:
    return make_environment().get_template(TEMPLATE).render(m=page_model(report), generator=GENERATOR)


def write_page(report: dict, site_path: Path) -> None:
    site_path.parent.mkdir(parents=True, exist_ok=True)
    write_bytes_atomic(site_path, render_page(report).encode("utf-8"))
