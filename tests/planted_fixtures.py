"""Fixtures for the gated planted faults (contended, intermittent), built from the CPU self-test's probe.

`python tests/planted_fixtures.py` rewrites tests/data/fixture-contended.json; the intermittent
fixture names an absolute claim directory, so tests build it with `write_intermittent_fixture`.
Neither fixture carries expectations: whether the contended arm fails depends on the machine's load,
and which trial of the intermittent arm fails on which engine won the claim. The replay fixture
(another probe's KV served whole) carries none either: its test reads the report.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SELFTEST_CPU = ROOT / "fixtures" / "selftest-cpu.json"
CONTENDED_FIXTURE = ROOT / "tests" / "data" / "fixture-contended.json"
PLANTED_MODULE = "repro.engine.connectors.planted_fault"
CONTENDED_ARM = "PlantedFault-contended"
INTERMITTENT_ARM = "PlantedFault-intermittent"
BUSY_ARM = "PlantedFault-none"
REPLAY_ARM = "PlantedFault-replay"


def _planted_arm(name: str, **extra) -> dict:
    return {
        "connector": "PlantedFaultConnector",
        "extra_config": {"store_dir": "@tmpdir", **extra},
        "module_path": PLANTED_MODULE,
        "name": name,
    }


def _fixture(name: str, description: str, arms: list[dict]) -> dict:
    selftest = json.loads(SELFTEST_CPU.read_text(encoding="utf-8"))
    return {
        "arms": arms,
        "description": description,
        "kind": "kvkit-fixture",
        "name": name,
        "probes": selftest["probes"],
        "schema_version": 1,
        "tokenizer": selftest["tokenizer"],
        "tool_version": selftest["tool_version"],
    }


def _fault_extra(fault: str, **gate) -> dict:
    """The planted fault's settings with its gate; zero_blocks on the first 16 loaded blocks."""
    extra = {"fault": fault, **gate}
    if fault == "zero_blocks":
        extra.update(first_block=0, num_blocks=16)
    return extra


def contended_fixture(fault: str = "zero_blocks", **gate) -> dict:
    """A zero_blocks fault that applies only to a load whose stand-in copy waited on a run queue
    (when: contended), plus a faithful planted arm that keeps a core busy when arms run at once.
    Alone (--jobs 1) the contended arm should PASS; beside --cpu-load (a spinning process on every
    core) it should FAIL on at least one reuse, however many arms share the cores (other arms alone,
    --jobs 4 --compare-native on two cores, made it fail only when they happened to hold its core)."""
    extra = _fault_extra(fault, when="contended", **gate)
    return _fixture(
        "planted-contended",
        "The planted fault gated on CPU contention: a load faults only when the connector's stand-in "
        "copy waited on a run queue for at least contended_ratio of its CPU time. No expectations: "
        "the verdict depends on what else runs on the machine.",
        [_planted_arm(CONTENDED_ARM, **extra), _planted_arm(BUSY_ARM, fault="none")],
    )


def intermittent_fixture(claim_dir: str | os.PathLike, fault: str = "zero_blocks") -> dict:
    """A zero_blocks fault that applies only in the one engine that claims claim_dir (once_in): of
    N trials of the arm, exactly one fails. claim_dir must be absolute and fresh per run."""
    claim_dir = os.fspath(claim_dir)
    if not os.path.isabs(claim_dir):
        raise ValueError(f"claim_dir {claim_dir!r} must be absolute")
    extra = _fault_extra(fault, once_in=claim_dir)
    return _fixture(
        "planted-intermittent",
        "The planted fault in one engine only: the engine that claims once_in first faults, every "
        "other engine of the arm's trials loads faithfully. No expectations: which trial fails "
        "depends on which engine wins the claim.",
        [_planted_arm(INTERMITTENT_ARM, **extra)],
    )


def replay_fixture() -> dict:
    """The other_prompt fault: every reuse runs on the KV the most recently stored other prompt has at
    the same positions (the previous probe's cold request stored it), its own last partial block computed
    on top. The first probe has no other prompt stored before it: it loads faithfully."""
    return _fixture(
        "planted-replay",
        "The planted other_prompt fault: each reuse is served another probe's stored KV for its whole "
        "loaded prefix. No expectations: the test asserts what the report says of it.",
        [_planted_arm(REPLAY_ARM, fault="other_prompt")],
    )


def write_fixture(path: str | os.PathLike, fixture: dict) -> Path:
    path = Path(path)
    path.write_text(json.dumps(fixture, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return path


def write_intermittent_fixture(directory: str | os.PathLike, fault: str = "zero_blocks") -> Path:
    """directory/fixture-intermittent.json, its claim in directory/once_in (a tmp_path in tests)."""
    directory = Path(directory).resolve()
    (directory / "once_in").mkdir(parents=True, exist_ok=True)
    return write_fixture(directory / "fixture-intermittent.json", intermittent_fixture(directory / "once_in", fault))


if __name__ == "__main__":
    print(write_fixture(CONTENDED_FIXTURE, contended_fixture()))


def write_arms_fixture(path: Path, name: str, description: str, arms: list[dict], **extra) -> str:
    """A fixture at `path` with the CPU self-test's tokenizer (and its probes unless `extra` gives others), these
    arms and whatever else `extra` holds (probes, scenarios); no expectations: its tests read the report."""
    selftest = json.loads(SELFTEST_CPU.read_text(encoding="utf-8"))
    data = {k: selftest[k] for k in ("kind", "schema_version", "tool_version", "tokenizer", "probes")}
    data.update(name=name, description=description, arms=arms, **extra)
    path.write_text(json.dumps(data), encoding="utf-8")
    return str(path)


def fixture_argv(model: str, fixture: str, report: Path, *extra: str) -> list[str]:
    """The verifier's arguments for a test fixture on the CPU engine: the kit's CPU settings, then `extra`."""
    from repro.plan.options import CPU_ENGINE_FLAGS

    return ["--model", model, *CPU_ENGINE_FLAGS, "--fixture", fixture, "--report", str(report), *extra]
