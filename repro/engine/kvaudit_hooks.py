"""The KV audit's hooks (AuditHooks): what the audit reads in each connector hook, and when.

repro.engine.kvaudit's two connectors mix AuditHooks in before the connector class they audit.

What it reads, and when:
  scheduler side  get_num_new_matched_tokens whether the connector loads asynchronously, and the
                  local hit it was shown; update_state_after_alloc the external tokens it will load;
                  build_connector_meta (where a new request's num_computed_tokens is its local
                  prefix-cache hit plus those external tokens) wraps the connector's own metadata
                  with each newly scheduled request's block IDs and counts (AuditMetadata).
                  bind_connector_metadata hands the wrapped connector its own metadata back, so it
                  sees exactly what it built.
  worker side     wait_for_layer_load(layer), after the connector's own wait (a layer-wise loader
                  has finished that layer then; a synchronous one finished in start_load_kv): the
                  full blocks that hold the reused prefix. wait_for_save, after the connector's own, at
                  the end of the step: the full prompt blocks this step computed, every layer (requests
                  that reused nothing: the baseline's reference and each arm's cold prefill), as they are
                  once the step's every write landed: a connector that writes into them after the
                  forward without counting a load shows there.

An asynchronous load (get_num_new_matched_tokens returned (n, True); LMCache's MP connector, NIXL) is
read the same way, one promotion later. vLLM (0.26, 0.28 and 0.32 alike) then parks the request
in WAITING_FOR_REMOTE_KVS, where it is not in scheduled_new_reqs, while the connector loads; the worker reports
the load done (below); the scheduler promotes the request and schedules it as new, with num_computed_tokens = the
loaded tokens, and update_state_after_alloc is called a second time with 0. So the scheduler side keeps the first
nonzero external count from the allocation that started the load (_audit_pending) and describes the request when
it is promoted; the worker side remembers every id its connector reported received, and reads the blocks after
wait_for_layer_load of the first forward step that computes the request: exactly what attention reads. Since
vLLM 0.29 (#53333) a step with no synchronous load starts its loads after the forward launch; the audit reads
nothing of a load in the step that starts it, so that changes nothing here.

How the worker reports a load done depends on what the installed vLLM's worker calls (probed on the connector
class, never from a version): before 0.30, get_finished's second set; from 0.30, get_transfer_results
(KVConnectorTransferResults: finished_recving, and failed_recving for a receive that failed, which vLLM lists
as finished too so that the scheduler releases the request). The base class's get_transfer_results calls
get_finished, but MultiConnector, NixlConnector and Mooncake override it, so the audit wraps both and counts
one report per worker call (_audit_get_finished, _audit_get_transfer_results). A request promoted without this
worker having seen its load reported stays unavailable, with that reason; one whose receive was reported failed
is never read as loaded: its record says the receive failed and, where vLLM still counted tokens beyond its own
prefix-cache hit as computed, that a failed load was counted as a hit.

Each block is written as [2, elements]: plane 0 is K, plane 1 is V, split by the backend's layout
(repro.engine.kv_blocks.LAYOUTS). Files go to the audit directory (AUDIT_DIR_ENV) as
`<seq>.<kind>.<layer>.pt` (all of one request's blocks of one layer), with `<seq>.json` describing
the request; the child maps requests to seq numbers in submission order. The comparison runs later,
in its own process (repro.engine.kvcompare). An audit failure never reaches the engine: it is written
to `<seq>.json` or `audit-error.json` and the audit stops recording.

Each `<seq>.json` also carries `worker` (repro.engine.worker_facts): what the worker process runs
with, vLLM's batch-invariant flags, its attention backends, the device's compute capability and
PYTHONHASHSEED, read there because only the worker knows (the engine child gathers them into its result).
"""

from __future__ import annotations

import json
import os
import traceback
from dataclasses import dataclass, field
from typing import Any

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorMetadata

from repro.contract.result import LOAD_ERRORS_PREFIX
from repro.engine.kv_blocks import detect_layout, layer_order, prompt_sha256, split_planes
from repro.engine.worker_facts import worker_facts

