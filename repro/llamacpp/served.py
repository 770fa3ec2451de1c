"""llama.cpp's served arms (`--engine llamacpp --frontend server`): every arm, the baseline too, runs llama-server
(repro.llamacpp.server), built by the kit from the same source as the Python binding, and sends the requests the
binding's arms send (repro.llamacpp.arms), over HTTP. Prompts are built with the GGUF's own vocabulary and chat
template (the binding, vocabulary only) and sent as token IDs.

Each plain probe gets a fresh server: llama-server caches at token granularity, so every chat prompt would find the
chat template's first tokens held by the probe before it, and a probe's cold request must be a verified miss. A
scenario runs in one server, start to end: what its steps leave behind is its point.

- baseline: `--cache-ram 0` (no RAM prompt cache) and `cache_prompt: false` on every request, so every prompt is
  evaluated whole; llama-server's own counter (timings.cache_n) must say 0.
- native: llama-server as its users run it: its defaults (the RAM prompt cache on, idle slots saved to it,
  `cache_prompt` on), one slot for a plain probe and the scenario's max_num_seqs for a scenario.
- native-matched: `--cache-ram 0`; before each reuse the slot is erased and the probe's match prefix is sent alone
  (1 token generated, never judged), so the reuse finds that prefix in the slot.
- connector LlamaServerSlots: slot save and restore over HTTP (`--cache-ram 0`): after the cold request its slot is
  saved to a file and erased; before each reuse the file is restored into the slot.
- connector PlantedSlotFault: the same, the saved file altered before each restore (fault zero_blocks, as the
  binding's PlantedStateFault): the served KV audit's positive control, its reuses must FAIL with exactly those
  blocks blamed.
- connector LlamaServerCacheReuse: `--cache-reuse min_chunk` (`--cache-ram 0`), llama-server's KV shifting. Before
  each reuse the slot is erased and a donor sent alone (never judged nor audited): the probe's prompt with
  insert_text's tokens inserted at token insert_at. The reuse then keeps the donor's first insert_at positions (its
  common prefix) and, where min_chunk is above 0, shifts the donor's KV of the rest of the prompt back by the
  inserted length: KV computed after other tokens, which llama-server documents as shifting (an approximation by
  design, repro.judge.approximate). min_chunk 0 is its control: the same donor, the rest evaluated again.

Every server has a `--slot-save-path` (the slots arm's store, else a folder of the arm's own): the slot actions need
it, and the KV audit reads through it. With a KV audit, each judged request's slot is saved once it is done and the
file read as the binding's audit reads llama_state_seq_get_data (a slot file is that state behind llama.cpp's
sequence-file header: magic, version, its tokens); the priming requests are never audited.
"""

from __future__ import annotations

import os
import shutil
import struct
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from repro.contract.job import Job
from repro.contract.result import ProbeResult, RequestResult, ScenarioResult, StepRequest
from repro.judge.approximate import CACHE_REUSE
from repro.llamacpp import server as srv
from repro.llamacpp import state as seqstate

SLOTS = "LlamaServerSlots"
PLANTED_SLOTS = "PlantedSlotFault"  # the slots arm with its saved file altered before each restore
CONNECTORS = (SLOTS, PLANTED_SLOTS, CACHE_REUSE)
SEQ_FILE_MAGIC, SEQ_FILE_VERSION = 0x67677371, 3  # llama.h: LLAMA_STATE_SEQ_MAGIC ('ggsq'), LLAMA_STATE_SEQ_VERSION


def flags(job: Job, threads: int, slot_dir: str) -> tuple[list[str], bool]:
    """The arm's llama-server flags and whether its requests ask for the prompt cache."""
    conn = job.arm.connector
    slots = (job.engine.max_num_seqs or 1) if job.scenario is not None else 1
    batch = job.engine.max_num_batched_tokens or 512
    common = ["-c", str(job.engine.max_model_len * slots), "-np", str(slots), "-t", str(threads), "-tb", str(threads),
              "-b", str(batch), "-ub", str(batch), "--seed", str(job.engine.seed), "--no-webui",
              "--slot-save-path", slot_dir]  # fmt: skip
    if job.engine.kv_unified is not None:  # a scenario's: one KV buffer for every slot, or one per slot
        common.append("--kv-unified" if job.engine.kv_unified else "--no-kv-unified")
    if job.arm.mode == "baseline":
        return [*common, "--cache-ram", "0"], False
    if conn is None:
        matched = any(p.match_tokens for p in job.probes)
        return [*common, "--cache-ram", "0"] if matched else common, True
    if conn.name in (SLOTS, PLANTED_SLOTS):
        return [*common, "--cache-ram", "0"], True
    if conn.name == CACHE_REUSE:
        min_chunk = cache_reuse_config(conn.extra_config)[0]
        return [*common, "--cache-ram", "0", "--cache-reuse", str(min_chunk)], True
    raise ValueError(f"llama-server has no connector {conn.name!r}: its connector arms are {', '.join(CONNECTORS)}")


