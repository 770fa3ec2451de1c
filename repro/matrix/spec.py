"""The matrix file: a YAML list of cells, loaded strictly (a bad file is one line and exit 2)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from repro.errors import UsageError
from repro.paths import KIT_ROOT
from repro.plan.fixture_keys import nearest, unknown_key

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
_PROFILE = re.compile(r"^[a-z0-9][a-z0-9._-]*$")
_MATRIX_KEYS = ("name", "description", "defaults", "cells")
CELL_KEYS = ("name", "environment", "connector", "fixture", "model", "seed", "flags", "cpus", "timeout")
# The verifier flags a cell sets from its own keys (or the matrix sets): never in `flags`.
RESERVED_FLAGS = ("--model", "--fixture", "--seed", "--kv-connector", "--python", "--report")
DEFAULT_CELL_TIMEOUT_S = 3 * 3600


@dataclass(frozen=True)
class Cell:
    name: str
    environment: str  # a profile name (.venvs/<profile>) or an interpreter path
    python: str  # the interpreter that runs the cell's verifier and engines
    connector: str | None  # --kv-connector; None: the fixture's own connector arms
    fixture: str
    model: str
    seed: int
    flags: tuple[str, ...]
    cpus: int  # Ray's num_cpus for a CPU cell
    timeout_s: float  # the whole cell (every arm), after which it is an ERROR cell

    @property
    def device(self) -> str:
        """The cell's --device (cpu, cuda or auto)."""
        flags = list(self.flags)
        for i, flag in enumerate(flags):
            if flag == "--device" and i + 1 < len(flags):
                return flags[i + 1]
            if flag.startswith("--device="):
                return flag.split("=", 1)[1]
        return "auto"

    def verifier_argv(self, report: str) -> list[str]:
        """The verifier's arguments for this cell (what its report's provenance.argv records)."""
        argv = ["--model", self.model, "--fixture", self.fixture, "--seed", str(self.seed)]
        if self.connector:
            argv += ["--kv-connector", self.connector]
        return [*argv, *self.flags, "--python", self.python, "--report", report]


@dataclass(frozen=True)
class Matrix:
    name: str
    path: str
    cells: tuple[Cell, ...]


def profile_python(profile: str) -> str:
    return str(KIT_ROOT / ".venvs" / profile / "bin" / "python")


def _fail(where: str, message: str):
    raise UsageError(f"{where}: {message}")


def _text(where: str, key: str, value: object, optional: bool = False) -> str | None:
    if value is None and optional:
        return None
    if not isinstance(value, str) or not value.strip():
        _fail(where, f"{key} must be a non-empty string")
    return value


def _flags(where: str, value: object) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(
        isinstance(f, (str, int, float)) and not isinstance(f, bool) for f in value
    ):
        _fail(where, "flags must be a list of strings (verifier flags and their values)")
    flags = tuple(str(f) for f in value)
    for flag in flags:
        if flag.split("=", 1)[0] in RESERVED_FLAGS:
            _fail(where, f"flags must not set {flag.split('=', 1)[0]} (a cell key sets it)")
    return flags


def _positive_int(where: str, key: str, value: object, default: int) -> int:
    if value is None:
        return default
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        _fail(where, f"{key} must be a non-negative integer")
    return value


def _cell(raw: object, defaults: dict, index: int) -> Cell:
    where = f"cells[{index}]"
    if not isinstance(raw, dict):
        _fail(where, "must be a mapping of cell keys")
    unknown = sorted(set(raw) - set(CELL_KEYS))
    if unknown:
        _fail(where, unknown_key(unknown[0], CELL_KEYS, "key"))
    data = {**defaults, **raw}
    name = _text(where, "name", data.get("name"))
    if not _NAME.match(name):
        _fail(where, f"name {name!r} must be letters, digits, '.', '_' or '-' (it names the report file)")
    where = f"cell {name}"
    env = _text(where, "environment", data.get("environment"))
    if "/" in env:
        python = env
    elif _PROFILE.match(env):
        python = profile_python(env)
    else:
        _fail(where, f"environment {env!r} must be a profile name (.venvs/<profile>) or a path to a python")
    seed = _positive_int(where, "seed", data.get("seed"), 0)
    cpus = _positive_int(where, "cpus", data.get("cpus"), 1)
    timeout = data.get("timeout", DEFAULT_CELL_TIMEOUT_S)
    if not isinstance(timeout, (int, float)) or isinstance(timeout, bool) or timeout <= 0:
        _fail(where, "timeout must be a positive number of seconds")
    return Cell(
        name=name,
        environment=env,
        python=python,
        connector=_text(where, "connector", data.get("connector"), optional=True),
        fixture=_text(where, "fixture", data.get("fixture")),
        model=_text(where, "model", data.get("model")),
        seed=seed,
        flags=_flags(where, data.get("flags")),
        cpus=max(cpus, 1),
        timeout_s=float(timeout),
    )


def parse_matrix(data: object, path: str) -> Matrix:
    """A loaded matrix document as a Matrix; every problem is one UsageError naming the field."""
    where = f"matrix {path}"
    if not isinstance(data, dict):
        _fail(where, "must be a mapping with a 'cells' list")
    unknown = sorted(set(data) - set(_MATRIX_KEYS))
    if unknown:
        _fail(where, unknown_key(unknown[0], _MATRIX_KEYS, "key"))
    stem = Path(path).stem
    name = data.get("name", stem.removeprefix("matrix-"))
    if not isinstance(name, str) or not _NAME.match(name):
        _fail(where, "name must be letters, digits, '.', '_' or '-' (it names the reports folder)")
    defaults = data.get("defaults") or {}
    if not isinstance(defaults, dict):
        _fail(where, "defaults must be a mapping of cell keys")
    stray = sorted(set(defaults) - set(CELL_KEYS)) or (["name"] if "name" in defaults else [])
    if stray:
        bad = stray[0]
        _fail(where, f"defaults: key {bad!r} is not a shared cell key{nearest(bad, CELL_KEYS[1:])}")
    cells = data.get("cells")
    if not isinstance(cells, list) or not cells:
        _fail(where, "cells must be a non-empty list")
    try:
        out = tuple(_cell(raw, defaults, i) for i, raw in enumerate(cells))
    except UsageError as exc:  # a cell's line names the file too
        raise UsageError(f"{where}: {exc}") from None
    seen: set[str] = set()
    for cell in out:
        if cell.name in seen:
            _fail(where, f"two cells are named {cell.name!r}")
        seen.add(cell.name)
    return Matrix(name=name, path=path, cells=out)


def load_matrix(path: str | Path) -> Matrix:
    """Read and check a matrix file (YAML); one line and exit 2 for anything wrong with it."""
    import yaml  # pure Python; a dependency of Ray and of vLLM

    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"matrix {path}: cannot read ({exc.strerror or exc})") from None
    except UnicodeDecodeError:
        raise UsageError(f"matrix {path}: not UTF-8 text") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise UsageError(f"matrix {path}: invalid YAML ({str(exc).splitlines()[0][:160]})") from None
    return parse_matrix(data, str(path))
