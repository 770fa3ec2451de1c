"""Replayed answers (repro.judge.replays): the rule over token lists, what judging an arm stores per reuse, the
schema, and how the summary, the site and the issue Markdown say it. The token lists are the tiny
model's own (tests/data/render-selftest.json's baseline answers), so the cases are the ones it meets."""

from __future__ import annotations

import copy
import json

import jsonschema
import pytest
from conftest import ROOT

from repro.contract.result import ArmResult, ProbeResult, RequestResult
from repro.judge.evaluate import judge_arm
from repro.judge.kvaudit import MATCHES_KEPT
from repro.judge.replays import MIN_REPLAY_TOKENS, Replay, find_replays, replay_run
from repro.publish.issue_md import format_issue_md
from repro.publish.site_model import build_report_page
from repro.publish.summary import format_summary
from repro.readmodel import Probe, Request
from repro.readmodel import Replay as ReadReplay
from repro.record.report import ReportInvalid, validate_report

DATA = ROOT / "tests" / "data"
# The CPU self-test's baseline answers (tests/data/render-selftest.json): chat-511 and chat-513 are the
# same answer, chat-512 shares its first 13 tokens, and the fixture's shares "43 73 285" at 11-13.
FIXTURE = [210, 192, 179, 249, 231, 61, 123, 311, 219, 152, 229, 43, 73, 285, 250, 130]
CHAT_511 = [272, 17, 220, 279, 210, 192, 179, 249, 250, 286, 9, 43, 73, 285, 250, 286]
CHAT_512 = [272, 17, 220, 279, 210, 192, 179, 249, 250, 286, 9, 43, 73, 203, 298, 273]
ANSWERS = {"fixture": FIXTURE, "chat-511": CHAT_511, "chat-512": CHAT_512, "chat-513": list(CHAT_511)}


# ---- the rule ----------------------------------------------------------------------------------------


def test_the_threshold_is_the_issues_four_tokens():
    assert MIN_REPLAY_TOKENS == 4


def test_an_answer_replayed_from_the_first_token_is_found_at_its_indices():
    reuse = FIXTURE[:7] + [5] * 9  # the H200 case: another probe's first seven tokens, then something else
    assert replay_run(reuse, CHAT_511, FIXTURE) == (0, 7)
    assert find_replays("chat-511", reuse, CHAT_511, ANSWERS) == (Replay("fixture", "baseline", 0, 7),)


@pytest.mark.parametrize("n, found", [(MIN_REPLAY_TOKENS - 1, None), (MIN_REPLAY_TOKENS, (2, MIN_REPLAY_TOKENS))])
def test_a_run_shorter_than_the_threshold_is_no_replay(n, found):
    reuse = [1, 2] + FIXTURE[2 : 2 + n] + [3] * (14 - n)
    assert replay_run(reuse, CHAT_511, FIXTURE) == found


def test_tokens_the_probes_own_answer_has_there_are_no_evidence():
    """chat-512 running on chat-511's KV answers exactly chat-511's answer (the CPU engine did): 16 tokens
    equal, but 13 of them are chat-512's own answer too. Only 3 say anything: below the threshold."""
    assert replay_run(CHAT_511, CHAT_512, CHAT_511) is None
    assert find_replays("chat-512", CHAT_511, CHAT_512, ANSWERS) == ()


def test_a_run_is_cut_where_the_reuse_agrees_with_its_own_answer():
    reuse = FIXTURE[:11] + CHAT_511[11:]  # FIXTURE and CHAT_511 agree at 11-14: those indices are no evidence
    assert replay_run(reuse, CHAT_511, FIXTURE) == (0, 11)


def test_an_answer_shifted_by_some_tokens_is_not_compared():
    """Aligned only: on a small vocabulary short n-grams recur, so an unaligned match names sources by chance."""
    reuse = [7, 7] + FIXTURE[:14]
    assert replay_run(reuse, CHAT_511, FIXTURE) is None


def test_the_longest_run_of_a_source_and_the_earliest_of_equal_runs():
    reuse = [FIXTURE[0], FIXTURE[1], FIXTURE[2], FIXTURE[3], 0] + FIXTURE[5:9] + [0] + FIXTURE[10:16]
    assert replay_run(reuse, [9] * 16, FIXTURE) == (10, 6)
    assert replay_run(FIXTURE[:4] + [0] + FIXTURE[5:9] + [0] * 7, [9] * 16, FIXTURE) == (0, 4)


