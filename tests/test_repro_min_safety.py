"""Nothing in a report runs as code in repro_min.py (issue 55, D5 of review-2026-12-05): the script is the same bytes
for every report and reads a JSON sidecar that it checks strictly before anything runs; a report's strings (an arm
name, its file name, a max_tokens) stay data; only the kit's own LMCache YAML, by relative path and recorded SHA-256,
is inlined; an image probe is refused, not reproduced without its image. Engine-free: the script is run only as far
as its check of the inputs (a refusal exits 2 before vLLM is imported)."""

from __future__ import annotations

import copy
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from kvkit_testutil import ROOT

from repro.errors import UsageError
from repro.publish.issue_md import main as issue_md
from repro.publish.repro_min import SCRIPT, make_repro_min, script_check

SAMPLE = ROOT / "tests" / "data" / "kit-sample-report.json"
MARK = "PWNED"  # the file the injected code would touch in the folder the script runs from
TOUCH = f'__import__("pathlib").Path("{MARK}").touch()'


def sample() -> dict:
    return json.loads(SAMPLE.read_text(encoding="utf-8"))


def run_script(folder: Path, *args: str) -> subprocess.CompletedProcess:
    """`python repro_min.py ARGS` from folder, with no kit on the path (as a maintainer runs it)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    cmd = [sys.executable, "-I", str(folder / "repro_min.py"), *args]
    return subprocess.run(cmd, cwd=folder, env=env, capture_output=True, text=True, timeout=60, check=False)


def write_issue(report: dict, folder: Path, name: str = "report.json") -> Path:
    """issue-md on report (saved as folder/name) with --out folder/issue/issue.md; the issue folder."""
    src = folder / name
    src.write_text(json.dumps(report), encoding="utf-8")
    out = folder / "issue"
    out.mkdir()
    assert issue_md([str(src), "--out", str(out / "issue.md")]) == 0
    return out


def _renamed_arm(report: dict) -> dict:
    for arm in report["arms"]:
        if arm["name"] == "PlantedFault":
            arm["name"] = f'x"""; {TOUCH}; """'
    return report


def _max_tokens_as_code(report: dict) -> dict:
    report["config"]["max_tokens"] = f"16; {TOUCH}"
    return report


@pytest.mark.parametrize(
    ("crafted", "file_name"),
    [
        (_renamed_arm, "report.json"),
        (_max_tokens_as_code, "report.json"),
        (lambda r: r, f'r"""; {TOUCH}; """.json'),  # the report's own file name
    ],
    ids=["arm-name", "max-tokens", "report-file-name"],
)
def test_a_report_string_never_runs_as_code(tmp_path, crafted, file_name):
    out = write_issue(crafted(sample()), tmp_path, file_name)
    script = out / "repro_min.py"
    if script.exists():  # written: run as a maintainer would, without MODEL_DIR (the usage line, and nothing else)
        proc = run_script(out)
        assert not (out / MARK).exists(), "a report string ran as code"
        assert proc.returncode == 2 and "usage:" in proc.stderr, proc.stderr
        assert script.read_text(encoding="utf-8") == SCRIPT  # the fixed script: the strings are in its inputs, as data
    assert not (out / MARK).exists() and not (tmp_path / MARK).exists()


def test_the_script_is_the_same_bytes_for_every_report(tmp_path):
    a = make_repro_min(sample(), "PlantedFault", "a.json")
    b = make_repro_min(_renamed_arm(sample()), None, 'x"""y.json')
    c = make_repro_min(sample(), "native", "c.json")
    assert a.script == b.script == c.script == SCRIPT
    assert b.inputs["arm"] == f'x"""; {TOUCH}; """' and b.inputs["report"] == 'x"""y.json'  # data, read as data
    assert "PlantedFault" not in SCRIPT and "fixture" not in SCRIPT and "import repro" not in SCRIPT


def test_a_string_max_tokens_is_refused_by_the_scripts_own_check():
    with pytest.raises(UsageError, match="max_tokens: not an integer"):
        make_repro_min(_max_tokens_as_code(sample()))


