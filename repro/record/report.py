"""The report file: its kind and versions, strict loading, and validation against its schema before it is
written. What a report's verdicts meet is repro.record.acceptance; its exit code, repro.record.exit_rule.

Report schema (kind "kvkit-report"; JSON Schema in schemas/report.schema.json):
  schema_version 1: first version (example kept forever: tests/data/report-v1-example.json).
    Additions that old readers may ignore and old files lack (no version bump): acceptance
    .unchecked_probes, the failure kind result-version-mismatch.
  schema_version 2: the KV audit (example: tests/data/report-v2-example.json). config.kv_audit and
    config.keep_kv; per arm kv_audit (status, the measured floor, the KV layout); per probe kv (the
    KV verdict and its blame); per request kv_audit (the cold request's floor, each reuse's cells by
    block x layer x K/V plane, and what a non-exact cell's bytes equal); acceptance.checked items
    say which check they are ("tokens" or "kv"). All four kv fields are required in version 2
    (null where there is nothing to say).
    Additions to version 2 that old readers may ignore and old files lack (no version bump): the
    run's conditions (trials, confirm, lmcache_ops, gpu_load; cpu_load later) and provenance.lmcache_ops; per arm
    gpu, sharing (the other processes on its device and their overlap), copy_paths (each LMCache
    process: compiled ops or the torch fallback), trials (each run, rates per probe, the class) and
    confirmation (the same job re-run alone, and the class of the finding); diagnostics
    arms_wall_s, trials_wall_s and confirm_wall_s. Per reuse request replays (issue 19: null when it
    matched the baseline, else the runs of its tokens that are another probe's answer or an earlier
    request's, repro.judge.replays); a file without them shows no replays. provenance.model.source: where a
    model folder the kit converted from a packaged GGUF came from (repro.models: package and version,
    the GGUF's SHA-256, dequantized_from); absent for other models. config.frontend (--frontend: sync,
    async or server, or endpoint for `repro endpoint`; absent: sync) and per arm effective_config.frontend (the front
    end that drove its engine) and, served, effective_config.served (the server's address, flags, /version,
    /v1/models and each prefix-cache reset over HTTP).
    config.engine_layout (--engine-layout: vllm or one-process; absent: vllm) and per arm
    effective_config.engine_layout and executor (the engine's processes as they ran).
    The failure kinds disk-runaway and disk-low (repro.run.diskwatch: a child stopped, or not started, to
    keep the disk from filling). Per connector arm and per (scenario, connector arm) store (repro.plan.arms: how
    its run's connector state was made fresh, each setting it rewrote to a directory of the run's own, or
    fresh false and why when a store may persist between runs), and in a confirmation that ran, independent
    (false when the run alone's store persisted; its reason then says so) and the run alone's store.
  schema_version 3: an audited reuse's KV grid stored compactly (repro.judge.kv_grid): per plane the class rows
    as before and `runs` (each a layer, a first block, and the max_abs and rel of adjacent blocks whose figures
    are not 0) in place of version 2's max_abs and rel for every cell; a cell in no run is 0 (an EXACT cell is
    bit-identical, so 0 by construction). The SmolLM2 H200 report: 1,594,427 bytes in version 2, 1,021,707 in 3
    (gzipped 144,659 and 135,057: gzip had already packed the zeros, the figures that are not 0 are what weighs).
    Nothing else changed. migrated_from (top level): the version an explicit migration rewrote the report from
    (python -m repro compact-report, repro.record.compact); absent from a report the verifier wrote.
    Additions to version 3 that old readers may ignore and old files lack (no version bump): `adapters` (top level:
    the LoRA adapters the probes ran under, repro.plan.adapters.describe), per probe `adapter` (its label), per
    replay `answers_as` (the source is the prompt under another adapter, repro.judge.adapters). `upstream` (top
    level: the fixture's expectations bound to a known upstream bug, each judged on the engine's recorded version,
    repro.record.acceptance.check_upstream); an older reader ignores it and so does not exit 1 on a bound that is
    fixed upstream, wrong or undecided (its acceptance still fails where the finding did not show).
    provenance.kit.patch (only where kit.dirty is true): the SHA-256 of the tree's diff against its commit and the
    changed and untracked files by name (repro.record.provenance.tree_patch); an older report made from a dirty tree
    has none and reads as it did.
The schema is authoritative: validate_report checks every report before it is written (and the
cross-field shape of the KV audit, which JSON Schema cannot say).
A newer file is refused ("upgrade the kit"). A version 1 file loads as it is: version 2 only added
fields, and a report without them is shown as one made before the KV audit (no KV column, no
heatmap); no migration is needed or done. A version 2 file loads as it is too, its dense grids checked as
version 2 wrote them (the read model reads both forms into one view, repro.readmodel.RequestAudit.planes);
`python -m repro compact-report IN OUT` migrates it to version 3, which the kit packs. Each version's grid form is
strict: a version 3 file with dense grids, or a version 2 file with runs, is refused.
"""

