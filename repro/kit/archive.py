"""Building the kit archive: which files go in (from HEAD, never the working tree), SHA256SUMS, the bytes."""

from __future__ import annotations

import gzip
import hashlib
import io
import sys
import tarfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from repro.errors import UsageError
from repro.kit import archive_name
from repro.kit.evidence import DEFAULT_REPORTS, ChosenReport, LeftOut, evidence_files, gather_reports
from repro.kit.git import committed_files, dirty_paths, head_commit, read_blob
from repro.kit.readme import render_readme
from repro.record.atomic import write_bytes_atomic

# What the kit may weigh: small enough to attach to an upstream issue and download in a moment (GitHub takes 25 MB
# per attachment), and a catch for a report or folder that should not be packed. 1 MB until the kit's own code and
# tests reached it (1,005,006 bytes at 14377e7, the three default reports unchanged); 1.2 MB since, a choice about
# size, not about any verdict. `make kit REPORT=` the SmolLM2 report then fits too (1,166,854 bytes at dde9763), with
# 33 KB to spare. Packed as schema_version 3 (its KV grid's figures only where not 0, repro.record.compact) it is
# 9.7 KB lighter, which the code for it took most of back (1,165,014 bytes at c9968f0): the limit stays 1.2 MB, since
# the default kit alone (1,013,810 bytes) is over 1 MB. What weighs is the figures of its cells that are not EXACT.
# 1.25 MB since MultiConnector arms (issue 36, item 5): their code, tests and docs, about 13 KB gzipped, took the
# SmolLM2 kit to 1,202,583 bytes; again a choice about size. 1.3 MB since the production-load scenario and key
# identity under LoRA adapters (their code, tests, fixtures and docs) took it to 1,257,687 bytes at e9754bc. 1.35 MB
# since the P→D arm (disaggregated prefill: its code, tests and cases) took it to 1,310,468 bytes at 9e3532b. 1.4 MB
# since the served front end and image probes beside it took it to 1,342,814 bytes at ea89a35 (7 KB under 1.35 MB).
# 1.5 MB since the current stacks (what the installed vLLM offers, the release watch, the KV audit's
# transfer results, the vLLM 0.34 GPU scripts; their code, tests and docs) took it to 1,438,270 bytes at 7a8f03c.
# 1.75 MB since one judge for every kind of run (the answer check, strict fixtures, no report replaced without
# --force, the property tests over every kind; their code, tests and docs) took it to 1,530,701 bytes at 8af4096: a
# choice about size, as each before; the largest parts are the kit's own tests/ (about 551 KB gzipped) and repro/.
MAX_KIT_BYTES = 1_750_000
SIZE_PARTS_SHOWN = 6  # the largest parts named in the size line and in the too-big error
# What a maintainer needs to run the kit; everything else in the repository stays out.
KIT_PATHS = (
    "Makefile",
    "tasks.py",
    "pyproject.toml",
    "setup.py",  # `pip install .` in the unpacked kit: the wheel's templates, schemas and fixtures
    "repro/",
    "fixtures/",
    "schemas/",
    "templates/",
    "requirements/",
    "tests/",
)
NEVER_PATHS = (".venvs/", ".cache/", "dist/", "site/", "reports/", "tests/artifacts/")
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".ckpt", ".onnx", ".h5", ".npz")


@dataclass(frozen=True)
class Entry:
    path: str  # inside the archive, below the top directory
    data: bytes
    executable: bool = False


def is_kit_path(path: str) -> bool:
    if path.startswith(NEVER_PATHS) or path.lower().endswith(WEIGHT_SUFFIXES):
        return False
    return any(path == p or (p.endswith("/") and path.startswith(p)) for p in KIT_PATHS)


def dirty_kit_paths(root: Path) -> list[str]:
    """Kit files with uncommitted changes: they are not packed, and the builder says so."""
    return [p for p in dirty_paths(root) if is_kit_path(p)]


def sums_entry(entries: list[Entry]) -> Entry:
    """SHA256SUMS over the entries, in `sha256sum -c` format, sorted by path."""
    lines = (f"{hashlib.sha256(e.data).hexdigest()}  {e.path}\n" for e in sorted(entries, key=lambda e: e.path))
    return Entry("SHA256SUMS", "".join(lines).encode())


