"""Issue Markdown: a report as GitHub-flavoured Markdown to paste into an upstream issue."""

from __future__ import annotations

import sys
from pathlib import Path

from repro.commands import ArgumentParser
from repro.errors import EXIT_OK, UsageError
from repro.judge.kv_verdict import COUNT_NAMES
from repro.judge.verdict import ERROR, PASS
from repro.judge.wording import blocks_text, machine_path_name, number, span_text
from repro.publish.headline import acceptance_text, headline
from repro.publish.issue_facts import format_conditions, format_maintainer_facts
from repro.publish.issue_sections import (
    find_lmcache_yaml,
    format_environment,
    format_expected_actual,
    format_how_to_reproduce,
)
from repro.publish.markdown import format_tokens, margin_text, markdown_table
from repro.publish.scenario_md import format_scenarios
from repro.readmodel import (
    DIVERGENCE_LEGEND,
    KV_FINER_LEGEND,
    REPLAY_LEGEND,
    Arm,
    BlamedChunk,
    Probe,
    Report,
    as_report,
    read_report,
)
from repro.readmodel.rerun import patch_text
from repro.record.atomic import write_bytes_atomic
from repro.record.report import CLAIM_LINE

GITHUB_BODY_LIMIT = 65_536  # characters GitHub accepts in an issue or comment body
# Token lists are shortened step by step until the body fits; None shows them whole.
TOKEN_LIMITS = (None, 64, 16, 4, 0)
MAX_WARNINGS = 40
TABLE_HEADER = ("arm", "probe", "tokens", "cached", "verdict", "first diffs")
KV_HEADER = ("KV",)  # the verdict table's extra column when the run audited KV
CHUNK_HEADER = ("arm", "probe", "reuse", "blocks (tokens)", "layers", "planes", "max rel error", "bytes equal")
CLASS_HEADER = ("cells",)  # after "reuse", where some chunk holds a foreign or misplaced cell: its cells by class
MAX_CHUNK_ROWS = 60
TRIALS_HEADER = ("trials",)  # columns the verdict table gains when a report records trials / a re-run alone
ALONE_HEADER = ("re-run alone",)


def _has_trials(report: Report) -> bool:
    return any(a.conditions.trials_found is not None for a in report.arms)


def _has_confirmation(report: Report) -> bool:
    return any(a.conditions.has_confirmation for a in report.arms)


def _verdict_cell(arm: Arm, probe: Probe) -> str:
    """'FAIL', or 'FAIL (intermittent 3/5, contention-dependent)' where its conditions qualify it."""
    marks = arm.marks_text(probe)
    return f"{probe.verdict} ({marks})" if marks else str(probe.verdict)


def _trials_cell(arm: Arm, probe: Probe) -> str:
    rate = arm.conditions.rate(probe.name)
    return f"{rate.cell} ({rate.cls})" if rate else "—"


def table_rows(report: Report | dict) -> list[tuple[str, ...]]:
    """One row per probe of every arm but a passing baseline (it is what the others are compared to);
    with the KV audit on, each row ends with the probe's KV verdict; then, where the report records
    them, the probe's trial rate and its verdict when re-run alone."""
    report = as_report(report)
    kv = bool(report.kv_audit_state)
    trials, alone = _has_trials(report), _has_confirmation(report)
    rows = []
    for arm in report.arms:
        if arm.is_baseline and arm.verdict == PASS:
            continue
        for p in arm.probes:
            row = (arm.title, p.title, p.tokens_text, p.cached_cell, _verdict_cell(arm, p), p.diff_class_cell)
            row += ((p.kv_cell,) if kv else ()) + ((_trials_cell(arm, p),) if trials else ())
            rows.append(row + ((arm.conditions.alone_cell(p.name),) if alone else ()))
        if not arm.probes:
            empty = ("—",) * (kv + trials + alone)
            rows.append((arm.title, "—", "", "—", arm.verdict, "") + empty)
    return rows


def format_table(report: Report | dict) -> str:
    report = as_report(report)
    header = TABLE_HEADER + (KV_HEADER if report.kv_audit_state else ())
    header += (TRIALS_HEADER if _has_trials(report) else ()) + (ALONE_HEADER if _has_confirmation(report) else ())
    return markdown_table(header, table_rows(report))


