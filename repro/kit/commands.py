"""The `kit` and `kit-check` commands: flags, the dirty-tree note, and the default archive path."""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

from repro.commands import ArgumentParser
from repro.errors import EXIT_OK, UsageError
from repro.kit import archive_name
from repro.kit.check import check_kit
from repro.kit.git import head_commit
from repro.paths import KIT_ROOT

DIST_DIR = "dist"


def kit(argv: list[str]) -> int:
    """`python -m repro kit [--report PATH ...] [--no-default-reports] [--out-dir DIR]`."""
    # Imported here: building renders the README with jinja2, which kit-check must not need.
    from repro.kit.archive import build_kit, dirty_kit_paths
    from repro.kit.evidence import DEFAULT_REPORTS

    parser = ArgumentParser(prog="python -m repro kit", description="Build the kit archive from HEAD.")
    parser.add_argument(
        "--report",
        action="append",
        default=[],
        help="a report JSON to include (repeatable); its cited logs are read beside it",
    )
    parser.add_argument(
        "--no-default-reports",
        action="store_true",
        help="leave out the default reports (repro/kit/evidence.py's DEFAULT_REPORTS); carry only --report ones",
    )
    parser.add_argument(
        "--out-dir", default=str(KIT_ROOT / DIST_DIR), help="where to write the archive (default: dist)"
    )
    args = parser.parse_args(argv)
    dirty = dirty_kit_paths(KIT_ROOT)
    if dirty:
        print(
            f"[kvkit] note: the kit packs HEAD; uncommitted changes to {len(dirty)} kit file(s) are left out: "
            + ", ".join(dirty),
            file=sys.stderr,
        )
    defaults = {} if args.no_default_reports else DEFAULT_REPORTS
    path = build_kit(KIT_ROOT, Path(args.out_dir), [r for r in args.report if r], defaults)
    data = path.read_bytes()
    print(f"{path}  {len(data)} bytes  sha256 {hashlib.sha256(data).hexdigest()}")
    return EXIT_OK


def kit_check(argv: list[str]) -> int:
    """`python -m repro kit-check [ARCHIVE] [--keep]`."""
    parser = ArgumentParser(prog="python -m repro kit-check", description="Check that the kit runs on its own.")
    parser.add_argument("archive", nargs="?", help="the kit (default: dist/kvkit-<version>-<HEAD>.tar.gz)")
    parser.add_argument("--keep", action="store_true", help="keep the unpacked tree")
    args = parser.parse_args(argv)
    if args.archive:
        archive = Path(args.archive)
    else:
        archive = KIT_ROOT / DIST_DIR / f"{archive_name(head_commit(KIT_ROOT)[0])}.tar.gz"
    if not archive.is_file():
        raise UsageError(f"{archive}: no such kit; build it with `make kit`")
    return check_kit(archive, keep=args.keep)
