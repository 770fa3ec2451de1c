"""The kit: a reproducible archive to attach to upstream issues, and the check that it stands alone.

The archive holds the committed kit files of HEAD (read from git, never from the working tree,
so the COMMIT inside names exactly what is packed), the chosen reports with the logs they cite
and their rendered pages, a maintainer-facing README.md and SHA256SUMS. Same commit and inputs
give the same bytes: sorted entries, the commit's timestamp on every entry, owners 0/"", modes
0644/0755, gzip header time 0 and no file name.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

from repro import __version__
from repro.errors import EXIT_OK, EXIT_RUNTIME, EXIT_USAGE, UsageError
from repro.report import REPORT_KIND

KIT_NAME = "kvkit"
MAX_KIT_BYTES = 1_000_000
# What a maintainer needs to run the kit; everything else in the repository stays out.
KIT_PATHS = (
    "Makefile",
    "tasks.py",
    "pyproject.toml",
    "repro/",
    "fixtures/",
    "schemas/",
    "templates/",
    "requirements/",
    "tests/",
)
NEVER_PATHS = (".venvs/", ".cache/", "dist/", "site/", "reports/", "tests/artifacts/")
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".ckpt", ".onnx", ".h5", ".npz")
EVIDENCE = "evidence"
RAW = "raw"  # the site renderer's folder for report and log copies
# Set by kit-check in the unpacked tree, so its tests do not build and check a kit again.
NESTED_ENV = "KVKIT_KIT_CHECK"


@dataclass(frozen=True)
class Entry:
    path: str  # inside the archive, below the top directory
    data: bytes
    executable: bool = False


def _git(root: Path, *args: str) -> bytes:
    try:
        return subprocess.run(["git", *args], cwd=root, capture_output=True, check=True, timeout=60).stdout
    except FileNotFoundError:
        raise UsageError("building a kit needs git (not found)") from None
    except subprocess.CalledProcessError as exc:
        msg = exc.stderr.decode(errors="replace").strip().splitlines()
        raise UsageError(
            f"building a kit needs a git checkout: git {args[0]} failed ({msg[-1] if msg else exc.returncode})"
        ) from None


def head_commit(root: Path) -> tuple[str, int]:
    """The full commit hash of HEAD and its committer timestamp (the mtime of every entry)."""
    commit, stamp = _git(root, "show", "-s", "--format=%H %ct", "HEAD").decode().split()
    return commit, int(stamp)


def is_kit_path(path: str) -> bool:
    if path.startswith(NEVER_PATHS) or path.lower().endswith(WEIGHT_SUFFIXES):
        return False
    return any(path == p or (p.endswith("/") and path.startswith(p)) for p in KIT_PATHS)


def committed_files(root: Path, commit: str) -> list[tuple[str, bool]]:
    """(path, executable) of every file of the commit, from `git ls-tree` (ignored junk never enters)."""
    out = []
    for line in _git(root, "ls-tree", "-r", "-z", "--full-tree", commit).split(b"\0"):
        if not line:
            continue
        meta, path = line.decode().split("\t", 1)
        mode, kind, _ = meta.split()
        if kind == "blob" and mode != "120000":  # links are not packed: the archive must stand alone
            out.append((path, mode == "100755"))
    return sorted(out)


def committed_reports(root: Path, commit: str) -> list[str]:
    return [
        p
        for p, _ in committed_files(root, commit)
        if p.startswith("reports/") and p.count("/") == 1 and p.endswith(".json")
    ]


def read_blob(root: Path, commit: str, path: str) -> bytes:
    return _git(root, "show", f"{commit}:{path}")


def report_logs(report: dict) -> list[str]:
    """The logs a report cites (arm["log"], relative to the report's directory), sorted, unique."""
    logs = {a["log"] for a in report.get("arms", []) if isinstance(a.get("log"), str) and a["log"]}
    for rel in logs:
        if Path(rel).is_absolute() or ".." in Path(rel).parts:
            raise UsageError(f"report cites a log outside its directory: {rel}")
    return sorted(logs)


@dataclass(frozen=True)
class ChosenReport:
    name: str  # file name in evidence/
    data: bytes
    report: dict
    logs: dict[str, bytes]  # cited log path (relative to the report) -> bytes
    missing_logs: tuple[str, ...]
    writeup: bytes | None = None  # reports/<stem>.md beside the report, rendered on its page


def choose_report(name: str, data: bytes, log_reader) -> ChosenReport:
    """Parse a chosen report and fetch what it cites through log_reader(rel) -> bytes | None."""
    try:
        report = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise UsageError(f"report {name}: not valid JSON ({exc})") from None
    if not isinstance(report, dict) or report.get("kind") != REPORT_KIND:
        raise UsageError(f"report {name}: not a {REPORT_KIND} file")
    logs, missing = {}, []
    for rel in report_logs(report):
        blob = log_reader(rel)
        if blob is None:
            missing.append(rel)
        else:
            logs[rel] = blob
    return ChosenReport(name, data, report, logs, tuple(missing), log_reader(f"{Path(name).stem}.md"))


def gather_reports(root: Path, commit: str, extra: list[str], use_committed: bool = True) -> list[ChosenReport]:
    """Committed reports/*.json (logs from the commit), then each --report PATH (logs from disk)."""
    chosen: list[ChosenReport] = []
    if use_committed:
        tracked = {p for p, _ in committed_files(root, commit)}
        for path in committed_reports(root, commit):
            base = Path(path).parent
            reader = lambda rel, b=base: (
                read_blob(root, commit, (b / rel).as_posix()) if (b / rel).as_posix() in tracked else None
            )
            chosen.append(choose_report(Path(path).name, read_blob(root, commit, path), reader))
    for path in extra:
        p = Path(path)
        if not p.is_file():
            raise UsageError(f"--report {path}: no such file")
        reader = lambda rel, b=p.parent: (b / rel).read_bytes() if (b / rel).is_file() else None
        chosen.append(choose_report(p.name, p.read_bytes(), reader))
    names = [c.name for c in chosen]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise UsageError(f"two chosen reports share a file name: {', '.join(dupes)}; rename one")
    return sorted(chosen, key=lambda c: c.name)


def render_pages(reports: list[ChosenReport], scratch: Path) -> tuple[dict[str, bytes], str | None]:
    """The site pages of the chosen reports from repro.publish.site, or a note on why there are none."""
    if not reports:
        return {}, "no report chosen, so no pages"
    try:
        from repro.publish.site import render_site
    except ImportError as exc:
        return {}, f"pages not rendered: the site renderer (repro.publish.site.render_site) is not available ({exc})"
    reports_dir, out_dir = scratch / "reports", scratch / "site"
    for c in reports:
        inputs = {c.name: c.data, **c.logs, **({f"{Path(c.name).stem}.md": c.writeup} if c.writeup is not None else {})}
        for rel, blob in inputs.items():
            (reports_dir / rel).parent.mkdir(parents=True, exist_ok=True)
            (reports_dir / rel).write_bytes(blob)
    out_dir.mkdir(parents=True, exist_ok=True)
    render_site(reports_dir, out_dir)
    pages = {p.relative_to(out_dir).as_posix(): p.read_bytes() for p in sorted(out_dir.rglob("*")) if p.is_file()}
    return pages, None if pages else "the site renderer wrote no pages"


VERDICT_MEANINGS = """| verdict | meaning |
| --- | --- |
| PASS | every reuse reported a hit (cached tokens > 0) and its generated token IDs matched the no-reuse baseline exactly |
| FAIL | a reuse that reported a hit generated different token IDs from the baseline; `@4,15` lists the first differing index of each reuse |
| INCONCLUSIVE | a reuse's hit counter was zero or missing (absent telemetry is never read as zero), the cold request was not a verified miss, or the cold miss already differed from the baseline |
| ERROR | the engine crashed, timed out or raised; never summarized as PASS |
| SKIPPED | a probe the fixture declares the arm cannot run, with the reason |"""

LIMITS = """- **No performance claim.** `claim_eligible=false`: the kit publishes no speed, cost, throughput or
  latency figures, and its timings are diagnostics only.
- **Numerics.** A FAIL is an exact token-ID difference after a counted cache hit; the margins say how
  decisive each side was. A divergence at a near tie (baseline top-1/top-2 gap under 0.1 nats) may be
  numerical noise rather than corrupted KV. Conversely, a byte-exact native prefix-caching result does
  not rule out numerics at the connector's suffix shape: a connector loads a different prefix length
  and recomputes a different suffix than native reuse does, so other kernels and shapes run.
- **Scope.** A verdict covers the probes, prompt lengths, model, dtype, block size, greedy decoding and
  stack versions that were run, on the recorded hardware; other settings or GPUs may behave differently.
- **The CPU self-test proves the kit, not the stack under test:** it shows the kit detects a planted
  fault and passes the in-tree connectors on a tiny generated model. It says nothing about LMCache on GPU.
- Hit counters are the engine's own telemetry; the kit cannot see a reuse that the engine does not count."""


def profile_for(report: dict, files: set[str]) -> str:
    """The `make repro` profile that matches a report's stack, or "" when none is packed."""
    if (report.get("config") or {}).get("device") == "cpu":
        return "cpu"
    lmcache = str((report["provenance"].get("packages") or {}).get("lmcache", ""))
    return f"gpu-lmcache-{lmcache}" if f"requirements/gpu-lmcache-{lmcache}.txt" in files else ""


def format_finding(c: ChosenReport, files: set[str]) -> str:
    from repro.publish import issue_md

    r = c.report
    profile = profile_for(r, files)
    run = (
        (
            f"`make repro PROFILE={profile}` reruns this stack's reference command; the exact command of "
            "this report (run it with the profile's `.venvs/{profile}/bin/python`) is:"
        ).replace("{profile}", profile)
        if profile
        else "No packed profile matches this report's stack; its exact command was:"
    )
    parts = [
        f"### `{EVIDENCE}/{RAW}/{c.name}`: {r.get('hardware_label', '?')} · {str(r['provenance'].get('started_utc', '?'))[:10]}",
        issue_md.format_table(r),
        issue_md.format_verdicts(r),
        "First diffs and margins:\n\n" + issue_md.format_diffs(r, token_limit=16),
        "Stack:\n\n" + issue_md.format_stack(r),
        run,
        issue_md.format_reproduce(r).split("\n\n")[0],
    ]
    if profile == "cpu":
        parts.append(
            "Its model is the kit's generated tiny model: `make model` writes it to "
            "`.cache/models/kvkit-tiny-qwen3` (pass that as `--model`); its SHA-256 must equal the "
            f"report's `provenance.model.sha256` ({r['provenance'].get('model', {}).get('sha256', '?')})."
        )
    if c.missing_logs:
        parts.append(
            "Logs the report cites but that were not available when the kit was built: "
            + ", ".join(f"`{m}`" for m in c.missing_logs)
            + "."
        )
    return "\n\n".join(parts)


def kit_readme(commit: str, reports: list[ChosenReport], files: set[str], pages_note: str | None) -> str:
    found = "\n\n".join(format_finding(c, files) for c in reports) or (
        "No report was chosen when this kit was built: run the command below to produce one."
    )
    pages = (
        f"Rendered pages: `{EVIDENCE}/index.html` (works offline from `file://`)."
        if pages_note is None
        else f"Rendered pages: none ({pages_note})."
    )
    return f"""# {KIT_NAME} {__version__}: silent KV-cache reuse corruption, a reproduction kit

Built from {KIT_NAME} commit `{commit}` (also in `COMMIT`). Prefix KV reuse (vLLM's native prefix
caching, or a KV connector such as LMCache's `LMCacheConnectorV1`) must not change a model's answer.
The kit runs a no-reuse baseline and each reuse path in separate processes (greedy decoding,
`ignore_eos`, eager mode, explicit block size) and compares the generated token IDs exactly.

## What was found

{found}

{pages} The reports and the logs they cite are in `{EVIDENCE}/{RAW}/`.

## Run it

```sh
make repro          # CUDA: the LMCache reference (PROFILE=gpu-lmcache-0.5.4); no CUDA: the CPU self-test
```

Needs Linux, Python 3.10+, `make` and access to a Python package index: each profile's pinned
environment is created under `.venvs/` from `requirements/`. Pick a stack with
`make repro PROFILE=cpu|gpu-lmcache-0.5.4|gpu-lmcache-0.5.5rc5`; use a local model with
`make repro MODEL=/path/to/Qwen3-0.6B`. The report lands in `reports/latest-<profile>.json` and
a text summary is printed (`0→1280×3`: the cold request reported 0 cached tokens, each of 3 reuses
1280; `@4,15`: first differing token index). `make test` runs the kit's own tests; `make help`
lists the rest. Exit codes: 0 acceptance matched, 1 not matched, 2 bad usage, 3 engine error.

## What each verdict means

{VERDICT_MEANINGS}

An arm takes the worst verdict of its probes (ERROR > FAIL > INCONCLUSIVE > PASS).

## What this kit cannot show

{LIMITS}

## Integrity

`sha256sum -c SHA256SUMS` checks every file. The archive is reproducible: the same commit and
reports give the same bytes.
"""


def evidence_entries(reports: list[ChosenReport], scratch: Path) -> tuple[list[Entry], str | None]:
    """evidence/ is the rendered site: pages at its root, reports and cited logs under raw/, where the
    site links them. The raw copies are packed by the kit itself, so they are there without pages too."""
    files = {f"{RAW}/{c.name}": c.data for c in reports}
    files.update({f"{RAW}/{rel}": blob for c in reports for rel, blob in c.logs.items()})
    files.update({f"{RAW}/{Path(c.name).stem}.md": c.writeup for c in reports if c.writeup is not None})
    pages, note = render_pages(reports, scratch)
    for rel, blob in pages.items():
        if rel in files and files[rel] != blob:
            raise UsageError(f"the site renderer wrote {rel} with bytes that differ from the chosen input")
        files[rel] = blob
    return [Entry(f"{EVIDENCE}/{rel}", blob) for rel, blob in sorted(files.items())], note


def collect_entries(root: Path, commit: str, reports: list[ChosenReport], scratch: Path) -> list[Entry]:
    files = committed_files(root, commit)
    kit_files = [(p, x) for p, x in files if is_kit_path(p)]
    entries = [Entry(p, read_blob(root, commit, p), x) for p, x in kit_files]
    evidence, pages_note = evidence_entries(reports, scratch)
    entries += evidence
    readme = kit_readme(commit, reports, {p for p, _ in kit_files}, pages_note)
    entries += [Entry("README.md", readme.encode("utf-8")), Entry("COMMIT", f"{commit}\n".encode())]
    sums = "".join(f"{hashlib.sha256(e.data).hexdigest()}  {e.path}\n" for e in sorted(entries, key=lambda e: e.path))
    entries.append(Entry("SHA256SUMS", sums.encode()))
    if pages_note:
        print(f"[kvkit] note: {pages_note}", file=sys.stderr)
    return sorted(entries, key=lambda e: e.path)


def _tar_info(
    name: str, mtime: int, *, size: int = 0, directory: bool = False, executable: bool = False
) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = tarfile.DIRTYPE if directory else tarfile.REGTYPE
    info.mode = 0o755 if directory or executable else 0o644
    info.size, info.mtime = size, mtime
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info


def archive_bytes(top: str, entries: list[Entry], mtime: int) -> bytes:
    """A deterministic .tar.gz: directories, then files, in sorted order under one top directory."""
    dirs = sorted({top} | {f"{top}/{parent}" for e in entries for parent in _parents(e.path)})
    members = [(d, None) for d in dirs] + [(f"{top}/{e.path}", e) for e in entries]
    buf = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=buf, mtime=0, compresslevel=9) as gz:
        with tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar:
            for name, e in sorted(members, key=lambda m: m[0]):
                if e is None:
                    tar.addfile(_tar_info(name, mtime, directory=True))
                else:
                    tar.addfile(_tar_info(name, mtime, size=len(e.data), executable=e.executable), io.BytesIO(e.data))
    return buf.getvalue()


