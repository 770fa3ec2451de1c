"""A report run again on another machine: its verifier arguments with that machine's paths replaced (each flag
once), the model it needs and the kit's command that makes it, and what the tree that made it held beyond its
commit. The report page's Reproduce block, the issue Markdown and the kit's README all build their commands here."""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import PurePath
from typing import Any

from repro.judge.wording import machine_path_name
from repro.models.registry import DEFAULT_DTYPE, DTYPES, MODELS, MODELS_DIR
from repro.models.tiny import MODEL_NAME, MODEL_SEED
from repro.paths import KIT_ROOT
from repro.plan.options import build_parser

VERIFY = ("python", "-m", "repro.verify_kv_reuse")
MODEL_DIR = "MODEL_DIR"  # the placeholder for a model folder where the command does not name the kit's own
REPORTS_DIR = "reports"  # a rerun writes its report here, in the kit's own tree, never over the evidence it carries
RERUN_REPORT = "report.json"  # the report's name where its recorded one is not a plain file name
# The reporter's choices about their own machine, not part of the run: the engine's interpreter (--python), where
# raw KV went (--keep-kv) and replacing a report already there (--force). The kit's defaults then apply.
DROPPED_FLAGS = frozenset({"--python", "--keep-kv", "--force"})
# the verifier's flags that take no value, read from its own parser (a hand-kept list missed --stream and --force,
# and the flag after one was then read as its value)
VALUELESS = frozenset(flag for action in build_parser()._actions if action.nargs == 0 for flag in action.option_strings)
MODELS_REL = MODELS_DIR.relative_to(KIT_ROOT).as_posix()  # '.cache/models', where the kit makes its models
# The kit's generated tiny model by its folder's name: MODEL_NAME for the default seed, MODEL_NAME-seedN for another
# (repro.detection.run and the GPU scripts name them so).
_TINY_FOLDER = re.compile(rf"^{re.escape(MODEL_NAME)}(?:-seed(?P<seed>\d{{1,9}}))?$")
_PLAIN_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,199}$")  # a file name that needs no quoting anywhere
_HUB_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")


def rerun_report_path(recorded: str | None) -> str:
    """'reports/<name>.json': where a rerun writes its report, relative to the kit's root; the recorded report's
    file name where it is a plain one, else RERUN_REPORT (a report's value is data, never pasted into a command)."""
    name = PurePath(recorded or "").name
    return f"{REPORTS_DIR}/{name if _PLAIN_NAME.match(name) and name.endswith('.json') else RERUN_REPORT}"


def _pairs(argv: list[str]) -> dict[str, str | None]:
    """Each flag once, with its last value (as argparse reads them), in the order of its last appearance."""
    pairs: dict[str, str | None] = {}
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg.startswith("--") and "=" in arg:
            flag, value = arg.split("=", 1)
        elif arg.startswith("--") and arg not in VALUELESS and i + 1 < len(argv):
            flag, value = arg, argv[i + 1]
            i += 1
        else:
            flag, value = arg, None
        pairs.pop(flag, None)  # a repeated flag moves to where its last value was given
        pairs[flag] = value
        i += 1
    return pairs


def reproduce_argv(argv: list[str], model: str = MODEL_DIR) -> list[str]:
    """The verifier's arguments with each flag once (the last value wins), --model as model, --report in the
    kit's reports/ (rerun_report_path), the machine's own choices dropped (DROPPED_FLAGS) and any other absolute
    path shown by its name; nothing else changed."""
    out: list[str] = []
    for flag, value in _pairs(argv).items():
        if flag in DROPPED_FLAGS:
            continue
        if flag == "--model":
            value = model
        elif flag == "--report":
            value = rerun_report_path(value)
        elif value is not None and PurePath(value).is_absolute():
            value = machine_path_name(value)
        out += [flag] if value is None else [flag, value]
    return out


