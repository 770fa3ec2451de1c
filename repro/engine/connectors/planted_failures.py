"""The planted connector's failures reported as success (repro.engine.connectors.planted_fault): a load, store or
restore that failed, while the connector counts its tokens as served. Mixed into PlantedFaultConnector
(ReportedSuccess), beside its gates; the faults are named in its `fault` setting like any other.

The faults, each a shape of upstream reports where the engine kept a key or counted blocks as loaded:
  dropped_load    every block of a load is counted as loaded and never written: attention reads whatever the blocks
                  held (zeros in a fresh pool; another request's KV where the pool recycled them). first_block and
                  num_blocks do not apply
  failed_store    a store that fails part-way yet is registered: the touched blocks (first_block and num_blocks, over
                  the blocks the request stores) are saved with their first stored_layers layers only, and their keys
                  stay visible to lookups; a later hit on them loads those layers and leaves the rest as the blocks
                  held them. Such a key is never stored again, and no gate of a later load undoes it
  late_load       an asynchronous load (get_num_new_matched_tokens says (n, True)) that the worker reports received
                  (get_finished) before writing any byte; the bytes are written only after the forward that first
                  computes the request ran on what the blocks held (its wait_for_save), so every later step reads them
  load_error      a load whose touched blocks (first_block and num_blocks) are never written and are reported
                  through get_block_ids_with_load_errors(): vLLM's kv_load_failure_policy decides what follows
                  ("fail": the request finishes with an error; "recompute": vLLM recomputes from the first bad block)
  unreported_load the connector finds a prompt's stored blocks and reports 0 tokens to vLLM, which computes the whole
                  prompt; after that prefill's forward (its wait_for_save) the connector writes, into each of those
                  blocks, the block another stored prompt has at that index (the most recently stored other prompt
                  whose block there differs, as `stale` picks it): every decode step reads that prompt's KV while
                  vLLM's counters say nothing was reused. A block with no such source is left alone (not faulted)

Settings (kv_connector_extra_config), beside PlantedFaultConnector's:
  async_load           true: every load is asynchronous (the worker writes it in the step that starts it, with no
                       forward, and reports it received in that step's get_finished); late_load implies it. With fault
                       "none" it is the control of the asynchronous path
  stored_layers        failed_store: how many of the model's layers (in model order) the failed store saved (default:
                       half of them, rounded down; 0: the key is registered with no bytes at all)
  load_failure_policy  "fail" or "recompute": vLLM's kv_load_failure_policy for the arm, set on the engine's
                       KVTransferConfig when the connector is built (the scheduler reads it after building its
                       connector; the kit's arm has no other way to set it). A vLLM whose KVTransferConfig has no such
                       field refuses the setting (ValueError), and the connector reports the policy in effect
                       (kv_transfer_params["planted_fault"]["load_failure_policy"])

What the worker does is decided on the scheduler side and carried in the metadata (_Op.async_load, _Op.late, and
"write_after" ops), so kv_transfer_params["planted_fault"] reports exactly what the worker did.
"""

from __future__ import annotations

from typing import Any

FAILURE_FAULTS = ("dropped_load", "failed_store", "late_load", "load_error", "unreported_load")
# Faults that leave every loaded block unwritten when the request's attention first reads it.
UNWRITTEN_FAULTS = ("dropped_load", "late_load")
POLICIES = ("fail", "recompute")
POLICY_FIELD = "kv_load_failure_policy"


def set_load_failure_policy(vllm_config: Any, policy: object) -> str:
    """Set vLLM's kv_load_failure_policy on the engine's KVTransferConfig and return what it reads back; a policy
    vLLM does not name, or a vLLM without the field, is a ValueError saying which."""
    if policy not in POLICIES:
        raise ValueError(f"planted fault option load_failure_policy={policy!r}; choose one of {', '.join(POLICIES)}")
    ktc = vllm_config.kv_transfer_config
    fields = getattr(type(ktc), "__dataclass_fields__", {}) or getattr(type(ktc), "model_fields", {})
    if POLICY_FIELD not in fields:
        raise ValueError(
            f"planted fault option load_failure_policy: unavailable: this vLLM's KVTransferConfig has no {POLICY_FIELD}"
        )
    setattr(ktc, POLICY_FIELD, policy)
    return str(getattr(ktc, POLICY_FIELD))


