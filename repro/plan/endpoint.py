"""`repro endpoint`: a deployment the kit did not start, checked before any child runs.

The two servers (`--url`, the one judged, and `--baseline-url`, whose answers are the reference) are asked what
they serve (`GET /v1/models`, a route every OpenAI-compatible server has); nothing is sent anywhere but to these
two addresses. Each problem is one line (a UsageError, exit 2): an address that is no http(s) URL, a server that
does not answer, one that answers but not as an OpenAI-compatible server, one that serves no model by the name
or path of `--model` (the tokenizer the probes are built with), one whose tokenizer is not `--model`'s. The
tokenizer is checked by token IDs, exactly: a fixed set of texts (TOKENIZER_TEXTS) is sent to the server's
`POST /tokenize` (vLLM's route) and encoded here by `--model`'s tokenizer loaded as the served child loads it
(transformers' AutoTokenizer, as vLLM's get_tokenizer loads it, so its tokenizer_config.json counts as it does
in a server; no special tokens added on either side); one text that differs refuses the server. Where that cannot
be done (no /tokenize, no local copy of --model's tokenizer) the check says why and the run goes on: each served
child checks again with vLLM's own load of the tokenizer and records the outcome in its report
(repro.engine.served). Then each server is sent one tiny completion (max_tokens 1, a prompt shorter than a KV
block, so nothing it leaves is reused) and its answer's `usage.prompt_tokens_details.cached_tokens` read: the hit
counter every verdict needs, which vLLM's server sends only when started with --enable-prompt-tokens-details; a
server whose answer lacks it is refused, naming the flag. The judged server's prefix cache is never reset unless
--reset-prefix-cache asks for it (it is someone's deployment): then its `POST /reset_prefix_cache` (vLLM's route,
served only with VLLM_SERVER_DEV_MODE=1 in the server's environment, vLLM 0.28 to 0.32) is tried once here, and a
server without it is refused; the endpoint arm's child resets it before each probe's cold request and records each
answer (repro.engine.served.EndpointFrontend). The baseline's is never reset: its caching is off, and a baseline
that reports cached tokens is the finding (INCONCLUSIVE), which a reset would hide. Standard library HTTP.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

from repro.contract.served import TOKENIZER_TEXTS
from repro.errors import UsageError
from repro.judge.verdict import SERVED_HITS_FLAG

PROBE_TIMEOUT_S = 10.0
USAGE_TIMEOUT_S = 120.0  # one token's completion: a CPU server under load takes seconds
# A prompt of a few tokens on any tokenizer: fewer than a KV block holds, so the judged server caches none of it
USAGE_PROMPT = "Hi"
RESET_ROUTE = "/reset_prefix_cache"
RESET_FLAG = "--reset-prefix-cache"
# The endpoint arm's child reads its server from ENDPOINT_URL_ENV: the URL, then RESET_MARK after a space where
# --reset-prefix-cache asked for resets (a URL holds no space: check_url). repro.engine.served.RESET_MARK, pinned equal.
RESET_MARK = "reset-prefix-cache"
# the child's front end reads its server's URL here (repro.engine.served.ENDPOINT_URL_ENV, pinned equal by a test)
ENDPOINT_URL_ENV = "KVKIT_ENDPOINT_URL"
BASELINE_ARM = "baseline"
ENDPOINT_ARM = "endpoint"


def check_url(flag: str, url: str) -> str:
    """The URL without a trailing slash, or one line: it must be http(s)://host[:port] (no credentials)."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname or any(c.isspace() for c in url):
        raise UsageError(f"{flag} {url}: not an http(s) URL of a server (e.g. http://127.0.0.1:8000)")
    if parts.username or parts.password or parts.query or parts.fragment:
        raise UsageError(f"{flag} {url}: give the server's address alone (no credentials, query or fragment)")
    return url.rstrip("/")


