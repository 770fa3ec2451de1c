"""The kit, a reproducible archive to attach to upstream issues: its name and its archive's name."""

# The package: git.py (HEAD's files), evidence.py (reports and logs, what is left out), readme.py (the maintainer's
# README.md), rerun.py (its first command: the lead finding run again), archive.py (entries and deterministic bytes),
# check.py (kit-check), commands.py (the CLI).
# This module stays on the standard library: kit-check imports it on a bare interpreter.

from __future__ import annotations

from repro import __version__
from repro.paths import RAW_DIR

KIT_NAME = "kvkit"
EVIDENCE = "evidence"  # the archive's folder for the chosen reports (under its RAW_DIR, where the site links them)
# The kit packs no pages: this renders them in the unpacked kit from its evidence, into site/ (kit-check runs it).
PAGES_COMMAND = ("make", "site", f"REPORTS={EVIDENCE}/{RAW_DIR}")


def archive_name(commit: str) -> str:
    """'kvkit-<version>-<short commit>': the archive's file stem and its top directory."""
    return f"{KIT_NAME}-{__version__}-{commit[:7]}"
