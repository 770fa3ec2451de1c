"""Issue Markdown: a correct GitHub table, the sections a maintainer needs, and the size cap."""

from __future__ import annotations

import copy
import json
import os
import re
import subprocess
import sys
from html.parser import HTMLParser

import markdown
import pytest
from conftest import ROOT

from repro.errors import UsageError
from repro.publish.headline import headline
from repro.publish.issue_md import GITHUB_BODY_LIMIT, format_issue_md, format_table
from repro.publish.issue_sections import format_environment
from repro.readmodel import as_report
from repro.readmodel.rerun import reproduce_argv
from repro.record.report import CLAIM_LINE

SAMPLE = ROOT / "tests" / "data" / "kit-sample-report.json"


def load_sample() -> dict:
    return json.loads(SAMPLE.read_text(encoding="utf-8"))


class TableParser(HTMLParser):
    """The cells of every <table>, row by row, as text."""

    def __init__(self):
        super().__init__()
        self.tables, self._cell = [], None

    def handle_starttag(self, tag, attrs):
        if tag == "table":
            self.tables.append([])
        elif tag == "tr":
            self.tables[-1].append([])
        elif tag in ("td", "th"):
            self._cell = ""

    def handle_endtag(self, tag):
        if tag in ("td", "th"):
            self.tables[-1][-1].append(self._cell.strip())
            self._cell = None

    def handle_data(self, data):
        if self._cell is not None:
            self._cell += data


def html_tables(md_text: str) -> list[list[list[str]]]:
    """The tables as GitHub renders the body: Markdown inside <details> (blank lines around it) is Markdown there,
    which Python-Markdown leaves as raw HTML, so the folding lines are left out before rendering."""
    unfolded = re.sub(r"^<details><summary>.*?</summary>$|^</details>$", "", md_text, flags=re.MULTILINE)
    parser = TableParser()
    parser.feed(markdown.markdown(unfolded, extensions=["tables"]))
    return parser.tables


def test_markdown_renders_the_verdict_table():
    body = format_issue_md(load_sample())
    tables = html_tables(body)
    assert len(tables) == 1
    header, *rows = tables[0]
    assert header == ["arm", "probe", "tokens", "cached", "verdict", "first diffs"]
    assert len(rows) == 12  # three arms × four probes; the passing baseline is not a row
    assert all(len(r) == 6 for r in rows)
    planted = "PlantedFault (PlantedFaultConnector)"
    assert [planted, "fixture", "1502", "0→1488×3", "FAIL", "@9 (decisive ×3, gap 0.682 nats)"] in rows
    assert [planted, "chat-513", "513", "0→512", "FAIL", "@2 (decisive, gap 7.606 nats)"] in rows
    assert ["native prefix caching", "fixture", "1502", "0→1488×3", "PASS", ""] in rows
    assert ["ExampleConnector", "chat-513", "", "—", "SKIPPED", ""] in rows


def test_title_is_the_headline_and_the_sections_come_in_the_maintainers_order():
    report = load_sample()
    body = format_issue_md(report)
    assert body.startswith(f"### {headline(report)}\n") and body.startswith("### Planted-fault self-test (vLLM 0.28.0")
    order = ["#### Expected vs actual", "#### How to reproduce", "#### Environment", "<details><summary>Evidence"]
    assert [body.index(h) for h in order] == sorted(body.index(h) for h in order)
    assert body.index("</details>") < body.index(f"`{CLAIM_LINE}`")
    # the commit as every view shows it (commit_label): a probe's failure is spelled out, not "unknown commit"
    assert "(kit commit `unavailable: git exited 128 (dirty: unknown)`)" in body
    report["provenance"]["kit"] = {"commit": "0123456789abcdef0123456789abcdef01234567", "dirty": True}
    assert "(kit commit `0123456789ab+dirty`)" in format_issue_md(report)


def test_expected_vs_actual_shows_both_answers_at_the_first_divergence():
    part = format_issue_md(load_sample()).split("#### Expected vs actual\n\n", 1)[1].split("\n\n####", 1)[0]
    lines = part.split("```text\n", 1)[1].split("\n```", 1)[0].splitlines()
    facts = {k.strip(): v for k, v in (line.split(" : ", 1) for line in lines)}
    assert facts["probe"].startswith("fixture (1502 prompt tokens), greedy")
    assert facts["first divergence: token 9"] == "expected id 152, actual id 228"
    assert facts["expected token ids"] == "… 61 123 311 219 [152] 229 43 73 285 …"  # four either side
    assert facts["actual token ids"].startswith("… 61 123 311 219 [228] ")
    actual = next(k for k in facts if k.startswith("actual (PlantedFault, reuse 1, 1488 cached)"))
    assert facts["expected (caching off)"].startswith('"') and facts[actual].startswith('"')  # the decoded answers
    assert "no text per token" in part