# ---- the LMCache YAML: only the kit's own file, by relative path and recorded SHA-256 ----------------------------


def _lmcache_report(path: str, sha: str) -> dict:
    """The sample report with its PlantedFault arm made an LMCache arm whose YAML the report records at path."""
    report = sample()
    for arm in report["arms"]:
        if arm["name"] == "PlantedFault":
            arm["connector"] = {"name": "LMCacheConnectorV1", "extra_config": {}, "module_path": None}
    report["config"]["lmcache_config"] = path
    report["provenance"]["lmcache_config"] = {"path": path, "sha256": sha}
    return report


@pytest.fixture
def kit(tmp_path) -> tuple[Path, Path, str]:
    """A kit root with fixtures/l.yaml, and a file of the machine outside it: (root, the secret file, its SHA-256)."""
    root = tmp_path / "kit"
    (root / "fixtures").mkdir(parents=True)
    (root / "fixtures" / "l.yaml").write_text("chunk_size: 256\n", encoding="utf-8")
    secret = tmp_path / "secret.yaml"
    secret.write_text("api_key: SECRET-of-this-machine\n", encoding="utf-8")
    return root, secret, hashlib.sha256(secret.read_bytes()).hexdigest()


def test_a_local_file_the_report_names_is_never_inlined(kit):
    """D5: the report names a file of the machine by absolute path (its SHA-256 recorded as it may be): refused."""
    _, secret, sha = kit
    with pytest.raises(UsageError, match="LMCache YAML is not inlined: .*absolute path"):
        make_repro_min(_lmcache_report(str(secret), sha), "PlantedFault")


def test_a_path_out_of_the_kit_or_a_link_out_of_it_is_refused(kit):
    root, secret, sha = kit
    with pytest.raises(UsageError, match="leads out of the kit"):
        make_repro_min(_lmcache_report("../secret.yaml", sha), "PlantedFault", root=root)
    (root / "fixtures" / "link.yaml").symlink_to(secret)
    with pytest.raises(UsageError, match="leads out of the kit"):
        make_repro_min(_lmcache_report("fixtures/link.yaml", sha), "PlantedFault", root=root)


def test_the_kits_yaml_is_inlined_only_with_the_recorded_sha256(kit):
    root, _, _ = kit
    good = hashlib.sha256(b"chunk_size: 256\n").hexdigest()
    inputs = make_repro_min(_lmcache_report("fixtures/l.yaml", good), "PlantedFault", root=root).inputs
    assert inputs["lmcache_yaml"] == {"path": "fixtures/l.yaml", "sha256": good, "text": "chunk_size: 256\n"}
    with pytest.raises(UsageError, match="not the file the report ran with"):
        make_repro_min(_lmcache_report("fixtures/l.yaml", "0" * 64), "PlantedFault", root=root)
    with pytest.raises(UsageError, match="not in this copy of the kit"):
        make_repro_min(_lmcache_report("fixtures/gone.yaml", good), "PlantedFault", root=root)


# ---- an image probe ---------------------------------------------------------------------------------------------


