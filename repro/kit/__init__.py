"""The kit, a reproducible archive to attach to upstream issues: its name and its archive's name."""

# The package: git.py (HEAD's files), evidence.py (reports, logs, pages), readme.py (the maintainer's
# README.md), archive.py (entries and deterministic bytes), check.py (kit-check), commands.py (the CLI).
# This module stays on the standard library: kit-check imports it on a bare interpreter.

from __future__ import annotations

from repro import __version__

KIT_NAME = "kvkit"


def archive_name(commit: str) -> str:
    """'kvkit-<version>-<short commit>': the archive's file stem and its top directory."""
    return f"{KIT_NAME}-{__version__}-{commit[:7]}"