def test_how_to_reproduce_is_one_command_each_flag_once_no_machine_path():
    argv = ["--model", "/tmp/models/a", "--dtype", "float16", "--compare-native", "--model", "/tmp/models/b",
            "--report", "/tmp/out/r.json", "--python", "/opt/venv/bin/python", "--fixture", "fixtures/x.json",
            "--lmcache-config=/home/me/l.yaml", "--quiet"]  # fmt: skip
    assert reproduce_argv(argv) == [
        "--dtype", "float16", "--compare-native", "--model", "MODEL_DIR", "--report", "reports/r.json",
        "--fixture", "fixtures/x.json", "--lmcache-config", "…/l.yaml", "--quiet",
    ]  # fmt: skip
    report = load_sample()
    report["provenance"]["argv"] = argv
    part = format_issue_md(report).split("#### How to reproduce\n\n", 1)[1].split("\n\n####", 1)[0]
    cmd = part.split("```sh\n", 1)[1].split("\n```", 1)[0]
    assert cmd.count("--model") == 1 and "/tmp" not in cmd and "/opt" not in cmd and "\n" not in cmd
    assert "`MODEL_DIR`: tiny (sha256 of its files" in part and "repro_min.py MODEL_DIR" in part


def test_the_environment_is_in_collect_envs_shape_with_the_lmcache_yaml():
    report = as_report(load_sample())
    text = format_environment(report, lmcache_yaml="chunk_size: 256\n")
    for line in ("         vLLM Info", "vLLM Version                 : 0.28.0", "PyTorch version              : 2.13.0+cpu",
                 "GPU models and configuration : none (CPU)", "Model                        : tiny"):  # fmt: skip
        assert line in text
    assert '- **ExampleConnector**: `{"kv_connector": "ExampleConnector"' in text
    if report.provenance.get("lmcache_config"):
        assert "```yaml\nchunk_size: 256\n```" in text


def test_sections_a_maintainer_needs():
    body = format_issue_md(load_sample())
    assert body.rstrip().endswith(f"`{CLAIM_LINE}`")
    assert "vllm 0.28.0" in body and "torch 2.13.0+cpu" in body  # stack versions
    assert "CPU Intel(R) Xeon(R) Processor" in body and "cpu_count 2" in body  # hardware
    assert "python -m repro.verify_kv_reuse --model MODEL_DIR" in body  # reproduce command
    assert "first diff @9" in body and "baseline margin 0.682 nats" in body and "reuse margin 5.998" in body
    assert "`210 192 179 249 231 61 123 311 219 152 229 43 73 285 250 130`" in body  # baseline tokens
    assert "In connector.start_load_kv, but the attn_metadata is None" in body and "ExampleConnector ×8" in body
    assert "acceptance.matched = true" in body


def test_double_unpin_count_is_a_warning():
    report = load_sample()
    planted = next(a for a in report["arms"] if a["name"] == "PlantedFault")
    planted["lmcache"] = {"double_unpin": 7, "hits": 3, "nested": {"ignored": 1}}
    body = format_issue_md(report)
    assert "- PlantedFault (PlantedFaultConnector) · LMCache double_unpin: 7" in body
    assert body.index("double_unpin") < body.index("LMCache hits: 3")


def test_pipes_cannot_break_the_table():
    report = load_sample()
    report["arms"][1]["probes"][0]["name"] = "a|b"
    _header, *rows = html_tables(format_table(report))[0]
    assert rows[0][:2] == ["ExampleConnector", "a|b"] and len(rows[0]) == 6


def huge_report() -> dict:
    report = load_sample()
    planted = next(a for a in report["arms"] if a["name"] == "PlantedFault")
    long_ids = list(range(5000))
    for p in planted["probes"]:
        for r in p["requests"][1:]:
            r["token_ids"] = long_ids
    planted["probes"] = [copy.deepcopy(p) | {"name": f"{p['name']}-{i}"} for i in range(30) for p in planted["probes"]]
    return report


def test_token_lists_shrink_to_fit_with_a_note():
    body = format_issue_md(huge_report())
    assert len(body) <= GITHUB_BODY_LIMIT
    assert "truncated to fit" in body or "left out to fit" in body
    assert body.rstrip().endswith(f"`{CLAIM_LINE}`")
    assert html_tables(body)[0][0][0] == "arm"


def test_hard_cap_closes_code_and_keeps_the_claim_line():
    report = huge_report()
    report["provenance"]["argv"] = ["--x"] * 40000  # a reproduce command alone over the limit
    body = format_issue_md(report, limit=20_000)
    assert len(body) <= 20_000
    assert "truncated to fit GitHub's 65536-character limit" in body
    assert body.count("```") % 2 == 0
    assert body.rstrip().endswith(f"`{CLAIM_LINE}`")