def cache_reuse_config(extra: dict) -> tuple[int, int, str]:
    """LlamaServerCacheReuse's (min_chunk, insert_at, insert_text), or a one-line ValueError."""
    min_chunk, at, text = extra.get("min_chunk"), extra.get("insert_at"), extra.get("insert_text")
    for key, value in (("min_chunk", min_chunk), ("insert_at", at)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ValueError(f"{CACHE_REUSE}: extra_config.{key} must be a whole number of 0 or more, not {value!r}")
    if not isinstance(text, str) or not text.strip():
        raise ValueError(
            f"{CACHE_REUSE}: extra_config.insert_text must be a non-empty string (the donor's inserted text)"
        )
    return min_chunk, at, text


def donor_ids(ids: list[int], at: int, inserted: list[int]) -> list[int]:
    """The prompt with `inserted` put in before token `at` (refused where the prompt has no token after `at`)."""
    if not inserted or at >= len(ids) - 1:
        raise ValueError(f"{CACHE_REUSE}: insert_at {at} leaves nothing to shift in a {len(ids)}-token prompt")
    return [*ids[:at], *inserted, *ids[at:]]


def read_slot_file(raw: bytes) -> tuple[bytes, list[int], int]:
    """A slot file (llama_state_seq_save_file) as (llama_state_seq_get_data's blob, the tokens the slot held, the
    length of the file's header and token section). llama-server writes its tokens packed (server_tokens::serialize:
    a -1 marker, format version 1, the count and the tokens, then the count of media chunks, which the kit never
    sends); a plain token list (older servers) is read as it is."""
    magic, version, n = struct.unpack_from("<III", raw)
    if magic != SEQ_FILE_MAGIC or version != SEQ_FILE_VERSION:
        raise seqstate.StateFormatError(f"slot file magic {magic:#x} version {version}: not llama.cpp's sequence file")
    packed = list(struct.unpack_from(f"<{n}i", raw, 12))
    tokens = packed
    if packed and packed[0] == -1:
        if len(packed) < 4 or packed[1] != 1 or packed[2] + 4 != len(packed) or packed[3 + packed[2]] != 0:
            raise seqstate.StateFormatError(
                f"slot file tokens: not llama-server's packed format 1 with no media ({packed[:3]})"
            )
        tokens = packed[3 : 3 + packed[2]]
    head = 12 + 4 * n
    return struct.pack("<Ii", seqstate.MAGIC, 0) + raw[head:], tokens, head


class SlotState:
    """What repro.llamacpp.audit.LlamaAudit reads from an engine (take_state), for one slot of a server."""

    def __init__(self, server: srv.LlamaServer, slot_dir: str, slot: int):
        self.server, self.slot_dir, self.slot = server, slot_dir, slot

    def take_state(self) -> tuple[bytes, list[int]]:
        name = f"audit-{self.slot}-{time.monotonic_ns()}.bin"
        self.server.slot(self.slot, "save", name)
        path = Path(self.slot_dir) / name
        try:
            blob, tokens, _ = read_slot_file(path.read_bytes())
            return blob, tokens
        finally:
            path.unlink(missing_ok=True)


def _record(answer: dict, role: str, rid: str, params: dict | None = None, audit: dict | None = None) -> RequestResult:
    stop = answer["stop_type"]
    return RequestResult(
        role=role,
        request_id=rid,
        cached_tokens=answer["cached_tokens"],
        token_ids=tuple(answer["token_ids"]),
        logprobs=tuple(tuple(step) for step in answer["logprobs"]),
        finish_reason="length" if stop == "limit" else stop,
        kv_transfer_params=params,
        text=answer["text"],
        kv_audit_record=audit,
    )


class ServedArm:
    def __init__(self, job: Job, audit, slot_dir: str, threads: int):
        self.job, self.audit, self.slot_dir = job, audit, slot_dir
        self.args, self.cache_prompt = flags(job, threads, slot_dir)
        self.facts: dict = {"primed": [], "servers": 0}
        self.lock = threading.Lock()
        self.argv: list[str] = []
        conn = job.arm.connector
        # LlamaServerCacheReuse: (min_chunk, insert_at, insert_text), checked by flags() above; the donor's inserted
        # tokens, which run() encodes with the GGUF's vocabulary
        self.cache_reuse = cache_reuse_config(conn.extra_config) if conn and conn.name == CACHE_REUSE else None
        self.inserted: list[int] = []

    def start(self) -> srv.LlamaServer:
        server = srv.LlamaServer(srv.binary_path(), self.job.engine.model, self.args)
        self.facts["servers"] += 1
        self.argv = server.argv[1:]
        return server

    def body(self, ids: list[int], n_predict: int | None = None, slot: int | None = 0) -> dict:
        n = self.job.max_tokens if n_predict is None else n_predict
        return srv.greedy_body(ids, n, self.job.logprobs, self.cache_prompt, slot, self.job.engine.seed)

    def request(self, server, ids: list[int], role: str | None, rid: str, slot: int | None = 0, params=None):
        """One judged request: its answer, then (with a KV audit) its slot's KV. role None: by its hit counter."""
        answer = server.complete(self.body(ids, slot=slot))
        role = role or ("reuse" if answer["cached_tokens"] else "cold")
        record = None
        if self.audit is not None:
            with self.lock:  # one audit record at a time (the audit numbers them)
                state = SlotState(server, self.slot_dir, int(answer["slot"] if answer["slot"] is not None else 0))
                record = self.audit.record(state, ids, rid, role, answer["cached_tokens"] or 0)
        return _record(answer, role, rid, params, record)

    def prime(self, server, ids: list[int], why: str) -> None:
        """A request whose answer is never judged nor audited: it only puts `ids` in slot 0."""
        got = server.complete(self.body(ids, n_predict=1))
        self.facts["primed"].append({"why": why, "prompt_tokens": len(ids), "cached_tokens": got["cached_tokens"]})

    def probe(self, n: int, probe, ids: list[int]) -> list[RequestResult]:
        conn = self.job.arm.connector
        server = self.start()  # a fresh server a probe: its cold request a true miss
        try:
            out = []
            for i in range(probe.requests):
                rid, params = f"{probe.name}-{i}", None
                if self.job.arm.mode == "baseline" or i == 0:
                    out.append(self.request(server, ids, "cold", rid))
                    if i == 0 and conn is not None and conn.name in (SLOTS, PLANTED_SLOTS):
                        saved = server.slot(0, "save", f"{n:03d}.bin")
                        self.facts.setdefault("saves", []).append({"probe": probe.name, **saved})
                        server.slot(0, "erase")
                    continue
                if probe.match_tokens is not None:
                    server.slot(0, "erase")
                    self.prime(server, ids[: probe.match_tokens[i - 1]], f"{rid}: the match prefix")
                if self.cache_reuse is not None:
                    params = self.donate(server, ids, rid)
                if conn is not None and conn.name in (SLOTS, PLANTED_SLOTS):
                    planted = (
                        self.plant(Path(self.slot_dir) / f"{n:03d}.bin", ids) if conn.name == PLANTED_SLOTS else {}
                    )
                    params = {"restore": server.slot(0, "restore", f"{n:03d}.bin"), **planted}
                out.append(self.request(server, ids, "reuse", rid, params=params))
            return out
        finally:
            server.stop()

    def donate(self, server, ids: list[int], rid: str) -> dict:
        """LlamaServerCacheReuse: the slot erased and the donor sent alone, so that the reuse finds the probe's first
        insert_at tokens at their own positions and the rest of its prompt after the inserted tokens. Returns what
        the report keeps of it (kv_transfer_params.cache_reuse): the setting, where the donor's insertion was and
        how long (a reuse past insert_at can only have been shifted by inserted_tokens positions)."""
        min_chunk, at, _ = self.cache_reuse
        server.slot(0, "erase")
        self.prime(server, donor_ids(ids, at, self.inserted), f"{rid}: the donor, {len(self.inserted)} tokens at {at}")
        return {"cache_reuse": {"min_chunk": min_chunk, "insert_at": at, "inserted_tokens": len(self.inserted),
                                "donor_tokens": len(ids) + len(self.inserted)}}  # fmt: skip

    def plant(self, path: Path, ids: list[int]) -> dict:
        """PlantedSlotFault: the saved slot file altered before it is restored, as the binding's PlantedStateFault
        alters its blob (repro.llamacpp.arms.planted_positions: fault zero_blocks, the K and V rows of num_blocks
        blocks from first_block, every layer, among the positions the reuse will keep). Returns what the judge's blame
        reads (kv_transfer_params.planted_fault, as vLLM's planted connector names it)."""
        from repro.llamacpp.arms import PLANTED_FAULTS, planted_positions
        from repro.llamacpp.engine import kept_by_rule

        extra = dict(self.job.arm.connector.extra_config)
        if extra.get("fault", "none") not in PLANTED_FAULTS:
            raise ValueError(f"{PLANTED_SLOTS}: fault {extra.get('fault')!r} is not one of {', '.join(PLANTED_FAULTS)}")
        raw = path.read_bytes()
        blob, tokens, head = read_slot_file(raw)
        zeroed = planted_positions(extra, kept_by_rule(tokens, ids), self.job.engine.block_size)
        if zeroed:
            altered = seqstate.zero_positions(seqstate.parse(blob), zeroed)
            path.write_bytes(raw[:head] + altered[8:])  # the file's header and tokens, as saved
        blocks = sorted({q // self.job.engine.block_size for q in zeroed})
        return {"planted_fault": {"fault": extra.get("fault", "none"), "faulted_blocks": blocks}}

    def scenario(self, ids_of: dict[str, list[int]]) -> ScenarioResult:
        server = self.start()
        try:
            requests = []
            for s, step in enumerate(self.job.scenario.steps):
                if step.wait_s:
                    time.sleep(step.wait_s)
                names = list(step.submit)

                def one(name: str, s=s) -> StepRequest:
                    return StepRequest(s, name, self.request(server, ids_of[name], None, f"{name}@{s}", slot=None))

                if step.together and len(names) > 1:
                    with ThreadPoolExecutor(len(names)) as pool:
                        requests.extend(pool.map(one, names))
                else:
                    requests.extend(one(name) for name in names)
        finally:
            server.stop()
        why = "unavailable: llama-server counts no preemptions (a slot holds its request until it ends)"
        return ScenarioResult(self.job.scenario.name, tuple(requests), None, why)


def server_versions() -> dict:
    """The llama-server that ran: what it says of itself, its SHA-256, and the kit's build record of it (or why none)."""
    import hashlib
    import json

    from repro.llamacpp.build import SERVER_STAMP

    binary = srv.binary_path()
    try:
        with open(os.path.join(os.path.dirname(os.path.dirname(binary)), SERVER_STAMP), encoding="utf-8") as fh:
            record = json.load(fh)
    except (OSError, ValueError) as exc:
        record = f"unavailable: {type(exc).__name__} (a llama-server the kit did not install)"
    with open(binary, "rb") as fh:
        digest = hashlib.sha256(fh.read()).hexdigest()
    return {"llama_server": srv.version(binary), "llama_server_sha256": digest, "llama_server_build": record}


class Prompts:
    """Prompts as token IDs from the GGUF's own vocabulary and chat template: the binding loads the vocabulary only
    (no weights), llama-server is sent the IDs."""

    def __init__(self, model: str):
        import llama_cpp

        from repro.llamacpp.engine import GgufTokenizer

        self.tokenizer = GgufTokenizer(llama_cpp.Llama(model_path=model, vocab_only=True, verbose=False))

    def prompt_ids(self, prompt: dict) -> tuple[list[int], list[dict] | None]:
        from repro.llamacpp.engine import prompt_ids

        return prompt_ids(self.tokenizer, prompt)


def run(job: Job, audit) -> tuple[list[ProbeResult], dict, ScenarioResult | None, dict]:
    """The arm's requests on llama-server; (probes, facts, scenario result, versions)."""
    from repro.llamacpp.arms import refused

    if (why := refused(job)) is not None:
        raise ValueError(why)
    conn = job.arm.connector
    own = conn is None or "store_dir" not in conn.extra_config
    slot_dir = tempfile.mkdtemp(prefix="kvkit-llama-slots-") if own else conn.extra_config["store_dir"]
    os.makedirs(slot_dir, exist_ok=True)
    try:
        arm = ServedArm(job, audit, slot_dir, len(os.sched_getaffinity(0)))
        prompts = Prompts(job.engine.model)
        if arm.cache_reuse is not None:
            arm.inserted = prompts.tokenizer.encode(arm.cache_reuse[2])
        ids_of = {p.name: prompts.prompt_ids(p.prompt) for p in job.probes}
        if job.scenario is not None:
            scenario = arm.scenario({name: ids for name, (ids, _) in ids_of.items()})
            probes = [ProbeResult(p.name, tuple(ids_of[p.name][0]), ids_of[p.name][1], ()) for p in job.probes]
        else:
            scenario, probes = None, []
            for n, probe in enumerate(job.probes):
                ids, messages = ids_of[probe.name]
                probes.append(ProbeResult(probe.name, tuple(ids), messages, tuple(arm.probe(n, probe, ids))))
        facts = {"frontend": "llama-server", "server_argv": arm.argv, "cache_prompt": arm.cache_prompt,
                 **{k: v for k, v in arm.facts.items() if v}}  # fmt: skip
        return probes, facts, scenario, server_versions()
    finally:
        if own:
            shutil.rmtree(slot_dir, ignore_errors=True)
