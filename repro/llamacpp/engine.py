"""One llama.cpp context (llama-cpp-python's Llama) as the kit drives it: greedy generation of exactly N tokens with
each step's top logprobs, the prompt reuse rule of Llama.generate read before each request, the sequence's KV state
taken and put back (llama_state_seq_get_data / set_data), and the facts a report names."""

from __future__ import annotations

import ctypes
import json
import os
import sys
from dataclasses import dataclass

import numpy as np

from repro.contract.chat import build_chat_prompt
from repro.contract.job import Job
from repro.llamacpp.build import BUILD_STAMP


def build_record() -> dict | str:
    """The kit's build record of the llama-cpp-python this interpreter runs, or why there is none (an environment
    the kit did not make)."""
    path = os.path.join(sys.prefix, BUILD_STAMP)
    try:
        with open(path, encoding="utf-8") as fh:
            return json.load(fh)
    except (OSError, ValueError) as exc:
        return f"unavailable: {path}: {type(exc).__name__} (not an environment the kit built)"


def kept_by_rule(kept: list[int], ids: list[int], live_logits: bool = False) -> int:
    """How many of `ids` Llama.generate(reset=True) takes from the tokens an engine keeps (llama_cpp/llama.py,
    generate): the longest common prefix, less one when the whole prompt is kept so that its last token is evaluated
    again; the whole prompt where nothing else is kept and its logits are live."""
    if not kept:
        return 0
    common = next((k for k, (a, b) in enumerate(zip(kept, ids)) if a != b), min(len(kept), len(ids)))
    consumed = common == len(ids)
    if consumed and len(kept) == len(ids) and live_logits:
        return len(ids)
    return common - 1 if consumed else common


def prompt_ids(tokenizer, prompt: dict) -> tuple[list[int], list[dict] | None]:
    """A probe's prompt as token IDs (and its chat messages): given IDs as they are, a chat through the GGUF's own
    template and vocabulary (repro.contract.chat)."""
    if "token_ids" in prompt:
        return [int(t) for t in prompt["token_ids"]], None
    return build_chat_prompt(tokenizer, prompt["chat"])


class GgufTokenizer:
    """The four calls repro.contract.chat needs, from the GGUF's own vocabulary and chat template (rendered by
    llama-cpp-python's Jinja2ChatFormatter, a sandboxed Jinja2 environment, as its chat completion does)."""

    def __init__(self, llm):
        from llama_cpp.llama_chat_format import Jinja2ChatFormatter

        template = llm.metadata.get("tokenizer.chat_template")
        if not template:
            raise ValueError("the GGUF has no tokenizer.chat_template: its chat probes cannot be built")
        text = llm._model.token_get_text
        self.llm = llm
        self.formatter = Jinja2ChatFormatter(
            template, eos_token=text(llm.token_eos()), bos_token=text(llm.token_bos()), add_generation_prompt=True
        )

    def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=True) -> str:
        assert not tokenize and add_generation_prompt
        return self.formatter(messages=messages).prompt

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        # special=True: the template's own markers (<|im_start|>) are single tokens, as a Hugging Face tokenizer reads them
        return list(self.llm.tokenize(text.encode("utf-8"), add_bos=add_special_tokens, special=True))

    def decode(self, ids: list[int]) -> str:
        return self.llm.detokenize(list(ids), special=True).decode("utf-8", errors="replace")


@dataclass
class Generated:
    token_ids: list[int]
    logprobs: list[list]  # per step: [[token_id, logprob], ...] best first
    cached_tokens: int  # what the engine kept of this prompt before the request, by Llama.generate's rule


