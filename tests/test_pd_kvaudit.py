"""The KV audit of the P→D consumer (repro.judge.pd_kvaudit) on the fake pairs: whose blocks it loaded, named by the
digests of the blocks it received against the reference's, beside the token verdict and never changing it."""

from __future__ import annotations

from pd_fakes import FakePair, ForeignProducer, audited_pair, kv_digest, reference_blocks, transferring_pair
from test_pd import GPU_CASES, OUT_OF_RANGE, report_of, small_cases

from repro.disagg.cases import load_cases
from repro.disagg.pair import controls, probe_requests, run_cases
from repro.judge.pd_kvaudit import name_loaded_blocks
from repro.judge.verdict import ERROR, EXACT, FAIL, FOREIGN, MISPLACED, PASS, UNAVAILABLE


def test_every_probe_of_a_transferring_pair_loaded_its_own_blocks():
    cases = load_cases(GPU_CASES)
    run = run_cases(audited_pair()(cases.block_size), cases)
    probes = probe_requests(run)
    assert {(j.verdict.verdict, j.kv.verdict) for j in probes if j.case != "short-prompt"} == {(PASS, EXACT)}
    long = next(j for j in probes if j.prompt == "long")
    assert len(long.kv.slots) == 1000 // 16 and long.kv.loaded_from == ("long",)
    partial = next(j for j in probes if j.case == "partial-hit")
    assert partial.kv.slots[0][0] == 6  # after the consumer's own six blocks
    short = next(j for j in probes if j.case == "short-prompt")
    assert (short.kv.verdict, short.kv.reason) == (UNAVAILABLE, "nothing received: no block to audit")  # < 1 block


def test_the_stale_reference_names_the_previous_requests_blocks_while_its_answer_is_neither():
    """The H200's stale control answered as no other request (the consumer computes the last token itself); the
    audit names what the tokens could not: the blocks loaded are the previous request's."""
    cases = load_cases(GPU_CASES)
    run = run_cases(audited_pair()(cases.block_size), cases)
    by_case = {j.case: j for j in controls(run)}
    stale = by_case["stale-reference"]
    assert stale.verdict.verdict == FAIL and stale.kv.verdict == FOREIGN
    assert (
        stale.kv.loaded_from == ("probe-a",)
        and stale.kv.shape == "slots 0–11 hold probe-a's blocks 0–11 (the same positions)"
    )
    consumed = by_case["consumed-reference"]
    assert (consumed.kv.verdict, consumed.kv.loaded_from) == (FOREIGN, ("probe-c",))  # the request between
    refused = by_case["out-of-range-reference"]  # refused (the default fake): nothing received, nothing to name
    assert refused.verdict.verdict == ERROR and refused.kv is None
    req = next(r for r in report_of(run, cases)["requests"] if r["case"] == "stale-reference" and r["control"])
    assert req["kv_audit"]["verdict"] == FOREIGN and req["kv_audit"]["shape"].startswith("slots 0–11 hold probe-a's")


def test_a_producer_handing_over_another_requests_blocks_is_foreign_named():
    cases = small_cases()
    run = run_cases(audited_pair(lambda bs: FakePair(bs, ForeignProducer(bs, fresh_blocks=True)))(4), cases)
    first, second = probe_requests(run)
    assert (first.kv.verdict, second.kv.verdict, second.kv.loaded_from) == (EXACT, FOREIGN, ("a",))


def test_silent_out_of_range_zeros_are_unavailable_not_corrupt_and_the_token_fail_stands():
    cases = small_cases([OUT_OF_RANGE])
    run = run_cases(audited_pair(bad_ids="silent")(cases.block_size), cases)
    (oor,) = controls(run)
    assert oor.verdict.verdict == FAIL and oor.kv.verdict == UNAVAILABLE
    assert oor.kv.reason.startswith("6 received block(s) equal no reference block bit for bit")


def test_an_unaudited_run_keeps_its_report_as_before():
    cases = small_cases()
    run = run_cases(transferring_pair(4), cases)
    assert all(j.kv is None for j in run.judged)
    assert all("kv_audit" not in r for r in report_of(run, cases)["requests"])


def test_naming_rules():
    a, b = (1, 2, 3, 4, 5, 6, 7, 8), (9, 10, 11, 12, 13, 14, 15, 16)
    ref = {"a": reference_blocks(a, 4), "b": reference_blocks(b, 4)}
    assert name_loaded_blocks("a", list(ref["a"]), 0, ref).verdict == EXACT
    swapped = name_loaded_blocks("a", [ref["a"][1], ref["a"][0]], 0, ref)
    assert swapped.verdict == MISPLACED and swapped.slots == ((0, "a", 1), (1, "a", 0))
    mixed = name_loaded_blocks("a", [ref["a"][0], ref["b"][1], kv_digest((0,))], 0, ref)
    assert mixed.verdict == FOREIGN and mixed.slots[2] == (2, None, None)  # a named block stands on its own
    assert name_loaded_blocks("a", [None], 0, ref).reason == "1 received block(s) the audit could not read"
    assert name_loaded_blocks("a", None, 0, ref).verdict == UNAVAILABLE
    assert name_loaded_blocks("zzz", [ref["a"][0]], 0, ref).reason == "the reference recorded no blocks of zzz"
    assert name_loaded_blocks("a", [ref["a"][1]], 1, ref).verdict == EXACT  # after one block of its own hit