def _chunks(report: Report) -> list[tuple[Arm, Probe, int, BlamedChunk]]:
    return [
        (arm, p, reuse_no, c)
        for arm in report.reuse_arms
        for p in arm.probes
        for reuse_no, r in p.numbered_requests()
        for c in (r.kv_audit.blamed_chunks if r.kv_audit is not None else ())
    ]


def _classed(report: Report) -> bool:
    """Some blamed chunk holds a foreign or misplaced cell: the chunk table says each chunk's cells by class (a
    report written before those classes blames corrupt cells only, and its table is as it always was)."""
    return any(not c.only_corrupt for *_, c in _chunks(report))


def _class_cell(chunk: BlamedChunk) -> str:
    """'misplaced 12, corrupt 3': the chunk's finding cells by class, worst first."""
    return ", ".join(f"{COUNT_NAMES.get(cls, cls)} {n}" for cls, n in chunk.classes)


def chunk_rows(report: Report | dict) -> list[tuple[str, ...]]:
    """One row per blamed chunk (a run of adjacent blocks with finding cells: corrupt, foreign, misplaced) of every
    audited reuse; with a cells-by-class column after the reuse where some chunk is not all corrupt."""
    report = as_report(report)
    classed = _classed(report)
    rows = []
    for arm, p, reuse_no, c in _chunks(report):
        rows.append(
            (arm.title, p.name, str(reuse_no))
            + ((_class_cell(c),) if classed else ())
            + (
                blocks_text(c.blocks, report.block_size),
                span_text(c.layers),
                "+".join(c.planes),
                "not finite" if c.max_rel is None else number(c.max_rel),
                _sources(c),
            )
        )
    return rows


def _sources(chunk: BlamedChunk) -> str:
    """'zeros (3 of 128 cells)': what the chunk's finding cells' bytes equal, where the audit found it."""
    counts: dict[str, int] = {}
    for source in chunk.sources:
        counts[source] = counts.get(source, 0) + 1
    shown = [f"{s} ({n} of {chunk.cells} cells)" for s, n in list(counts.items())[:3]]
    return ", ".join(shown) + (" …" if len(counts) > 3 else "") or "—"


def format_kv_audit(report: Report) -> str:
    """Each reuse arm's audit and floor, then every blamed chunk in one table, then what the foreign and misplaced
    cells of each reuse hold (its shape), where the audit said."""
    if not report.kv_audit_state:
        return "KV audit: off for this run (token verdicts only)."
    finer = f" {KV_FINER_LEGEND}." if report.shows_finer_kv else ""
    lines = [
        (
            "Each reuse's KV blocks, per layer and K/V plane, against the KV the cache-disabled baseline computed "
            "for the same tokens: EXACT bit-identical, NUMERIC within the arm's floor (its own cold prefill against "
            f"the baseline), CORRUPT beyond it.{finer}"
        ),
        "",
    ]
    lines += [f"- **{a.title}**: {a.kv_text}" for a in report.arms]
    shapes = [
        f"- **{a.title}** / `{p.name}` {shape}" for a in report.reuse_arms for p in a.probes for shape in p.kv_shapes
    ]
    shapes = ["", "What the foreign and misplaced cells hold:", "", *shapes] if shapes else []
    rows = chunk_rows(report)
    if not rows:
        return "\n".join([*lines, "", "No block was blamed.", *shapes])
    classed = _classed(report)
    header = CHUNK_HEADER[:3] + (CLASS_HEADER if classed else ()) + CHUNK_HEADER[3:]
    table = markdown_table(header, rows[:MAX_CHUNK_ROWS])
    more = (
        f"\n\n_… {len(rows) - MAX_CHUNK_ROWS} more blamed chunks in the report JSON._"
        if len(rows) > MAX_CHUNK_ROWS
        else ""
    )
    what = "a finding cell: corrupt, foreign or misplaced" if classed else "a corrupt cell"
    body = "\n".join([*lines, "", f"Blamed chunks (runs of adjacent blocks with {what}):", "", table]) + more
    return body + ("\n" + "\n".join(shapes) if shapes else "")


