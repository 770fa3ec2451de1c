"""What the terminal says is what the page says: the verifier's summary leads with the headline sentence the site and
the kit lead with, a planted fault caught as the fixture expects says so in words on its arm's line (read from the
acceptance record, never from the arm's name), `repro pd` leads with a headline through the one exit rule, and a
model command prints its digest with a label. Engine-free: committed reports and copies of them."""

from __future__ import annotations

import json

import pytest
from conftest import ROOT

from repro.disagg.report import exit_view, summary_lines
from repro.models.tiny import MODEL_SEED, digest_dir, digest_line, main, model_main
from repro.publish.headline import headline
from repro.publish.summary import AS_EXPECTED, format_summary
from repro.record.exit_rule import exit_reason

SELFTEST = ROOT / "reports" / "versions" / "cpu-vllm-0.28.0-selftest.json"
SCENARIOS = ROOT / "tests" / "data" / "scenarios-test-input.json"
PD = ROOT / "reports" / "pd" / "h200-pd-tiny-v026.json"
PLANTED = "PlantedFault (PlantedFaultConnector): FAIL (decisive: 6)"
CAUGHT = " — the planted fault (zero_blocks) caught, as the fixture expects"
TINY_SHA256 = "1102c467e75981ffaa7d8264a5e68ab6ebd537394e3b87bbf3c72ce5af2b38f6"  # fixtures/selftest-cpu.json's


def _selftest() -> dict:
    return json.loads(SELFTEST.read_text(encoding="utf-8"))


def _arm_line(text: str, title: str) -> str:
    return next(line for line in text.splitlines() if line.startswith(f"{title}: "))


# --- the verifier's summary ---------------------------------------------------------------------------------------


def test_the_selftest_summary_leads_with_the_headline_and_names_the_planted_fault_caught():
    report = _selftest()
    lines = format_summary(report).splitlines()
    assert lines[0] == headline(report) and lines[0].startswith("Planted-fault self-test (vLLM 0.28.0, ")
    assert "PlantedFault (planted fault: zero_blocks) answered differently" in lines[0]
    # then the hardware line and the exit line, as before
    assert lines[1] == "CPU AMD EPYC · 55f0d6e989d6 · 2026-12-05"
    assert lines[2].startswith("# 50 generations · acceptance.matched = true · exit 0: ")
    planted = _arm_line("\n".join(lines), "PlantedFault (PlantedFaultConnector)")
    assert planted == f"{PLANTED} · deterministic: reproduced when re-run alone{CAUGHT}"
    # the arms that PASS, the planted connector without a fault among them, say nothing of the kind
    assert [line for line in lines if AS_EXPECTED in line] == [planted]


def _unexpected_fail(report: dict) -> None:
    """The fixture expected the planted arm's fixture probe to PASS: its FAIL is not as the fixture states."""
    check = next(c for c in report["acceptance"]["checked"] if (c["arm"], c["probe"], c["check"]) == (
        "PlantedFault", "fixture", "tokens"))  # fmt: skip
    check.update(expected="PASS", ok=False)
    report["acceptance"]["matched"] = False


def _unstated_fail(report: dict) -> None:
    """A matched acceptance that holds no check of one of the arm's FAILs (the fixture states nothing for it)."""
    report["acceptance"]["checked"] = [
        c for c in report["acceptance"]["checked"] if (c["arm"], c["probe"]) != ("PlantedFault", "chat-513")
    ]


def _unstated_kv(report: dict) -> None:
    """The tokens' FAILs are stated, but a KV finding of the arm is not."""
    report["acceptance"]["checked"] = [
        c for c in report["acceptance"]["checked"]
        if (c["arm"], c["probe"], c["check"]) != ("PlantedFault", "fixture", "kv")
    ]  # fmt: skip


def _not_planted(report: dict) -> None:
    """The same arm name and expectations, but its connector is not the planted-fault one."""
    arm = next(a for a in report["arms"] if a["name"] == "PlantedFault")
    arm["connector"]["name"] = "ExampleConnector"


@pytest.mark.parametrize("edit", [_unexpected_fail, _unstated_fail, _unstated_kv, _not_planted])
def test_a_fail_the_fixture_does_not_expect_never_reads_as_expected(edit):
    report = _selftest()
    edit(report)
    text = format_summary(report)
    assert AS_EXPECTED not in text, [line for line in text.splitlines() if line.startswith("PlantedFault (")]
    assert text.splitlines()[0] == headline(report)


