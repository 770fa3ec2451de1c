"""--speculative-config: vLLM's speculative decoding in every arm of a run, the baseline's too, so that a difference
from the baseline is reuse's under speculative decoding, never speculative decoding's own. Read once from the
command line into the engine every job builds (repro.contract.job.EngineConfig.speculative_config); a problem is one
line and exit 2. vLLM checks the rest (an unknown method is every arm's ERROR, naming vLLM's message).

`"model": "@model"` (repro.contract.job.SPECULATIVE_SELF) drafts with the verified model itself: a draft model that
needs no second download, and a report that names no machine's folder. Whether the engine drafted at all is read
from its counters after the arm (repro.engine.outputs.speculative_counters): an arm that drafted nothing ran no
verification step, and its report says so (repro.run.entries)."""

from __future__ import annotations

import argparse
import json

from repro.contract.job import SPECULATIVE_SELF
from repro.errors import UsageError

FLAG = "--speculative-config"
HELP = (
    "JSON object: vLLM's speculative_config in every arm, the baseline's too, e.g. "
    f'\'{{"method": "draft_model", "model": "{SPECULATIVE_SELF}", "num_speculative_tokens": 3}}\' '
    f"({SPECULATIVE_SELF}: the verified model drafts for itself) or "
    '\'{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4}\''
)


def speculative_problem(value: object) -> str | None:
    """Why a parsed --speculative-config is not one the kit passes on (None: it is one)."""
    if not isinstance(value, dict):
        return f"must be a JSON object, got {type(value).__name__}"
    method = value.get("method")
    if not isinstance(method, str) or not method:
        return 'must name its "method" (a non-empty string: ngram, draft_model, eagle, mtp, ...)'
    n = value.get("num_speculative_tokens")
    if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
        return f'"num_speculative_tokens" must be a positive integer, got {n!r}'
    model = value.get("model")
    if model is not None and (not isinstance(model, str) or not model):
        return f'"model" must be a non-empty string (or "{SPECULATIVE_SELF}"), got {model!r}'
    return None


def from_flag(text: str) -> dict:
    """argparse's type for the flag: the object, or one line naming what is wrong."""
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not valid JSON ({exc})") from None
    problem = speculative_problem(value)
    if problem is not None:
        raise argparse.ArgumentTypeError(problem)
    return value


def check(args: argparse.Namespace, ask_engine) -> None:
    """Refuse, in one line, a --speculative-config this run cannot pass on: to servers the kit did not start, or a
    method the engine interpreter's vLLM does not name (ask_engine(): repro.plan.interpreter.probe_engine's answer,
    asked only for the kit's own engine; a stand-in engine in tests takes any)."""
    value = getattr(args, "speculative_config", None)
    if value is None:
        return
    if getattr(args, "frontend", None) == "endpoint":
        raise UsageError(
            f"{FLAG}: the servers repro endpoint is given run their own engine; start both with vLLM's {FLAG} instead"
        )
    if ask_engine is None:
        return
    caps = ask_engine()
    offered = caps.get("speculative_config") or {"unavailable": "its vLLM was not asked (an older kit's answer)"}
    who = f"vLLM {caps.get('vllm')}"
    if "unavailable" in offered:
        raise UsageError(f"{FLAG}: {who} cannot take it ({offered['unavailable']})")
    if value["method"] not in offered["methods"]:
        raise UsageError(
            f"{FLAG}: method {value['method']!r} is none that {who} names ({', '.join(offered['methods'])})"
        )