def served_models(flag: str, url: str, timeout: float = PROBE_TIMEOUT_S) -> list[dict]:
    """What the server at url says it serves (GET /v1/models's data), or one line why it cannot be used."""
    try:
        with urllib.request.urlopen(url + "/v1/models", timeout=timeout) as resp:
            body = resp.read()
    except urllib.error.HTTPError as exc:
        raise UsageError(
            f"{flag} {url}: not an OpenAI-compatible server (GET /v1/models answered HTTP {exc.code})"
        ) from None
    except (urllib.error.URLError, OSError) as exc:
        raise UsageError(f"{flag} {url}: unreachable ({getattr(exc, 'reason', exc)})") from None
    try:
        data = json.loads(body)
    except ValueError:
        raise UsageError(f"{flag} {url}: not an OpenAI-compatible server (GET /v1/models is not JSON)") from None
    models = data.get("data") if isinstance(data, dict) else None
    if not isinstance(models, list) or not models or not all(isinstance(m, dict) and m.get("id") for m in models):
        raise UsageError(f"{flag} {url}: not an OpenAI-compatible server (GET /v1/models lists no model)")
    return models


def _same_model(entry: dict, model: str) -> bool:
    names = {str(entry.get("id")), str(entry.get("root") or "")}
    if model in names:
        return True
    if Path(model).exists():  # a local folder: the server may name it by another spelling of its path
        want = Path(model).resolve()
        return any(n and Path(n).exists() and Path(n).resolve() == want for n in names)
    return False


def check_model(flag: str, url: str, models: list[dict], model: str) -> dict:
    """The served model that is --model's (by its id or root, a local path by where it resolves), or one line."""
    for entry in models:
        if _same_model(entry, model):
            return entry
    served = ", ".join(str(m.get("root") or m.get("id")) for m in models)
    raise UsageError(
        f"{flag} {url}: serves {served}, not --model {model} (the tokenizer the fixture's probes are built with)"
    )


def _local_folder(model: str) -> Path | str:
    """--model's folder here (a path, or a hub ID's snapshot already in the local cache: nothing is fetched), or why
    there is none (a string)."""
    if Path(model).is_dir():
        return Path(model)
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        return f"no local tokenizer for --model {model} (huggingface_hub is not installed here)"
    for name in ("tokenizer_config.json", "tokenizer.json"):
        try:
            cached = try_to_load_from_cache(model, name)
        except ValueError as exc:
            return f"no local tokenizer for --model {model} ({type(exc).__name__})"
        if isinstance(cached, str):
            return Path(cached).parent
    return f"no local tokenizer for --model {model}"


def _local_tokenizer(model: str):
    """--model's tokenizer loaded by transformers' AutoTokenizer, as vLLM's get_tokenizer loads a Hugging Face
    tokenizer in the server and the served child (with its tokenizer_config.json, which can change how text is
    split, such as add_prefix_space), or the reason it cannot be loaded here (a string). vLLM itself is not imported
    here: its import logs lines of its own, and the refusal is one line."""
    folder = _local_folder(model)
    if isinstance(folder, str):
        return folder
    try:
        from transformers import AutoTokenizer
    except ImportError:
        return "transformers is not installed here"
    try:
        return AutoTokenizer.from_pretrained(str(folder))
    except Exception as exc:  # noqa: BLE001 -- any failure to load it is a reason, never a traceback
        return f"{folder} does not load as a tokenizer ({type(exc).__name__})"


def server_tokens(url: str, served_id: str, text: str, timeout: float = PROBE_TIMEOUT_S) -> list[int] | str:
    """The token IDs the server gives text (POST /tokenize, no special tokens added), or why it gave none."""
    answer = _post(url, "/tokenize", {"model": served_id, "prompt": text, "add_special_tokens": False}, timeout)
    tokens = answer if isinstance(answer, str) else answer.get("tokens")
    if isinstance(tokens, str):
        return tokens
    if not isinstance(tokens, list) or not all(isinstance(t, int) for t in tokens):
        return "POST /tokenize answered no list of token IDs"
    return tokens


def _post(url: str, path: str, body: dict | None, timeout: float) -> dict | str:
    """The JSON object a POST answered, or why there is none (a string: the HTTP status, no answer, not JSON)."""
    data = json.dumps(body if body is not None else {}).encode("utf-8")
    req = urllib.request.Request(url + path, data=data, method="POST", headers={"Content-Type": "application/json"})
    route = path.split("?", 1)[0]
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            answer = json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return f"POST {route} answered HTTP {exc.code}"
    except (urllib.error.URLError, OSError) as exc:
        return f"POST {route}: no answer ({getattr(exc, 'reason', exc)})"
    except ValueError:
        return f"POST {route} answered no JSON"
    return answer if isinstance(answer, dict) else f"POST {route} answered no JSON object"