class Engine:
    def __init__(self, llm, job: Job, threads: int):
        self.llm, self.job, self.threads = llm, job, threads
        self.tokenizer = GgufTokenizer(llm)

    @classmethod
    def load(cls, job: Job) -> Engine:
        import llama_cpp

        threads = len(os.sched_getaffinity(0))
        batch = job.engine.max_num_batched_tokens or 512
        llm = llama_cpp.Llama(
            model_path=job.engine.model,
            n_ctx=job.engine.max_model_len,
            n_batch=batch,
            n_ubatch=batch,
            n_threads=threads,
            n_threads_batch=threads,
            seed=job.engine.seed,
            logits_all=False,
            verbose=False,
        )
        return cls(llm, job, threads)

    def prompt_ids(self, prompt: dict) -> tuple[list[int], list[dict] | None]:
        return prompt_ids(self.tokenizer, prompt)

    def clear(self) -> None:
        """Nothing kept: the KV memory emptied and the binding's kept tokens forgotten."""
        self.llm._ctx.kv_cache_clear()
        self.llm.reset()

    def kept_tokens(self) -> list[int]:
        return [int(t) for t in self.llm.input_ids[: self.llm.n_tokens]]

    def reuse_rule(self, ids: list[int]) -> int:
        """How many of `ids` Llama.generate(reset=True) will take from what this engine keeps (kept_by_rule)."""
        return kept_by_rule(self.kept_tokens(), ids, live_logits=not self.llm._requires_eval)

    def generate(self, ids: list[int]) -> Generated:
        cached = self.reuse_rule(ids)
        out, steps = [], []
        stream = self.llm.generate(ids, top_k=1, top_p=1.0, min_p=0.0, temp=0.0, repeat_penalty=1.0, reset=True)
        try:
            for token in stream:
                steps.append(self.top_logprobs(self.job.logprobs))
                out.append(int(token))
                if len(out) == self.job.max_tokens:
                    break
        finally:
            stream.close()
        return Generated(out, steps, cached)

    def top_logprobs(self, k: int) -> list[list]:
        """The k best tokens of the distribution the last token was sampled from, as log-probabilities."""
        import llama_cpp

        if k <= 0:
            return []
        ptr = llama_cpp.llama_get_logits_ith(self.llm._ctx.ctx, -1)
        logits = np.ctypeslib.as_array(ptr, shape=(self.llm.n_vocab(),)).astype(np.float64)
        top = logits.max()
        logprobs = logits - (top + np.log(np.exp(logits - top).sum()))
        best = sorted(np.argpartition(-logprobs, k)[:k].tolist(), key=lambda t: (-logprobs[t], t))
        return [[int(t), float(logprobs[t])] for t in best]

    def take_state(self) -> tuple[bytes, list[int]]:
        """Sequence 0's KV state and the tokens it holds."""
        import llama_cpp

        ctx = self.llm._ctx.ctx
        size = llama_cpp.llama_state_seq_get_size(ctx, 0)
        buf = (ctypes.c_uint8 * size)()
        written = llama_cpp.llama_state_seq_get_data(ctx, buf, size, 0)
        return bytes(buf)[:written], self.kept_tokens()

    def put_state(self, blob: bytes, tokens: list[int]) -> int:
        """Empty the memory, then restore a sequence state into sequence 0 and tell the binding which tokens it
        holds (as Llama.load_state does); the bytes llama.cpp read, 0 when it refused the blob."""
        import llama_cpp

        self.clear()
        buf = (ctypes.c_uint8 * len(blob)).from_buffer_copy(blob)
        read = llama_cpp.llama_state_seq_set_data(self.llm._ctx.ctx, buf, len(blob), 0)
        if read:
            self.llm.input_ids[: len(tokens)] = tokens
            self.llm.n_tokens = len(tokens)
            self.llm._requires_eval = True
        return int(read)

    def versions(self) -> dict:
        from importlib.metadata import version

        import llama_cpp

        return {
            "engine": "llama.cpp",
            "llama_cpp_python": version("llama_cpp_python"),
            "llama_cpp_system_info": llama_cpp.llama_print_system_info().decode("utf-8", "replace").strip(),
            "numpy": np.__version__,
            "llamacpp_build": build_record(),
        }

    def effective_config(self) -> dict:
        llm = self.llm
        return {
            "engine": "llama.cpp",
            "model": self.job.engine.model,
            "n_ctx": llm.n_ctx(),
            "n_batch": llm.n_batch,
            "n_threads": self.threads,
            "kv_type": "f16 (llama.cpp's default)",
            "flash_attn": False,
            "block_size": self.job.engine.block_size,
            "seed": self.job.engine.seed,
            "decoding": "greedy (temperature 0, repeat_penalty 1.0); exactly max_tokens tokens",
            "gguf": {k: llm.metadata.get(k) for k in ("general.architecture", "general.name", "general.file_type")},
        }
