"""The watch's result file (kind kvkit-watch): what was asked of the index, what ran, each arm against the baseline,
the lines printed and the exit code; where a stack's results live (reports/watch/<stack>/), which one is its
baseline (the newest committed), and the write that never replaces a file (a new dated name instead)."""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from repro import __version__
from repro.errors import UsageError
from repro.paths import KIT_ROOT
from repro.record.atomic import dumps_json, write_bytes_atomic
from repro.watch.outcome import RunOutcome

WATCH_KIND = "kvkit-watch"
# 1: stack, versions (the stack's packages), index (each watched package: asked, picked, newest, how many listed),
#    baseline (path, commit, versions, or null with why), runs (exit code, wall time, report, error, the facts a
#    comparison needs, each arm's verdict, KV class and findings), changes (each arm's status against the
#    baseline), not_run (the packages this machine could not run, with why), lines, issues, exit_code, provenance.
WATCH_SCHEMA_VERSION = 1
WATCH_DIR = "reports/watch"
GIT_TIMEOUT_S = 30
STAMP_CHARS = len("2026-12-05T035337Z")  # a result's name starts with its UTC start (commands.result_stem)
_CLAIM = re.compile(r"-(\d+)\.json$")  # a second result of the same second: -2 (a version is never a bare integer)
MAX_CLAIMS = 100  # dated names tried before giving up: -2, -3, ... on a second watch within the same second


@dataclass(frozen=True)
class Baseline:
    """A stack's last committed result: where it is, the commit it was read at, the stack it ran and its runs."""

    path: str  # relative to the kit's root
    source: str  # 'git HEAD', or 'the disk (unavailable: …)' outside a git checkout
    versions: Mapping[str, str]
    started_utc: str
    runs: tuple[RunOutcome, ...]

    def to_json(self) -> dict:
        return {"path": self.path, "source": self.source, "versions": dict(self.versions),
                "started_utc": self.started_utc}  # fmt: skip


def check_watch(data: object, where: str) -> dict:
    """A kvkit-watch document, strictly: kind and version (a newer one says to upgrade the kit)."""
    if not isinstance(data, dict) or data.get("kind") != WATCH_KIND:
        raise UsageError(f"{where}: not a {WATCH_KIND} file")
    version = data.get("schema_version")
    if not isinstance(version, int) or isinstance(version, bool):
        raise UsageError(f"{where}: schema_version {version!r} is not a version number")
    if version > WATCH_SCHEMA_VERSION:
        raise UsageError(
            f"{where}: schema_version {version} is newer than this kit ({WATCH_SCHEMA_VERSION}): upgrade the kit"
        )
    if version < 1:
        raise UsageError(f"{where}: schema_version {version} is not one this kit reads")
    return data


def read_watch(path: str | Path) -> dict:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"{path}: cannot read ({exc.strerror or exc})") from None
    return parse_watch(text, str(path))


def parse_watch(text: str, where: str) -> dict:
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise UsageError(f"{where}: not JSON ({exc})") from None
    return check_watch(data, where)


Git = Callable[[list[str]], str]  # git's stdout for these arguments, run in the kit's root; OSError on failure


def run_git(args: list[str], root: Path = KIT_ROOT) -> str:
    try:
        out = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, timeout=GIT_TIMEOUT_S,
                             check=False)  # fmt: skip
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise OSError(f"git {args[0]}: {exc}") from None
    if out.returncode != 0:
        raise OSError(f"git {args[0]} exited {out.returncode}: {(out.stderr.strip().splitlines() or [''])[-1][:160]}")
    return out.stdout


def _age(path: str) -> tuple[str, int]:
    """A result's place in time: its name's UTC stamp, then claim_folder's -2, -3 (in plain name order '…-2.json'
    would come before '….json')."""
    name = path.rsplit("/", 1)[-1]
    claim = _CLAIM.search(name)
    return name[:STAMP_CHARS], int(claim.group(1)) if claim else 1


def find_baseline(stack: str, root: Path = KIT_ROOT, git: Git | None = None) -> Baseline | None:
    """The stack's newest result committed at HEAD (reports/watch/<stack>/*.json, dated names: the last in name
    order), read as committed; outside a git checkout, the newest on the disk, and the baseline says so. None:
    the stack has none (its first result). A baseline that does not load is one line, exit 2."""
    git = git or (lambda args: run_git(args, root))
    folder = f"{WATCH_DIR}/{stack}"
    try:
        listed = [p for p in git(["ls-files", "-z", "--", folder]).split("\0") if p]
        names = sorted((p for p in listed if "/" not in p[len(folder) + 1 :] and p.endswith(".json")), key=_age)
        source = "git HEAD"
    except OSError as exc:
        names = sorted((p.relative_to(root).as_posix() for p in (root / folder).glob("*.json")), key=_age)
        source = f"the disk (unavailable: {exc})"
    if not names:
        return None
    path = names[-1]
    try:
        text = git(["show", f"HEAD:{path}"]) if source == "git HEAD" else (root / path).read_text(encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"{path}: the stack's baseline cannot be read ({exc})") from None
    data = parse_watch(text, path)
    try:
        runs = tuple(RunOutcome.from_json(r) for r in data["runs"])
        return Baseline(path, source, dict(data["versions"]), str(data["provenance"]["started_utc"]), runs)
    except (KeyError, TypeError, ValueError) as exc:
        raise UsageError(f"{path}: the stack's baseline is damaged ({type(exc).__name__}: {exc})") from None


def claim_folder(stack_dir: Path, stem: str) -> Path:
    """A new folder stack_dir/<stem> (or <stem>-2, -3, ...), made here: mkdir fails on a name that exists, so two
    watches never share one, and the result file <folder>.json beside it is free too."""
    stack_dir.mkdir(parents=True, exist_ok=True)
    for n in range(1, MAX_CLAIMS + 1):
        folder = stack_dir / (stem if n == 1 else f"{stem}-{n}")
        if folder.with_name(folder.name + ".json").exists():
            continue
        try:
            folder.mkdir()
        except FileExistsError:
            continue
        return folder
    raise OSError(f"{stack_dir}: {MAX_CLAIMS} results named {stem} already")


def write_new_json(path: Path, obj: Any) -> None:
    """obj written to path by the kit's one writer, never replacing a file: written whole under a staged name
    beside it (repro.record.atomic), then linked to its own name, which fails when the name exists
    (FileExistsError: nothing that was there is touched), and the staged name removed."""
    path = Path(path)
    staged = path.with_name(f".{path.name}.{os.getpid()}.staged")
    write_bytes_atomic(staged, dumps_json(obj).encode("utf-8"))
    try:
        os.link(staged, path)
    finally:
        staged.unlink()
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def watch_document(**fields: Any) -> dict:
    """The result's top level: kind, version and the kit's version before the fields."""
    return {"kind": WATCH_KIND, "schema_version": WATCH_SCHEMA_VERSION, "tool_version": __version__, **fields}