def format_verdicts(report: Report | dict) -> str:
    """Each arm's verdict with its first reasons, the acceptance result, and each upstream bound as the run judged it."""
    report = as_report(report)
    lines = [f"- {acceptance_text(report)} · {report.generations} generations"]
    lines += [f"- upstream bound: {u.text}" for u in report.upstream]
    for arm in report.arms:
        reasons = "; ".join(arm.reasons)
        reasons = reasons if len(reasons) <= 400 else reasons[:399] + "…"
        lines.append(f"- **{arm.title}**: {arm.verdict_text}" + (f" — {reasons}" if reasons else ""))
        if arm.error:
            lines.append(f"  - {ERROR} {arm.error.get('kind')}: {str(arm.error.get('detail'))[:300]}")
    for err in report.errors:
        lines.append(f"- {ERROR} {err.get('arm')}: {err.get('kind')}: {str(err.get('detail'))[:300]}")
    return "\n".join(lines)


def format_diffs(report: Report | dict, token_limit: int | None) -> str:
    """Every reuse that differed: where, the logprob margins on both sides, both token lists, and
    whose answer it replays (repro.judge.replays) where the report says."""
    report = as_report(report)
    lines, replayed = [], False
    for arm in report.arms:
        for p in arm.probes:
            for i, r in enumerate(p.requests):
                if r.first_diff is None:
                    continue
                lines.append(
                    f"- **{arm.title}** / `{p.name}` / {'request' if r.role is None else r.role} {i}: "
                    f"{r.cached_tokens} cached tokens, first diff @{r.first_diff}; {margin_text(r.margin)}"
                )
                replays = [f"  - **{text}**" for text in r.replay_texts]
                replayed = replayed or bool(replays)
                lines += replays
                if token_limit != 0:
                    lines.append(f"  - baseline: {format_tokens(report.baseline_token_ids(p.name), token_limit)}")
                    lines.append(f"  - reuse: {format_tokens(r.token_ids, token_limit)}")
    if not lines:
        return "No reuse differed from the baseline."
    if replayed:
        lines.append(f"\n_Replays: {REPLAY_LEGEND}._")
    if token_limit == 0:
        lines.append("\n_Generated token lists left out to fit GitHub's size limit; they are in the report JSON._")
    return "\n".join(lines)


def lmcache_signals(arm: Arm) -> list[str]:
    """LMCache's own counters on an arm (double unpins first), as 'name: value' lines."""
    signals = arm.lmcache
    keys = sorted(signals, key=lambda k: ("unpin" not in k, k))
    return [f"{k}: {signals[k]}" for k in keys if isinstance(signals[k], (int, float, str, bool))]


def format_warnings(report: Report) -> str:
    """LMCache signals and findings per arm, then log warnings grouped by message across arms."""
    lines = []
    for arm in report.arms:
        lines += [f"- {arm.title} · LMCache {signal}" for signal in lmcache_signals(arm)]
        lines += [f"- {arm.title} · {note}" for note in arm.findings]
    by_message: dict[str, list[str]] = {}
    for w in report.warnings:
        msg = " ".join(str(w.get("message", "")).split())[:300].replace("`", "'")
        by_message.setdefault(msg, []).append(f"{w.get('arm')} ×{w.get('count')}")
    for msg, where in list(by_message.items())[:MAX_WARNINGS]:
        lines.append(f"- `{msg}` ({', '.join(where)})")
    if len(by_message) > MAX_WARNINGS:
        lines.append(f"- … {len(by_message) - MAX_WARNINGS} more distinct warnings in the report JSON")
    return "\n".join(lines) if lines else "None recorded."