def collect_entries(root: Path, commit: str, reports: list[ChosenReport], left_out: list[LeftOut]) -> list[Entry]:
    """HEAD's kit files, evidence/, README.md, COMMIT and SHA256SUMS, sorted by path."""
    kit_files = [(p, x) for p, x in committed_files(root, commit) if is_kit_path(p)]
    entries = [Entry(p, read_blob(root, commit, p), x) for p, x in kit_files]
    readme = render_readme(commit, reports, left_out, {e.path: e.data for e in entries})
    entries += [Entry(rel, blob) for rel, blob in evidence_files(reports).items()]
    entries += [Entry("README.md", readme.encode("utf-8")), Entry("COMMIT", f"{commit}\n".encode())]
    entries.append(sums_entry(entries))
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


def _parents(path: str) -> list[str]:
    parts = path.split("/")[:-1]
    return ["/".join(parts[: i + 1]) for i in range(len(parts))]


def archive_bytes(top: str, entries: list[Entry], mtime: int) -> bytes:
    """A deterministic .tar.gz: directories, then files, in sorted order under one top directory.

    Same entries and mtime give the same bytes: the commit's timestamp on every entry, owners 0/"",
    modes 0644/0755, gzip header time 0 and no file name."""
    dirs = sorted({top} | {f"{top}/{parent}" for e in entries for parent in _parents(e.path)})
    members = [(d, None) for d in dirs] + [(f"{top}/{e.path}", e) for e in entries]
    buf = io.BytesIO()
    with (
        gzip.GzipFile(filename="", mode="wb", fileobj=buf, mtime=0, compresslevel=9) as gz,
        tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar,
    ):
        for name, e in sorted(members, key=lambda m: m[0]):
            if e is None:
                tar.addfile(_tar_info(name, mtime, directory=True))
            else:
                tar.addfile(_tar_info(name, mtime, size=len(e.data), executable=e.executable), io.BytesIO(e.data))
    return buf.getvalue()


def size_parts(entries: list[Entry], reports: list[ChosenReport]) -> list[tuple[str, int]]:
    """What each part of the kit costs, largest first: a chosen report with its logs and writeup, or a
    top-level folder or file, its entries gzipped together (the parts add up to about the archive's size)."""
    owner = {f"{c.raw_path.rsplit('/', 1)[0]}/{rel}": c.raw_path for c in reports for rel in c.inputs()}
    parts: dict[str, list[bytes]] = {}
    for e in entries:
        part = owner.get(e.path) or (e.path.split("/", 1)[0] + "/" if "/" in e.path else e.path)
        parts.setdefault(part, []).append(e.data)
    sizes = {part: len(gzip.compress(b"".join(blobs), compresslevel=9, mtime=0)) for part, blobs in parts.items()}
    return sorted(sizes.items(), key=lambda kv: (-kv[1], kv[0]))


def describe_size(size: int, parts: list[tuple[str, int]]) -> str:
    """'N bytes (limit M); largest parts, gzipped: a ≈n, b ≈n, ...': one line."""
    shown = ", ".join(f"{name} ≈{n}" for name, n in parts[:SIZE_PARTS_SHOWN])
    rest = sum(n for _, n in parts[SIZE_PARTS_SHOWN:])
    return f"{size} bytes (limit {MAX_KIT_BYTES}); largest parts, gzipped: {shown}" + (
        f", the other {len(parts) - SIZE_PARTS_SHOWN} ≈{rest}" if rest else ""
    )


def check_size(data: bytes, entries: list[Entry], reports: list[ChosenReport]) -> str:
    """The kit's size line; a kit too big to attach is refused in one line naming its largest parts."""
    line = describe_size(len(data), size_parts(entries, reports))
    if len(data) >= MAX_KIT_BYTES:
        raise UsageError(
            f"kit would be {line}; carry fewer reports (REPORT=, or DEFAULT_REPORTS in repro/kit/evidence.py)"
        )
    return line


def build_kit(
    root: Path,
    out_dir: Path,
    extra_reports: list[str] | None = None,
    defaults: Mapping[str, str] = DEFAULT_REPORTS,
) -> Path:
    """Write out_dir/kvkit-<version>-<commit>.tar.gz from HEAD, the default reports (defaults: repository
    path -> why it is carried) and the extra ones; return its path. A kit over the limit writes nothing."""
    commit, mtime = head_commit(root)
    reports, left_out = gather_reports(root, commit, list(extra_reports or []), defaults)
    entries = collect_entries(root, commit, reports, left_out)
    name = archive_name(commit)
    data = archive_bytes(name, entries, mtime)
    line = check_size(data, entries, reports)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{name}.tar.gz"
    write_bytes_atomic(path, data)
    print(f"[kvkit] {line}", file=sys.stderr)
    return path
