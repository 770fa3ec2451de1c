"""Fixture expectations (repro.fixtures): expected token verdicts and expected KV verdicts, each
checked against its own list of verdicts, every bad entry a one-line UsageError."""

from __future__ import annotations

import json

import pytest
from conftest import ROOT

from repro.errors import UsageError
from repro.fixtures import load_fixture, parse_fixture
from repro.verdict import CORRUPT, EXACT, KV_VERDICTS, UNAVAILABLE

SELFTEST = ROOT / "fixtures" / "selftest-cpu.json"


def _doc(**extra) -> dict:
    doc = json.loads(SELFTEST.read_text(encoding="utf-8"))
    doc.pop("expected_kv", None)
    doc.update(extra)
    return doc


def test_expected_kv_is_read_beside_expected():
    table = {"PlantedFault": {"fixture": CORRUPT}, "native": {"fixture": EXACT, "chat-511": UNAVAILABLE}}
    fixture = parse_fixture(_doc(expected_kv=table), "f.json", "0" * 64)
    assert fixture.expected_kv == table
    assert fixture.expected == _doc()["expected"]  # the token expectations are untouched


def test_a_fixture_without_expected_kv_expects_none():
    assert parse_fixture(_doc(), "f.json", "0" * 64).expected_kv == {}


def test_every_kv_verdict_may_be_expected():
    table = {"native": {f"p{i}": v for i, v in enumerate(KV_VERDICTS)}}
    assert parse_fixture(_doc(expected_kv=table), "f.json", "0" * 64).expected_kv == table


@pytest.mark.parametrize(
    "expected_kv, message",
    [
        ([], r"expected_kv: must be an object of arm -> \{probe: verdict\}"),
        ({"native": ["EXACT"]}, "expected_kv.native: must be an object of probe -> verdict"),
        ({"native": {"fixture": "PASS"}}, "expected_kv.native.fixture: 'PASS' is not one of EXACT, NUMERIC"),
        ({"native": {"fixture": "exact"}}, "expected_kv.native.fixture: 'exact' is not one of"),
        ({"native": {"fixture": ["EXACT"]}}, r"expected_kv.native.fixture: \['EXACT'\] is not one of"),
        ({"native": {"fixture": None}}, "expected_kv.native.fixture: None is not one of"),
    ],
)
def test_a_bad_expected_kv_is_one_line(expected_kv, message):
    with pytest.raises(UsageError, match=message) as info:
        parse_fixture(_doc(expected_kv=expected_kv), "f.json", "0" * 64)
    assert "\n" not in str(info.value) and str(info.value).startswith("fixture f.json: ")


def test_a_kv_verdict_is_not_a_token_verdict():
    with pytest.raises(UsageError, match="expected.native.fixture: 'EXACT' is not one of PASS"):
        parse_fixture(_doc(expected={"native": {"fixture": EXACT}}), "f.json", "0" * 64)


def test_the_shipped_fixtures_still_load():
    for path in sorted((ROOT / "fixtures").glob("*.json")):
        fixture = load_fixture(path)
        assert fixture.probes and fixture.sha256
        assert all(v in KV_VERDICTS for table in fixture.expected_kv.values() for v in table.values())