def _parents(path: str) -> list[str]:
    parts = path.split("/")[:-1]
    return ["/".join(parts[: i + 1]) for i in range(len(parts))]


def archive_name(commit: str) -> str:
    return f"{KIT_NAME}-{__version__}-{commit[:7]}"


def build_kit(root: Path, out_dir: Path, extra_reports: list[str] | None = None, use_committed: bool = True) -> Path:
    """Write out_dir/kvkit-<version>-<commit>.tar.gz from HEAD and the chosen reports; return its path."""
    from repro.atomic import write_bytes_atomic

    commit, mtime = head_commit(root)
    reports = gather_reports(root, commit, list(extra_reports or []), use_committed)
    out_dir.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=".kit-", dir=out_dir))
    try:
        entries = collect_entries(root, commit, reports, scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    name = archive_name(commit)
    data = archive_bytes(name, entries, mtime)
    if len(data) >= MAX_KIT_BYTES:
        big = sorted(entries, key=lambda e: -len(e.data))[:5]
        raise UsageError(
            f"kit would be {len(data)} bytes (limit {MAX_KIT_BYTES}); largest: "
            + ", ".join(f"{e.path} ({len(e.data)})" for e in big)
        )
    path = out_dir / f"{name}.tar.gz"
    write_bytes_atomic(path, data)
    return path


def dirty_kit_paths(root: Path) -> list[str]:
    """Kit files with uncommitted changes: they are not packed, and the builder says so."""
    out = _git(root, "status", "--porcelain", "--untracked-files=no", "-z").decode()
    return sorted(p[3:] for p in out.split("\0") if len(p) > 3 and is_kit_path(p[3:]))


# The kit's own CPU self-test and tests, as a maintainer would run them.
CHECK_COMMANDS = (("make", "repro", "PROFILE=cpu"), ("make", "test"))
CHECK_REPORT = "reports/latest-cpu.json"


def unpack(archive: Path, dest: Path) -> Path:
    """Extract safely (no absolute paths, links or devices) and return the kit's top directory."""
    with tarfile.open(archive, "r:gz") as tar:
        names = tar.getnames()
        tops = {n.split("/", 1)[0] for n in names}
        if len(tops) != 1:
            raise UsageError(f"{archive}: expected one top directory, found {sorted(tops)}")
        tar.extractall(dest, filter="data")
    return dest / tops.pop()


def verify_sums(tree: Path) -> list[str]:
    """Problems with SHA256SUMS: a listed file missing or changed, or a file it does not list."""
    listed, problems = set(), []
    for line in (tree / "SHA256SUMS").read_text(encoding="utf-8").splitlines():
        digest, rel = line.split("  ", 1)
        listed.add(rel)
        path = tree / rel
        if not path.is_file():
            problems.append(f"missing: {rel}")
        elif hashlib.sha256(path.read_bytes()).hexdigest() != digest:
            problems.append(f"changed: {rel}")
    for path in sorted(tree.rglob("*")):
        rel = path.relative_to(tree).as_posix()
        if path.is_file() and rel != "SHA256SUMS" and rel not in listed:
            problems.append(f"not listed: {rel}")
    return problems


def check_env(tree: Path) -> dict[str, str]:
    """The caller's environment minus anything that points back into the source checkout."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "MAKEFLAGS", "MAKELEVEL")}
    env.update({"GIT_CEILING_DIRECTORIES": str(tree.parent), NESTED_ENV: "1", "PYTHONPATH": str(tree)})
    return env


def check_provenance(tree: Path) -> list[str]:
    """The self-test's report must say it ran from the packed commit, read from COMMIT (no git)."""
    path = tree / CHECK_REPORT
    if not path.is_file():
        return [f"{CHECK_REPORT} was not written"]
    report = json.loads(path.read_text(encoding="utf-8"))
    kit = report["provenance"]["kit"]
    want = (tree / "COMMIT").read_text().strip()
    problems = (
        []
        if kit.get("commit") == want and kit.get("source") == "COMMIT file"
        else [f"report provenance.kit = {kit}, expected commit {want} from the COMMIT file"]
    )
    if report["acceptance"].get("matched") is not True:
        problems.append("the CPU self-test's acceptance did not match")
    return problems


def check_kit(archive: Path, commands=CHECK_COMMANDS, keep: bool = False, check_report: bool = True) -> int:
    """Unpack archive into a temporary directory, verify SHA256SUMS, run commands in the tree, then
    check the self-test report they wrote (check_report)."""
    work = Path(tempfile.mkdtemp(prefix="kvkit-check-"))
    ok = False
    try:
        tree = unpack(archive, work)
        problems = verify_sums(tree)
        print(
            f"[kvkit] unpacked {archive.name} into {tree}; SHA256SUMS: {'ok' if not problems else problems}", flush=True
        )
        if problems:
            return EXIT_RUNTIME
        if (tree / ".git").exists():
            print("[kvkit] the kit must not carry a .git directory", file=sys.stderr)
            return EXIT_RUNTIME
        env = check_env(tree)
        for cmd in commands:
            print(f"[kvkit] kit-check: {' '.join(cmd)}", flush=True)
            rc = subprocess.run(list(cmd), cwd=tree, env=env).returncode
            if rc != 0:
                print(f"[kvkit] kit-check FAILED: `{' '.join(cmd)}` exited {rc}", file=sys.stderr)
                return EXIT_RUNTIME
        problems = check_provenance(tree) if check_report else []
        if problems:
            print("[kvkit] kit-check FAILED: " + "; ".join(problems), file=sys.stderr)
            return EXIT_RUNTIME
        ok = True
        print(f"[kvkit] kit-check passed: {archive.name} runs from its own files", flush=True)
        return EXIT_OK
    finally:
        if keep or not ok:
            print(f"[kvkit] unpacked tree kept at {work}", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)


def main(argv: list[str]) -> int:
    """`python -m repro kit ...` and `python -m repro kit-check ...`."""
    import argparse

    root = Path.cwd()
    cmd, rest = argv[0], argv[1:]
    parser = argparse.ArgumentParser(prog=f"python -m repro {cmd}")
    if cmd == "kit":
        parser.add_argument(
            "--report",
            action="append",
            default=[],
            help="a report JSON to include (repeatable); its cited logs are read beside it",
        )
        parser.add_argument(
            "--no-committed-reports", action="store_true", help="leave out the committed reports/*.json"
        )
        parser.add_argument("--out-dir", default="dist", help="where to write the archive (default: dist)")
    else:
        parser.add_argument("archive", nargs="?", help="the kit (default: dist/kvkit-<version>-<HEAD>.tar.gz)")
        parser.add_argument("--keep", action="store_true", help="keep the unpacked tree")
    args = parser.parse_args(rest)
    try:
        if cmd == "kit":
            dirty = dirty_kit_paths(root)
            if dirty:
                print(
                    f"[kvkit] note: the kit packs HEAD; uncommitted changes to {len(dirty)} kit file(s) are left out: "
                    + ", ".join(dirty),
                    file=sys.stderr,
                )
            path = build_kit(root, Path(args.out_dir), [r for r in args.report if r], not args.no_committed_reports)
            data = path.read_bytes()
            print(f"{path}  {len(data)} bytes  sha256 {hashlib.sha256(data).hexdigest()}")
            return EXIT_OK
        archive = Path(args.archive) if args.archive else root / "dist" / f"{archive_name(head_commit(root)[0])}.tar.gz"
        if not archive.is_file():
            raise UsageError(f"{archive}: no such kit; build it with `make kit`")
        return check_kit(archive, keep=args.keep)
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