def check_tokenizer(flag: str, url: str, served_id: str, model: str) -> dict:
    """The server's tokenizer against --model's, token ID by token ID on TOKENIZER_TEXTS: a difference is one line;
    otherwise what was checked, or why it was not (the served child checks again and records it)."""
    local = _local_tokenizer(model)
    if isinstance(local, str):
        return {"checked": False, "why": local}
    for text in TOKENIZER_TEXTS:
        theirs = server_tokens(url, served_id, text)
        if isinstance(theirs, str):
            return {"checked": False, "why": theirs}
        ours = list(local.encode(text, add_special_tokens=False))
        if theirs != ours:
            at = next((i for i, (a, b) in enumerate(zip(theirs, ours)) if a != b), min(len(theirs), len(ours)))
            raise UsageError(
                f"{flag} {url}: its tokenizer is not --model {model}'s: {text[:24]!r}... is {len(theirs)} tokens there, "
                f"{len(ours)} here, first different at token {at} (the probes' token IDs would mean other text)"
            )
    return {"checked": True, "texts": len(TOKENIZER_TEXTS)}


def check_usage(flag: str, url: str, served_id: str, timeout: float = USAGE_TIMEOUT_S) -> int:
    """The cached tokens a tiny completion's answer reports (usage.prompt_tokens_details.cached_tokens), or one line:
    no answer, or an answer without the hit counter (the server needs --enable-prompt-tokens-details)."""
    body = {"model": served_id, "prompt": USAGE_PROMPT, "max_tokens": 1, "temperature": 0.0}
    answer = _post(url, "/v1/completions", body, timeout)
    if isinstance(answer, str):
        raise UsageError(f"{flag} {url}: cannot complete a prompt ({answer})")
    usage = answer.get("usage")
    details = usage.get("prompt_tokens_details") if isinstance(usage, dict) else None
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    if isinstance(cached, bool) or not isinstance(cached, int):
        raise UsageError(
            f"{flag} {url}: its answers carry no usage.prompt_tokens_details.cached_tokens, the hit counter every "
            f"verdict reads: restart it with {SERVED_HITS_FLAG}"
        )
    return cached


def check_reset(flag: str, url: str, timeout: float = PROBE_TIMEOUT_S) -> dict:
    """--reset-prefix-cache: the server's answer to one POST /reset_prefix_cache (its local prefix cache only), or
    one line: it offers no such route (vLLM serves it only under VLLM_SERVER_DEV_MODE=1)."""
    answer = _post(url, RESET_ROUTE + "?reset_running_requests=false&reset_external=false", None, timeout)
    if isinstance(answer, str):
        raise UsageError(
            f"{flag} {url}: {RESET_FLAG} cannot reset its prefix cache ({answer}; vLLM's server offers "
            f"{RESET_ROUTE} only when started with VLLM_SERVER_DEV_MODE=1): start it so, or restart it instead"
        )
    return answer


def check_endpoints(url: str, baseline_url: str, model: str, reset: bool = False) -> dict[str, str]:
    """Both servers checked, the model and tokenizer of each first, then each one's hit counter, then (reset:
    --reset-prefix-cache) the judged server's reset; what each arm's child reads of its server (ENDPOINT_URL_ENV)
    by arm name: its URL, and the judged server's followed by RESET_MARK where reset asks for resets."""
    urls = {ENDPOINT_ARM: check_url("--url", url), BASELINE_ARM: check_url("--baseline-url", baseline_url)}
    if urls[ENDPOINT_ARM] == urls[BASELINE_ARM]:
        raise UsageError("--url and --baseline-url are the same server: the baseline must be another (reuse off)")
    flags = {ENDPOINT_ARM: "--url", BASELINE_ARM: "--baseline-url"}
    served = {}
    for arm, flag in flags.items():
        served[arm] = str(check_model(flag, urls[arm], served_models(flag, urls[arm]), model).get("id"))
        check_tokenizer(flag, urls[arm], served[arm], model)
    for arm, flag in flags.items():
        check_usage(flag, urls[arm], served[arm])
    if reset:
        check_reset("--url", urls[ENDPOINT_ARM])
    return {**urls, ENDPOINT_ARM: urls[ENDPOINT_ARM] + (f" {RESET_MARK}" if reset else "")}