def block_range(first_block: int | None, num_blocks: int, n: int, tail: bool) -> list[int]:
    """Indices among n blocks that first_block and num_blocks name (first_block None: the first num_blocks, or the
    last ones for a tail fault; negative: counted from the end)."""
    if first_block is None:
        first_block = -num_blocks if tail else 0
    start = first_block + n if first_block < 0 else first_block
    return list(range(max(start, 0), min(start + num_blocks, n)))


def stored_layer_count(setting: object, num_layers: int) -> int:
    """How many layers a failed store keeps: the setting, or half of num_layers (rounded down) when it is None."""
    if setting is None:
        return num_layers // 2
    return min(int(setting), num_layers)


class ReportedSuccess:
    """The reported-success faults' half of the planted connector: settings, scheduler-side bookkeeping, and the
    worker's asynchronous completions, load errors and writes after the forward."""

    def _init_failures(self, extra: dict, vllm_config: Any) -> None:
        async_load = extra.get("async_load", False)
        if type(async_load) is not bool:  # JSON true or false only
            raise ValueError(f"planted fault option async_load={async_load!r}: true or false")
        self.async_load = async_load or self.fault == "late_load"
        layers = extra.get("stored_layers")
        if layers is not None and (isinstance(layers, bool) or not isinstance(layers, int) or layers < 0):
            raise ValueError(f"planted fault option stored_layers={layers!r}: an integer of at least 0")
        if layers is not None and self.fault != "failed_store":
            raise ValueError(f"planted fault option stored_layers applies only to failed_store (fault={self.fault!r})")
        self.stored_layers = layers
        policy = extra.get("load_failure_policy")
        self.load_failure_policy = None if policy is None else set_load_failure_policy(vllm_config, policy)
        # scheduler side
        self._broken: set[str] = set()  # failed_store: keys registered with a partial payload
        self._async_pending: dict[str, tuple[list[int], list[int], int, int]] = {}  # tokens, blocks, local, external
        self._late: dict[str, Any] = {}  # late_load: the load whose bytes go in after the request's first forward
        self._unreported: dict[str, int] = {}  # unreported_load: tokens found and reported as 0
        self._unreported_tokens: dict[str, int] = {}  # ... of a request whose prefill this connector then overwrote
        self._local_seen: dict[str, int] = {}  # the local hit vLLM showed the connector (async loads)
        # worker side
        self._received: set[str] = set()  # asynchronous loads to report received in this step's get_finished
        self._load_errors: set[int] = set()  # block IDs to report in this step's get_block_ids_with_load_errors

    # ---- scheduler side
    def _report_match(self, request, tokens: int, num_computed_tokens: int) -> tuple[int, bool]:
        """What get_num_new_matched_tokens tells vLLM of `tokens` found: 0 for unreported_load (kept to overwrite
        after the prefill), an asynchronous load where async_load is set."""
        if self.fault == "unreported_load":
            if tokens > 0:
                self._unreported[request.request_id] = tokens
            return 0, False
        self._local_seen[request.request_id] = num_computed_tokens
        return tokens, self.async_load and tokens > 0

    def _note_async_alloc(self, request, blocks, num_external_tokens: int) -> None:
        """An asynchronous load is planned in the step that allocates it: the request is not scheduled then."""
        if not (self.async_load and num_external_tokens > 0):
            return
        block_ids = list(blocks.get_block_ids()[0])
        local = self._local_seen.pop(request.request_id, 0)
        tokens = list(request.prompt_token_ids or [])
        self._async_pending[request.request_id] = (tokens, block_ids, local, num_external_tokens)

    def _async_loads(self, step: dict | None) -> list:
        """This step's asynchronous loads (their requests wait for them, unscheduled)."""
        ops = []
        for req_id, (tokens, block_ids, local, external) in self._async_pending.items():
            self._external.pop(req_id, None)
            self._resume_prompts.pop(req_id, None)
            op = self._load_op(req_id, tokens, block_ids, local + external, external, step)
            op.async_load = True
            if self.fault == "late_load" and op.faulted:
                op.late = True
                self._late[req_id] = op
            ops.append(op)
        self._async_pending.clear()
        return ops

    def _after_prefill(self, req_id: str, tokens: list[int], block_ids: list[int], done: int) -> Any | None:
        """The write after this step's forward for a newly scheduled request: a late load's bytes, or an unreported
        load's other prompt (only once the step computes the whole prompt). None: nothing to write."""
        late = self._late.pop(req_id, None)
        if late is not None:  # the blocks its load was given: the request holds them still
            return self._write_op(req_id, late.keys, late.block_ids, {j: late.keys[j] for j in late.faulted})
        found = self._unreported.pop(req_id, 0)
        if not found or done < len(tokens):
            return None
        n = found // self.block_size
        keys = self._keys(tokens, n, self._salts.get(req_id, ""))
        sources = {j: src for j in range(n) if (src := self._stale_source(j, keys[j])) is not None}
        gate = self._gate_load(None, None)
        if gate is not None and not gate["apply"]:
            sources = {}
        self._loaded.setdefault(req_id, []).append((0, sorted(sources), gate, False))
        self._unreported_tokens[req_id] = found
        if not sources:
            return None
        return self._write_op(req_id, keys, block_ids[:n], sources)

    def _write_op(self, req_id: str, keys: list[str], block_ids: list[int], sources: dict[int, str]):
        """A "write_after" op: block j of block_ids gets the stored block sources[j] after the step's forward."""
        op = self._new_op(req_id, "write_after", list(keys), list(block_ids))
        op.faulted = sorted(sources)
        op.sources = dict(sources)
        return op

    def _store_faulted(self, indices: list[int], keys: list[str], n: int) -> list[int]:
        """failed_store: which of a store's blocks (indices: their prompt block indices, of the n the request stores)
        save partially; their keys break (and stay visible)."""
        if self.fault != "failed_store":
            return []
        touched = set(block_range(self.first_block, self.num_blocks, n, tail=False))
        out = [j for j, i in enumerate(indices) if i in touched]
        self._broken.update(keys[j] for j in out)
        return out

    def _failure_report(self, req_id: str) -> dict:
        """What a request's kv_transfer_params add for these faults and settings."""
        out: dict[str, Any] = {}
        if self.async_load:
            out["async_load"] = True
        if self.load_failure_policy is not None:
            out["load_failure_policy"] = self.load_failure_policy
        found = self._unreported_tokens.pop(req_id, None)
        if found is not None:
            out["unreported_tokens"] = found
        self._unreported.pop(req_id, None)
        self._local_seen.pop(req_id, None)
        self._late.pop(req_id, None)
        return out

    # ---- worker side
    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str] | None, set[str] | None]:
        received, self._received = self._received, set()
        return None, (received or None)

    def get_block_ids_with_load_errors(self) -> set[int]:
        errors, self._load_errors = self._load_errors, set()
        return errors

    @staticmethod
    def _write_block(layers: list, block_id: int, blob: Any) -> None:
        """Copy a stored block ([num_layers, *block_shape]) into block block_id of each layer's KV, in model order;
        a blob with fewer layers (a failed store's) writes only those, and the rest keep what the block held."""
        for li, kv in enumerate(layers[: blob.shape[0]]):
            kv[block_id].copy_(blob[li].to(kv.device))

    def _write_after(self, op, layers: list) -> None:
        """After the forward: a late load's own bytes, or an unreported load's other prompt's blocks."""
        import torch

        for j, (key, block_id) in enumerate(zip(op.keys, op.block_ids)):
            if j not in op.faulted:
                continue
            self._write_block(layers, block_id, torch.load(self._path(op.sources[j])))
