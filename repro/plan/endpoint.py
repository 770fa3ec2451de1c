"""`repro endpoint`: a deployment the kit did not start, checked before any child runs.

The two servers (`--url`, the one judged, and `--baseline-url`, whose answers are the reference) are asked what
they serve (`GET /v1/models`, a route every OpenAI-compatible server has); nothing is sent anywhere but to these
two addresses. Each problem is one line (a UsageError, exit 2): an address that is no http(s) URL, a server that
does not answer, one that answers but not as an OpenAI-compatible server, one that serves no model by the name
or path of `--model` (the tokenizer the probes are built with). Standard library only.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

from repro.errors import UsageError

PROBE_TIMEOUT_S = 10.0
# the child's front end reads its server's URL here (repro.engine.served.ENDPOINT_URL_ENV, pinned equal by a test)
ENDPOINT_URL_ENV = "KVKIT_ENDPOINT_URL"
BASELINE_ARM = "baseline"
ENDPOINT_ARM = "endpoint"


def check_url(flag: str, url: str) -> str:
    """The URL without a trailing slash, or one line: it must be http(s)://host[:port] (no credentials)."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
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


def check_endpoints(url: str, baseline_url: str, model: str) -> dict[str, str]:
    """Both servers checked; each arm's URL by arm name."""
    urls = {ENDPOINT_ARM: check_url("--url", url), BASELINE_ARM: check_url("--baseline-url", baseline_url)}
    if urls[ENDPOINT_ARM] == urls[BASELINE_ARM]:
        raise UsageError("--url and --baseline-url are the same server: the baseline must be another (reuse off)")
    for arm, flag in ((ENDPOINT_ARM, "--url"), (BASELINE_ARM, "--baseline-url")):
        check_model(flag, urls[arm], served_models(flag, urls[arm]), model)
    return urls
