"""The report: assembling the versioned JSON, acceptance, exit codes and the text summary.

Report schema (kind "kvkit-report"; JSON Schema in schemas/report.schema.json):
  schema_version 1: first version (example kept forever: tests/data/report-v1-example.json).
    Additions that old readers may ignore and old files lack (no version bump): acceptance
    .unchecked_probes, the failure kind result-version-mismatch.
The schema is authoritative: validate_report checks every report before it is written.
A newer file is refused ("upgrade the kit"). When version 2 comes, version 1 files are migrated
only by an explicit command (`python -m repro migrate`, to be added with it), never on load.
"""

from __future__ import annotations

import json
from pathlib import Path

from repro.display import acceptance_label, arm_title, cached_cell, diff_cell, headline
from repro.errors import EXIT_MISMATCH, EXIT_OK, EXIT_RUNTIME, UsageError
from repro.paths import SCHEMAS_DIR
from repro.verdict import ERROR, PASS, SKIPPED

REPORT_KIND = "kvkit-report"
REPORT_SCHEMA_VERSION = 1
CLAIM_LINE = "claim_eligible=false; no performance claim"


def generations(arms: list[dict]) -> int:
    return sum(len(p["requests"]) for a in arms for p in a.get("probes", []))


def check_acceptance(arms: list[dict], expected: dict, suite: str | None) -> dict:
    """Observed verdicts against the fixture's expected ones; matched only if all were checked."""
    if suite != "acceptance":
        return {
            "suite": suite,
            "matched": None,
            "checked": [],
            "unchecked_arms": [],
            "unchecked_probes": [],
            "note": "no acceptance suite was run",
        }
    checked, unchecked, unlisted = [], [], []
    by_name = {a["name"]: a for a in arms}
    for arm in arms:
        if arm["mode"] != "baseline" and arm["name"] not in expected:
            unchecked.append(arm["name"])
        # a probe an expected arm ran that its table does not list would never be checked
        table = expected.get(arm["name"])
        if table is not None:
            unlisted += [
                {"arm": arm["name"], "probe": p["name"], "observed": p["verdict"]}
                for p in arm.get("probes", [])
                if p["verdict"] != SKIPPED and p["name"] not in table
            ]
    for arm_name, table in sorted(expected.items()):
        arm = by_name.get(arm_name)
        probes = {p["name"]: p for p in (arm or {}).get("probes", [])}
        for probe_name, want in sorted(table.items()):
            got = (
                probes[probe_name]["verdict"]
                if probe_name in probes
                else (arm["verdict"] if arm and arm["verdict"] == ERROR else None)
            )
            checked.append({"arm": arm_name, "probe": probe_name, "expected": want, "observed": got, "ok": got == want})
    matched = bool(checked) and all(c["ok"] for c in checked) and not unchecked and not unlisted
    return {
        "suite": suite,
        "matched": matched,
        "checked": checked,
        "unchecked_arms": unchecked,
        "unchecked_probes": unlisted,
    }


def exit_code(report: dict) -> int:
    """0 all good; 1 completed but acceptance not matched (or a non-PASS verdict outside it); 3 error."""
    if not report.get("complete", False) or report["errors"] or any(a["verdict"] == ERROR for a in report["arms"]):
        return EXIT_RUNTIME
    acc = report["acceptance"]
    if acc["matched"] is None:
        return EXIT_OK if all(a["verdict"] == PASS for a in report["arms"]) else EXIT_MISMATCH
    if not acc["matched"]:
        return EXIT_MISMATCH
    unchecked = set(acc.get("unchecked_arms", []))
    return EXIT_MISMATCH if any(a["verdict"] != PASS for a in report["arms"] if a["name"] in unchecked) else EXIT_OK


def format_summary(report: dict) -> str:
    lines = [
        headline(report),
        f"# {report['generations']} generations · acceptance.matched = {acceptance_label(report)}",
    ]
    for arm in report["arms"]:
        if arm["mode"] == "baseline":
            if arm["verdict"] != PASS:
                lines.append(f"baseline: {arm['verdict']} — " + "; ".join(arm["reasons"])[:300])
            continue
        lines.append(f"{arm_title(arm)}: {arm['verdict']}")
        if arm.get("error"):
            lines.append(f"  ERROR {arm['error']['kind']}: {arm['error']['detail']}"[:400])
        for p in arm["probes"]:
            tokens = "" if p["prompt_tokens"] is None else str(p["prompt_tokens"])
            lines.append(f"  {p['name']:<10} {tokens:>5}  {cached_cell(p):<12} {p['verdict']} {diff_cell(p)}".rstrip())
        for note in arm.get("findings", []):
            lines.append(f"  note: {note}")
    for err in report["errors"]:
        lines.append(f"ERROR {err['arm']}: {err['kind']}: {err['detail']}"[:400])
    lines.append(CLAIM_LINE)
    return "\n".join(lines)


def load_report(path: str | Path) -> dict:
    """Strict loading: the kind and version must be ones this kit writes."""
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise UsageError(f"report {path}: cannot read ({exc.strerror or exc})") from None
    except (UnicodeDecodeError, ValueError) as exc:
        raise UsageError(f"report {path}: not valid JSON ({str(exc).splitlines()[0][:200]})") from None
    if not isinstance(data, dict) or data.get("kind") != REPORT_KIND:
        raise UsageError(f"report {path}: not a {REPORT_KIND} file")
    version = data.get("schema_version")
    if not isinstance(version, int) or isinstance(version, bool):
        raise UsageError(f"report {path}: schema_version missing or not an integer")
    if version > REPORT_SCHEMA_VERSION:
        raise UsageError(
            f"report {path}: schema_version {version} is newer than this kit ({REPORT_SCHEMA_VERSION}): upgrade the kit"
        )
    if version < REPORT_SCHEMA_VERSION:
        raise UsageError(
            f"report {path}: schema_version {version} is older than any this kit wrote and no migration "
            f"exists: regenerate it (old versions are migrated only by an explicit command)"
        )
    for key, typ in (("arms", list), ("provenance", dict), ("acceptance", dict), ("errors", list)):
        if not isinstance(data.get(key), typ):
            raise UsageError(f"report {path}: field {key!r} missing or of the wrong type")
    for i, arm in enumerate(data["arms"]):
        if (
            not isinstance(arm, dict)
            or not all(isinstance(arm.get(k), str) for k in ("name", "mode", "verdict"))
            or not isinstance(arm.get("probes"), list)
            or not all(isinstance(p, dict) for p in arm["probes"])
        ):
            raise UsageError(f"report {path}: arms[{i}] is not an arm (name, mode, verdict, probes)")
    return data


def validate_report(report: dict) -> None:
    """Check a report against schemas/report.schema.json before it is written: the schema is the
    authority on the report's shape, and a report that breaks it is a kit bug (ReportInvalid)."""
    import jsonschema  # a dependency of vLLM, so present wherever the verifier runs

    schema = json.loads((SCHEMAS_DIR / "report.schema.json").read_text(encoding="utf-8"))
    error = jsonschema.exceptions.best_match(jsonschema.Draft202012Validator(schema).iter_errors(report))
    if error is not None:
        where = "/".join(str(p) for p in error.absolute_path) or "(top level)"
        raise ReportInvalid(f"the report does not match schemas/report.schema.json at {where}: {error.message[:300]}")


class ReportInvalid(Exception):
    """A report the kit built breaks its own schema (a kit bug; nothing is written)."""