def test_the_words_come_from_the_acceptance_record_not_the_arm_name():
    """An arm named anything else, planting the same fault with the same expectations, is said to be caught."""
    report = _selftest()
    arm = next(a for a in report["arms"] if a["name"] == "PlantedFault")
    arm["name"] = "Mystery"
    for c in report["acceptance"]["checked"]:
        c["arm"] = "Mystery" if c["arm"] == "PlantedFault" else c["arm"]
    line = _arm_line(format_summary(report), "Mystery (PlantedFaultConnector)")
    assert line.endswith(CAUGHT), line


def test_a_scenario_run_of_a_planted_fault_says_so_only_where_every_finding_is_stated():
    report = json.loads(SCENARIOS.read_text(encoding="utf-8"))
    scenarios = report["acceptance"]["scenarios"]
    before = [line for line in format_summary(report).splitlines() if line.startswith("  a-b-a · PlantedFault: ")]
    assert before and AS_EXPECTED not in before[0]  # the scenarios' acceptance did not match
    checked = [
        {"check": "tokens", "arm": "PlantedFault", "scenario": s, "expected": "FAIL", "observed": "FAIL", "ok": True}
        for s in ("a-b-a", "in-flight")
    ]
    checked.append({"check": "kv", "arm": "PlantedFault", "scenario": "a-b-a", "expected": "CORRUPT",
                    "observed": "CORRUPT", "ok": True})  # fmt: skip
    scenarios.update(matched=True, checked=checked, unchecked=[])
    lines = format_summary(report).splitlines()
    aba = next(line for line in lines if line.startswith("  a-b-a · PlantedFault: "))
    flight = next(line for line in lines if line.startswith("  in-flight · PlantedFault: "))
    assert aba.endswith(CAUGHT), aba
    assert "KV CORRUPT" in flight and AS_EXPECTED not in flight  # its KV finding is stated nowhere


def test_every_summary_line_stays_within_its_limit_with_a_long_headline():
    """A headline over LINE_CHARS wraps (never cut) and still leads."""
    report = json.loads(SCENARIOS.read_text(encoding="utf-8"))
    lines = format_summary(report).splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("# "))
    assert len(headline(report)) > 400 and at > 2  # the headline took more than one line, the hardware line after it
    assert " ".join(x.strip() for x in lines[: at - 1]) == headline(report)
    assert all(len(line) <= 400 for line in lines[:at])


# --- repro pd -----------------------------------------------------------------------------------------------------


def test_the_pd_summary_leads_with_a_headline_through_the_one_exit_rule():
    report = json.loads(PD.read_text(encoding="utf-8"))
    code, why = exit_reason(exit_view(report))
    head, arm, *_ = summary_lines(report)
    assert (code, why.split(": ")[0]) == (1, "acceptance not matched")
    assert head == (
        "P→D (NixlConnector, NIXL 1.2.0, vLLM 0.26.0, NVIDIA H200, kvkit-tiny-qwen3-seed6): matched caching off token "
        "for token on 21 of 21 probe requests; negative controls held 3 of 6; exit 1: acceptance not matched"
    )
    assert arm.startswith("P→D (NixlConnector): tokens PASS, exit 1: ")
    assert "/tmp/" not in head  # the model by its folder's name, never a machine path


def test_a_pd_probe_request_that_differs_is_named_in_the_headline():
    report = json.loads(PD.read_text(encoding="utf-8"))
    probe = next(r for r in report["requests"] if r["control"] is None and r["reference"] is not None)
    probe.update(verdict="FAIL", kv_audit={"verdict": "FOREIGN", "reason": "", "shape": ""})
    head = summary_lines(report)[0]
    code, why = exit_reason(exit_view(report))
    assert ": answered differently on 1 of 21 probe requests; loaded foreign KV on 1 of 21; " in head, head
    assert code == 1 and head.endswith(f"; exit 1: {why.split(': ')[0]}"), head


# --- the model's digest -------------------------------------------------------------------------------------------


def test_the_model_digest_is_printed_with_a_label(tmp_path, capsys):
    assert digest_line(".cache/models/kvkit-tiny-qwen3", TINY_SHA256) == (
        f"model kvkit-tiny-qwen3: sha256 of its files {TINY_SHA256}"
    )
    folder = tmp_path / "kvkit-tiny-qwen3"
    assert main([str(folder)]) == 0  # `python -m repro make-model DIR`
    assert capsys.readouterr().out == f"model kvkit-tiny-qwen3: sha256 of its files {TINY_SHA256}\n"
    assert digest_dir(folder) == TINY_SHA256  # the label names the digest the report records
    assert model_main([str(tmp_path / "other")], "make-x", "d", lambda d, seed: f"{seed:064x}", MODEL_SEED) == 0
    assert capsys.readouterr().out == f"model other: sha256 of its files {MODEL_SEED:064x}\n"