def format_stack(report: Report | dict) -> str:
    report = as_report(report)
    prov = report.provenance
    kit = prov.get("kit") or {}
    hw = prov.get("hardware") or {}
    pkgs = ", ".join(f"{k} {v}" for k, v in sorted((prov.get("packages") or {}).items()))
    engine = ", ".join(f"{k} {v}" for k, v in sorted((prov.get("engine_versions") or {}).items()))
    hw_txt = ", ".join(
        f"{k} {', '.join(map(str, v)) or 'none' if isinstance(v, list) else v}" for k, v in sorted(hw.items())
    )
    return "\n".join(
        [
            f"- packages (parent process): {pkgs or 'not recorded'}",
            f"- engine process: {engine or 'not recorded'}",
            f"- Python {prov.get('python', '?')} on {prov.get('platform', '?')}",
            f"- hardware: **{report.hardware_label}** ({hw_txt or 'not recorded'})",
            f"- kvkit {report.tool_version}, commit {kit.get('commit', '?')}"
            + (" (dirty)" if kit.get("dirty") else "")
            + (f"; {patch}" if (patch := patch_text(prov)) else ""),
        ]
    )


def format_adapters(report: Report) -> str:
    """The LoRA adapters the probes ran under, a line each (how each was sent, its weights, its probes)."""
    return "\n".join(f"- {line}" for line in report.adapter_lines)


def format_conditions_warning(report: Report) -> list[str]:
    """Above the table, where a failure it shows was intermittent or needed the shared device; else nothing."""
    warning = report.conditions_warning
    return [f"**Read the verdicts with their conditions:** {warning}."] if warning else []


def _has_scenarios(report: Report) -> bool:
    """The report ran scenarios, or was asked to (then the section says which are missing)."""
    return bool(report.scenarios or report.requested_scenarios)


def render_body(report: Report, token_limit: int | None, lmcache_yaml: str | None = None) -> str:
    """In the order maintainers read an issue: the finding in one sentence (the headline, also the title), expected
    vs actual, how to reproduce, the environment (collect_env's shape), then the evidence folded."""
    evidence = [
        (
            "Generated token IDs of each reuse are compared exactly with a no-reuse baseline run in a separate "
            "process (greedy decoding, `ignore_eos`). `0→1280×3`: the cold request reported 0 cached tokens, each "
            f"of 3 reuses 1280; `@4,15`: first differing token index; {DIVERGENCE_LEGEND}."
        ),
        *format_conditions_warning(report),
        format_table(report),
        *(["#### LoRA adapters\n\n" + format_adapters(report)] if report.adapters else []),
        format_verdicts(report),
        *(["#### Conditions\n\n" + format_conditions(report)] if report.has_conditions else []),
        *(["#### Scenarios\n\n" + format_scenarios(report, token_limit)] if _has_scenarios(report) else []),
        *(["#### KV audit\n\n" + format_kv_audit(report)] if report.kv_audit_state is not None else []),
        "#### What maintainers ask for\n\n" + format_maintainer_facts(report),
        "#### First diffs and margins\n\n" + format_diffs(report, token_limit),
        "#### Stack\n\n" + format_stack(report),
        "#### Warnings\n\n" + format_warnings(report),
    ]
    parts = [
        f"### {headline(report)}",
        f"Found by kvkit on {report.hardware_label}, {report.day}; {acceptance_text(report)}.",
        "#### Expected vs actual\n\n" + format_expected_actual(report),
        "#### How to reproduce\n\n" + format_how_to_reproduce(report),
        "#### Environment\n\n" + format_environment(report, lmcache_yaml),
        f"<details><summary>Evidence: {_evidence_summary(evidence)}</summary>\n\n"
        + machine_path_name("\n\n".join(evidence))
        + "\n\n</details>",  # no path of the machine
        f"`{CLAIM_LINE}`",
    ]
    return "\n\n".join(parts) + "\n"


def _evidence_summary(evidence: list[str]) -> str:
    """'verdicts per probe, conditions, KV audit, …': the folded sections, as their headings name them."""
    names = [part.split("\n", 1)[0][5:].lower() for part in evidence if part.startswith("#### ")]
    return ", ".join(["verdicts per probe", *(n.replace("kv audit", "KV audit") for n in names)])


def hard_truncate(body: str, limit: int) -> str:
    """Cut at a line boundary, close an open code fence, say so, and keep the claim line last."""
    tail = f"\n\n_… truncated to fit GitHub's {GITHUB_BODY_LIMIT}-character limit; the full report is in the kit._\n\n`{CLAIM_LINE}`\n"
    kept = body[: max(0, limit - len(tail) - 30)]
    kept = kept[: kept.rfind("\n")] if "\n" in kept else kept
    if kept.count("```") % 2:
        kept += "\n```"
    if kept.count("<details>") > kept.count("</details>"):
        kept += "\n\n</details>"
    return kept + tail