from __future__ import annotations

import json
import lzma
from pathlib import Path

from repro.errors import UsageError
from repro.judge.kv_grid import FIGURES, is_compact, run_problems
from repro.judge.kv_verdict import CELL_CLASSES, CELL_FOREIGN, CELL_MISPLACED, COUNT_NAMES
from repro.paths import SCHEMAS_DIR

REPORT_KIND = "kvkit-report"
REPORT_SCHEMA_VERSION = 3
# Every version load_report reads; older ones are refused (no migration exists).
READABLE_VERSIONS = (1, 2, 3)
COMPACT_GRID_VERSION = 3  # the first version whose audited reuses store their KV grid in runs
CLAIM_LINE = "claim_eligible=false; no performance claim"


def generations(arms: list[dict]) -> int:
    """How many generations the arms ran: every request of every probe."""
    return sum(len(p["requests"]) for a in arms for p in a.get("probes", []))


def report_bytes(path: Path) -> bytes:
    """A report file's JSON bytes: NAME.json as it is, NAME.json.xz (a report committed xz-compressed, over the 1 MiB a
    committed file keeps to) decompressed. OSError and lzma.LZMAError as reading and decompressing raise them."""
    raw = Path(path).read_bytes()
    return lzma.decompress(raw) if Path(path).name.endswith(".xz") else raw


def load_report(path: str | Path) -> dict:
    """Strict loading: the kind and version must be ones this kit writes."""
    path = Path(path)
    try:
        data = json.loads(report_bytes(path).decode("utf-8"))
    except OSError as exc:
        raise UsageError(f"report {path}: cannot read ({exc.strerror or exc})") from None
    except lzma.LZMAError as exc:
        raise UsageError(f"report {path}: not valid xz ({exc})") from None
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
    if version not in READABLE_VERSIONS:
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
    if version >= 2:
        problems = kv_audit_problems(data)
        if problems:
            raise UsageError(f"report {path}: {problems[0]}")
    return data


def kv_audit_problems(report: dict) -> list[str]:
    """What is wrong with a version-2 (or later) report's KV audit fields beyond what the schema says: each
    field an object or null, and every audited reuse's cell grids shaped layers x blocks in its version's form
    (dense rows in version 2, runs from version 3), with counts that add up. Renderers index these grids, so the
    loader checks them too."""
    compact = report.get("schema_version", 0) >= COMPACT_GRID_VERSION
    config = report.get("config")
    if not isinstance(config, dict) or not isinstance(config.get("kv_audit"), bool):
        return ["config.kv_audit missing or not true/false"]
    problems = []
    for i, arm in enumerate(report.get("arms") or []):
        if "kv_audit" not in arm or not isinstance(arm["kv_audit"], (dict, type(None))):
            problems.append(f"arms[{i}].kv_audit missing or not an object or null")
        for j, probe in enumerate(arm.get("probes") or []):
            where = f"arms[{i}].probes[{j}]"
            if "kv" not in probe or not isinstance(probe["kv"], (dict, type(None))):
                problems.append(f"{where}.kv missing or not an object or null")
            requests = probe.get("requests")
            for k, req in enumerate(requests if isinstance(requests, list) else []):
                if not isinstance(req, dict) or "kv_audit" not in req:
                    problems.append(f"{where}.requests[{k}].kv_audit missing")
                elif isinstance(req["kv_audit"], dict):
                    found = _grid_problems(req["kv_audit"], compact)
                    problems += [f"{where}.requests[{k}].kv_audit: {p}" for p in found]
                elif req["kv_audit"] is not None:
                    problems.append(f"{where}.requests[{k}].kv_audit is not an object or null")
    return problems