def test_an_image_probe_is_refused_not_reproduced_without_its_image(tmp_path):
    report = sample()
    report["images"] = {"chat-511": {"seed": 1, "size": [64, 64], "uuid": "b1" * 32, "int16": 1}}
    with pytest.raises(UsageError, match="cannot send the image probe's image; run the kit"):
        make_repro_min(report, "PlantedFault")
    src = tmp_path / "r.json"
    src.write_text(json.dumps(report), encoding="utf-8")
    proc = subprocess.run(
        [sys.executable, "-m", "repro", "issue-md", str(src), "--out", str(tmp_path / "issue.md")],
        cwd=ROOT, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert proc.returncode == 0 and "no repro_min.py: " in proc.stderr and "run the kit" in proc.stderr
    assert not (tmp_path / "repro_min.py").exists() and not (tmp_path / "repro_min.json").exists()


# ---- the script's own check of its inputs -----------------------------------------------------------------------


def _set(path: str, value):
    def change(inputs: dict) -> None:
        *parents, last = path.split(".")
        target = inputs
        for key in parents:
            target = target[int(key)] if isinstance(target, list) else target[key]
        if value is KeyError:
            del target[last]
        else:
            target[last] = value

    return change


BAD_INPUTS = {
    "unknown key": (_set("images", {}), "unknown key"),
    "missing key": (_set("engine.seed", KeyError), "missing key"),
    "another kind": (_set("kind", "kvkit-report"), "kind"),
    "a newer version": (_set("schema_version", 2), "schema_version"),
    "max_tokens as text": (_set("max_tokens", "16"), "max_tokens"),
    "max_tokens as a bool": (_set("max_tokens", True), "max_tokens"),
    "max_tokens out of range": (_set("max_tokens", 0), "max_tokens"),
    "a negative token id": (_set("prompts.0.token_ids", [1, -2]), "token_ids"),
    "a token id as text": (_set("prompts.0.token_ids", [1, "2"]), "token_ids"),
    "an escape in a name": (_set("arm", "x\x1b]2;title\x07"), "arm"),
    "a newline in a name": (_set("prompts.0.name", "a\nb"), "name"),
    "a dtype it does not know": (_set("engine.dtype", "float8; rm"), "dtype"),
    "a module path that is not one": (_set("connector.kv_connector_module_path", "os; import x"), "module_path"),
    "a dotted module path (not a file beside it)": (
        _set("connector.kv_connector_module_path", "repro.engine.connectors.planted_fault"),
        "module_path",
    ),
    "an extra config key": (_set("connector.kv_connector_extra_config", {"a b": 1}), "key"),
    "a nested extra config value": (_set("connector.kv_connector_extra_config", {"a": {"b": 1}}), "extra config"),
    "a role it never runs": (_set("connector.kv_role", "kv_producer"), "kv_role"),
    "a yaml whose sha differs": (
        _set("lmcache_yaml", {"path": "fixtures/l.yaml", "sha256": "0" * 64, "text": "a: 1\n"}),
        "SHA-256",
    ),
}


@pytest.fixture(scope="module")
def good_inputs() -> dict:
    return make_repro_min(sample(), "PlantedFault", "report.json").inputs


@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_the_scripts_check_refuses_in_one_line_with_exit_2(tmp_path, good_inputs, case):
    change, said = BAD_INPUTS[case]
    inputs = copy.deepcopy(good_inputs)
    change(inputs)
    (tmp_path / "repro_min.py").write_text(SCRIPT, encoding="utf-8")
    (tmp_path / "repro_min.json").write_text(json.dumps(inputs), encoding="utf-8")
    proc = run_script(tmp_path, "MODEL_DIR")  # its inputs by default: repro_min.json beside it
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stdout == "" and len(proc.stderr.splitlines()) == 1, proc.stderr
    assert proc.stderr.startswith(f"repro_min.py: {tmp_path / 'repro_min.json'}: refused: ") and said in proc.stderr
    assert "\x1b" not in proc.stderr


def test_the_script_refuses_a_file_that_is_not_its_inputs(tmp_path):
    (tmp_path / "repro_min.py").write_text(SCRIPT, encoding="utf-8")
    (tmp_path / "other.json").write_text('{"max_tokens": NaN}', encoding="utf-8")
    for args, said in (((), "No such file"), (("other.json",), "NaN is not a number")):
        proc = run_script(tmp_path, "MODEL_DIR", *args)
        assert proc.returncode == 2 and len(proc.stderr.splitlines()) == 1 and said in proc.stderr, proc.stderr


def test_what_the_kit_writes_passes_the_scripts_check(good_inputs):
    check, _ = script_check()
    assert check(json.loads(json.dumps(good_inputs))) is not None
    assert good_inputs["kind"] == "kvkit-repro-min-inputs" and good_inputs["schema_version"] == 1
    assert [p["name"] for p in good_inputs["prompts"]] == ["fixture", "chat-511", "chat-512", "chat-513"]
