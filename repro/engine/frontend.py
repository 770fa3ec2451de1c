"""The engine front ends the child drives: vLLM's synchronous `LLM`, or a bare `AsyncLLM` behind the same calls.

`--frontend server` is a `vllm serve` process the child starts and drives over HTTP (repro.engine.served).
`--frontend async` drives the engine as the reference command's server does (vllm's AsyncLLM, the
front end of `vllm serve`), which requests in flight together need; `sync` (the default) is `LLM`.
Both build the same engine (the same EngineArgs, its EngineCore in its own process) and are handed
the same TokensPrompt, rendered by vLLM's renderer with its default tokenization as LLM and the OpenAI
server render it, the same SamplingParams (greedy, FINAL_ONLY outputs) and the same request IDs ("0",
"1", ... in submission order, as LLM numbers them), so a RequestOutput is the same record either way.

The parent says which by FRONTEND_ENV (repro.plan.options.FRONTEND_ENV, pinned equal by a test: the child never
imports the parent's side). This module imports vLLM only inside functions: reading the constants
needs no engine.
"""

from __future__ import annotations

import asyncio
import itertools

FRONTEND_ENV = "KVKIT_FRONTEND"
FRONTENDS = ("sync", "async", "server", "endpoint")
DEFAULT_FRONTEND = "sync"


def frontend_from_env(environ) -> str:
    """The front end the parent asked for (unset: the default). Anything else is a kit bug: the
    command line only offers FRONTENDS, so the arm fails with this one line rather than guess."""
    name = environ.get(FRONTEND_ENV) or DEFAULT_FRONTEND
    if name not in FRONTENDS:
        raise ValueError(f"{FRONTEND_ENV}={name!r}: not one of {', '.join(FRONTENDS)}")
    return name


def build_frontend(name: str, engine_kwargs: dict):
    """The engine behind `name`'s front end, with the calls the child makes (generate,
    reset_prefix_cache, get_tokenizer; its vllm_config through vllm_config_of)."""
    if name == "sync":
        from vllm import LLM

        return LLM(**engine_kwargs)
    if name == "async":
        return AsyncFrontend(engine_kwargs)
    if name == "server":  # a `vllm serve` process driven over HTTP (repro.engine.served)
        from repro.engine.served import ServerFrontend

        return ServerFrontend(engine_kwargs)
    if name == "endpoint":  # a server the kit did not start, at the URL the parent gives (repro endpoint)
        import os

        from repro.engine.served import ENDPOINT_URL_ENV, EndpointFrontend

        return EndpointFrontend(engine_kwargs, os.environ[ENDPOINT_URL_ENV])
    raise ValueError(f"unknown front end {name!r}: not one of {', '.join(FRONTENDS)}")


def vllm_config_of(frontend):
    """The engine's VllmConfig, whichever front end built it."""
    if isinstance(frontend, AsyncFrontend):
        return frontend.engine.vllm_config
    if hasattr(frontend, "vllm_config"):  # the server front end: the config vLLM derives from the same arguments
        return frontend.vllm_config
    return frontend.llm_engine.vllm_config


def frontend_name(frontend) -> str:
    if hasattr(frontend, "endpoint_config"):
        return "endpoint"
    if hasattr(frontend, "served_facts"):
        return "server"
    return "async" if isinstance(frontend, AsyncFrontend) else "sync"


class AsyncFrontend:
    """A bare vllm.v1.engine.async_llm.AsyncLLM driven from synchronous code.

    The child owns one event loop for its whole life: AsyncLLM is built inside it (so its output
    handler task belongs to that loop) and every call runs it until that call's requests finish.
    Between calls the loop is idle; what the engine core sends meanwhile waits in its socket. As
    with LLM, nothing is shut down gracefully: the child writes its result and exits, and the
    parent kills its process group (engine core and workers included).
    """

    def __init__(self, engine_kwargs: dict):
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        self._loop = asyncio.new_event_loop()
        asyncio.set_event_loop(self._loop)
        self._ids = itertools.count()  # request IDs as LLM gives them: "0", "1", ... in submission order
        args = AsyncEngineArgs(**engine_kwargs)

        async def build():
            return AsyncLLM.from_engine_args(args)

        self.engine = self._loop.run_until_complete(build())

    def get_tokenizer(self):
        return self.engine.get_tokenizer()

    def reset_prefix_cache(self, reset_running_requests: bool = False, reset_connector: bool = False) -> bool:
        return self._loop.run_until_complete(self.engine.reset_prefix_cache(reset_running_requests, reset_connector))

    def generate(self, prompts: list, sampling_params, use_tqdm: bool = False, lora_request=None) -> list:
        """Like LLM.generate: every prompt added in list order (under its LoRA adapter: lora_request, one per prompt
        or None), then their final outputs in the same order (use_tqdm is accepted for the same call and ignored)."""
        loras = lora_request if isinstance(lora_request, list) else [lora_request] * len(prompts)
        return self._loop.run_until_complete(self._generate(list(prompts), sampling_params, loras))

    async def _generate(self, prompts: list, sampling_params, loras: list) -> list:
        from vllm.renderers.inputs.preprocess import parse_model_prompt
        from vllm.sampling_params import RequestOutputKind

        each = sampling_params if isinstance(sampling_params, list) else [sampling_params] * len(prompts)
        params = [p.clone() for p in each]  # one per prompt, as LLM.generate takes them (prompt logprobs)
        for p in params:
            p.output_kind = RequestOutputKind.FINAL_ONLY  # what LLM sets: one output per request, when done
        # Rendered first, as LLM and the OpenAI server do (the raw-prompt path of add_request is deprecated).
        renderer = self.engine.renderer
        parsed = [parse_model_prompt(self.engine.model_config, p) for p in prompts]
        inputs = await renderer.render_cmpl_async(parsed, renderer.default_cmpl_tok_params)
        # Added one after another (each awaited) so they reach the engine in list order, as LLM adds them
        # before it steps: a batch is the same batch in both front ends.
        queues = []
        try:
            for engine_input, lora, one in zip(inputs, loras, params):
                extra = {"lora_request": lora} if lora is not None else {}  # a LoRA adapter's request only
                queues.append(await self.engine.add_request(str(next(self._ids)), engine_input, one, **extra))
            return [await _final(q) for q in queues]
        except (Exception, asyncio.CancelledError):
            if queues:  # a failure or a cancellation leaves no request running in the engine
                await self.engine.abort([q.request_id for q in queues], internal=True)
            raise
        finally:
            for q in queues:
                q.close()


async def _final(queue):
    """A request's final output from its AsyncLLM output collector (what AsyncLLM.generate's loop does)."""
    while True:
        out = queue.get_nowait() or await queue.get()
        if getattr(out, "finished", False):
            return out
