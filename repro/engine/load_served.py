"""A production-load scenario on the served front end (repro.engine.served): its cancellations are client
disconnects over HTTP, what production sees, instead of the engine's own abort (repro.engine.load).

Each round sends every prompt at once, each its own HTTP request. A request the round cancels is sent streamed
(`"stream": true`) and its connection closed:
- "prefill": once the server has answered the request's headers (the request is in the server) and before any
  token chunk has come; a token chunk already waiting when the kit closes means its prefill was over: missed. The
  server's scheduler is another process: how much of the prompt it had computed is not visible over HTTP
  (`observed: false`, as offline in vLLM's own layout);
- "last-step": after all but its last token have come in chunks; a chunk that finishes it first: missed.
Then it is sent again at once, as an ordinary request: that answer is the one judged, with what the cancelled
attempt did (chunks, tokens, missed or not). The server's own counts (/metrics: `vllm:request_success` by
finished_reason, "abort" apart, and its running and waiting gauges) are read before and after each round and recorded
on the round's cancellations (`round`), beside the requests the kit sent and the connections it closed: a closed
attempt is finished or aborted there as the disconnect reaches the server before its last token or not: each one
it finished anyway shows as one finished request more than the requests it ran to their end. A cancelled attempt's
KV audit record cannot be told from its retry's over HTTP: the retry's record is marked unavailable. Standard
library HTTP.
"""

from __future__ import annotations

import http.client
import json
import urllib.parse

from repro.contract.result import ProbeResult, ScenarioResult, StepRequest
from repro.engine.load import reference_probes
from repro.engine.outputs import _request, preemption_count
from repro.engine.served import STREAM, ServerFailed, as_output, completion_body

IN_PREFILL, AT_LAST_STEP = "prefill", "last-step"  # repro.plan.load's
SUCCESS = "vllm:request_success"  # by finished_reason: "abort" among them
GAUGES = ("vllm:num_requests_running", "vllm:num_requests_waiting")


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


def _tokens_in(event: bytes) -> tuple[int, bool]:
    """(token IDs, finished) in one server-sent event of a streamed /v1/completions answer."""
    line = event.decode("utf-8", "replace").strip()
    if not line.startswith("data: ") or line == "data: [DONE]":
        return 0, line == "data: [DONE]"
    choices = json.loads(line[len("data: ") :]).get("choices") or []
    n = sum(len(c.get("token_ids") or []) for c in choices)
    return n, any(c.get("finish_reason") for c in choices)


def cancel_once(base: str, body: dict, when: str, max_tokens: int) -> dict:
    """One streamed attempt, its connection closed at its point (module docstring): what was observed."""
    if when == AT_LAST_STEP and max_tokens < 2:
        return {"when": when, "missed": "max_tokens is 1: the first token is the last"}
    url = urllib.parse.urlsplit(base)
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=600)
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
            if waiting:
                return {"when": when, "missed": "a token chunk had come before the close: its prefill was over",
                        "streamed": True}  # fmt: skip
            return {"when": when, "chunks": 0, "generated": 0, "observed": False, "over": "http", "streamed": True}
        generated, chunks = 0, 0
        while generated < max_tokens - 1:
            event = b""
            while not event.endswith(b"\n\n"):
                line = resp.readline()
                if not line:
                    return {"when": when, "missed": f"the stream ended after {generated} tokens", "streamed": True}
                event += line
            n, finished = _tokens_in(event)
            generated, chunks = generated + n, chunks + (n > 0)
            if finished or generated >= max_tokens:
                came = f"its last token came in the chunk that brought {generated}"
                missed = came if n else f"the stream ended after {generated} tokens"
                return {"when": when, "missed": missed, "streamed": True, "generated": generated}
        return {
            "when": when,
            "chunks": chunks,
            "generated": generated,
            "observed": True,
            "over": "http",
            "streamed": True,
        }
    finally:
        conn.close()  # the disconnect: the server aborts the request


def run_load_served(llm, job, sp, audit, report_stage) -> tuple[list[ProbeResult], ScenarioResult]:
    """The load scenario's reference or rounds on a served arm (module docstring)."""
    prompts = {p.name: list(p.prompt["token_ids"]) for p in job.probes}
    probes = reference_probes(llm, job, prompts, sp, audit, report_stage)
    results = []
    for k, step in enumerate(job.scenario.steps):
        report_stage(job, f"round {k + 1} of {len(job.scenario.steps)}: {len(step.submit)} requests", preflight_ok=True)
        before, _ = preemption_count()
        counts_before = server_counts(llm)

        def one(name: str, when: str | None = None) -> tuple:
            body = completion_body(prompts[name], sp)
            cancel = None if when is None else cancel_once(llm.base, body, when, job.max_tokens)
            return as_output(llm._complete(body), prompts[name]), cancel

        futures = [llm._pool.submit(one, name, step.cancel.get(name)) for name in step.submit]
        answers = [f.result() for f in futures]
        closed = sum(1 for _, c in answers if c is not None and not c.get("missed"))
        tried = sum(1 for _, c in answers if c is not None and c.get("streamed"))
        counts = round_counts(counts_before, server_counts(llm), len(answers) + tried, closed)
        after, _ = preemption_count()
        grew = None if before is None or after is None else after - before
        records = audit.take_many([prompts[name] for name in step.submit])
        for name, (out, cancel), record in zip(step.submit, answers, records):
            if cancel is not None:
                cancel = {**cancel, "round": counts}
                if record is not None and not cancel.get("missed"):
                    record = {"seq": None, "unavailable": "a cancelled attempt's record and its retry's are one "
                                                          "prompt's over HTTP: not told apart"}  # fmt: skip
            cached = getattr(out, "num_cached_tokens", None)
            results.append(StepRequest(k, name, _request(out, "reuse" if cached else "cold", record), grew, cancel))
    count, source = preemption_count()
    return probes, ScenarioResult(job.scenario.name, tuple(results), count, source)