def test_a_reuse_longer_than_its_own_answer_counts_the_extra_tokens_as_not_its_own():
    assert replay_run(FIXTURE, CHAT_511[:2], FIXTURE) == (0, 16)


def test_other_probes_come_first_longest_first_and_the_probes_own_answer_is_skipped():
    reuse = CHAT_511[:4] + FIXTURE[4:10] + [0] * 6  # chat-511 and chat-513 (the same answer) at 0-3, fixture at 4-9
    found = find_replays("chat-512", reuse, [9] * 16, {**ANSWERS, "chat-512": reuse})
    assert found == (
        Replay("fixture", "baseline", 4, 6),
        Replay("chat-511", "baseline", 0, 4),
        Replay("chat-513", "baseline", 0, 4),
    )


def test_earlier_requests_of_the_probe_after_other_probes_and_one_finding_for_the_same_run():
    wrong = FIXTURE[:9] + [228, 133, 210, 192, 179, 249, 231]  # the self-test's zero_blocks fixture reuses
    earlier = [("cold", FIXTURE), ("reuse 1", wrong), ("reuse 2", wrong)]
    assert find_replays("fixture", wrong, FIXTURE, ANSWERS, earlier) == (Replay("fixture", "reuse 1", 9, 7),)
    assert find_replays("fixture", wrong, FIXTURE, ANSWERS, earlier[:1]) == ()  # the cold answer is the baseline's


def test_a_replay_as_the_report_stores_it():
    assert Replay("fixture", "baseline", 0, 7).as_dict() == {"probe": "fixture", "request": "baseline", "from": 0,
                                                              "tokens": 7}  # fmt: skip


# ---- judging an arm stores replays per reuse --------------------------------------------------------


def _probe(name: str, outputs: list[list[int]], cached: int = 496) -> ProbeResult:
    reqs = tuple(
        RequestResult(
            role="cold" if i == 0 else "reuse",
            cached_tokens=0 if i == 0 else cached,
            token_ids=tuple(ids),
            logprobs=tuple([[t, -0.1], [t + 1, -2.0]] for t in ids),
            finish_reason="length",
            kv_transfer_params=None,
            text=None,
        )
        for i, ids in enumerate(outputs)
    )
    prompt = tuple(range(len(name), 600))  # the probes' names differ in length: no two share a first block
    return ProbeResult(name=name, prompt_token_ids=prompt, messages=None, requests=reqs)


def _arm(name: str, probes: list[ProbeResult]) -> ArmResult:
    config = {"model": "m", "revision": None, "dtype": "float32", "block_size": 16, "max_model_len": 2048,
              "seed": 0, "enforce_eager": True}  # fmt: skip
    return ArmResult(arm=name, probes=tuple(probes), effective_config=config, versions={}, fixture_sha256="x")


def test_judging_an_arm_stores_what_each_divergent_reuse_replays():
    base = _arm("baseline", [_probe("fixture", [FIXTURE]), _probe("chat-511", [CHAT_511])])
    served = FIXTURE[:6] + [316, 229, 43, 73, 285, 209, 134, 311, 210, 192]  # what the CPU engine answered
    other = _arm(
        "planted", [_probe("fixture", [FIXTURE, FIXTURE], 1488), _probe("chat-511", [CHAT_511, served, served])]
    )
    probes, verdict = judge_arm(other, base, "connector", 16)
    fixture, chat = probes
    assert verdict.verdict == "FAIL"
    assert "replays" not in fixture["requests"][0] and fixture["requests"][1]["replays"] is None  # matched
    assert "replays" not in chat["requests"][0]  # the cold request is no reuse
    assert chat["requests"][1]["replays"] == [{"probe": "fixture", "request": "baseline", "from": 0, "tokens": 6}]
    assert chat["requests"][2]["replays"] == [  # also the same wrong answer as reuse 1
        {"probe": "fixture", "request": "baseline", "from": 0, "tokens": 6},
        {"probe": "chat-511", "request": "reuse 1", "from": 0, "tokens": 16},
    ]


def test_the_baseline_arm_stores_no_replays():
    base = _arm("baseline", [_probe("fixture", [FIXTURE])])
    probes, _ = judge_arm(base, None, "baseline", 16)
    assert all("replays" not in r for r in probes[0]["requests"])


