"""The KV audit on llama.cpp: after each request, sequence 0's KV state (llama_state_seq_get_data, read by
repro.llamacpp.state) is written as the kit's audit writes vLLM's blocks, so that the same comparison
(repro.engine.kvcompare) and the same classes (repro.judge.kvaudit) apply: per request a record
(<seq>.json: its prompt's SHA-256, the blocks it computed or reused) and per layer one array
<seq>.<computed|reused>.<layer>.npy of shape [blocks, 2 (K, V), block_size x row elements], f16.

A cold request's blocks are its prompt's full blocks as it computed them; a reuse's are the full blocks of what it
kept (its hit counter) as it read them. Both are read once the request is done: the positions below the hit are
never written by a request (Llama.generate removes the cells from the hit on and evaluates the rest), so what is
read is what the reuse attended over. K and V rows must be f16 (llama.cpp's default cache type); another type is
said as the record's unavailable reason, never compared as something else.
"""

from __future__ import annotations

import json
import os

import numpy as np

from repro.llamacpp import state as seqstate
from repro.record.child_io import prompt_sha256

F16 = 1  # ggml_type GGML_TYPE_F16


class LlamaAudit:
    def __init__(self, directory: str | None, block_size: int):
        self.directory, self.block_size, self.seq = directory, block_size, 0
        if directory:
            os.makedirs(directory, exist_ok=True)
        self.errors: list[dict] = []

    def record(self, engine, ids: list[int], rid: str, role: str, cached: int) -> dict | None:
        """Write one request's blocks; its record (or why none)."""
        if not self.directory:
            return None
        seq, self.seq = self.seq, self.seq + 1
        reused = cached // self.block_size if role == "reuse" else 0
        computed = len(ids) // self.block_size if reused == 0 else 0
        record = {"seq": seq, "req_id": rid, "prompt_sha256": prompt_sha256(ids), "block_size": self.block_size,
                  "reused_blocks": reused, "computed_blocks": computed, "num_cached_tokens": cached,
                  "source": "llama_state_seq_get_data after the request"}  # fmt: skip
        try:
            blob, _tokens = engine.take_state()
            st = seqstate.parse(blob)
            bad = [(i, lay.k_type, lay.v_type) for i, lay in enumerate(st.layers) if F16 not in (lay.k_type, lay.v_type)
                   or lay.k_type != lay.v_type]  # fmt: skip
            if bad:
                raise seqstate.StateFormatError(f"layer {bad[0][0]}: K/V type {bad[0][1]}/{bad[0][2]}, not f16 ({F16})")
            n = reused or computed
            rows = st.rows(list(range(n * self.block_size))).view(np.float16)  # [layers, 2, positions, elems]
            layers, _, _, elems = rows.shape
            kind = "reused" if reused else "computed"
            for li in range(layers):
                blocks = rows[li].reshape(2, n, self.block_size * elems).transpose(1, 0, 2)  # [blocks, 2, E]
                np.save(os.path.join(self.directory, f"{seq:06d}.{kind}.{li:03d}.npy"), np.ascontiguousarray(blocks))
            record["layers"] = [f"blk.{li}" for li in range(layers)]
        except Exception as exc:  # noqa: BLE001 - an audit failure never fails the arm: the record says why
            record = {"seq": None, "unavailable": f"the llama.cpp state could not be read: {type(exc).__name__}: {exc}"}
            self.errors.append({"request": rid, "error": record["unavailable"]})
        with open(os.path.join(self.directory, f"{seq:06d}.json"), "w", encoding="utf-8") as fh:
            json.dump(record, fh)
        return record

    def summary(self) -> dict | None:
        if not self.directory:
            return None
        return {"dir": self.directory, "errors": self.errors, "primes": [], "engine": "llama.cpp"}
