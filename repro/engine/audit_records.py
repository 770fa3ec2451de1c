"""The engine child's side of the KV audit: its settings handed to the engine's processes, and the
records the audit writes per request (repro.engine.kvaudit) matched to the kit's requests.
"""

from __future__ import annotations

import json
import os

from repro.contract.job import Job
from repro.contract.result import LOAD_ERRORS_PREFIX


def audit_env(job: Job) -> None:
    """The audit's settings reach the engine core and worker processes (spawned) by environment."""
    if not job.kv_audit_dir:
        return
    from repro.engine.kvaudit import AUDIT_TARGET_ENV
    from repro.engine.kvaudit_hooks import AUDIT_DIR_ENV

    os.makedirs(job.kv_audit_dir, exist_ok=True)
    os.environ[AUDIT_DIR_ENV] = job.kv_audit_dir
    if job.arm.connector is not None:
        c = job.arm.connector
        os.environ[AUDIT_TARGET_ENV] = f"{c.module_path}:{c.name}" if c.module_path else c.name


def served_member(record: dict | None, audited: str | None) -> dict:
    """Which member of a MultiConnector loaded a request, from its KV audit record: {"index", "connector",
    "tokens"} (index None and tokens 0: no member loaded anything), or {"index": None, "unavailable": why}."""
    if not audited:
        return {"index": None, "unavailable": "the KV audit is off: which member served is not recorded"}
    if record is None or record.get("seq") is None:
        why = (record or {}).get("unavailable") or "no KV audit record"
        return {"index": None, "unavailable": f"the KV audit has no record of this request: {why}"}
    member, tokens = record.get("connector_member"), int(record.get("external_tokens") or 0)
    if member is None:
        return {"index": None, "connector": None, "tokens": 0} if not tokens else {
            "index": None, "unavailable": f"a member loaded {tokens} tokens; the audit did not see which"}  # fmt: skip
    return {"index": member.get("index"), "connector": member.get("connector"), "tokens": tokens}


def served_request(engine_id: object, kit_id: str) -> bool:
    """Whether the engine's request ID (an audit record's req_id) is that of the HTTP request the kit sent with
    `request_id` kit_id: vLLM's server names the request cmpl-<kit_id>, each of its prompts cmpl-<kit_id>-<n>, and
    its engine adds '-' and 8 random characters. A server that names it otherwise matches nothing: no record, said
    as such, never another request's."""
    return isinstance(engine_id, str) and (engine_id == f"cmpl-{kit_id}" or engine_id.startswith(f"cmpl-{kit_id}-"))


def _first_of(records: list[dict]) -> dict:
    """One request's record among several: one is written per scheduling of a new request, so a second one (kept as
    "also_seqs") is the same request or prompt scheduled anew; the first is its own first load."""
    return {**records[0], "also_seqs": [r.get("seq") for r in records[1:]]} if len(records) > 1 else records[0]


class AuditRecords:
    """Maps the audit's per-request records (<seq>.json, in scheduling order) to the kit's requests."""

    def __init__(self, directory: str | None):
        self.directory, self.seen = directory, set()
        self.primes: list[dict] = []  # native-matched: each priming prefill's record

    def take(self, ids: list[int]) -> dict | None:
        if not self.directory:
            return None
        try:
            return self._take(ids)
        except Exception as exc:  # noqa: BLE001 - an audit failure never fails the arm
            return {"seq": None, "unavailable": f"the audit record could not be read: {type(exc).__name__}: {exc}"}

    def _new_records(self) -> list[dict]:
        """The audit's records (<seq>.json) written since the last call, in scheduling order."""
        new = sorted(
            n for n in os.listdir(self.directory) if n.endswith(".json") and n[0].isdigit() and n not in self.seen
        )
        self.seen.update(new)
        records = []
        for name in new:
            with open(os.path.join(self.directory, name), encoding="utf-8") as fh:
                records.append(json.load(fh))
        return [self._with_load_errors(r) for r in records]

    def _with_load_errors(self, record: dict) -> dict:
        """A record with the reused blocks its connector reported to vLLM as not loaded ("load_errors": prompt block
        indices; repro.engine.kvaudit_hooks writes them after the forward that read them, before the request ends)."""
        seq = record.get("seq")
        path = os.path.join(self.directory, f"{LOAD_ERRORS_PREFIX}{seq:06d}.json") if isinstance(seq, int) else None
        if path is None or not os.path.exists(path):
            return record
        with open(path, encoding="utf-8") as fh:
            return {**record, "load_errors": sorted(int(b) for b in json.load(fh)["blocks"])}

    def _take(self, ids: list[int]) -> dict:
        from repro.engine.kv_blocks import prompt_sha256

        records = self._new_records()
        mine = [r for r in records if r.get("prompt_sha256") == prompt_sha256(ids)]
        if len(mine) != 1 or len(records) != 1:
            return {
                "seq": None,
                "unavailable": f"expected one audit record for this request, found {len(mine)} of {len(records)} new",
            }
        return mine[0]

    def take_many(self, prompts: list[list[int]]) -> list[dict | None]:
        """The records of one generate call of several prompts (a scenario step in flight together), each prompt
        sent once: every new record, matched to each prompt by its SHA-256 (the prompts are distinct). Where a prompt
        is sent more than once (a cancelled attempt and its retry), its records are told apart by request ID
        (take_requests), never by prompt."""
        if not self.directory:
            return [None] * len(prompts)
        try:
            return self._take_many(prompts)
        except Exception as exc:  # noqa: BLE001 - an audit failure never fails the arm
            why = f"the audit record could not be read: {type(exc).__name__}: {exc}"
            return [{"seq": None, "unavailable": why} for _ in prompts]

    def _take_many(self, prompts: list[list[int]]) -> list[dict]:
        from repro.engine.kv_blocks import prompt_sha256

        records = self._new_records()
        out = []
        for ids in prompts:
            mine = [r for r in records if r.get("prompt_sha256") == prompt_sha256(ids)]
            if not mine:
                out.append({"seq": None, "unavailable": f"no audit record for this prompt among {len(records)} new"})
                continue
            out.append(_first_of(mine))
        return out

    def take_requests(self, request_ids: list[str], served: bool = False) -> list[dict | None]:
        """The records of requests the kit added itself (a load round: repro.engine.load, or repro.engine.load_served
        with served), matched by request ID: the engine's, or (served) the one the kit gave its HTTP request
        (served_request). The first record of each is its own first scheduling, later ones ("also_seqs") its
        rescheduling after a preemption. Records of other requests (a cancelled attempt) are set aside."""
        if not self.directory:
            return [None] * len(request_ids)
        try:
            records = self._new_records()
        except Exception as exc:  # noqa: BLE001 - an audit failure never fails the arm
            why = f"the audit record could not be read: {type(exc).__name__}: {exc}"
            return [{"seq": None, "unavailable": why} for _ in request_ids]
        out = []
        for rid in request_ids:
            mine = [r for r in records if (served_request(r.get("req_id"), rid) if served else r.get("req_id") == rid)]
            if not mine:
                out.append({"seq": None, "unavailable": f"no audit record for request {rid} among {len(records)} new"})
            else:
                out.append(_first_of(mine))
        return out

    def summary(self) -> dict | None:
        if not self.directory:
            return None
        errors = []
        for name in sorted(os.listdir(self.directory)):
            if name.startswith("audit-error"):
                with open(os.path.join(self.directory, name), encoding="utf-8") as fh:
                    errors.append(json.load(fh))
        return {"dir": self.directory, "errors": errors, "primes": self.primes}