# ---- the schema ---------------------------------------------------------------------------------------


def _request_schema() -> tuple[dict, dict]:
    schema = json.loads((ROOT / "schemas" / "report.schema.json").read_text())
    return schema, {"$defs": schema["$defs"], "$ref": "#/$defs/request"}


@pytest.mark.parametrize(
    "replays, ok",
    [
        (None, True),
        ([], True),
        ([{"probe": "fixture", "request": "baseline", "from": 0, "tokens": 7}], True),
        ([{"probe": "fixture", "request": "baseline", "from": 0, "tokens": 3}], False),  # below the threshold
        ([{"probe": "fixture", "request": "baseline", "from": 0}], False),
        ([{"probe": "fixture", "request": "baseline", "from": 0, "tokens": 7, "extra": 1}], False),
        ("fixture", False),
    ],
)
def test_the_schema_says_what_a_replay_is(replays, ok):
    _, schema = _request_schema()
    request = {"role": "reuse", "cached_tokens": 496, "token_ids": [1, 2], "first_diff": 0, "replays": replays}
    errors = list(jsonschema.Draft202012Validator(schema).iter_errors(request))
    assert (not errors) == ok, errors


# ---- every view ----------------------------------------------------------------------------------------


def _report_with_replays() -> dict:
    """The CPU self-test report (schema 1) with chat-511's planted reuse answering as the fixture probe did
    (the CPU engine's answer under the other_prompt fault) and the replays judging stores for it."""
    report = json.loads((DATA / "render-selftest.json").read_text())
    arm = next(a for a in report["arms"] if a["name"] == "PlantedFault")
    chat = next(p for p in arm["probes"] if p["name"] == "chat-511")
    reuse = chat["requests"][1]
    reuse["token_ids"] = FIXTURE[:6] + [316, 229, 43, 73, 285, 209, 134, 311, 210, 192]
    reuse["first_diff"] = 0
    reuse["replays"] = [r.as_dict() for r in find_replays("chat-511", reuse["token_ids"], CHAT_511, ANSWERS)]
    return report


def test_a_replay_in_words():
    assert ReadReplay.from_json({"probe": "fixture", "request": "baseline", "from": 0, "tokens": 7}).text == (
        "replays fixture's answer from @0, 7 tokens"
    )
    assert ReadReplay.from_json({"probe": "fixture", "request": "reuse 1", "from": 9, "tokens": 7}).text == (
        "repeats its reuse 1's answer from @9, 7 tokens"
    )
    assert ReadReplay.from_json({"probe": "chat-511", "request": "cold", "from": 2, "tokens": 5}).text == (
        "repeats its cold request's answer from @2, 5 tokens"
    )


def test_a_probes_reuses_with_the_same_replay_share_a_line_and_extra_sources_are_counted():
    one = {"probe": "fixture", "request": "baseline", "from": 0, "tokens": 6}
    probe = {
        "requests": [
            {"role": "cold"},
            {"role": "reuse", "replays": [one]},
            {"role": "reuse", "replays": [one]},
            {"role": "reuse", "replays": [one, {"probe": "x", "request": "reuse 1", "from": 0, "tokens": 16}]},
            {"role": "reuse", "replays": None},
        ]
    }
    assert list(Probe.from_json(probe, None).replay_lines()) == [
        "reuses 1, 2: replays fixture's answer from @0, 6 tokens",
        "reuse 3: replays fixture's answer from @0, 6 tokens (+1 more)",
    ]
    assert Probe.from_json({"requests": [{"role": "reuse"}]}, None).replay_lines() == ()  # a report made before replays
    assert Request.from_json(probe["requests"][3]).replay_indices == set(range(16))


