"""The parent↔child contract: strict reading, a named failure on a version mismatch, round trips."""

from __future__ import annotations

import json

import pytest

from repro.contract.failure import RESULT_VERSION, UNPARSABLE_OUTPUT, ContractError
from repro.contract.job import ArmSpec, ConnectorSpec
from repro.contract.result import ARM_RESULT_KIND, ArmResult, ChildError, ProbeResult, RequestResult

REQ = RequestResult(
    role="reuse",
    cached_tokens=None,
    token_ids=(5, 6),
    logprobs=([[5, -0.1], [7, -2.0]], []),
    finish_reason="length",
    kv_transfer_params=None,
    text="ab",
    request_id="1",
)
RESULT = ArmResult(
    arm="x",
    probes=(ProbeResult("p", (1, 2, 3), None, (REQ,)),),
    pid=7,
    versions={"vllm": "0.28.0"},
    effective_config={"dtype": "float32"},
    engine_start_s=1.5,
)


def test_a_result_round_trips_and_a_missing_counter_stays_missing():
    back = ArmResult.from_json(json.loads(json.dumps(RESULT.to_json())))
    assert back == RESULT and back.probes[0].requests[0].cached_tokens is None


@pytest.mark.parametrize("version", [0, 1, 3, None, "2"])
def test_another_schema_version_is_a_named_failure_never_a_key_error(version):
    data = dict(RESULT.to_json(), schema_version=version)
    with pytest.raises(ContractError) as info:
        ArmResult.from_json(data)
    assert info.value.kind == RESULT_VERSION and "schema_version" in str(info.value)


@pytest.mark.parametrize(
    "mutate, where",
    [
        (lambda d: d.update(kind="other"), ARM_RESULT_KIND),
        (lambda d: d.pop("probes"), "result.probes: missing"),
        (lambda d: d["probes"][0].pop("requests"), "result.probes[0].requests: missing"),
        (lambda d: d["probes"][0]["requests"][0].update(token_ids=["5"]), "token_ids: must be a list of integers"),
        (lambda d: d["probes"][0]["requests"][0].update(cached_tokens=True), "cached_tokens: wrong type bool"),
        (lambda d: d["probes"][0]["requests"][0].update(role="warm"), "neither cold nor reuse"),
    ],
)
def test_a_malformed_result_is_one_line_naming_the_field(mutate, where):
    data = json.loads(json.dumps(RESULT.to_json()))
    mutate(data)
    with pytest.raises(ContractError) as info:
        ArmResult.from_json(data)
    assert info.value.kind == UNPARSABLE_OUTPUT and where in str(info.value) and "\n" not in str(info.value)


def test_an_error_result_keeps_what_was_raised():
    data = ArmResult(arm="x", error=ChildError("ValueError", "boom")).to_json()
    assert ArmResult.from_json(data).error == ChildError("ValueError", "boom")


def test_arm_specs_must_be_consistent():
    with pytest.raises(ContractError):
        ArmSpec("x", "connector")  # a connector arm without a connector
    with pytest.raises(ContractError):
        ArmSpec("native", "native", ConnectorSpec("ExampleConnector"))
    with pytest.raises(ContractError):
        ArmSpec("x", "warm")
