"""Replayed answers, end to end on the real vLLM CPU engine: the planted other_prompt fault serves each
reuse the previous probe's stored KV for its whole loaded prefix. The report names the reuse that
answers as that probe did (`replays fixture's answer from @0, …`), the KV audit independently finds that
probe's blocks in what the reuse read, and the summary, the site and the issue Markdown say so."""

from __future__ import annotations

import json
import re

import pytest
from conftest import have_vllm, run_cli
from e2e_runs import shared_run
from planted_fixtures import REPLAY_ARM, replay_fixture, write_fixture

from repro.judge.replays import MIN_REPLAY_TOKENS
from repro.plan.options import CPU_ENGINE_FLAGS

pytestmark = [pytest.mark.e2e, pytest.mark.skipif(not have_vllm(), reason="vLLM (CPU profile) is not installed")]

AUDIT_SOURCE = re.compile(r"^probe (\S+) block \d+$")


def _replay_run(model: str, tmp) -> tuple:
    fixture = write_fixture(tmp / "fixture-replay.json", replay_fixture())
    report = tmp / "replay.json"
    argv = ["--model", model, *CPU_ENGINE_FLAGS, "--fixture", str(fixture), "--suite", "acceptance",
            "--jobs", "1", "--quiet", "--report", str(report)]  # fmt: skip
    proc = run_cli(argv)
    assert report.exists(), proc.stdout[-2000:] + proc.stderr[-3000:]
    return proc, json.loads(report.read_text()), report


replay_run = shared_run("replay_run", _replay_run, lane=True)  # one arm at a time: made ahead (tests/e2e_runs.py)


@pytest.fixture
def run(replay_run):
    return replay_run


def _arm(data: dict, name: str) -> dict:
    return next(a for a in data["arms"] if a["name"] == name)


def _audit_sources(request: dict) -> set[str]:
    """The probes whose blocks the KV audit found in what this reuse read, from layer 1 on (layer 0's KV
    depends on a token and its position only, so prompts that share a token there share it)."""
    found = set()
    for m in (request.get("kv_audit") or {}).get("matches") or []:
        hit = AUDIT_SOURCE.match(str(m["source"]))
        if hit and m["layer"] > 0:
            found.add(hit.group(1))
    return found


def test_a_reuse_served_another_probes_kv_is_named_as_replaying_its_answer(run):
    proc, data, _ = run
    assert proc.returncode == 1, proc.stderr[-3000:]  # FAILs and CORRUPT KV the fixture does not expect
    arm = _arm(data, REPLAY_ARM)
    probes = {p["name"]: p for p in arm["probes"]}
    # the first probe has no other prompt stored before it: loaded faithfully, nothing to replay
    first = probes["fixture"]
    assert first["verdict"] == "PASS" and first["kv"]["verdict"] == "EXACT"
    assert all(r["replays"] is None for r in first["requests"][1:])
    # chat-511 runs on the fixture probe's stored KV and answers as the fixture probe did
    chat = probes["chat-511"]
    (reuse,) = chat["requests"][1:]
    assert chat["verdict"] == "FAIL" and reuse["cached_tokens"] > 0 and reuse["first_diff"] == 0
    loaded = reuse["cached_tokens"] // 16
    assert reuse["kv_transfer_params"]["planted_fault"]["faulted_blocks"] == list(range(loaded))
    top = reuse["replays"][0]
    assert top["probe"] == "fixture" and top["request"] == "baseline" and top["from"] == 0
    assert top["tokens"] >= MIN_REPLAY_TOKENS
    # the KV audit, which the replay does not read, finds the fixture probe's blocks in that reuse
    assert "fixture" in _audit_sources(reuse)
    line = f"    reuse 1: replays fixture's answer from @0, {top['tokens']} tokens (KV audit: fixture's blocks)"
    assert line in proc.stdout.splitlines()


def test_every_replay_the_report_names_is_in_the_tokens_and_in_the_kv(run):
    """Each named replay re-checked from the report's own token IDs: the run equals the named probe's
    baseline answer at the same indices and differs from the probe's own there; and where the source is
    another probe, the audit found that probe's KV in the reuse (the fault served it)."""
    _, data, _ = run
    baseline = {p["name"]: p["requests"][0]["token_ids"] for p in _arm(data, "baseline")["probes"]}
    named = 0
    for p in _arm(data, REPLAY_ARM)["probes"]:
        own = baseline[p["name"]]
        for r in p["requests"][1:]:
            assert (r["replays"] is None) == (r["first_diff"] is None)
            for rep in r["replays"] or []:
                assert rep["request"] == "baseline"  # one reuse per chat probe; the fixture probe's were clean
                source = baseline[rep["probe"]]
                span = range(rep["from"], rep["from"] + rep["tokens"])
                assert all(r["token_ids"][k] == source[k] != own[k] for k in span), (p["name"], rep)
                assert rep["probe"] in _audit_sources(r), (p["name"], rep)
                named += 1
    assert named >= 1


def test_the_site_and_the_issue_markdown_show_the_replay(run, tmp_path):
    from repro.publish.issue_md import format_issue_md
    from repro.publish.site import render_site

    _, data, report = run
    reports = tmp_path / "reports"
    reports.mkdir()
    (reports / "replay.json").write_text(report.read_text())
    render_site(reports, tmp_path / "site")
    page = (tmp_path / "site" / "replay.html").read_text()
    assert "reuse 1: replays fixture&#39;s answer from @0" in page and 'class="diff replay"' in page
    markdown = format_issue_md(data)
    assert "**replays fixture's answer from @0" in markdown and "_Replays: a replay is a run of at least 4" in markdown


def test_an_answer_that_shares_most_tokens_with_the_probes_own_is_not_named(run):
    """chat-512 runs on chat-511's stored KV and answers exactly as chat-511 did, but the two baseline answers
    share their first 13 tokens: only 3 indices differ from chat-512's own answer, under the threshold. What
    the rule cannot see, said in docs/verdicts.md."""
    _, data, _ = run
    baseline = {p["name"]: p["requests"][0]["token_ids"] for p in _arm(data, "baseline")["probes"]}
    (reuse,) = next(p for p in _arm(data, REPLAY_ARM)["probes"] if p["name"] == "chat-512")["requests"][1:]
    assert "chat-511" in _audit_sources(reuse)
    assert reuse["token_ids"] == baseline["chat-511"] and reuse["first_diff"] is not None
    evidence = [k for k, t in enumerate(reuse["token_ids"]) if t != baseline["chat-512"][k]]
    assert len(evidence) < MIN_REPLAY_TOKENS and reuse["replays"] == []
