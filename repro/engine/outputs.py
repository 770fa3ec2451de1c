"""What the engine child makes of vLLM's outputs and counters: one request's result (RequestResult) from a
RequestOutput, and the engine's cumulative counters (preemptions, connector hits) as this process reads them.
Shared by the child's plain probes and scenarios (repro.engine.child) and its load rounds (repro.engine.load)."""

from __future__ import annotations

import json

from repro.contract.result import RequestResult


def _top_logprobs(step) -> list[list]:
    """[[token_id, logprob], ...] best first, for one generated position."""
    if step is None:
        return []
    items = sorted(((int(t), float(lp.logprob)) for t, lp in step.items()), key=lambda x: (-x[1], x[0]))
    return [[t, lp] for t, lp in items]


def _request(
    out, role: str, kv_audit_record: dict | None = None, external: int | None = None, member: dict | None = None
) -> RequestResult:
    comp = out.outputs[0]
    cached = getattr(out, "num_cached_tokens", None)
    ktp = json.loads(json.dumps(out.kv_transfer_params, default=str)) if out.kv_transfer_params else None
    return RequestResult(
        role=role,
        request_id=str(out.request_id),
        cached_tokens=None if cached is None else int(cached),
        token_ids=tuple(int(t) for t in comp.token_ids),
        logprobs=tuple(_top_logprobs(s) for s in (comp.logprobs or [])),
        finish_reason=comp.finish_reason,
        kv_transfer_params=ktp,
        text=comp.text,
        kv_audit_record=kv_audit_record,
        external_tokens=external,
        connector_member=member,
    )


PREEMPTIONS_METRIC = "vllm:num_preemptions"
# tokens a connector loaded, as the scheduler counts them at admission (connector_prefix_cache_stats)
EXTERNAL_HITS_METRIC = "vllm:external_prefix_cache_hits"


_SERVED: list = []  # the server front end whose /metrics the counters are read from (repro.engine.served)


def read_counters_from(frontend) -> None:
    """The arm's engine is a server (repro.engine.served): its counters are read from its /metrics from now on."""
    _SERVED[:] = [frontend]


def _served_counter(metric: str) -> tuple[int | None, str]:
    from repro.engine.served import ServerFailed, parse_metric

    try:
        value = parse_metric(_SERVED[0].metrics_text(), metric)
    except ServerFailed as exc:
        return None, f"unavailable: {str(exc)[:200]}"
    if value is None:
        return None, f"unavailable: the server's /metrics has no {metric}"
    return value, f"{metric} (the server's /metrics)"


def _counter(metric: str) -> tuple[int | None, str]:
    """One of the engine's cumulative Prometheus counters and where it came from (v1/metrics/loggers.py), read
    in this process as LLM.get_metrics() reads it (vllm.v1.metrics.reader.get_metrics_snapshot), which
    serves the synchronous LLM and the bare AsyncLLM alike; (None, "unavailable: why") otherwise."""
    if _SERVED:
        return _served_counter(metric)
    try:
        from vllm.v1.metrics.reader import get_metrics_snapshot

        values = [m.value for m in get_metrics_snapshot() if m.name == metric]
    except Exception as exc:  # noqa: BLE001 - a counter that cannot be read is reported as such
        return None, f"unavailable: {type(exc).__name__}: {str(exc)[:200]}"
    if not values:
        return None, f"unavailable: vLLM's metrics have no {metric} (stat logging off?)"
    return int(sum(values)), f"{metric} (vLLM's Prometheus counter, as LLM.get_metrics() reads it)"


def preemption_count() -> tuple[int | None, str]:
    """The engine's cumulative count of preempted requests (fed by the scheduler's PREEMPTED events)."""
    return _counter(PREEMPTIONS_METRIC)


SPECULATIVE_METRICS = {
    "drafts": "vllm:spec_decode_num_drafts",
    "draft_tokens": "vllm:spec_decode_num_draft_tokens",
    "accepted_tokens": "vllm:spec_decode_num_accepted_tokens",
}


def speculative_counters() -> dict:
    """What speculative decoding did in this engine so far (a fresh engine per arm: all of the arm's): its drafts,
    the tokens drafted and those the target accepted, each None where its counter cannot be read, and where each
    came from. An arm that drafted nothing never ran a verification step (repro.run.entries says so)."""
    out: dict = {"sources": {}}
    for key, metric in SPECULATIVE_METRICS.items():
        out[key], out["sources"][key] = _counter(metric)
    return out


def connector_tokens(record: dict | None, before: int | None, after: int | None) -> int | None:
    """The tokens a connector beneath the GPU prefix cache loaded for one request sent alone: what the scheduler
    told the connector it would load (update_state_after_alloc's num_external_tokens, as the KV audit's record of
    the request keeps it), else vLLM's external-hit counter across the request. The counter alone is not enough:
    on vLLM 0.26 with OffloadingConnector's asynchronous loads it stayed at 0 while the audit saw every reuse
    loaded by the connector (H200, 2026-12-03). None: neither says."""
    ext = (record or {}).get("external_tokens")
    if isinstance(ext, int) and not isinstance(ext, bool):
        return ext
    return None if before is None or after is None else after - before


def external_hits() -> tuple[int | None, str]:
    """The tokens every connector load so far brought in, as the scheduler counted them: a request sent alone
    gets the difference across it (its own connector hits, apart from the GPU prefix cache's)."""
    return _counter(EXTERNAL_HITS_METRIC)
