"""Exceptions that map to the kit's documented exit codes."""

from __future__ import annotations


class UsageError(Exception):
    """Bad usage or input: a one-line message, exit code 2, nothing overwritten."""


EXIT_OK = 0
EXIT_MISMATCH = 1
EXIT_USAGE = 2
EXIT_RUNTIME = 3
EXIT_INTERRUPTED = 130
