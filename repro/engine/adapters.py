"""LoRA adapters in the engine child: the engine's LoRA settings and the LoRARequest a probe's requests carry
(its prompt spec's "adapter", repro.plan.adapters.PlannedAdapter.request).

A reuse arm sends each adapter as the fixture declares it (lora_name, lora_int_id, load_inplace): that is what is
under test. The baseline sends each adapter's weights under an id and name of their own instead (one per adapter
folder, never an in-place reload): vLLM keeps the weights first loaded under an id, so the fixture's own ids (one id
reloaded with other weights, say) would let one probe's weights answer another's in the one engine the baseline runs
its probes in. With caching off neither name nor id keys anything there: its answers are each adapter's own.
"""

from __future__ import annotations

from repro.contract.job import EngineConfig, Job

BASELINE_NAME = "kvkit-baseline-{}"  # the baseline's name for the adapter of its id


def lora_kwargs(engine: EngineConfig) -> dict:
    """vLLM's LoRA keyword arguments for a job whose probes run under adapters; {} for any other."""
    if not engine.lora:
        return {}
    return {"enable_lora": True, "max_lora_rank": engine.lora["max_lora_rank"], "max_loras": engine.lora["max_loras"]}


class AdapterRequests:
    """The adapter each of a job's prompts is sent under, as a dict (what the result says it ran under) and as
    vLLM's LoRARequest."""

    def __init__(self, job: Job) -> None:
        self.baseline = job.arm.mode == "baseline"
        folders = sorted({p.prompt["adapter"]["path"] for p in job.probes if "adapter" in p.prompt})
        self._ids = {path: i for i, path in enumerate(folders, start=1)}

    def sent(self, prompt: dict) -> dict | None:
        """The adapter a prompt's requests are sent under (None: the base model)."""
        adapter = prompt.get("adapter")
        if adapter is None:
            return None
        if self.baseline:
            own = self._ids[adapter["path"]]
            return {**adapter, "lora_name": BASELINE_NAME.format(own), "lora_int_id": own, "load_inplace": False}
        return dict(adapter)

    def request(self, prompt: dict):
        """vLLM's LoRARequest for a prompt (None: the base model)."""
        adapter = self.sent(prompt)
        if adapter is None:
            return None
        from vllm.lora.request import LoRARequest

        return LoRARequest(adapter["lora_name"], adapter["lora_int_id"], adapter["path"],
                           load_inplace=bool(adapter.get("load_inplace")))  # fmt: skip

    def generate_kwargs(self, prompts: list[dict]) -> dict:
        """generate()'s lora_request for these prompts in order; {} where none runs under an adapter (the call is
        then as it always was)."""
        requests = [self.request(p) for p in prompts]
        return {"lora_request": requests} if any(r is not None for r in requests) else {}
