"""kit-check: unpack a kit safely, verify SHA256SUMS, run its self-test and tests there, check the report, and run
the README's first command where it reruns a CPU finding (its verdicts and exit code must be the packed report's)."""

# Standard library only: `inv kit-check` runs this on a bare interpreter, before any environment exists.

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

from repro.errors import EXIT_OK, EXIT_RUNTIME, UsageError
from repro.kit import EVIDENCE, PAGES_COMMAND
from repro.paths import RAW_DIR

# Set by kit-check in the unpacked tree, so its tests do not build and check a kit again.
NESTED_ENV = "KVKIT_KIT_CHECK"
# The kit's own CPU self-test and tests, as a maintainer would run them.
CHECK_COMMANDS = (("make", "repro", "PROFILE=cpu"), ("make", "test"))
CHECK_REPORT = "reports/latest-cpu.json"
VERIFY_MODULE = "repro.verify_kv_reuse"  # the README's first command's verifier line runs this module
# A kit is under 1.75 MB compressed (repro.kit.archive.MAX_KIT_BYTES); these bound what a hostile archive may write when
# unpacked.
MAX_MEMBER_BYTES = 64 * 2**20
MAX_UNPACKED_BYTES = 256 * 2**20


def member_problem(member: tarfile.TarInfo) -> str | None:
    """Why a member may not be extracted, or None: only regular files and directories, inside the
    destination, with plain permission bits and a sane size."""
    parts = member.name.split("/")
    if not (member.isreg() or member.isdir()):
        return "not a regular file or directory (links and devices are refused)"
    if not member.name or member.name.startswith("/") or os.path.isabs(member.name):
        return "absolute or empty path"
    if ".." in parts:
        return "path leaves the destination (..)"
    if member.mode & ~0o777:
        return f"mode {member.mode:o} has set-id or sticky bits"
    if not 0 <= member.size <= MAX_MEMBER_BYTES:
        return f"size {member.size} is over {MAX_MEMBER_BYTES} bytes"
    return None


def check_members(archive: Path, members: list[tarfile.TarInfo]) -> str:
    """The archive's one top directory, after refusing any member that could escape or mislead."""
    for member in members:
        problem = member_problem(member)
        if problem:
            raise UsageError(f"{archive.name}: refused member {member.name!r}: {problem}")
    total = sum(m.size for m in members)
    if total > MAX_UNPACKED_BYTES:
        raise UsageError(f"{archive.name}: refused: {total} bytes unpacked is over {MAX_UNPACKED_BYTES}")
    tops = {m.name.split("/", 1)[0] for m in members}
    if len(tops) != 1:
        raise UsageError(f"{archive}: expected one top directory, found {sorted(tops)}")
    return tops.pop()


def unpack(archive: Path, dest: Path) -> Path:
    """Extract safely on every Python the kit supports and return the kit's top directory.

    The members are checked here on every Python; where tarfile has the "data" filter (3.10.12+,
    3.11.4+, 3.12+) it guards the extraction as well. Older Pythons have no `filter` argument."""
    try:
        with tarfile.open(archive, "r:gz") as tar:
            members = tar.getmembers()
            top = check_members(archive, members)
            if hasattr(tarfile, "data_filter"):
                tar.extractall(dest, members=members, filter="data")
            else:
                tar.extractall(dest, members=members)
    except tarfile.TarError as exc:  # unreadable, or refused by the data filter
        raise UsageError(f"{archive.name}: refused: {exc}") from None
    return dest / top


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


@dataclass(frozen=True)
class FirstCommand:
    """The README's first command where this machine can run it: a CPU finding run again from the kit."""

    script: str  # the fenced block's lines, run by `sh -e` in the tree
    report: str  # where it writes its report, relative to the tree
    packed: str  # the packed report it runs again (evidence/raw/<the same name>), relative to the tree


def readme_first_block(readme: str) -> str | None:
    """The body of the README's first fenced sh block: the command its reader runs first."""
    found = re.search(r"^```sh\n(.*?)^```$", readme, re.MULTILINE | re.DOTALL)
    return found.group(1) if found else None


