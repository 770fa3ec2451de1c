"""PlantedFaultConnector: stores KV faithfully, corrupts it on load, and says it loaded it all.

A positive control for the verifier. It behaves like a working external KV cache (block-granular
prefix keys, counted hits, `kv_transfer_params` saying how many tokens were loaded) while the
load path applies one configured fault. Blocks are copied whole (`kv[block_id]`), which assumes a
per-layer KV tensor indexed by block first: vLLM's CPU backend, whose layout is
(num_blocks, num_kv_heads, block_size, 2 * head_size). Per head, that memory is all the block's
K rows (block_size x head_size) followed by all its V rows: the backend views it as
(num_kv_heads, 2 * block_size, head_size) and splits dim 1 in two (cpu_attn.py).

Configure through `kv_connector_extra_config`:
  store_dir    directory for stored blocks (a fresh one per arm; the runner makes it)
  fault        one of FAULTS (below)
  first_block  first loaded block the fault touches; negative counts from the end of the loaded
               blocks (-1 is the last one). Default 0, and -num_blocks for the two tail faults.
  num_blocks   how many blocks it touches (default 16, i.e. 256 tokens at block size 16)
  layer        layer index (model order) for corrupt_layer (default 0)
  scale        standard deviation of the noise for corrupt_layer / overwrite_tail (default 1.0)
  audit_path   optional JSON-lines file: one line per load with the faulted blocks and how far
               each loaded block ended up from the KV its request computed (max |difference|; for a
               failed store, against the whole block kept beside its partial save), so a harness can
               show that a fault really changed what attention reads, and which faulted blocks it left
               right all the same (unchanged_blocks: not written, yet already holding the right KV)

The faults, each a bug class seen in KV offloading code:
  none           faithful load (a no-fault control)
  zero_blocks    the chunk arrives as zeros (a transfer that never filled its buffer)
  shift_blocks   off by one block: block j gets block j+1's KV (the last loaded block, which has
                 no successor among the loaded ones, gets block j-1's); keys carry RoPE of the
                 wrong positions
  stale          block j gets block j of the most recently stored *other* prompt that has a
                 block j with different content (a stale chunk served for a colliding or
                 reused slot); when no such prompt is stored the block loads faithfully and is
                 not reported as faulted
  other_prompt   every loaded block gets its source as stale picks it (first_block and num_blocks do
                 not apply): the request runs on another prompt's stored KV at the same positions,
                 usually the previous probe's (a prefix served under another prompt's key); only its
                 own last partial block is computed. Its answer may be that prompt's (a replay)
  reverse_blocks the touched blocks in reverse order: block first+i gets block first+k-1-i's KV (k touched; the
                 middle one of an odd k keeps its own and is not reported as faulted). With num_blocks at least
                 the loaded count, a complete permutation of the loaded prefix: every key and value is there,
                 each with the rotary position it was computed at, in another slot
  shift_beyond   the connector reports a hit on the first num_blocks stored blocks only, and loaded block j
                 gets block j + n (n loaded) of the same prompt: the reused slots hold the prompt's blocks from
                 beyond the reused prefix, which it then computes again itself (those keys twice, the prefix's
                 own missing); a block with no stored block n further on loads faithfully, not faulted
  swap_kv        K and V exchanged within each head (a transposed K/V layout)
  corrupt_layer  Gaussian noise added to one layer's K and V only (a per-layer offset bug)
  overwrite_tail the last num_blocks loaded blocks (a partial last chunk) overwritten with noise
  drop_tail      the last num_blocks loaded blocks are never written but still counted as a hit:
                 attention reads whatever the freshly allocated blocks held
  land_elsewhere a load that lands in a block another request still reads: every load is faithful, but where
                 a scheduler step loads for two or more requests (the gates permitting), the step's last load
                 also writes its first block into the first loaded block of the step's first load, which that
                 request then reads (vLLM #47282's shape: a block reused as a load destination while compute
                 still reads it). The loader reports `landed_in`, the request whose block it overwrote
                 `overwritten_by` (and that block), in their kv_transfer_params. One request at a time never
                 shows it; with when "in_flight" and in_flight_min 16 only a step with 16 requests in flight does.

  dropped_load, failed_store, late_load, load_error, unreported_load
                 failures reported as success (a load or store that failed while the connector counts it served):
                 repro.engine.connectors.planted_failures says what each does, with its settings (async_load,
                 stored_layers, load_failure_policy)

Gates (repro.engine.connectors.planted_gates): optional conditions under which a load's fault applies
at all ("when": always, contended, in_flight or after_eviction; "once_in": one engine of an arm's
trials); each load's gate figures go in its audit line and in `kv_transfer_params["planted_fault"]["gate"]`.

The scheduler side decides which blocks a load faults (and their sources) and evaluates the gates,
so `kv_transfer_params["planted_fault"]` reports exactly what the worker did.

Preemption: a request preempted and resumed asks the connector again (its computed tokens went with
its blocks) and is promised its prompt's stored blocks; vLLM's V1 model runner then sends it among
scheduler_output.scheduled_cached_reqs (resumed_req_ids, all its block IDs anew), not among the new
ones, and the connector loads it there, the fault and gates applying as to any load. Its
kv_transfer_params then also carry "loads" (each load in order: loaded_tokens, faulted_blocks,
resumed, gate) and faulted_blocks is their union; its audit line says "resumed": true.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass, field
from typing import Any

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
)

from repro.engine.connectors.planted_failures import (
    FAILURE_FAULTS,
    UNWRITTEN_FAULTS,
    ReportedSuccess,
    block_range,
    stored_layer_count,
)
from repro.engine.connectors.planted_gates import LoadGates, in_flight_figures

FAULTS = (
    "none",
    "zero_blocks",
    "shift_blocks",
    "stale",
    "swap_kv",
    "corrupt_layer",
    "overwrite_tail",
    "drop_tail",
    "other_prompt",
    "reverse_blocks",
    "shift_beyond",
    "land_elsewhere",
    *FAILURE_FAULTS,
)
# Loads whose touched blocks are never written (what the blocks held stays); load_error also reports them to vLLM.
NOT_WRITTEN = ("drop_tail", "load_error", *UNWRITTEN_FAULTS)
# failed_store: the whole block as computed, kept beside its partial save for the load audit alone (never loaded)
TRUTH_SUFFIX = ".truth"
TAIL_FAULTS = ("overwrite_tail", "drop_tail")


def faulted_indices(fault: str, first_block: int | None, num_blocks: int, n_loaded: int) -> list[int]:
    """Indices among the n_loaded blocks of one load that the fault touches."""
    # land_elsewhere: the loader's own blocks load faithfully (another request's do not); failed_store: the blocks
    # whose store broke (the scheduler knows them); unreported_load: no load at all
    if fault in ("none", "land_elsewhere", "failed_store", "unreported_load") or n_loaded <= 0 or num_blocks <= 0:
        return []
    if fault in ("other_prompt", *UNWRITTEN_FAULTS):
        return list(range(n_loaded))
    return block_range(first_block, num_blocks, n_loaded, fault in TAIL_FAULTS)


def _layer_order(name: str) -> tuple:
    """Model order for layer names: 'layers.10' after 'layers.9' (plain sorting would not)."""
    return tuple(int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name))


@dataclass
class _Op:
    req_id: str
    kind: str  # "store" | "load"
    keys: list[str]
    block_ids: list[int]
    first_loaded_block: int = 0  # index of keys[0] within the prompt's blocks
    faulted: list[int] = field(default_factory=list)  # indices into keys/block_ids
    sources: dict[int, str] = field(default_factory=dict)  # faulted index -> key its bytes come from
    gate: dict | None = None  # why the gates let this load's fault apply or not (None: no gate set)
    resumed: bool = False  # a load on resuming after preemption
    prompt_keys: list[str] = field(default_factory=list)  # shift_beyond: every block key of the prompt
    lands_in: int | None = None  # land_elsewhere: another request's block this load also writes its first block into
    async_load: bool = False  # an asynchronous load: reported received in the get_finished of the step that starts it
    late: bool = False  # late_load: its bytes are written after the request's first forward (a "write_after" op)


@dataclass
class PlantedFaultMetadata(KVConnectorMetadata):
    ops: list[_Op] = field(default_factory=list)


class PlantedFaultConnector(ReportedSuccess, LoadGates, KVConnectorBase_V1):
    def __init__(self, vllm_config, role: KVConnectorRole, kv_cache_config=None):
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        extra = self._kv_transfer_config.kv_connector_extra_config or {}
        if "store_dir" not in extra:
            raise ValueError("PlantedFaultConnector needs kv_connector_extra_config.store_dir")
        self.store_dir = str(extra["store_dir"])
        self.fault = str(extra.get("fault", "zero_blocks"))
        if self.fault not in FAULTS:
            raise ValueError(f"unknown planted fault {self.fault!r}; choose one of {', '.join(FAULTS)}")
        self.first_block = None if extra.get("first_block") is None else int(extra["first_block"])
        self.num_blocks = int(extra.get("num_blocks", 16))
        self.layer = int(extra.get("layer", 0))
        self.scale = float(extra.get("scale", 1.0))
        self.audit_path = extra.get("audit_path")
        self._init_gates(extra, role)
        self._init_failures(extra, vllm_config)
        self.block_size = vllm_config.cache_config.block_size
        os.makedirs(self.store_dir, exist_ok=True)
        self._external: dict[str, int] = {}
        self._loaded: dict[str, list[tuple]] = {}  # request -> its loads: (tokens, faulted, gate, resumed)
        self._resume_prompts: dict[str, list[int]] = {}  # prompt of a request promised a load, until scheduled
        self._salts: dict[str, str] = {}  # what else a request's block keys hold (_salt), until it finishes
        self._stored_prompts: list[list[str]] = []  # block keys of each stored prompt, oldest first
        self._kv: dict[str, torch.Tensor] = {}
        self._landed: dict[str, dict] = {}  # land_elsewhere: request -> {"landed_in"|"overwritten_by": ..., ...}

    # ---- shared helpers
    def _salt(self, request) -> str:
        """What a request's block keys hold besides its tokens: nothing here (a prompt's KV is keyed by its tokens
        alone, whatever LoRA adapter computed it); repro.engine.connectors.planted_keys may add the adapter."""
        return ""

    def _keys(self, tokens: list[int], n_blocks: int, salt: str = "") -> list[str]:
        """Chained per-block prefix hashes: block i's key covers salt and tokens[: (i+1)*block_size]."""
        h, out = hashlib.sha256(salt.encode()), []
        for i in range(n_blocks):
            h.update(repr(tokens[i * self.block_size : (i + 1) * self.block_size]).encode())
            out.append(h.copy().hexdigest())
        return out

    def _path(self, key: str) -> str:
        return os.path.join(self.store_dir, key + ".pt")

    def _have(self, key: str) -> bool:
        return os.path.exists(self._path(key))

    # ---- scheduler side
    def get_num_new_matched_tokens(self, request, num_computed_tokens: int) -> tuple[int | None, bool]:
        tokens = list(request.prompt_token_ids or [])
        hit = 0
        self._salts[request.request_id] = salt = self._salt(request)
        for key in self._keys(tokens, (len(tokens) - 1) // self.block_size, salt):  # never the last prompt token
            if not self._have(key):
                break
            hit += 1
        if self.fault == "shift_beyond":  # a hit on the first num_blocks only, so that stored blocks lie beyond it
            hit = min(hit, self.num_blocks)
        return self._report_match(request, max(hit * self.block_size - num_computed_tokens, 0), num_computed_tokens)

    def update_state_after_alloc(self, request, blocks, num_external_tokens: int) -> None:
        if num_external_tokens > 0:
            self._external[request.request_id] = num_external_tokens
            self._resume_prompts[request.request_id] = list(request.prompt_token_ids or [])
        self._note_async_alloc(request, blocks, num_external_tokens)

    def _stale_source(self, block: int, key: str) -> str | None:
        """Block `block` of the most recently stored prompt whose block there differs from ours."""
        for keys in reversed(self._stored_prompts):
            if len(keys) > block and keys[block] != key and self._have(keys[block]):
                return keys[block]
        return None

    def _plan_load(self, op: _Op, step: dict | None = None) -> None:
        """Fill op.faulted and op.sources; a sourced fault without a source does not apply, nor does
        one a gate holds back. step: see _gate_load."""
        op.gate = self._gate_load(op, step)
        if self.fault == "failed_store":  # the blocks whose store broke: no gate of a load undoes a store
            op.faulted = [j for j, key in enumerate(op.keys) if key in self._broken]
            return
        if op.gate is not None and not op.gate["apply"]:
            return
        n = len(op.keys)
        for j in faulted_indices(self.fault, self.first_block, self.num_blocks, n):
            if self.fault == "shift_blocks":
                src = j + 1 if j + 1 < n else j - 1
                if src < 0:
                    continue
                op.sources[j] = op.keys[src]
            elif self.fault == "shift_beyond":
                src = op.first_loaded_block + j + n  # the block n further on: beyond the loaded prefix
                if src >= len(op.prompt_keys) or not self._have(op.prompt_keys[src]):
                    continue
                op.sources[j] = op.prompt_keys[src]
            elif self.fault == "reverse_blocks":
                touched = faulted_indices(self.fault, self.first_block, self.num_blocks, n)
                src = touched[0] + touched[-1] - j
                if src == j:  # the middle of an odd run keeps its own block: not faulted
                    continue
                op.sources[j] = op.keys[src]
            elif self.fault in ("stale", "other_prompt"):
                other = self._stale_source(op.first_loaded_block + j, op.keys[j])
                if other is None:
                    continue
                op.sources[j] = other
            op.faulted.append(j)

    def build_connector_meta(self, scheduler_output) -> KVConnectorMetadata:
        meta = PlantedFaultMetadata()
        step = None
        if self.when == "in_flight":
            self._unfinished.update(req.req_id for req in scheduler_output.scheduled_new_reqs)
            step = in_flight_figures(set(scheduler_output.num_scheduled_tokens), self._unfinished, self.in_flight_min)
        for req in scheduler_output.scheduled_new_reqs:
            tokens = list(req.prompt_token_ids or [])
            block_ids = list(req.block_ids[0])
            external = self._external.pop(req.req_id, 0)
            self._resume_prompts.pop(req.req_id, None)
            if external:
                meta.ops.append(self._load_op(req.req_id, tokens, block_ids, req.num_computed_tokens, external, step))
            else:
                done = min(len(tokens), req.num_computed_tokens + scheduler_output.num_scheduled_tokens[req.req_id])
                n = done // self.block_size
                keys = self._keys(tokens, n, self._salts.get(req.req_id, ""))
                todo = [(i, k, b) for i, (k, b) in enumerate(zip(keys, block_ids[:n])) if not self._have(k)]
                if todo:
                    store = _Op(req.req_id, "store", [k for _, k, _ in todo], [b for _, _, b in todo])
                    store.faulted = self._store_faulted([i for i, _, _ in todo], store.keys, n)
                    meta.ops.append(store)
                    self._stored_prompts.append(keys)
                    if self.local_tier is not None:
                        self.local_tier.put(store.keys)
                after = self._after_prefill(req.req_id, tokens, block_ids, done)
                if after is not None:
                    meta.ops.append(after)
        # A request resumed after preemption (vLLM's V1 model runner sends it among the cached requests,
        # with all its block IDs anew) asked the connector again and was promised its prompt's stored
        # blocks: load them, or attention reads whatever its fresh blocks hold.
        cached = scheduler_output.scheduled_cached_reqs
        for i, req_id in enumerate(cached.req_ids):
            if req_id in cached.resumed_req_ids and req_id in self._external:
                external, tokens = self._external.pop(req_id), self._resume_prompts.pop(req_id)
                block_ids = list(cached.new_block_ids[i][0])
                computed = cached.num_computed_tokens[i]
                meta.ops.append(self._load_op(req_id, tokens, block_ids, computed, external, step, resumed=True))
        meta.ops += self._async_loads(step)  # requests waiting for an asynchronous load are not scheduled
        if self.fault == "land_elsewhere":
            self._land_elsewhere(meta.ops)
        return meta

    def _land_elsewhere(self, ops: list[_Op]) -> None:
        """The step's last load also writes into the first loaded block of its first load (the worker loads in
        order, so that write stays): only where the gates let both loads' fault apply."""
        loads = [op for op in ops if op.kind == "load" and op.block_ids and (op.gate is None or op.gate["apply"])]
        if len(loads) < 2:
            return
        victim, loader = loads[0], loads[-1]
        loader.lands_in = victim.block_ids[0]
        self._landed[loader.req_id] = {"landed_in": victim.req_id}
        self._landed[victim.req_id] = {"overwritten_by": loader.req_id, "overwritten_block": victim.first_loaded_block}

    def _new_op(self, req_id: str, kind: str, keys: list[str], block_ids: list[int]) -> _Op:
        """An _Op for the ReportedSuccess mixin's "write_after" ops: planted_failures cannot import this module."""
        return _Op(req_id, kind, keys, block_ids)

    def _load_op(self, req_id, tokens, block_ids, computed: int, external: int, step, resumed: bool = False) -> _Op:
        """Plan one load of `external` tokens after `computed - external` local ones, and remember it for
        the request's kv_transfer_params."""
        local = computed - external
        b0, b1 = local // self.block_size, (local + external) // self.block_size
        salt = self._salts.get(req_id, "")
        op = _Op(req_id, "load", self._keys(tokens, b1, salt)[b0:], block_ids[b0:b1], b0, resumed=resumed)
        if self.fault == "shift_beyond":
            op.prompt_keys = self._keys(tokens, (len(tokens) - 1) // self.block_size, salt)
        self._plan_load(op, step)
        self._loaded.setdefault(req_id, []).append((external, [b0 + j for j in op.faulted], op.gate, op.resumed))
        return op

    def request_finished(self, request, block_ids) -> tuple[bool, dict[str, Any] | None]:
        self._unfinished.discard(request.request_id)
        self._salts.pop(request.request_id, None)
        self._external.pop(request.request_id, None)
        self._resume_prompts.pop(request.request_id, None)
        loads = self._loaded.pop(request.request_id, [(0, [], None, False)])
        loaded, faulted, gate, _ = loads[0]
        report = {"loaded_tokens": loaded, "fault": self.fault, "faulted_blocks": faulted}
        report.update(self._landed.pop(request.request_id, {}))
        report.update(self._failure_report(request.request_id))
        if gate is not None:
            report["gate"] = gate
        if len(loads) > 1 or loads[0][3]:  # loaded again on resuming after preemption: every load, in order
            report["faulted_blocks"] = sorted({b for load in loads for b in load[1]})
            report["loads"] = [
                {"loaded_tokens": n, "faulted_blocks": f, "resumed": r, **({"gate": g} if g is not None else {})}
                for n, f, g, r in loads
            ]
        return False, {"planted_fault": report}

    # ---- worker side
    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        self._kv = dict(sorted(kv_caches.items(), key=lambda item: _layer_order(item[0])))

    def _corrupt(self, blob: torch.Tensor, j: int) -> torch.Tensor:
        """The faulted version of one block, blob: [num_layers, num_kv_heads, block_size, 2*head_size]."""
        if self.fault == "zero_blocks":
            return torch.zeros_like(blob)
        if self.fault == "swap_kv":
            # per head the block is K rows then V rows (see the module docstring): swap the halves
            layers, heads = blob.shape[0], blob.shape[1]
            return blob.reshape(layers, heads, 2, -1).flip(2).reshape(blob.shape).contiguous()
        if self.fault == "corrupt_layer":
            g = torch.Generator().manual_seed(j)
            out = blob.clone()
            out[self.layer] += self.scale * torch.randn(blob.shape[1:], generator=g).to(blob.dtype)
            return out
        if self.fault == "overwrite_tail":
            g = torch.Generator().manual_seed(1000 + j)
            return (self.scale * torch.randn(blob.shape, generator=g)).to(blob.dtype)
        return blob  # shift_blocks, shift_beyond, reverse_blocks, stale and other_prompt: the bytes already come
        # from the wrong block

    def start_load_kv(self, forward_context, **kwargs: Any) -> None:
        layers = list(self._kv.values())
        for op in self._get_connector_metadata().ops:
            if op.kind != "load":
                continue
            faulted, diffs = set(op.faulted), []
            for j, (key, block_id) in enumerate(zip(op.keys, op.block_ids)):
                true = torch.load(self._path(key))  # [num_layers, *block_shape]; fewer layers after a failed store
                truth = self._truth(key, true)  # every layer: what the load should have given, for the audit line
                if j in faulted and self.fault in NOT_WRITTEN:
                    src = None  # counted as loaded, never written (late_load: not yet)
                elif j in faulted:
                    src = self._corrupt(torch.load(self._path(op.sources[j])) if j in op.sources else true, j)
                else:
                    src = true
                if src is not None:
                    self._write_block(layers, block_id, src)
                diff = (
                    float((kv[block_id].cpu() - truth[li]).abs().max()) for li, kv in enumerate(layers[: len(truth)])
                )
                diffs.append(max(diff, default=0.0))
            if self.fault == "load_error":  # vLLM's kv_load_failure_policy takes it from here
                self._load_errors.update(op.block_ids[j] for j in op.faulted)
            if op.async_load:  # reported received in this step, its bytes written or not (late_load)
                self._received.add(op.req_id)
            if op.lands_in is not None:  # land_elsewhere: this load's first block lands in another request's block
                first = torch.load(self._path(op.keys[0]))
                for li, kv in enumerate(layers):
                    kv[op.lands_in].copy_(first[li].to(kv.device))
            self._write_audit(op, diffs)

    def _write_audit(self, op: _Op, diffs: list[float]) -> None:
        if not self.audit_path:
            return
        b0 = op.first_loaded_block
        line = {
            "first_loaded_block": b0,
            "loaded_blocks": len(op.keys),
            "fault": self.fault,
            "faulted_blocks": [b0 + j for j in op.faulted],
            "faulted_max_abs_diff": [[b0 + j, diffs[j]] for j in op.faulted],
            "clean_max_abs_diff": max([d for j, d in enumerate(diffs) if j not in set(op.faulted)], default=0.0),
            # faulted blocks whose bytes the load left right all the same (a block not written that already held
            # this prompt's KV at its own position): the fault did not change what attention reads there
            "unchanged_blocks": [b0 + j for j in op.faulted if diffs[j] == 0.0],
        }
        if op.gate is not None:
            line["gate"] = op.gate
        if op.resumed:
            line["resumed"] = True
        if op.lands_in is not None:
            line["lands_in_block_id"] = op.lands_in
        if op.async_load:
            line["async_load"] = True
        if op.late:
            line["late"] = True
        with open(self.audit_path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(line, sort_keys=True) + "\n")

    def wait_for_layer_load(self, layer_name: str) -> None:
        return

    @staticmethod
    def _save_blob(blob: torch.Tensor, path: str) -> None:
        tmp = path + f".{os.getpid()}.tmp"
        torch.save(blob, tmp)
        os.replace(tmp, path)

    def _truth(self, key: str, stored: torch.Tensor) -> torch.Tensor:
        """The whole block as its request computed it: the stored blob, or for a failed store the copy kept beside it."""
        path = self._path(key) + TRUTH_SUFFIX
        return torch.load(path) if os.path.exists(path) else stored

    def save_kv_layer(self, layer_name: str, kv_layer, attn_metadata, **kwargs: Any) -> None:
        return

    def wait_for_save(self) -> None:
        ops = self._get_connector_metadata().ops
        keep = stored_layer_count(self.stored_layers, len(self._kv))
        for op in ops:
            if op.kind != "store":
                continue
            for j, (key, block_id) in enumerate(zip(op.keys, op.block_ids)):
                blob = torch.stack([kv[block_id].detach().cpu() for kv in self._kv.values()])  # every layer, a copy
                if j in op.faulted:  # failed_store: the whole block beside, never loaded (what the load audit
                    self._save_blob(blob, self._path(key) + TRUTH_SUFFIX)  # measures against), and a partial save
                    blob = blob[:keep].clone()  # its own storage: torch.save of a view would write every layer
                self._save_blob(blob, self._path(key))  # visible to lookups only once written (failed_store: partial)
        for op in ops:  # after the stores, which read what this step computed
            if op.kind == "write_after":
                self._write_after(op, list(self._kv.values()))