def _grid_problems(audit: dict, compact: bool) -> list[str]:
    """An audited reuse: planes K and V, each with a class string per layer, one character per block, and
    its figures: a rel and max_abs row per layer, one entry per block (dense), or runs (compact,
    repro.judge.kv_grid); counts equal to the classes' tally. Other statuses have no grid."""
    if audit.get("status") != "audited":
        return []
    layers, blocks, planes = audit.get("layers"), audit.get("num_blocks"), audit.get("planes")
    if not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in (layers, blocks)):
        return ["layers and num_blocks must be counts"]
    if not isinstance(planes, dict) or set(planes) != {"K", "V"}:
        return ["an audited reuse needs planes K and V"]
    tally = dict.fromkeys(CELL_CLASSES, 0)
    for name in ("K", "V"):
        plane = planes[name]
        if not isinstance(plane, dict):
            return [f"plane {name} is not an object"]
        if is_compact(plane) != compact or (compact and set(plane) != {"class", "runs"}):
            form = "runs (schema_version 3 on)" if compact else "max_abs and rel rows (schema_version 2)"
            return [f"planes.{name} must store its figures as {form}"]
        dense = () if compact else tuple((key, list) for key in FIGURES)
        for key, row_type in (("class", str), *dense):
            rows = plane.get(key)
            if not isinstance(rows, list) or len(rows) != layers or not all(_sized(r, row_type, blocks) for r in rows):
                return [f"planes.{name}.{key} must be {layers} rows (layers) of {blocks} entries (blocks)"]
        if compact and (found := run_problems(plane.get("runs"), layers, blocks)):
            return [f"planes.{name}.{p}" for p in found]
        for row in plane["class"]:
            if set(row) - set(tally):
                return [f"planes.{name}.class rows must be strings of {', '.join(tally)}"]
            for c in row:
                tally[c] += 1
    counts = audit.get("counts")
    # misplaced and foreign: absent from the counts of reports written before those classes (and then none)
    newer = (CELL_MISPLACED, CELL_FOREIGN)
    want = {
        COUNT_NAMES[c]: n
        for c, n in tally.items()
        if c not in newer or n or (isinstance(counts, dict) and COUNT_NAMES[c] in counts)
    }
    if not isinstance(counts, dict) or {k: counts.get(k) for k in want} != want:
        return [f"counts {counts} do not match the cells' classes {want}"]
    return []


def _sized(row: object, row_type: type, n: int) -> bool:
    return isinstance(row, row_type) and len(row) == n


def validate_report(report: dict) -> None:
    """Check a report against schemas/report.schema.json before it is written: the schema is the
    authority on the report's shape, and a report that breaks it is a kit bug (ReportInvalid)."""
    import jsonschema  # a dependency of vLLM, so present wherever the verifier runs

    schema = json.loads((SCHEMAS_DIR / "report.schema.json").read_text(encoding="utf-8"))
    error = jsonschema.exceptions.best_match(jsonschema.Draft202012Validator(schema).iter_errors(report))
    if error is not None:
        where = "/".join(str(p) for p in error.absolute_path) or "(top level)"
        raise ReportInvalid(f"the report does not match schemas/report.schema.json at {where}: {error.message[:300]}")
    problems = kv_audit_problems(report) if report.get("schema_version", 0) >= 2 else []
    if problems:
        raise ReportInvalid(f"the report's KV audit is malformed: {problems[0][:300]}")


class ReportInvalid(Exception):
    """A report the kit built breaks its own schema (a kit bug; nothing is written)."""
