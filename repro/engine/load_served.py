"""A production-load scenario on the served front end (repro.engine.served): its cancellations are client
disconnects over HTTP, what production sees, instead of the engine's own abort (repro.engine.load).

Each round sends every prompt at once, each its own HTTP request. A request the round cancels is sent streamed
(`"stream": true`) and its connection closed:
- "prefill": once the server has answered the request's headers (the request is in the server) and before any
  token chunk has come. The server's scheduler is another process: how much of the prompt it had computed is not
  visible over HTTP (`observed: false`, as offline in vLLM's own layout);
- "last-step": after all but its last token have come in chunks.
Then it is sent again at once, as an ordinary request: that answer is the one judged, with what the cancelled
attempt did (chunks, tokens, its request ID). A cancellation whose point has passed (a token chunk already waiting
at the prefill's close; a chunk that finishes it before its last step) is missed, as offline: its connection is not
closed, its answer is read to its end and is the one judged, never sent again, so "missed" never hides an abort. A
stream that ends with no finish reason is no answer: missed, and sent again. The server's own counts (/metrics:
`vllm:request_success` by finished_reason, "abort" apart, and its running and waiting gauges) are read before and
after each round and recorded on the round's cancellations (`round`), beside the requests the kit sent and the
connections it closed: a closed attempt is finished or aborted there as the disconnect reaches the server before its
last token or not: each one it finished anyway shows as one finished request more than the requests it ran to their
end.

Every HTTP request carries a request ID of the kit's (`request_id`, which vLLM's server makes its own request's
cmpl-<id>), so each request's KV audit record is matched by ID, as offline: the record of the request whose answer
is judged, never a cancelled attempt's. Standard library HTTP.
"""

from __future__ import annotations

import http.client
import json
import urllib.parse
import uuid

from repro.contract.result import ProbeResult, ScenarioResult, StepRequest
from repro.engine.load import reference_probes
from repro.engine.outputs import _request, preemption_count
from repro.engine.served import STREAM, ServerFailed, as_output, completion_body, joined_stream, the_choice

IN_PREFILL, AT_LAST_STEP = "prefill", "last-step"  # repro.plan.load's
SUCCESS = "vllm:request_success"  # by finished_reason: "abort" among them
GAUGES = ("vllm:num_requests_running", "vllm:num_requests_waiting")
TIMEOUT_S = 600


def server_counts(llm) -> dict:
    """What the server's /metrics says of its requests: finished aborted, finished in all (every finished_reason),
    running and waiting now; a value absent there is None."""
    found: dict = {}
    for line in llm.metrics_text().splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        try:
            value = float(line.rsplit(" ", 1)[1])
        except (IndexError, ValueError):
            continue
        if name in (SUCCESS, SUCCESS + "_total"):
            found["finished"] = found.get("finished", 0) + value
            if 'finished_reason="abort"' in line:
                found["aborted"] = found.get("aborted", 0) + value
            else:
                found.setdefault("aborted", 0)
        elif name in GAUGES:
            key = name.rsplit("_", 1)[1]
            found[key] = found.get(key, 0) + value
    return {k: None if found.get(k) is None else int(found[k]) for k in ("aborted", "finished", "running", "waiting")}


def round_counts(before: dict, after: dict, sent: int, closed: int) -> dict:
    """A round as the server counted it beside what the kit did: requests sent (the closed attempts among them),
    how far its aborted and finished counts moved, what it had running and waiting at the end."""

    def moved(key):
        return None if before[key] is None or after[key] is None else after[key] - before[key]

    return {"sent": sent, "closed": closed, "server_aborted": moved("aborted"), "server_finished": moved("finished"),
            "server_running_at_end": after["running"], "server_waiting_at_end": after["waiting"]}  # fmt: skip


def new_request_id() -> str:
    """A request ID of the kit's for one HTTP request: unique, one length, so none is the start of another."""
    return f"kvkit-{uuid.uuid4().hex}"


def _tokens_in(event: bytes) -> tuple[int, bool, bool]:
    """(token IDs, a choice finished, the stream's [DONE]) in one server-sent event of a streamed /v1/completions
    answer."""
    line = event.decode("utf-8", "replace").strip()
    if not line.startswith("data: ") or line == "data: [DONE]":
        return 0, False, line == "data: [DONE]"
    choices = json.loads(line[len("data: ") :]).get("choices") or []
    n = sum(len(c.get("token_ids") or []) for c in choices)
    return n, any(c.get("finish_reason") for c in choices), False


def _read_to_end(resp, seen: bytes, body: dict) -> dict:
    """A missed cancellation's answer: the events already read and the rest of the stream, joined, and held to what
    its body asked as every answer is (repro.engine.served.the_choice)."""
    try:
        raw = seen + resp.read()
    except (OSError, http.client.HTTPException) as exc:
        raise ServerFailed(f"POST /v1/completions (a missed cancellation, read to its end): {type(exc).__name__}: "
                           f"{exc}") from None  # fmt: skip
    answer = joined_stream(raw)
    the_choice(answer, body)
    return answer