def test_cli_writes_the_file(tmp_path):
    from repro.publish.issue_md import main

    out = tmp_path / "issue.md"
    assert main([str(SAMPLE), "--out", str(out)]) == 0
    assert out.read_text(encoding="utf-8") == format_issue_md(load_sample())
    with pytest.raises(UsageError, match="cannot read"):
        main([str(tmp_path / "missing.json")])


def test_a_second_issue_in_a_folder_replaces_nothing_the_first_wrote(tmp_path):
    """issue 55 D13: repro_min.py and its inputs have fixed names beside the issue text, so a second issue written into
    the folder is refused (one line, exit 2) before anything is written; --force replaces, as asked."""
    from repro.publish.issue_md import main

    first = tmp_path / "issue.md"
    assert main([str(SAMPLE), "--out", str(first)]) == 0
    written = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    assert {"issue.md", "repro_min.py"} <= set(written)  # and repro_min.json, its inputs (issue 55 D5)
    second = ["--arm", "native", "--out", str(tmp_path / "issue-2.md")]
    with pytest.raises(UsageError, match=r"repro_min\.(py|json) exists .*nothing was written.*--force"):
        main([str(SAMPLE), *second])
    with pytest.raises(UsageError, match=r"issue\.md exists"):  # the issue text alone is not replaced either
        main([str(SAMPLE), "--out", str(first), "--repro-min", str(tmp_path / "elsewhere" / "repro_min.py")])
    proc = run_repro("issue-md", str(SAMPLE), "--repro-min", str(tmp_path / "repro_min.py"))
    assert proc.returncode == 2 and len(proc.stderr.splitlines()) == 1 and "exists" in proc.stderr, proc.stderr
    assert proc.stdout == ""  # not even the body on stdout: refused before anything
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == written
    assert main([str(SAMPLE), *second, "--force"]) == 0
    assert json.loads((tmp_path / "repro_min.json").read_text(encoding="utf-8"))["arm"] == "native"


def run_repro(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p))
    cmd = [sys.executable, "-m", "repro", *args]
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False)


@pytest.mark.parametrize(
    "args",
    [
        ("issue-md",),  # the report argument is missing
        ("issue-md", "tests/data/no-such-report.json"),
        ("site", "--bogus"),
        ("site", "--reports", "tests/data/no-such-dir"),
    ],
)
def test_bad_usage_is_one_line_and_exit_2(args, tmp_path):
    proc = run_repro(*args, *(["--out", str(tmp_path / "out")] if args[0] == "site" else []))
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout == ""
    assert len(proc.stderr.splitlines()) == 1 and proc.stderr.startswith("error: "), proc.stderr
    assert not (tmp_path / "out").exists()


# ---- What maintainers ask for ----------------------------------------------------------------------


def _section(body: str) -> list[str]:
    part = body.split("#### What maintainers ask for\n\n", 1)[1].split("\n\n####", 1)[0]
    return part.splitlines()


def test_an_old_report_says_not_recorded_for_what_it_lacks():
    lines = _section(format_issue_md(load_sample()))
    assert lines == [
        "- **Attention backend**: not recorded",
        "- **GPU compute capability**: not recorded",
        "- **LMCache wheel**: no LMCache arm in this report",
        "- **PYTHONHASHSEED**: set to 0 for every engine process; as they saw it: not recorded",
        "- **LMCache config**: no LMCache arm in this report",
        "- **Shape-matched native**: not recorded (no `native-matched` arm in this report)",
        "- **Batch-invariant kernels**: not recorded (the report predates `--batch-invariant`)",
        "- **LMCache multi-process connector**: not recorded (no `LMCacheMPConnector` arm in this report)",
    ]


def _worker(pid, capability="9.0", backend="FLASH_ATTN", seed="0"):
    return {
        "pid": pid,
        "pythonhashseed": seed,
        "platform": "cuda",
        "compute_capability": capability,
        "batch_invariant": {"env": True, "mode": True},
        "attention_backends": [{"name": backend, "supports_batch_invariance": True}],
        "problems": [],
    }