def format_issue_md(report: Report | dict, limit: int = GITHUB_BODY_LIMIT, lmcache_yaml: str | None = None) -> str:
    """The issue body; token lists shrink first, then the body is cut, so it always fits in limit. lmcache_yaml: the
    report's LMCache YAML where the report does not carry it (repro.publish.issue_sections.find_lmcache_yaml)."""
    report = as_report(report)
    for token_limit in TOKEN_LIMITS:
        body = render_body(report, token_limit, lmcache_yaml)
        if len(body) <= limit:
            return body
    return hard_truncate(body, limit)


def _outputs(args) -> tuple[Path | None, Path | None]:
    """Where the issue text and repro_min.py go: --out FILE, and --repro-min PATH or beside --out."""
    out = Path(args.out) if args.out else None
    script = Path(args.repro_min) if args.repro_min else (out.parent / "repro_min.py" if out else None)
    if script is not None and script.suffix != ".py":  # its inputs go beside it under its name with .json
        raise UsageError(f"--repro-min {script}: name the script with .py (its inputs are written beside it as .json)")
    if (
        out is not None
        and script is not None
        and out.resolve() in (script.resolve(), script.with_suffix(".json").resolve())
    ):
        raise UsageError(f"--out {out}: that is where repro_min.py or its inputs go; name the issue text otherwise")
    return out, script


def _refuse_replacing(paths: list[Path], force: bool) -> None:
    """Nothing already written is replaced unless asked: another issue's text or reproducer may be there, and that
    issue's text still says `python repro_min.py` (attached). Checked before anything is written."""
    there = [p for p in paths if p.exists() or p.is_symlink()]
    if there and not force:
        raise UsageError(
            f"{there[0]} exists (another issue's?): nothing was written; write into another folder, or pass --force "
            "to replace it"
        )


def main(argv: list[str]) -> int:
    """`python -m repro issue-md REPORT [--out FILE]`: print the issue body, or write it to FILE."""
    parser = ArgumentParser(prog="python -m repro issue-md", description=main.__doc__)
    parser.add_argument("report", help="a kvkit report JSON")
    parser.add_argument(
        "--out", help="write the Markdown to this file instead of stdout (and repro_min.py and its .json beside it)"
    )
    parser.add_argument("--repro-min", help="write the reproducer without the kit here (default: beside --out)")
    parser.add_argument("--arm", help="the reuse arm repro_min.py reproduces (default: the first with a finding)")
    parser.add_argument("--force", action="store_true", help="replace files already there (default: refuse, exit 2)")
    args = parser.parse_args(argv)
    out, script = _outputs(args)
    report = read_report(args.report)
    body = format_issue_md(report, lmcache_yaml=find_lmcache_yaml(report))
    repro = None
    if script is not None:
        from repro.publish.repro_min import make_repro_min

        try:
            repro = make_repro_min(report.data, args.arm, Path(args.report).name)
        except UsageError as exc:
            if args.repro_min or args.arm:
                raise
            print(f"no repro_min.py: {exc}", file=sys.stderr)
    writes = [(out, body)] if out else []
    if repro is not None:  # its inputs, the connector module they name where the arm needs one, the script
        writes += repro.files(script)
    if out is not None and out.resolve() in [path.resolve() for path, _ in writes[1:]]:
        raise UsageError(
            f"--out {out}: that is where repro_min.py or a file beside it goes; name the issue text otherwise"
        )
    _refuse_replacing([path for path, _ in reversed(writes)], args.force)  # the script named first where it is there
    if not out:
        sys.stdout.write(body)
    for path, text in writes:  # the script last: a script is never there without its inputs
        write_bytes_atomic(path, text.encode("utf-8"))
        what = f"{text.count(chr(10))} lines" if path.suffix == ".py" else f"{len(text)} characters"
        print(f"wrote {path} ({what})", file=sys.stderr)
    return EXIT_OK