def cancel_once(base: str, body: dict, when: str, max_tokens: int) -> tuple[dict, dict | None]:
    """One streamed attempt, its connection closed at its point (module docstring): (what was observed, the
    attempt's whole answer where its point had passed and it was read to its end, else None: send it again)."""
    if when == AT_LAST_STEP and max_tokens < 2:
        return {"when": when, "missed": "max_tokens is 1: the first token is the last"}, None
    url = urllib.parse.urlsplit(base)
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=TIMEOUT_S)
    try:
        conn.request("POST", "/v1/completions", json.dumps({**body, **STREAM}),
                     {"Content-Type": "application/json"})  # fmt: skip
        sock = conn.sock  # the connection lets go of it once the answer says it will close
        resp = conn.getresponse()
        if resp.status != 200:
            raise ServerFailed(f"POST /v1/completions (to cancel) answered HTTP {resp.status}")
        if when == IN_PREFILL:
            # body bytes already waiting (in the reader's buffer or the socket) mean a chunk came: the prefill was over
            sock.setblocking(False)
            try:
                waiting = bool(resp.fp.peek(1))
            except BlockingIOError:
                waiting = False
            if not waiting:
                return {"when": when, "chunks": 0, "generated": 0, "observed": False, "over": "http",
                        "streamed": True}, None  # fmt: skip
            sock.settimeout(TIMEOUT_S)
            missed = "a token chunk had come before the close: its prefill was over; not closed, read to its end"
            return {"when": when, "missed": missed, "streamed": True}, _read_to_end(resp, b"", body)
        return _close_at_last_step(resp, body, when, max_tokens)
    finally:
        conn.close()  # a landed cancellation's disconnect: the server aborts the request (a read answer: nothing)


def _close_at_last_step(resp, body: dict, when: str, max_tokens: int) -> tuple[dict, dict | None]:
    """cancel_once's last step: read chunks until all but the last token have come (then the caller closes)."""
    generated, chunks, seen = 0, 0, b""
    while generated < max_tokens - 1:
        event = b""
        while not event.endswith(b"\n\n"):
            line = resp.readline()
            if not line:  # the stream ended with no finish reason: no answer
                return _ended(when, generated), None
            event += line
        n, finished, done = _tokens_in(event)
        seen, generated, chunks = seen + event, generated + n, chunks + (n > 0)
        if finished or generated >= max_tokens:
            came = f"its last token came in the chunk that brought {generated}; not closed, read to its end"
            return {"when": when, "missed": came, "streamed": True, "generated": generated}, _read_to_end(
                resp, seen, body
            )
        if done:
            return _ended(when, generated), None
    return {"when": when, "chunks": chunks, "generated": generated, "observed": True, "over": "http",
            "streamed": True}, None  # fmt: skip


def _ended(when: str, generated: int) -> dict:
    why = f"the stream ended after {generated} tokens with no finish reason: sent again"
    return {"when": when, "missed": why, "streamed": True, "generated": generated}


def _one(llm, ids: list[int], sp, when: str | None, max_tokens: int) -> tuple:
    """One prompt's request in a round: (its answer, its cancellation's record or None, the request ID of the HTTP
    request whose answer it is, the HTTP requests it took, whether the kit closed one mid-answer)."""
    body, cancel = completion_body(ids, sp), None
    if when is not None:
        attempt = new_request_id()
        cancel, answer = cancel_once(llm.base, {**body, "request_id": attempt}, when, max_tokens)
        if answer is not None:  # missed, read to its end: the answer judged
            return as_output(answer, ids), cancel, attempt, 1, False
        if not cancel.get("missed"):
            cancel = {**cancel, "request_id": attempt}
    rid = new_request_id()
    tried = cancel is not None and bool(cancel.get("streamed"))
    closed = tried and not cancel.get("missed")
    return as_output(llm._complete({**body, "request_id": rid}), ids), cancel, rid, 1 + tried, closed


def run_load_served(llm, job, sp, audit, report_stage) -> tuple[list[ProbeResult], ScenarioResult]:
    """The load scenario's reference or rounds on a served arm (module docstring)."""
    prompts = {p.name: list(p.prompt["token_ids"]) for p in job.probes}
    probes = reference_probes(llm, job, prompts, sp, audit, report_stage)
    results = []
    for k, step in enumerate(job.scenario.steps):
        report_stage(job, f"round {k + 1} of {len(job.scenario.steps)}: {len(step.submit)} requests", preflight_ok=True)
        before, _ = preemption_count()
        counts_before = server_counts(llm)
        futures = [
            llm._pool.submit(_one, llm, prompts[name], sp, step.cancel.get(name), job.max_tokens)
            for name in step.submit
        ]
        answers = [f.result() for f in futures]
        counts = round_counts(counts_before, server_counts(llm), sum(a[3] for a in answers), sum(a[4] for a in answers))
        after, _ = preemption_count()
        grew = None if before is None or after is None else after - before
        records = audit.take_requests([a[2] for a in answers], served=True)
        for name, (out, cancel, _, _, _), record in zip(step.submit, answers, records):
            if cancel is not None:
                cancel = {**cancel, "round": counts}
            cached = getattr(out, "num_cached_tokens", None)
            req = _request(out, "reuse" if cached else "cold", record)
            results.append(StepRequest(k, name, req, grew, cancel))
    count, source = preemption_count()
    return probes, ScenarioResult(job.scenario.name, tuple(results), count, source)
