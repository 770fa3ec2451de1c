"""The kit runs that a chaos run faults: command lines, environments and report paths.

Every run is the real kit (the verifier, or the matrix on Ray) with the failure-handling tests' stand-ins:
the fake engine (tests/fake_engine.py: the child's file contract, no vLLM, each arm a second or so) and the
MP stand-in (tests/stand_in_mp_server.py). They prove failure handling only, which is all a chaos run asks.
"""

from __future__ import annotations

import json
import os
import shlex
from dataclasses import dataclass
from pathlib import Path

from repro.chaos.faults import LINGER, MATRIX, MP, SELFTEST
from repro.chaos.procs import Proc
from repro.lmcache.mp import CONNECTOR as MP_CONNECTOR
from repro.paths import KIT_ROOT
from repro.plan.options import selftest_cpu_argv

FAKE_ENGINE = "tests.fake_engine"
STAND_IN = "tests.stand_in_mp_server"
VERIFIER = "repro.verify_kv_reuse"
ARM_S = 1.0  # how long each fake arm takes: long enough for a fault to land mid-arm
MATRIX_NAME = "chaos"
MATRIX_CELLS = ("a", "b")
_MATRIX_FLAGS = ["--dtype", "float32", "--max-model-len", "2048", "--block-size", "16", "--max-tokens", "16",
                 "--device", "cpu", "--reuses", "1", "--timeout", "120", "--engine-module", FAKE_ENGINE]  # fmt: skip


@dataclass(frozen=True)
class Layout:
    """Where a chaos run keeps its things: one folder, made by prepare()."""

    root: Path

    @property
    def model(self) -> Path:
        return self.root / "model"  # a config.json only: the fake engine loads nothing

    @property
    def reports(self) -> Path:
        return self.root / "reports"

    @property
    def tmp(self) -> Path:
        return self.root / "tmp"

    @property
    def matrix_reports(self) -> Path:
        return self.root / "matrix-reports"

    def report(self, scenario: str) -> Path:
        """The report a scenario's runs replace, one after another (each fault's previous report)."""
        if scenario == MATRIX:
            return self.matrix_reports / f"{MATRIX_NAME}.json"
        return self.reports / f"{scenario}.json"


def prepare(layout: Layout, python: str) -> None:
    for folder in (layout.model, layout.reports, layout.tmp, layout.matrix_reports):
        folder.mkdir(parents=True, exist_ok=True)
    (layout.model / "config.json").write_text(json.dumps({"vocab_size": 151936}) + "\n")
    wrapper = layout.root / "engine-python"  # a cell's interpreter: the kit's, with the fake engine's settings
    fake = json.dumps({"modes": {"*": "slow"}, "sleep_s": ARM_S})
    wrapper.write_text(f'#!/bin/sh\nexport KVKIT_FAKE={shlex.quote(fake)}\nexec {shlex.quote(python)} "$@"\n')
    wrapper.chmod(0o755)
    defaults = {"environment": str(wrapper), "model": str(layout.model), "fixture": "fixtures/selftest-cpu.json",
                "connector": "ExampleConnector", "cpus": 1, "timeout": 300, "flags": _MATRIX_FLAGS}  # fmt: skip
    spec = {"name": MATRIX_NAME, "description": "the chaos run's 2-cell matrix (fake engine)", "defaults": defaults,
            "cells": [{"name": name, "seed": i} for i, name in enumerate(MATRIX_CELLS)]}  # fmt: skip
    (layout.root / "matrix.yaml").write_text(json.dumps(spec, indent=2) + "\n")  # JSON is YAML


def command(
    layout: Layout, scenario: str, report: Path, tmpdir: Path, python: str, ray_python: str | None
) -> tuple[list[str], dict[str, str]]:
    """The argv and environment of one kit run of the scenario, writing `report` (--force: each run replaces the
    previous one's report on purpose, which is what the checks judge a fault against)."""
    env = {**os.environ, "PYTHONPATH": str(KIT_ROOT)}
    env.pop("RAY_ADDRESS", None)  # a local cluster of its own, never someone's
    if scenario == MATRIX:
        if ray_python is None:
            raise ValueError("the matrix scenario needs a Python with Ray")
        argv = [ray_python, "-m", "repro", "matrix", str(layout.root / "matrix.yaml"), "--reports", str(report.parent),
                "--force"]  # fmt: skip
        return argv, env  # Ray keeps its sockets under TMPDIR: left as it is (their paths have a length limit)
    argv = [python, "-m", VERIFIER, *selftest_cpu_argv(str(layout.model), str(report)), "--force",
            "--engine-module", FAKE_ENGINE]  # fmt: skip
    mode = "linger" if scenario == LINGER else "slow"  # linger: the result is written, then the child waits
    env.update(KVKIT_FAKE=json.dumps({"modes": {"*": mode}, "sleep_s": ARM_S}), TMPDIR=str(tmpdir))
    if scenario == MP:
        argv += ["--kv-connector", MP_CONNECTOR, "--lmcache-server-module", STAND_IN]
        env["KVKIT_STAND_IN"] = "{}"
    elif scenario not in (SELFTEST, LINGER):
        raise ValueError(f"unknown scenario {scenario!r}")
    return argv, env


def is_engine_child(p: Proc) -> bool:
    """An arm's engine child itself (after the lifeline exec'd it), not its lifeline watcher."""
    return p.args[1:3] == ("-m", FAKE_ENGINE)


def is_mp_server(p: Proc) -> bool:
    return p.args[1:3] == ("-m", STAND_IN)


def is_verifier(p: Proc) -> bool:
    return p.args[1:3] == ("-m", VERIFIER)


def is_ray_worker(p: Proc) -> bool:
    return bool(p.args) and p.args[0].startswith("ray::")


def arm_of(child: Proc) -> str:
    """An engine child's arm: its job file is <work>/<arm>.job.json."""
    return Path(child.args[-1]).name.removesuffix(".job.json")


def result_file(child: Proc) -> Path:
    return Path(child.args[-1]).with_name(f"{arm_of(child)}.result.json")


def cell_of(verifier: Proc) -> str:
    """A cell's verifier writes <reports>/<matrix>/<cell>.json."""
    args = list(verifier.args)
    return Path(args[args.index("--report") + 1]).stem if "--report" in args[:-1] else "?"
