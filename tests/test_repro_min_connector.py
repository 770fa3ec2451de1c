"""repro_min.py without the kit on the path (F4 of the newcomer note of 2026-12-05: the planted arm's script failed
with `No module named 'repro'` inside vLLM's connector factory, and exited 1, FAIL's code). The planted connector
travels beside the script as one module, planted_fault_connector.py, made from the kit's own planted_gates.py,
planted_failures.py and planted_fault.py with no import of the kit; repro_min.json names it by that plain name; issue-md writes it beside the
script and never over a file already there without --force; an arm whose connector the kit cannot ship gets no
script; and a script that cannot run (no vLLM, the connector missing or not importable, a crash) exits 3, never 1.
Engine-free: the script runs as far as its own checks, or against a stand-in vLLM that fails. Its run on the real
engine, outside the repository, is tests/test_repro_min_e2e.py."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from kvkit_testutil import ROOT, have_vllm

from repro.errors import UsageError
from repro.publish.issue_md import main as issue_md
from repro.publish.repro_min import make_repro_min
from repro.publish.shipped_connector import SHIPPED_MODULE, planted_connector_source

SAMPLE = ROOT / "tests" / "data" / "kit-sample-report.json"  # its PlantedFault arm names the kit's earlier path
CONNECTORS = ROOT / "repro" / "engine" / "connectors"
FUTURE = "from __future__ import annotations\n"
GATES_IMPORT = "from repro.engine.connectors.planted_gates import LoadGates, in_flight_figures\n"
FAILURES = "repro.engine.connectors.planted_failures"
SHIPPED_FILE = f"{SHIPPED_MODULE}.py"


def sample() -> dict:
    return json.loads(SAMPLE.read_text(encoding="utf-8"))


def _top_level(tree: ast.Module) -> dict[str, str]:
    """Each name a module binds at its top level -> the statement that binds it, as source."""
    out = {}
    for node in tree.body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            out |= {(a.asname or a.name).split(".")[0]: ast.unparse(node) for a in node.names}
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            out[node.name] = f"def {node.name}"
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            out |= {n.id: "assign" for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
    return out


def _helper_import(fault: str) -> str:
    """planted_fault.py's import of planted_failures, as it stands in the file (one statement over several lines)."""
    node = next(n for n in ast.parse(fault).body if isinstance(n, ast.ImportFrom) and n.module == FAILURES)
    return "".join(fault.splitlines(keepends=True)[node.lineno - 1 : node.end_lineno])


def test_the_module_is_the_kits_three_files_without_an_import_of_the_kit():
    gates = (CONNECTORS / "planted_gates.py").read_text(encoding="utf-8")
    failures = (CONNECTORS / "planted_failures.py").read_text(encoding="utf-8")
    fault = (CONNECTORS / "planted_fault.py").read_text(encoding="utf-8")
    source = planted_connector_source()
    assert source == planted_connector_source()  # the same bytes each time: the kit's files, nothing of a report
    # every line of the files is there, in order, but the helpers' imports and the later `from __future__` lines
    doc_end = fault.index('"""', 3) + 4
    assert gates.count(FUTURE) == failures.count(FUTURE) == fault.count(FUTURE) == fault.count(GATES_IMPORT) == 1
    body = fault[doc_end:].replace(FUTURE, "").replace(GATES_IMPORT, "").replace(_helper_import(fault), "")
    order = [fault[:doc_end], FUTURE, gates.replace(FUTURE, ""), failures.replace(FUTURE, ""), body]
    assert [source.index(part) for part in order] == sorted(source.index(part) for part in order)
    tree = ast.parse(source)
    compile(source, SHIPPED_FILE, "exec")  # one `from __future__`, first after the docstring
    assert ast.get_docstring(tree) == ast.get_docstring(ast.parse(fault))
    imports = [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))]
    named = {a.name for n in imports if isinstance(n, ast.Import) for a in n.names}
    named |= {n.module for n in imports if isinstance(n, ast.ImportFrom)}
    assert not any(n.split(".")[0] == "repro" for n in named) and not any(getattr(n, "level", 0) for n in imports)
    assert {n.split(".")[0] for n in named} <= set(sys.stdlib_module_names) | {"vllm", "torch"}
    # the modules share no top-level name but by the same import, so each one's code reads what it did
    g, r, f = (_top_level(ast.parse(text)) for text in (gates, failures, fault))
    helpers = {"LoadGates", "in_flight_figures", "ReportedSuccess", "block_range", "stored_layer_count"}
    helpers |= {"FAILURE_FAULTS", "UNWRITTEN_FAULTS"}
    for a, b in ((g, f), (r, f), (g, r)):
        for name in set(a) & set(b) - {"annotations"} - helpers:
            assert a[name].startswith(("import", "from")) and b[name].startswith(("import", "from")), name
            assert name in {x.asname or x.name for x in ast.parse(a[name]).body[0].names}
            assert name in {x.asname or x.name for x in ast.parse(b[name]).body[0].names}
    assert _top_level(tree).keys() == g.keys() | r.keys() | f.keys()