AUDIT_DIR_ENV = "KVKIT_KV_AUDIT_DIR"
# What one engine process's audit may write before it stops recording (it says so in audit-error.*.json;
# the arm's later requests are then unaudited, never judged). The largest legitimate output, by arithmetic:
# the reference model (Qwen3-0.6B: 28 layers, 8 KV heads x 128 x K,V x float16 = 4 KiB a token and layer,
# 112 KiB a token) at a 2048-token max_model_len is 224 MiB a request, written once per request; a plain
# arm's 16 requests (4 probes x a cold request and 3 reuses) 3.5 GiB. The default is twice that.
MAX_BYTES_ENV = "KVKIT_KV_AUDIT_MAX_BYTES"
DEFAULT_MAX_BYTES = 8 * 1024**3


def max_bytes_from_env(environ) -> int:
    """The audit's write limit: MAX_BYTES_ENV when it is a positive integer, else DEFAULT_MAX_BYTES."""
    try:
        value = int(environ.get(MAX_BYTES_ENV) or 0)
    except ValueError:
        value = 0
    return value if value > 0 else DEFAULT_MAX_BYTES


@dataclass
class AuditRequest:
    """One newly scheduled request, as the scheduler saw it."""

    seq: int
    req_id: str
    prompt_sha256: str
    prompt_len: int
    block_ids: list[int]
    local_tokens: int  # prefix-cache hit (block-aligned)
    external_tokens: int  # what the connector said it loads (for an asynchronous load: the first nonzero count)
    scheduled_tokens: int
    async_load: bool
    # num_computed_tokens as scheduled: after an asynchronous load, what vLLM counts as loaded (less than
    # local + external after a load error, one less on a full-prompt hit); None in older records
    computed_tokens: int | None = None
    # MultiConnector: the member it chose to load this request ({"index", "connector"}), None when none loaded
    member: dict | None = None

    def reused_blocks(self, block_size: int) -> list[int]:
        """Indices (within the prompt) of the full blocks whose KV was reused, not computed."""
        reused = self.local_tokens + self.external_tokens
        if self.computed_tokens is not None:
            reused = min(reused, self.computed_tokens)
        return list(range(reused // block_size))

    def computed_blocks(self, block_size: int) -> list[int]:
        """Full prompt blocks this step computed; only for a request that reused nothing."""
        if self.local_tokens + self.external_tokens:
            return []
        end = min(self.prompt_len, self.scheduled_tokens)
        return list(range(end // block_size))


@dataclass
class AuditMetadata(KVConnectorMetadata):
    inner: Any = None  # the wrapped connector's own metadata
    requests: list[AuditRequest] = field(default_factory=list)


# How a worker reports an asynchronous load done, by what its connector class offers (the audited class's hooks
# the audit wraps, repro.engine.kvaudit.make_wrapped): vLLM 0.30 added get_transfer_results, and with it
# failed_recving; before it get_finished was the only report.
HOOKS_BEFORE_030 = ("get_finished",)
HOOKS_SINCE_030 = ("get_transfer_results", "get_finished")
# What a record of an asynchronous load says when this vLLM reports no receive failure apart from its completion.
NO_FAILED_RECVING = (
    "unavailable: this vLLM's connector API has no get_transfer_results (vLLM 0.30 added it, with failed_recving): "
    "a receive that failed is reported finished like one that succeeded"
)


class AuditHooks:
    """The audit's half of every hook; mixed in before the connector class it audits."""

    _audit_target_name: str | None = None
    _audit_completion_hooks: tuple[str, ...] = HOOKS_BEFORE_030
    # worker: get_transfer_results calls under way (the base class's calls get_finished: one report, not two), and
    # the reports taken so far (a get_finished that called get_transfer_results inside took its report from it)
    _audit_transfer_depth = 0
    _audit_transfer_reports = 0

    def _audit_init(self, vllm_config, role) -> None:
        self._audit_dir = os.environ.get(AUDIT_DIR_ENV) or None
        self._audit_bs = vllm_config.cache_config.block_size
        self._audit_head = vllm_config.model_config.get_head_size()
        self._audit_role = role
        self._audit_async: dict[str, bool] = {}
        self._audit_local: dict[str, int] = {}  # the local hit get_num_new_matched_tokens was shown
        self._audit_external: dict[str, int] = {}
        self._audit_pending: dict[str, tuple[int, int]] = {}  # async load started: (local, external)
        self._audit_members: dict[str, dict] = {}  # MultiConnector: the member chosen to load each request
        self._audit_received: dict[str, str] = {}  # worker: ids reported loaded -> the hook that reported it
        self._audit_failed: set[str] = set()  # worker: ids whose receive was reported failed (failed_recving)
        self._audit_seq = 0
        self._audit_seqs: dict[str, int] = {}  # scheduler: each request id's seq, given at its first scheduling
        self._audit_bytes = 0  # worker: what this process has written
        self._audit_max_bytes = max_bytes_from_env(os.environ)
        self._audit_kv: dict[str, torch.Tensor] = {}
        self._audit_layout: str | None = None
        self._audit_layout_problem: str | None = None
        self._audit_reqs: list[AuditRequest] = []
        self._audit_written: set[int] = set()
        self._audit_blind: set[int] = set()  # seqs described as unavailable: never read
        # worker: each block ID a read request reused -> (its seq, the block's index in its prompt), the latest reader
        self._audit_owner: dict[int, tuple[int, int]] = {}
        self._audit_dead = self._audit_dir is None

    def _audit_fail(self, where: str) -> None:
        """Record an audit failure (the exception being handled) and stop auditing; the engine goes on untouched."""
        self._audit_stop(where, traceback.format_exc(limit=8)[-4000:])

    def _audit_stop(self, where: str, message: str) -> None:
        """Stop auditing and say why in audit-error.<pid>.json; the engine goes on untouched."""
        self._audit_dead = True
        try:
            path = os.path.join(self._audit_dir, f"audit-error.{os.getpid()}.json")
            with open(path, "w", encoding="utf-8") as fh:
                json.dump({"where": where, "error": message}, fh)
        except Exception:  # noqa: BLE001 - nothing more to do without a directory
            traceback.print_exc()

    # ---- scheduler side
    def _audit_matched(self, request, num_computed_tokens, result) -> None:
        if self._audit_dead:
            return
        try:
            self._audit_async[request.request_id] = bool(result[1]) if result else False
            self._audit_local[request.request_id] = int(num_computed_tokens or 0)
            self._audit_note_member(request.request_id, result)
        except Exception:  # noqa: BLE001
            self._audit_fail("get_num_new_matched_tokens")

    def _audit_note_member(self, rid: str, result) -> None:
        """MultiConnector (vLLM 0.26, 0.28 and 0.32 alike) records the member it will load a request from in
        _requests_to_connector when that member reports hits: read it right after it chose."""
        chosen = getattr(self, "_requests_to_connector", None)
        if chosen is None or not result or not result[0]:
            return
        index = chosen.get(rid)
        if index is not None:
            member = self._connectors[index]
            self._audit_members[rid] = {"index": int(index), "connector": type(member).__name__}

    def _audit_alloc(self, request, num_external_tokens) -> None:
        """An allocation that starts an asynchronous load keeps its counts until the request is
        promoted; the promotion's own allocation passes 0 and changes nothing."""
        if self._audit_dead:
            return
        try:
            rid, ext = request.request_id, int(num_external_tokens or 0)
            self._audit_external[rid] = ext
            if ext and self._audit_async.get(rid) and rid not in self._audit_pending:
                self._audit_pending[rid] = (self._audit_local.get(rid, 0), ext)
        except Exception:  # noqa: BLE001
            self._audit_fail("update_state_after_alloc")

    def _audit_counts(self, req) -> tuple[int, int, bool]:
        """(local, external, asynchronous) for a newly scheduled request; forgets it."""
        rid, computed = req.req_id, int(req.num_computed_tokens)
        pending = self._audit_pending.pop(rid, None)
        ext = self._audit_external.pop(rid, 0)
        self._audit_async.pop(rid, None)
        self._audit_local.pop(rid, None)
        if pending is None:  # loaded in this step, or not at all: num_computed_tokens is local + external
            return computed - ext, ext, False
        local, ext = pending
        return min(local, computed), ext, True

    def _audit_meta(self, scheduler_output, inner) -> AuditMetadata:
        meta = AuditMetadata(inner=inner)
        if self._audit_dead:
            return meta
        try:
            for req in scheduler_output.scheduled_new_reqs:
                local, ext, is_async = self._audit_counts(req)
                member = self._audit_members.pop(str(req.req_id), None)
                if str(req.req_id) in self._audit_seqs:
                    # a request resumed after preemption: under vLLM's model runner v2 (what the H200 runs, 0.26
                    # and 0.28 alike) vLLM 0.28's scheduler sends it as new again. Its first record stands and it
                    # is not read again: one record per request, and a request preempted over and over cannot
                    # write its blocks over and over (on an H200 a preemption scenario's run dir grew about
                    # 450 MB/s until the disk was full)
                    continue
                self._audit_seqs[str(req.req_id)] = self._audit_seq
                tokens = list(req.prompt_token_ids or [])
                meta.requests.append(
                    AuditRequest(
                        seq=self._audit_seq,
                        req_id=str(req.req_id),
                        prompt_sha256=prompt_sha256(tokens),
                        prompt_len=len(tokens),
                        block_ids=[int(b) for b in req.block_ids[0]],
                        local_tokens=int(local),
                        external_tokens=int(ext),
                        scheduled_tokens=int(req.num_computed_tokens)
                        + int(scheduler_output.num_scheduled_tokens[req.req_id]),
                        async_load=is_async,
                        computed_tokens=int(req.num_computed_tokens),
                        member=member if ext else None,
                    )
                )
                self._audit_seq += 1
        except Exception:  # noqa: BLE001
            self._audit_fail("build_connector_meta")
            meta.requests = []
        return meta

    # ---- worker side
    def _audit_register(self, kv_caches) -> None:
        if self._audit_dead:
            return
        try:
            self._audit_kv = dict(sorted(kv_caches.items(), key=lambda item: layer_order(item[0])))
            first = next(iter(self._audit_kv.values()))
            nb = getattr(getattr(self, "_kv_cache_config", None), "num_blocks", None)
            self._audit_layout = detect_layout(first, nb, self._audit_head)
            if self._audit_layout is None:
                self._audit_layout_problem = (
                    f"KV layout not recognised: shape {tuple(first.shape)} on {first.device.type}, "
                    f"head size {self._audit_head}, {nb} blocks"
                )
            self._audit_shape = list(first.shape)
            self._audit_dtype = str(first.dtype).replace("torch.", "")
        except Exception:  # noqa: BLE001
            self._audit_fail("register_kv_caches")

    def _audit_get_finished(self, call, finished_req_ids):
        """The connector's get_finished, `call`, through the audit: its received ids count unless a
        get_transfer_results report covers this call (under way around it, or taken inside it)."""
        taken = self._audit_transfer_reports
        out = call(self, finished_req_ids)
        if not self._audit_transfer_depth and taken == self._audit_transfer_reports:
            self._audit_finished(out)
        return out

    def _audit_get_transfer_results(self, call, finished_req_ids):
        """The connector's get_transfer_results, `call`, through the audit: the outermost call's report counts."""
        self._audit_transfer_depth += 1
        try:
            out = call(self, finished_req_ids)
        finally:
            self._audit_transfer_depth -= 1
        if not self._audit_transfer_depth:
            self._audit_transfer_reports += 1
            self._audit_transferred(out)
        return out

    def _audit_finished(self, result) -> None:
        """The ids get_finished reported received: their asynchronous loads are complete."""
        if self._audit_dead:
            return
        try:
            received = result[1] if result else None
            self._audit_note_received({str(rid) for rid in received or ()}, set(), "get_finished")
        except Exception:  # noqa: BLE001
            self._audit_fail("get_finished")

    def _audit_transferred(self, results) -> None:
        """What get_transfer_results reported: loads complete (finished_recving) and receives that failed
        (failed_recving; vLLM lists those as finished too, and a failed one is counted whether or not it is)."""
        if self._audit_dead:
            return
        try:
            failed = {str(rid) for rid in getattr(results, "failed_recving", None) or ()}
            done = {str(rid) for rid in getattr(results, "finished_recving", None) or ()}
            self._audit_note_received(done | failed, failed, "get_transfer_results")
        except Exception:  # noqa: BLE001
            self._audit_fail("get_transfer_results")

    def _audit_note_received(self, done: set[str], failed: set[str], hook: str) -> None:
        """A report's receives; the latest report of an id stands: one that succeeded after a failed one is a
        retried load (vLLM's recompute policy frees the request's blocks and may load it again)."""
        for rid in done:
            self._audit_received[rid] = hook
            if rid in failed:
                self._audit_failed.add(rid)
            else:
                self._audit_failed.discard(rid)

    def _audit_bind(self, metadata):
        """Remember our part; return the wrapped connector's own metadata."""
        if isinstance(metadata, AuditMetadata):
            if not self._audit_dead:
                try:
                    self._audit_reqs = [r for r in metadata.requests if self._audit_describe(r)]
                    for r in self._audit_reqs:
                        for i in r.reused_blocks(self._audit_bs):
                            self._audit_owner[r.block_ids[i]] = (r.seq, i)
                except Exception:  # noqa: BLE001
                    self._audit_reqs = []
                    self._audit_fail("bind_connector_metadata")
            return metadata.inner
        return metadata

    def _audit_load_errors(self, block_ids) -> None:
        """The blocks the connector reported to vLLM as not loaded (get_block_ids_with_load_errors, asked after the
        forward; an asynchronous load's may come in a later one): each as its reader's prompt index, in
        load-errors.<seq>.json (repro.engine.audit_records attaches them to the request's record). vLLM's
        kv_load_failure_policy decides what follows (fail: the request ends in an error; recompute: vLLM discards the
        step that read them and computes from the first of them), so the judge reads them as reported, never as a
        silent finding (repro.judge.kvaudit)."""
        if self._audit_dead or not block_ids:
            return
        try:
            by_seq: dict[int, set[int]] = {}
            for b in block_ids:
                if (owner := self._audit_owner.get(int(b))) is not None:
                    by_seq.setdefault(owner[0], set()).add(owner[1])
            for seq, idx in by_seq.items():
                path = os.path.join(self._audit_dir, f"{LOAD_ERRORS_PREFIX}{seq:06d}.json")
                if os.path.exists(path):
                    with open(path, encoding="utf-8") as fh:
                        idx |= set(json.load(fh)["blocks"])
                with open(path + ".tmp", "w", encoding="utf-8") as fh:
                    json.dump({"seq": seq, "blocks": sorted(idx), "hook": "get_block_ids_with_load_errors"}, fh)
                os.replace(path + ".tmp", path)
        except Exception:  # noqa: BLE001
            self._audit_fail("get_block_ids_with_load_errors")

    def _audit_describe(self, r: AuditRequest) -> bool:
        """Write the request's record once; whether its blocks are to be read."""
        if r.seq in self._audit_written:
            return r.seq not in self._audit_blind
        self._audit_written.add(r.seq)
        reason, signalled, failed, by = None, None, None, None
        if r.async_load:
            # the scheduler promotes on the workers' reports; this worker's own report is the proof that the
            # bytes are in place before this step's forward, and a failed receive's blocks are never read
            by = self._audit_received.pop(r.req_id, None)
            signalled, failed = by is not None, r.req_id in self._audit_failed
            self._audit_failed.discard(r.req_id)
            if failed:
                reason = self._audit_failed_reason(r)
            elif not signalled:
                reason = (
                    f"the connector loads asynchronously and this worker's {' / '.join(self._audit_completion_hooks)} "
                    "never reported the request's load finished: the audit cannot tell when the load completed"
                )
            if "get_transfer_results" not in self._audit_completion_hooks:
                failed = NO_FAILED_RECVING
        if reason is None and self._audit_layout is None:
            reason = self._audit_layout_problem or "no KV tensors were registered"
        record = {
            "seq": r.seq,
            "req_id": r.req_id,
            "prompt_sha256": r.prompt_sha256,
            "prompt_len": r.prompt_len,
            "block_size": self._audit_bs,
            "local_tokens": r.local_tokens,
            "external_tokens": r.external_tokens,
            "computed_tokens": r.computed_tokens,
            "async_load": r.async_load,
            "load_finished_reported": signalled,
            "load_reported_by": by,
            "load_failed_reported": failed,
            "reused_blocks": len(r.reused_blocks(self._audit_bs)),
            "computed_blocks": len(r.computed_blocks(self._audit_bs)),
            "layers": list(self._audit_kv),
            "layout": self._audit_layout,
            "kv_shape": getattr(self, "_audit_shape", None),
            "dtype": getattr(self, "_audit_dtype", None),
            "unavailable": reason,
            "pid": os.getpid(),
            "connector_member": r.member,
            "worker": self._audit_worker(),
        }
        path = os.path.join(self._audit_dir, f"{r.seq:06d}.json")
        tmp = path + ".tmp"
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump(record, fh, sort_keys=True)
        os.replace(tmp, path)
        if reason is not None:
            self._audit_blind.add(r.seq)
        return reason is None

    def _audit_failed_reason(self, r: AuditRequest) -> str:
        """Why a request whose receive this worker's connector reported failed is not read."""
        said = "the connector reported this request's receive failed (failed_recving)"
        computed = r.computed_tokens if r.computed_tokens is not None else r.local_tokens + r.external_tokens
        beyond = computed - r.local_tokens
        if beyond > 0:
            return (
                f"{said}, yet vLLM scheduled it with {computed} tokens counted as computed, {beyond} beyond its own "
                f"prefix-cache hit of {r.local_tokens}: a failed load counted as a hit; the audit does not read "
                "blocks a failed receive left"
            )
        return (
            f"{said} and vLLM recomputed it ({computed} tokens counted as computed, its own prefix-cache hit): "
            "no received block to audit"
        )

    def _audit_worker(self) -> dict:
        """What this worker process runs with, read once it has served a request (see worker_facts)."""
        facts = getattr(self, "_audit_worker_facts", None)
        if facts is None:
            try:
                facts = worker_facts(getattr(self, "_vllm_config", None))
            except Exception as exc:  # noqa: BLE001 - the facts never stop the audit
                facts = {"pid": os.getpid(), "problems": [f"worker facts: {type(exc).__name__}: {exc}"[:200]]}
            self._audit_worker_facts = facts
        return facts

    def _audit_write_computed(self) -> None:
        for layer_name in list(self._audit_kv):
            self._audit_write(layer_name, "computed")

    def _audit_write(self, layer_name: str, kind: str) -> None:
        if self._audit_dead or self._audit_layout is None or not self._audit_reqs:
            return
        try:
            kv = self._audit_kv.get(layer_name)
            if kv is None:
                return
            li = list(self._audit_kv).index(layer_name)
            for r in self._audit_reqs:
                idx = r.reused_blocks(self._audit_bs) if kind == "reused" else r.computed_blocks(self._audit_bs)
                if not idx:
                    continue
                blob = split_planes(kv, [r.block_ids[i] for i in idx], self._audit_layout)
                path = os.path.join(self._audit_dir, f"{r.seq:06d}.{kind}.{li:03d}.pt")
                torch.save(blob, path + ".tmp")
                os.replace(path + ".tmp", path)
                self._audit_bytes += os.path.getsize(path)
                if self._audit_bytes > self._audit_max_bytes:
                    self._audit_stop(
                        f"{kind} {layer_name}",
                        f"the audit stopped recording: this process had written {self._audit_bytes} bytes of KV, "
                        f"over its limit of {self._audit_max_bytes} ({MAX_BYTES_ENV}); later requests are unaudited",
                    )
                    return
        except Exception:  # noqa: BLE001
            self._audit_fail(f"{kind} {layer_name}")