@dataclass(frozen=True)
class ModelNeed:
    """The model a report ran on, as a rerun names it: the kit's own folder and the command that makes it, a hub
    name, or a placeholder for a folder only its owner has."""

    argument: str  # what --model gets: '.cache/models/kvkit-tiny-qwen3-seed6', 'Qwen/Qwen3-0.6B' or MODEL_DIR
    make: tuple[str, ...] = ()  # the kit's command that writes argument, () where the kit does not make it
    seed: int | None = None  # the generated tiny model's weight seed

    @property
    def made_by_kit(self) -> bool:
        return bool(self.make)

    def make_text(self, python: str = "python") -> str:
        """The make command as one shell line ('python -m repro make-model .cache/models/X --seed 6', python as
        the interpreter, written as given); "" where the kit does not make the model."""
        return _command(self.make, python)


def model_need(provenance: Mapping[str, Any]) -> ModelNeed:
    """What model a rerun needs, read from provenance.model: the generated tiny model (its folder's name says its
    seed: MODEL_NAME, or MODEL_NAME-seedN), a packaged model the kit converts (source.name a known one, in its
    dtype), a hub model (no local folder was hashed), else MODEL_DIR."""
    model = provenance.get("model") if isinstance(provenance.get("model"), Mapping) else {}
    name = str(model.get("name") or "")
    source = model.get("source") if isinstance(model.get("source"), Mapping) else {}
    tiny = _TINY_FOLDER.match(PurePath(name).name)
    if tiny and not source:
        seed = int(tiny["seed"]) if tiny["seed"] else MODEL_SEED
        folder = f"{MODELS_REL}/{PurePath(name).name}"
        return ModelNeed(folder, ("python", "-m", "repro", "make-model", folder, "--seed", str(seed)), seed)
    if source.get("name") in MODELS:
        dtype = source.get("dtype") if source.get("dtype") in DTYPES else DEFAULT_DTYPE
        packaged = MODELS[str(source["name"])]
        folder = packaged.folder(dtype).relative_to(KIT_ROOT).as_posix()
        extra = () if dtype == DEFAULT_DTYPE else (f"DTYPE={dtype}",)
        return ModelNeed(folder, ("make", "model", f"MODEL={packaged.name}", *extra))
    sha = str(model.get("sha256") or "")
    if _HUB_NAME.match(name) and sha.startswith("unavailable:") and "not a local directory" in sha:
        return ModelNeed(name)
    return ModelNeed(MODEL_DIR)


def patch_text(provenance: Mapping[str, Any]) -> str:
    """'uncommitted changes: patch sha256 <64 hex> over repro/a.py, fixtures/b.json; untracked: c.py' for a report
    made from a dirty tree that recorded its patch (repro.record.provenance.tree_patch), the probe's own words where
    it could not, and "" for a clean tree or a report made before the patch was recorded."""
    kit = provenance.get("kit") if isinstance(provenance.get("kit"), Mapping) else {}
    patch = kit.get("patch")
    if isinstance(patch, str):
        return f"uncommitted changes: patch {patch}"
    if not isinstance(patch, Mapping) or not isinstance(patch.get("sha256"), str):
        return ""
    files = [machine_path_name(str(f)) for f in patch.get("files") or []]
    untracked = [machine_path_name(str(f)) for f in patch.get("untracked") or []]
    omitted = patch.get("omitted") if isinstance(patch.get("omitted"), int) else 0
    text = f"uncommitted changes: patch sha256 {patch['sha256']}"
    text += f" over {', '.join(files)}" if files else " (no tracked file's contents differ)"
    text += f"; untracked: {', '.join(untracked)}" if untracked else ""
    return text + (f"; and {omitted} more file(s)" if omitted else "")


def rerun_lines(argv: list[str], provenance: Mapping[str, Any], python: str = "python") -> tuple[str, ...]:
    """The commands that run a report again from the root of a checkout or kit of its commit: the model's make
    command where the kit makes it, then the verifier's, each one shell line; no path of the machine that made it.
    python: the interpreter to name ('python', '.venvs/cpu/bin/python')."""
    need = model_need(provenance)
    make = need.make_text(python)
    return ((make,) if make else ()) + (_command((*VERIFY, *reproduce_argv(argv, need.argument)), python),)


def _command(words: tuple[str, ...] | list[str], python: str) -> str:
    """One shell line, every word quoted as needed but a leading 'python', which becomes python as given (the
    caller's constant, e.g. '.venvs/cpu/bin/python' or '"$PYTHON"', never a report's value)."""
    if not words:
        return ""
    if words[0] == "python":
        return f"{python} {shlex.join(words[1:])}"
    return shlex.join(words)