def first_command(tree: Path) -> FirstCommand | None:
    """The README's first command when it reruns a packed CPU finding (its verifier line says --device cpu and
    writes a report whose name the evidence holds); None for a GPU finding or a README without one."""
    readme = tree / "README.md"
    block = readme_first_block(readme.read_text(encoding="utf-8")) if readme.is_file() else None
    verify = [shlex.split(line) for line in (block or "").splitlines() if VERIFY_MODULE in line.split()]
    if not verify:
        return None
    words = verify[-1]
    value = {w: words[i + 1] for i, w in enumerate(words[:-1]) if w.startswith("--")}
    packed = f"{EVIDENCE}/{RAW_DIR}/{Path(value.get('--report', '')).name}"
    if value.get("--device") != "cpu" or "--report" not in value or not (tree / packed).is_file():
        return None
    return FirstCommand(block, value["--report"], packed)


def rerun_problems(tree: Path, first: FirstCommand, rc: int) -> list[str]:
    """How the first command's run differs from the packed one: its exit code, or an arm's verdict."""
    from repro.record.exit_rule import exit_reason  # pure; imported only where a rerun is checked

    packed = json.loads((tree / first.packed).read_text(encoding="utf-8"))
    want_rc = exit_reason(packed)[0]
    problems = [] if rc == want_rc else [f"the README's first command exited {rc}, the packed run {want_rc}"]
    path = tree / first.report
    if not path.is_file():
        return [*problems, f"the README's first command wrote no {first.report}"]
    got = {a["name"]: a["verdict"] for a in json.loads(path.read_text(encoding="utf-8"))["arms"]}
    want = {a["name"]: a["verdict"] for a in packed["arms"]}
    if got != want:
        problems.append(f"the README's first command's verdicts {got} are not the packed report's {want}")
    return problems


def check_commands(tree: Path) -> tuple[tuple[str, ...], ...]:
    """CHECK_COMMANDS, then PAGES_COMMAND when the kit carries reports: its README says the pages render
    from them on demand (in the CPU environment the self-test has set up)."""
    return CHECK_COMMANDS + ((PAGES_COMMAND,) if (tree / EVIDENCE / RAW_DIR).is_dir() else ())


def check_tree(tree: Path, commands, check_report: bool) -> str | None:
    """Run the checks in an unpacked tree (commands None: check_commands); the first failure as one line,
    or None when all pass."""
    problems = verify_sums(tree)
    print(f"[kvkit] SHA256SUMS: {'ok' if not problems else problems}", flush=True)
    if problems:
        return "SHA256SUMS does not match the files"
    if (tree / ".git").exists():
        return "the kit must not carry a .git directory"
    env = check_env(tree)
    for cmd in commands if commands is not None else check_commands(tree):
        print(f"[kvkit] kit-check: {' '.join(cmd)}", flush=True)
        rc = subprocess.run(list(cmd), cwd=tree, env=env, check=False).returncode
        if rc != 0:
            return f"`{' '.join(cmd)}` exited {rc}"
    problems = check_provenance(tree) if check_report else []
    first = first_command(tree) if commands is None else None
    if first is not None and not problems:  # after the self-test, whose environment it runs in
        print(f"[kvkit] kit-check: the README's first command, which reruns {first.packed}", flush=True)
        rc = subprocess.run(["sh", "-e", "-c", first.script], cwd=tree, env=env, check=False).returncode
        problems = rerun_problems(tree, first, rc)
    return "; ".join(problems) or None


def check_kit(archive: Path, commands=None, keep: bool = False, check_report: bool = True) -> int:
    """Unpack archive into a temporary directory, verify SHA256SUMS, run commands in the tree (None:
    check_commands), then check the self-test report they wrote (check_report). The tree is kept when a
    check fails."""
    work = Path(tempfile.mkdtemp(prefix="kvkit-check-"))
    try:
        tree = unpack(archive, work)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)  # a refused archive leaves nothing behind
        raise
    print(f"[kvkit] unpacked {archive.name} into {tree}", flush=True)
    failure: str | None = "interrupted"
    try:
        failure = check_tree(tree, commands, check_report)
    finally:
        if keep or failure:
            print(f"[kvkit] unpacked tree kept at {work}", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)
    if failure:
        print(f"[kvkit] kit-check FAILED: {failure}", file=sys.stderr)
        return EXIT_RUNTIME
    print(f"[kvkit] kit-check passed: {archive.name} runs from its own files", flush=True)
    return EXIT_OK
