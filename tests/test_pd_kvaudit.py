"""The KV audit of the P→D consumer (repro.judge.pd_kvaudit) on the fake pairs: whose blocks it loaded, named by the
digests of the blocks it received against the reference's, beside the token verdict and never changing it."""

from __future__ import annotations

import json

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


def test_the_served_pair_audits_the_reference_and_the_consumer_only(tmp_path):
    from repro.disagg import audit, servers
    from repro.engine import kvaudit, kvaudit_hooks

    assert (audit.AUDIT_MODULE, audit.WRAPPED, audit.OBSERVER, audit.OBSERVER_ROLE, audit.AUDIT_TARGET_ENV) == (
        kvaudit.MODULE, kvaudit.WRAPPED, kvaudit.OBSERVER, kvaudit.OBSERVER_ROLE, kvaudit.AUDIT_TARGET_ENV)  # fmt: skip
    assert audit.AUDIT_DIR_ENV == kvaudit_hooks.AUDIT_DIR_ENV
    s = servers.ServeSettings("/py", "/m", 16, 2048, kv_audit_dir=str(tmp_path))

    def ktc(argv):
        return json.loads(argv[argv.index("--kv-transfer-config") + 1])

    assert ktc(servers.serve_argv(s, 1, None, False)) == {
        "kv_connector": "KVAuditObserver", "kv_connector_module_path": "repro.engine.kvaudit", "kv_role": "kv_producer"}  # fmt: skip
    assert ktc(servers.serve_argv(s, 1, "kv_consumer", True)) == {
        "kv_connector": "KVAuditWrapped", "kv_connector_module_path": "repro.engine.kvaudit", "kv_role": "kv_consumer"}  # fmt: skip
    assert ktc(servers.serve_argv(s, 1, "kv_producer", False)) == {
        "kv_connector": "NixlConnector",
        "kv_role": "kv_producer",
    }
    pair = servers.NixlPair(s, tmp_path / "logs", {"PYTHONPATH": "/x"})
    (tmp_path / "logs").mkdir()
    consumer = pair._server("consumer", "kv_consumer", True, 1, 2)
    reference = pair._server("reference", None, False, 3, None)
    assert consumer.env["KVKIT_KV_AUDIT_TARGET"] == "NixlConnector" and "KVKIT_KV_AUDIT_TARGET" not in reference.env
    assert consumer.env["KVKIT_KV_AUDIT_DIR"] == str(tmp_path / "consumer") and (tmp_path / "reference").is_dir()
    assert reference.env["VLLM_KV_CACHE_LAYOUT"] == "HND" and reference.env["PYTHONPATH"].endswith(":/x")
    producer = pair._server("producer", "kv_producer", False, 4, 5)
    assert "KVKIT_KV_AUDIT_DIR" not in producer.env


def _record(folder, seq, prompt, kind, blocks, local=0, layers=2, unavailable=None):
    import torch

    from repro.disagg import audit

    folder.mkdir(parents=True, exist_ok=True)
    rec = {"seq": seq, "prompt_sha256": audit.prompt_sha256(prompt), "layers": [f"l{i}" for i in range(layers)],
           f"{kind}_blocks": len(blocks), "local_tokens": local, "unavailable": unavailable}  # fmt: skip
    (folder / f"{seq:06d}.json").write_text(json.dumps(rec))
    for li in range(layers):
        blob = torch.tensor([[[b * 10 + li, b], [li, -b]] for b in blocks], dtype=torch.float16)  # [n, 2, 2]
        torch.save(blob, folder / f"{seq:06d}.{kind}.{li:03d}.pt")
    return rec


def test_block_digests_are_read_back_from_the_audits_records(tmp_path):
    from repro.disagg import audit, servers
    from repro.engine.kv_blocks import prompt_sha256

    prompt = tuple(range(40, 88))
    assert audit.prompt_sha256(prompt) == prompt_sha256(prompt)
    pair = servers.NixlPair(servers.ServeSettings("/py", "/m", 16, 2048, kv_audit_dir=str(tmp_path)), tmp_path, {})
    assert pair._audit_files("reference") == {}  # no folder yet
    _record(tmp_path / "reference", 0, prompt, "computed", [0, 1, 2])
    _record(tmp_path / "consumer", 0, prompt, "reused", [7, 7, 7])  # an older request of the same prompt
    before = pair._audit_files("consumer")
    _record(tmp_path / "consumer", 1, prompt, "reused", [0, 1, 2], local=16)  # its own first block, then two received
    ref, _ = pair._audited("reference", prompt, "computed", {})
    got, first = pair._audited("consumer", prompt, "reused", before)
    assert len(ref) == 3 and (got, first) == (ref[1:], 1)  # the record written since; the received blocks only
    assert name_loaded_blocks("p", got, 1, {"p": ref}).verdict == EXACT
    assert pair._audited("consumer", (1, 2), "reused", {}) == (None, 0)  # no record of that prompt
    assert pair._audited("consumer", prompt, "reused", pair._audit_files("consumer")) == (None, 0)  # none since
    _record(tmp_path / "torn", 0, prompt, "reused", [0, 1])
    (tmp_path / "torn" / "000000.reused.001.pt").unlink()
    rec = audit.new_record(tmp_path / "torn", audit.prompt_sha256(prompt), {})
    assert audit.block_digests(tmp_path / "torn", rec, "reused") is None
    blind = _record(tmp_path / "blind", 0, prompt, "reused", [0], unavailable="no KV tensors were registered")
    assert audit.block_digests(tmp_path / "blind", blind, "reused") is None
    plain = servers.NixlPair(servers.ServeSettings("/py", "/m", 16, 2048), tmp_path, {})
    assert plain._audit_files("consumer") == {} and plain._audited("consumer", prompt, "reused", {}) == (None, 0)


def test_the_summary_and_the_page_say_whose_blocks_a_control_loaded():
    from repro.disagg import report as pd_report
    from repro.disagg.page import page_model

    cases = load_cases(GPU_CASES)
    run = run_cases(audited_pair()(cases.block_size), cases)
    report = report_of(run, cases)
    stale = next(line for line in pd_report.summary_lines(report) if "control stale-reference" in line)
    assert stale.endswith("; KV FOREIGN: slots 0–11 hold probe-a's blocks 0–11 (the same positions)")
    rows = [row for row in page_model(report).rows if row.case == "stale-reference" and row.reference == "probe-a"]
    assert any("KV FOREIGN: slots 0–11 hold probe-a's" in row.why for row in rows)


def test_a_digest_is_the_blocks_bytes_as_torch_saved_them(tmp_path):
    import hashlib

    import torch

    from repro.disagg import audit

    blob = torch.arange(24, dtype=torch.float16).reshape(3, 2, 4)
    torch.save(blob, tmp_path / "000000.reused.000.pt")
    rec = {"seq": 0, "layers": ["l0"], "reused_blocks": 3}
    got = audit.block_digests(tmp_path, rec, "reused")
    assert got == tuple(hashlib.sha256(blob[b].numpy().tobytes()).hexdigest()[:32] for b in range(3))
    assert audit.block_digests(tmp_path, {**rec, "reused_blocks": 5}, "reused") is None  # 48 bytes are not 5 blocks
    (tmp_path / "000001.reused.000.pt").write_bytes(b"not a zip")
    assert audit.block_digests(tmp_path, {**rec, "seq": 1}, "reused") is None
