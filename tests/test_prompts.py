"""The chat prompt specs: one builder for the suite and the detection study, specs unchanged byte for byte."""

from __future__ import annotations

import json

from repro.detection.plan import DECOY, PROMPTS, prompt_spec
from repro.plan.prompts import BOUNDARY_FILLER, DETECTION_FILLERS, chat_spec
from repro.plan.suite import boundary_probe

# Pinned: produced by repro/plan/suite.py and repro/detection.py as they were before repro/plan/prompts.py existed; the
# committed results were generated from these exact specs.
SUITE_CHAT_512 = {
    "messages": [
        {"role": "system", "content": "512-token boundary probe. You are a careful assistant."},
        {"role": "user", "content": "Summarize these notes in one sentence.\n\n"},
    ],
    "length": 512,
    "filler": "Release notes, section four. The scheduler keeps a queue of waiting requests and admits them when "
    "blocks are free; a cache hit lets it skip the prefill of the shared prefix, and the answer must not change "
    "because of that.",
}
DETECTION_BRAVO = {
    "messages": [
        {"role": "system", "content": "Bravo probe. You are a careful assistant."},
        {"role": "user", "content": "Summarize these notes in one sentence.\n\n"},
    ],
    "length": 421,
    "filler": "Maintenance log. Pump B pressure drifted low at 03:14; the operator reset the valve and logged the "
    "reading. Cooling loop two reported a stale sensor value at 04:40.",
}
# Which filler each detection prompt got (index into DETECTION_FILLERS), from the code before the split.
DETECTION_FILLER_INDEX = {"alpha": 2, "bravo": 1, "charlie": 2, "delta": 0, "echo": 1, "decoy": 1}


def _bytes(spec: dict) -> bytes:
    return json.dumps(spec, sort_keys=True, ensure_ascii=False).encode("utf-8")


def test_suite_boundary_probe_spec_is_unchanged():
    probe = boundary_probe(512)
    assert probe.name == "chat-512" and probe.reuses == 1
    assert _bytes(probe.chat) == _bytes(SUITE_CHAT_512)


def test_detection_prompt_spec_is_unchanged():
    assert _bytes(prompt_spec("bravo", 421)) == _bytes(DETECTION_BRAVO)
    for name, length in (*PROMPTS, DECOY):
        spec = prompt_spec(name, length)
        assert spec["filler"] == DETECTION_FILLERS[DETECTION_FILLER_INDEX[name]], name
        assert spec["messages"][0]["content"] == f"{name.capitalize()} probe. You are a careful assistant."
        assert spec["length"] == length


def test_both_go_through_the_one_builder():
    assert boundary_probe(513).chat == chat_spec("513-token boundary", 513, BOUNDARY_FILLER)
    assert prompt_spec("echo", 350) == chat_spec("Echo", 350, DETECTION_FILLERS[1])


def test_fillers_are_distinct_and_the_builder_copies_nothing_shared():
    assert len({BOUNDARY_FILLER, *DETECTION_FILLERS}) == 4
    a, b = chat_spec("X", 10, "f"), chat_spec("X", 10, "f")
    a["messages"][0]["content"] = "changed"
    assert b["messages"][0]["content"] == "X probe. You are a careful assistant."