def maintainer_report() -> dict:
    """The sample with what a GPU run records: worker facts, an LMCache arm, native-matched, the MP arm."""
    report = load_sample()
    report["config"]["batch_invariant"] = True
    report["provenance"]["engine_versions"].update(gpus=["NVIDIA H200"], torch="2.11.0+cu130")
    report["provenance"]["lmcache_config"] = {"path": "fixtures/lmcache-local-cpu.yaml", "sha256": "a75dabb2b2936d53"}
    _base, example, planted, native = report["arms"]
    for i, arm in enumerate(report["arms"]):
        arm["effective_config"].update(
            pythonhashseed="0",
            workers=[_worker(100 + i)],
            batch_invariant={"requested": True, "active": True, "reasons": []},
        )
    planted["effective_config"]["batch_invariant"] = {
        "requested": True,
        "active": False,
        "reasons": ["worker pid 102: vLLM's batch-invariant mode is off"],
    }
    example["connector"]["name"] = example["name"] = "LMCacheConnectorV1"
    example["versions"] = {
        "lmcache_build": {
            "version": "0.5.4",
            "torch_build": "not recorded in the wheel",
            "cuda_runtime": ["libcudart.so.13"],
            "nvcc": "13.0.88",
            "cuda_ops": "not loaded: ImportError: undefined symbol: _ZN3c10",
        }
    }
    example["lmcache"] = {
        "cuda_ops": "not loaded: fell back to torch ops",
        "effective_config": "{'chunk_size': 256, 'local_cpu': True, 'save_unfull_chunk': False, 'x': '`'}",
    }
    mp = copy.deepcopy(example)
    mp["name"] = mp["connector"]["name"] = "LMCacheMPConnector"
    mp["effective_config"]["workers"] = [_worker(105, seed="1")]
    mp["versions"] = {}
    matched = copy.deepcopy(native)
    matched.update(name="native-matched", matched_to="LMCacheConnectorV1")
    matched["effective_config"]["workers"] = [_worker(106)]
    report["arms"] += [mp, matched]
    return report


def test_what_maintainers_ask_for_from_a_gpu_report():
    lines = _section(format_issue_md(maintainer_report()))
    text = "\n".join(lines)
    assert lines[0] == "- **Attention backend**: FLASH_ATTN (every arm)"
    assert lines[1] == "- **GPU compute capability**: 9.0 (every arm) (NVIDIA H200)"
    assert lines[2].startswith("- **LMCache wheel**: 0.5.4 · CUDA build: libcudart.so.13, nvcc 13.0.88 · ")
    assert "torch build: not recorded in the wheel (the engine ran torch 2.11.0+cu130)" in lines[2]
    assert "compiled ops: not loaded: ImportError: undefined symbol" in lines[2]
    assert "LMCache's log: not loaded: fell back to torch ops" in lines[2]
    # one process saw another hash seed: every arm is listed
    assert "PlantedFault (PlantedFaultConnector): 0 in the engine child and its workers" in lines[3]
    assert "LMCacheMPConnector: engine child 0, workers 1" in lines[3]
    assert "- **LMCache config**: `fixtures/lmcache-local-cpu.yaml` (sha256 a75dabb2b293…)" in text
    assert "as LMCache logged it (LMCacheConnectorV1): `chunk_size 256, local_cpu True, save_unfull_chunk False" in text
    assert "- **Shape-matched native**: **native prefix caching, matched to LMCacheConnectorV1**: PASS · KV" in text
    assert "- **Batch-invariant kernels** (`--batch-invariant`): baseline: active; " in text
    assert (
        "PlantedFault (PlantedFaultConnector): **not active** (worker pid 102: vLLM's batch-invariant mode is off)"
        in text
    )
    assert "- **LMCache multi-process connector**: **LMCacheMPConnector**: PASS" in text
    assert "upstream says LMCache #4463 does not affect" in text


def test_batch_invariance_off_and_a_report_without_worker_facts_in_one_arm():
    report = maintainer_report()
    report["config"]["batch_invariant"] = False
    del report["arms"][0]["effective_config"]["workers"]
    lines = _section(format_issue_md(report))
    assert lines[0].startswith("- **Attention backend**: baseline: not recorded; LMCacheConnectorV1: FLASH_ATTN")
    assert any(line.startswith("- **Batch-invariant kernels**: off for this run") for line in lines)


def test_engines_on_the_cpu_have_no_compute_capability():
    report = maintainer_report()
    for arm in report["arms"]:
        arm["effective_config"]["workers"] = [dict(_worker(1, capability=None), platform="cpu")]
    assert "- **GPU compute capability**: none (cpu) (every arm) (NVIDIA H200)" in _section(format_issue_md(report))


def test_expected_vs_actual_points_at_the_scenarios_when_only_they_found_something():
    """A run whose plain probes all matched but whose scenario runs FAILed or died (the H200 production-load report:
    OffloadingConnector's engine died, two arms FAILed) must not read 'No reuse differed'; one without scenario
    findings reads as before."""
    from repro.publish.issue_sections import format_expected_actual

    data = json.loads((ROOT / "reports" / "offloading" / "load-offloading-tiny-bi.json").read_text(encoding="utf-8"))
    text = format_expected_actual(as_report(data))
    assert text.startswith("No plain probe's reuse differed") and "under Scenarios below" in text
    for sc in data["scenarios"]:
        for arm in sc["arms"]:
            arm["verdict"] = "PASS"
    assert format_expected_actual(as_report(data)) == "No reuse differed from caching off."
