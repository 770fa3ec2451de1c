"""What each llama.cpp arm does with a probe's requests (cold first, then the reuses), in one process:

- baseline: the cache off. Before every request the KV memory is emptied and the binding's kept tokens forgotten,
  so every prompt is evaluated whole; its hit counter is 0 by construction.
- native: llama-cpp-python's own prompt reuse (Llama.generate with reset=True keeps the longest common prefix of the
  tokens it holds and evaluates the rest). Before a probe's cold request the memory is emptied; its reuses find
  the cold request's tokens held. native-matched (the probe's match_tokens): before each reuse the memory is emptied
  and exactly that prefix evaluated alone (Llama.eval), so the reuse keeps that many tokens.
- connector STATE_SEQ: save and restore, the in-process form of llama-server's slot save/restore. After the cold
  request sequence 0's KV state (llama_state_seq_get_data) and its tokens are written to the arm's store; before
  each reuse the memory is emptied and the state read back from the file and restored (llama_state_seq_set_data),
  so the reuse can only come from the restored bytes.
- connector PLANTED: the same, with the restored blob altered first (fault zero_blocks: the K and V rows of
  num_blocks blocks of block_size positions from first_block, in every layer, zeroed; -1 is the last full block
  of the reused prefix). The kit's planted fault on llama.cpp: its reuses must FAIL.

Every reuse's hit counter is what the engine kept of its prompt just before the request, by the rule
Llama.generate applies (repro.llamacpp.engine.Engine.reuse_rule): after a restore, that is what the restore put
back. A restore llama.cpp refused (0 bytes read) keeps nothing, so its reuse counts 0 and is never judged a reuse.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from repro.contract.job import Job
from repro.contract.result import ProbeResult, RequestResult
from repro.llamacpp import state as seqstate
from repro.llamacpp.engine import kept_by_rule

STATE_SEQ = "LlamaStateSeq"
PLANTED = "PlantedStateFault"
CONNECTORS = (STATE_SEQ, PLANTED)
PLANTED_FAULTS = ("none", "zero_blocks")


def _request(role: str, gen, rid: str, text: str, params: dict | None = None) -> RequestResult:
    return RequestResult(
        role=role,
        request_id=rid,
        cached_tokens=gen.cached_tokens,
        token_ids=tuple(gen.token_ids),
        logprobs=tuple(tuple(step) for step in gen.logprobs),
        finish_reason="length",
        kv_transfer_params=params,
        text=text,
    )


def _generate(engine, audit, ids: list[int], role: str, rid: str, params: dict | None = None) -> RequestResult:
    gen = engine.generate(ids)
    out = _request(role, gen, rid, engine.tokenizer.decode(gen.token_ids), params)
    return replace(out, kv_audit_record=audit.record(engine, ids, rid, role, gen.cached_tokens))


def planted_positions(extra: dict, reused: int, block_size: int) -> list[int]:
    """The positions a planted fault zeroes among the `reused` positions a reuse takes from its restore."""
    if extra.get("fault", "none") == "none":
        return []
    full = reused // block_size
    first, count = int(extra.get("first_block", 0)), int(extra.get("num_blocks", 1))
    start = first if first >= 0 else full + first
    blocks = [b for b in range(start, start + count) if 0 <= b < full]
    return [p for b in blocks for p in range(b * block_size, (b + 1) * block_size)]


# What a probe may ask of vLLM's child that llama.cpp's does not send: refused, never run without it and judged as if
UNSENT = {
    "adapter": "a LoRA adapter",
    "image": "an image",
    "cache_salt": "a tenant salt (cache_salt)",
    "prompt_logprobs": "prompt logprobs",
}


def refused(job: Job) -> str | None:
    """Why llama.cpp's child cannot run this job as asked (one line), or None."""
    for probe in job.probes:
        asked = [what for key, what in UNSENT.items() if probe.prompt.get(key) is not None]
        if probe.between is not None:
            asked.append("a prompt sent between its requests")
        if asked:
            return f"probe {probe.name} asks for {', '.join(asked)}, which llama.cpp's child does not send"
    return None


def run(engine, job: Job, audit) -> tuple[list[ProbeResult], dict]:
    """Every probe's requests (repro.llamacpp.audit.LlamaAudit records each one's KV where the job asks)."""
    if (why := refused(job)) is not None:
        raise ValueError(why)
    conn = job.arm.connector
    if conn is not None and conn.name not in CONNECTORS:
        raise ValueError(f"llama.cpp has no connector {conn.name!r}: its arms are native and {', '.join(CONNECTORS)}")
    extra = dict(conn.extra_config) if conn is not None else {}
    if conn is not None and conn.name == PLANTED and extra.get("fault", "none") not in PLANTED_FAULTS:
        raise ValueError(f"{PLANTED}: fault {extra.get('fault')!r} is not one of {', '.join(PLANTED_FAULTS)}")
    store = Path(extra["store_dir"]) if conn is not None else None
    if store is not None:
        store.mkdir(parents=True, exist_ok=True)
    probes, restores = [], []
    for n, probe in enumerate(job.probes):
        ids, messages = engine.prompt_ids(probe.prompt)
        requests = []
        engine.clear()
        for i in range(probe.requests):
            if job.arm.mode == "baseline":
                engine.clear()
                requests.append(_generate(engine, audit, ids, "cold", f"{probe.name}-{i}"))
                continue
            if i > 0 and probe.match_tokens is not None:  # native-matched: the engine holds exactly this prefix
                engine.clear()
                engine.llm.eval(ids[: probe.match_tokens[i - 1]])
            if i == 0 or conn is None:
                requests.append(_generate(engine, audit, ids, "cold" if i == 0 else "reuse", f"{probe.name}-{i}"))
                if i == 0 and store is not None:
                    blob, tokens = engine.take_state()
                    (store / f"{n:03d}.state").write_bytes(blob)
                    (store / f"{n:03d}.tokens.json").write_text(json.dumps(tokens), encoding="utf-8")
                    engine.clear()
                continue
            blob = (store / f"{n:03d}.state").read_bytes()
            tokens = json.loads((store / f"{n:03d}.tokens.json").read_text(encoding="utf-8"))
            kept = kept_by_rule(tokens, ids)  # what the reuse will keep of the restored tokens (logits not live)
            zeroed = planted_positions(extra, kept, job.engine.block_size) if conn.name == PLANTED else []
            if zeroed:
                blob = seqstate.zero_positions(seqstate.parse(blob), zeroed)
            read = engine.put_state(blob, tokens)
            params = {"restored_bytes": read, "restored_tokens": len(tokens) if read else 0}
            if conn.name == PLANTED:  # as the vLLM planted connector names them (repro.readmodel: planted_blocks)
                blocks = sorted({p // job.engine.block_size for p in zeroed})
                params["planted_fault"] = {"fault": extra.get("fault", "none"), "faulted_blocks": blocks}
            restores.append({"probe": probe.name, "reuse": i, **params})
            requests.append(_generate(engine, audit, ids, "reuse", f"{probe.name}-{i}", params))
        probes.append(ProbeResult(probe.name, tuple(ids), messages, tuple(requests)))
    return probes, ({"restores": restores} if restores else {})