def test_a_replay_the_kv_audit_backs_says_so_and_layer_0_matches_do_not_count():
    """Layer 0's K and V depend on a token and its position only: another prompt with the same token at the
    same place has the same bytes there, so only deeper layers show whose KV a reuse read."""
    replay = {"probe": "fixture", "request": "baseline", "from": 0, "tokens": 6}
    shallow = {"source": "probe fixture block 48", "layer": 0, "plane": "K", "block": 0}
    deep = dict(shallow, layer=1)
    request = {"role": "reuse", "replays": [replay], "kv_audit": {"status": "audited", "matches": [shallow]}}
    assert Request.from_json(request).audit_source_probes == ()
    assert (
        Request.from_json(request).replay_text()
        == "replays fixture's answer from @0, 6 tokens (KV audit: not fixture's blocks)"
    )
    request["kv_audit"]["matches"].append(deep)
    assert Request.from_json(request).audit_source_probes == ("fixture",)
    assert (
        Request.from_json(request).replay_text()
        == "replays fixture's answer from @0, 6 tokens (KV audit: fixture's blocks)"
    )
    request["kv_audit"]["matches"] = [dict(deep, source="block 3"), dict(deep, source="zeros")]  # its own, zeros
    assert Request.from_json(request).audit_source_probes == ()
    request["kv_audit"]["matches"] = [dict(shallow, block=b % 93) for b in range(MATCHES_KEPT)]  # cut at the cap
    assert (
        Request.from_json(request).replay_text() == "replays fixture's answer from @0, 6 tokens"
    )  # layers 1+ may be cut off
    request["kv_audit"] = {"status": "unavailable", "reason": "why"}  # unaudited: nothing said either way
    assert Request.from_json(request).replay_text() == "replays fixture's answer from @0, 6 tokens"
    own = {"role": "reuse", "replays": [dict(replay, probe="x", request="reuse 1")], "kv_audit": {"status": "audited"}}
    assert (
        Request.from_json(own).replay_text() == "repeats its reuse 1's answer from @0, 6 tokens"
    )  # its own prompt's KV


def test_the_summary_names_the_replay_under_its_probe():
    lines = format_summary(_report_with_replays()).splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("  chat-511") and "FAIL @0" in line)
    assert lines[at + 1] == "    reuse 1: replays fixture's answer from @0, 6 tokens"
    assert sum("replays" in line for line in lines) == 1
    # the same report without the field (as written before replays) prints no replay line
    plain = json.loads((DATA / "render-selftest.json").read_text())
    assert "replays" not in format_summary(plain) and "repeats" not in format_summary(plain)


def test_the_site_lists_the_replay_and_marks_its_tokens():
    page = build_report_page(_report_with_replays(), stem="r", raw_href="raw/r.json", log_hrefs={})
    detail = next(d for d in page.details if d.probe == "chat-511" and d.arm.startswith("PlantedFault"))
    assert detail.replays == ("reuse 1: replays fixture's answer from @0, 6 tokens",)
    reuse_row = next(cells for chunk in detail.chunks for label, cells in chunk.lines if label == "reuse 1")
    assert [c.css for c in reuse_row[:7]] == ["first replay"] + ["diff replay"] * 5 + ["diff"]
    row = next(r for b in page.blocks for r in b.rows if b.title.startswith("PlantedFault") and r.probe == "chat-511")
    assert row.replays == "reuse 1: replays fixture's answer from @0, 6 tokens"
    others = [d.replays for d in page.details if d is not detail]
    assert others == [()] * len(others)
    assert page.replay_legend.startswith("a replay is a run of at least 4 generated tokens")
    plain = json.loads((DATA / "render-selftest.json").read_text())
    assert build_report_page(plain, stem="r", raw_href="raw/r.json", log_hrefs={}).replay_legend == ""


def test_the_issue_markdown_gives_the_replay_under_its_divergence_with_the_rule():
    body = format_issue_md(_report_with_replays())
    at = body.index("/ `chat-511` / reuse 1:")
    assert body[at:].splitlines()[1] == "  - **replays fixture's answer from @0, 6 tokens**"
    assert "_Replays: a replay is a run of at least 4 generated tokens" in body
    plain = format_issue_md(json.loads((DATA / "render-selftest.json").read_text()))
    assert "_Replays:" not in plain


def test_a_report_with_replays_passes_the_kits_own_check():
    report = copy.deepcopy(json.loads((DATA / "report-v2-example.json").read_text()))
    reuse = next(r for a in report["arms"] for p in a["probes"] for r in p["requests"] if r["role"] == "reuse")
    reuse["replays"] = [{"probe": "fixture", "request": "baseline", "from": 0, "tokens": 6}]
    validate_report(report)
    reuse["replays"][0]["tokens"] = 2
    with pytest.raises(ReportInvalid, match="replays"):
        validate_report(report)