@pytest.mark.skipif(not have_vllm(), reason="vLLM (CPU profile) is not installed")
def test_the_module_imports_where_the_kit_is_not(tmp_path):
    (tmp_path / SHIPPED_FILE).write_text(planted_connector_source(), encoding="utf-8")
    code = (
        "import importlib.util, sys; sys.path.insert(0, '.'); assert importlib.util.find_spec('repro') is None; "
        f"import {SHIPPED_MODULE} as m; print(m.PlantedFaultConnector.__module__, sorted(vars(m.PlantedFaultConnector)))"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run([sys.executable, "-I", "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300, check=False)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    module, names = proc.stdout.strip().splitlines()[-1].split(" ", 1)
    fault = ast.parse((CONNECTORS / "planted_fault.py").read_text(encoding="utf-8"))
    cls = next(n for n in fault.body if isinstance(n, ast.ClassDef) and n.name == "PlantedFaultConnector")
    methods = {n.name for n in cls.body if isinstance(n, ast.FunctionDef)}
    assert module == SHIPPED_MODULE and methods and methods <= set(ast.literal_eval(names))


def test_the_inputs_name_the_module_beside_the_script(tmp_path):
    made = make_repro_min(sample(), "PlantedFault", "report.json")  # its arm: repro.connectors.planted_fault
    assert made.inputs["connector"]["kv_connector_module_path"] == SHIPPED_MODULE
    assert made.connector == planted_connector_source()
    script = tmp_path / "repro_min.py"
    assert [p.name for p, _ in made.files(script)] == ["repro_min.json", SHIPPED_FILE, "repro_min.py"]
    native = make_repro_min(sample(), "native", "report.json")
    assert native.connector is None and [p.name for p, _ in native.files(script)] == ["repro_min.json", "repro_min.py"]
    example = make_repro_min(sample(), "ExampleConnector", "report.json")  # vLLM's own: nothing to ship
    assert example.connector is None and "kv_connector_module_path" not in example.inputs["connector"]


@pytest.mark.parametrize("module", ["repro.engine.connectors.planted_keys", "my_company.kv.connector"])
def test_a_connector_the_kit_cannot_ship_gets_no_script(tmp_path, module):
    report = sample()
    for arm in report["arms"]:
        if arm["name"] == "PlantedFault":
            arm["connector"]["module_path"] = module
    with pytest.raises(UsageError, match=rf"from the module {module}, which repro_min.py cannot ship .*run the kit"):
        make_repro_min(report, "PlantedFault")
    src = tmp_path / "r.json"
    src.write_text(json.dumps(report), encoding="utf-8")
    cmd = [
        sys.executable,
        "-m",
        "repro",
        "issue-md",
        str(src),
        "--arm",
        "PlantedFault",
        "--out",
        str(tmp_path / "i.md"),
    ]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 2 and len(proc.stderr.splitlines()) == 1 and module in proc.stderr, proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.json"]


def test_issue_md_writes_the_module_beside_the_script_and_never_over_one(tmp_path):
    first = tmp_path / "first"
    first.mkdir()
    assert issue_md([str(SAMPLE), "--out", str(first / "issue.md")]) == 0  # the first arm with a finding: planted
    assert (first / SHIPPED_FILE).read_text(encoding="utf-8") == planted_connector_source()
    inputs = json.loads((first / "repro_min.json").read_text(encoding="utf-8"))
    assert inputs["connector"]["kv_connector_module_path"] == SHIPPED_MODULE
    second = tmp_path / "second"
    second.mkdir()
    (second / SHIPPED_FILE).write_text("# another issue's connector\n", encoding="utf-8")
    with pytest.raises(UsageError, match=rf"{SHIPPED_FILE} exists .*nothing was written.*--force"):
        issue_md([str(SAMPLE), "--out", str(second / "issue.md")])
    assert [p.name for p in second.iterdir()] == [SHIPPED_FILE]
    assert issue_md([str(SAMPLE), "--out", str(second / "issue.md"), "--force"]) == 0
    assert (second / SHIPPED_FILE).read_text(encoding="utf-8") == planted_connector_source()
    with pytest.raises(UsageError, match="where repro_min.py or a file beside it goes"):
        issue_md([str(SAMPLE), "--out", str(tmp_path / "third" / SHIPPED_FILE)])


# ---- a script that cannot run exits 3 (no verdict), never 1 (FAIL) ---------------------------------------------

STAND_IN_ENGINES = {  # what the stand-in vLLM's LLM() does: its engine dies as it starts, so no engine is needed
    "dies": "raise RuntimeError('the stand-in engine died')",
    # an engine process that outlives its run and holds the run's stdout open (as an orphaned VLLM::EngineCore did):
    # the script must see the run gone, not wait for the pipe to close
    "leaves-an-engine": (
        "import os, time\n        if os.fork() == 0:\n            time.sleep(300)\n            os._exit(0)\n"
        "        raise RuntimeError('the stand-in engine died and left its engine process')"
    ),
}


def _stand_in_vllm(folder: Path, engine: str) -> str:
    """A vLLM package in folder/stand-in whose LLM() does STAND_IN_ENGINES[engine]; the folder, for PYTHONPATH."""
    (folder / "stand-in" / "vllm").mkdir(parents=True)
    (folder / "stand-in" / "vllm" / "__init__.py").write_text(
        "class SamplingParams:\n    def __init__(self, **kw):\n        pass\n\n\n"
        f"class LLM:\n    def __init__(self, **kw):\n        {STAND_IN_ENGINES[engine]}\n",
        encoding="utf-8",
    )
    (folder / "stand-in" / "vllm" / "config.py").write_text(
        "class KVTransferConfig(dict):\n    def __init__(self, **kw):\n        super().__init__(kw)\n", encoding="utf-8"
    )
    return str(folder / "stand-in")


def _written(tmp_path: Path) -> Path:
    """The planted arm's script, inputs and connector as issue-md writes them, in tmp_path/issue."""
    out = tmp_path / "issue"
    out.mkdir()
    assert issue_md([str(SAMPLE), "--arm", "PlantedFault", "--repro-min", str(out / "repro_min.py")]) == 0
    return out


def _run(folder: Path, *flags: str, pythonpath: str | None = None) -> subprocess.CompletedProcess:
    """`python -I repro_min.py MODEL_DIR` from folder, with no kit on the path; pythonpath reaches its runs only."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV") and not k.startswith("VLLM_")}
    env |= {"PYTHONPATH": pythonpath} if pythonpath else {}
    cmd = [sys.executable, "-I", *flags, str(folder / "repro_min.py"), str(folder / "no-model")]
    return subprocess.run(cmd, cwd=folder, env=env, capture_output=True, text=True, timeout=120, check=False)


def _no_verdict(proc: subprocess.CompletedProcess, said: str) -> None:
    assert proc.returncode == 3, proc.stdout + proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("repro_min.py: no verdict: ") and said in last, proc.stderr


def test_a_missing_connector_or_vllm_is_no_verdict_before_anything_runs(tmp_path):
    out = _written(tmp_path)
    (out / SHIPPED_FILE).unlink()
    proc = _run(out)
    _no_verdict(proc, f"{SHIPPED_FILE}, the connector that comes with this script, is not beside it")
    assert proc.stdout == "" and len(proc.stderr.splitlines()) == 1
    proc = _run(out, "-S")  # no site-packages: no vLLM
    _no_verdict(proc, "vllm is not installed for ")
    assert proc.stdout == "" and len(proc.stderr.splitlines()) == 1


@pytest.mark.parametrize(
    ("connector", "engine", "said"),
    [
        (  # F4, as the run says it
            "import repro.engine.connectors.planted_fault\n",
            "dies",
            "ModuleNotFoundError: No module named 'repro'",
        ),
        (None, "dies", "RuntimeError: the stand-in engine died"),  # a connector that imports; an engine that dies
        (None, "leaves-an-engine", "RuntimeError: the stand-in engine died and left its engine process"),
    ],
    ids=["connector-not-importable", "engine-crash", "engine-left-behind"],
)
def test_a_run_that_fails_is_no_verdict_never_fail(tmp_path, connector, engine, said):
    out = _written(tmp_path)
    (out / SHIPPED_FILE).write_text(connector or "class PlantedFaultConnector:\n    pass\n", encoding="utf-8")
    t0 = time.monotonic()
    proc = _run(out, pythonpath=_stand_in_vllm(tmp_path, engine))
    _no_verdict(proc, f"the off run failed (exit 1): {said}")
    verdicts = [line for line in proc.stdout.splitlines() if line.startswith(("PASS", "FAIL", "INCONCLUSIVE"))]
    assert not verdicts and "Traceback" in proc.stderr  # no verdict; the run's log tail, then the one line
    assert time.monotonic() - t0 < 60  # the process left behind sleeps 300 s: the script did not wait for it


# ---- answers compared as the kit compares them ------------------------------------------------------------------

_ANSWERING_VLLM = """
import os


class SamplingParams:
    def __init__(self, **kw):
        self.max_tokens = kw["max_tokens"]


class _Answer:
    def __init__(self, token_ids, cached):
        self.outputs = [type("Out", (), {"token_ids": token_ids})()]
        self.num_cached_tokens = cached


class LLM:
    def __init__(self, **kw):
        self.reuse = "kv_transfer_config" in kw or kw.get("enable_prefix_caching")

    def generate(self, prompts, sp, use_tqdm=False):
        how = os.environ["STAND_IN_ANSWERS"]
        if how == "short":  # a server or engine that cut the answer: two tokens of max_tokens
            return [_Answer([1, 2], 0)]
        # the run with reuse answers otherwise, and its hit counter is vLLM's -1 ("not checked yet"), no count
        return [_Answer([2 if self.reuse else 1] * sp.max_tokens, -1 if self.reuse else 0)]
"""


@pytest.mark.parametrize(("how", "code", "said"), [("short", 3, "answers not max_tokens long: "), ("minus-one", 2, "")])
def test_an_answer_of_another_length_is_no_verdict_and_a_minus_one_counter_no_hit(tmp_path, how, code, said):
    """As the kit judges: an answer shorter than max_tokens (greedy, ignore_eos) is no answer (exit 3, never two
    cut answers compared), and a reuse whose hit counter is -1 that differs is INCONCLUSIVE (2), never a FAIL (1)."""
    out = _written(tmp_path)
    (out / SHIPPED_FILE).write_text("class PlantedFaultConnector:\n    pass\n", encoding="utf-8")
    stand_in = tmp_path / "stand-in"
    _stand_in_vllm(tmp_path, "dies")
    (stand_in / "vllm" / "__init__.py").write_text(_ANSWERING_VLLM, encoding="utf-8")
    os.environ["STAND_IN_ANSWERS"] = how
    try:
        proc = _run(out, pythonpath=str(stand_in))
    finally:
        del os.environ["STAND_IN_ANSWERS"]
    assert proc.returncode == code, proc.stdout + proc.stderr
    if code == 3:
        _no_verdict(proc, said)
    else:
        assert proc.stdout.strip().splitlines()[-1] == "INCONCLUSIVE", proc.stdout  # the old reading said FAIL
