"""--frontend (issue 23 item 3): the flag, its way to every engine child, the report's record of it, and
the async front end's calls, all without an engine (tests/test_e2e_frontend.py runs both on vLLM)."""

from __future__ import annotations

import asyncio
import copy
import json
from types import SimpleNamespace

import pytest
from kvkit_testutil import ROOT, have_vllm, run_cli
from test_cli_failures import _args, _env, assert_untouched, setup  # noqa: F401 - setup is a fixture

from repro.engine import frontend
from repro.llamacpp import child as llamacpp_child
from repro.plan import options as cli
from repro.record.report import ReportInvalid, validate_report


def test_the_parent_and_the_child_name_the_same_front_ends_and_variable():
    assert cli.FRONTENDS == frontend.FRONTENDS and cli.FRONTEND_ENV == frontend.FRONTEND_ENV
    assert llamacpp_child.FRONTEND_ENV == cli.FRONTEND_ENV  # llama.cpp's child reads it too
    assert cli.build_parser().get_default("frontend") == frontend.DEFAULT_FRONTEND == "sync"


@pytest.mark.parametrize(
    "argv, expected", [([], "sync"), (["--frontend", "sync"], "sync"), (["--frontend", "async"], "async")]
)
def test_the_flag_parses_with_sync_by_default(argv, expected):
    args = cli.build_parser().parse_args(["--model", "m", "--fixture", "f", *argv])
    assert args.frontend == expected


def test_an_unknown_front_end_is_one_line_exit_2_and_writes_nothing(setup):  # noqa: F811 - the imported fixture
    proc = run_cli(_args(setup, "--kv-connector", "ExampleConnector", "--frontend", "foo"), env=_env(setup), timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("error: "), proc.stderr
    assert "argument --frontend: invalid choice: 'foo'" in proc.stderr and "Traceback" not in proc.stderr
    assert proc.stdout == ""
    assert_untouched(setup)


def _fake_run(setup: dict, *flags: str, caller: str | None = None) -> tuple[dict, list[str]]:  # noqa: F811
    env = _env(setup, echo_env=[cli.FRONTEND_ENV])
    if caller is not None:
        env[cli.FRONTEND_ENV] = caller
    proc = run_cli(_args(setup, "--kv-connector", "ExampleConnector", "--jobs", "1", *flags), env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(setup["report"].read_text())
    return data, [(setup["logs"] / f"{a['name']}.log").read_text() for a in data["arms"]]


def test_the_flag_reaches_every_child_and_the_report_says_it(setup):  # noqa: F811
    data, logs = _fake_run(setup, "--frontend", "async")
    assert data["config"]["frontend"] == "async"
    assert data["provenance"]["env"][cli.FRONTEND_ENV] == "async"
    assert len(logs) == 2 and all(f"fake-engine: {cli.FRONTEND_ENV}=async" in log for log in logs)


def test_without_the_flag_every_child_runs_sync_whatever_the_caller_set(setup):  # noqa: F811
    data, logs = _fake_run(setup, caller="async")
    assert data["config"]["frontend"] == "sync"
    assert all(f"fake-engine: {cli.FRONTEND_ENV}=sync" in log for log in logs)


def test_the_schema_takes_either_front_end_and_no_other_and_older_reports_without_it():
    report = json.loads((ROOT / "tests" / "data" / "report-v2-example.json").read_text())
    assert "frontend" not in report["config"]
    validate_report(report)  # a report from before the flag
    for name in ("sync", "async", "server"):
        validate_report({**report, "config": {**report["config"], "frontend": name}})
    with pytest.raises(ReportInvalid, match="config/frontend"):
        validate_report({**report, "config": {**report["config"], "frontend": "foo"}})


# ---- the child side, without an engine ------------------------------------------------------------


@pytest.mark.parametrize("environ, expected", [({}, "sync"), ({"KVKIT_FRONTEND": ""}, "sync"),
                                               ({"KVKIT_FRONTEND": "async"}, "async")])  # fmt: skip
def test_the_child_reads_its_front_end_from_the_environment(environ, expected):
    assert frontend.frontend_from_env(environ) == expected


def test_the_child_refuses_a_front_end_it_does_not_know():
    with pytest.raises(ValueError, match="KVKIT_FRONTEND='foo': not one of sync, async"):
        frontend.frontend_from_env({"KVKIT_FRONTEND": "foo"})
    with pytest.raises(ValueError, match="unknown front end 'foo'"):
        frontend.build_frontend("foo", {})


class _Queue:
    """AsyncLLM's per-request output collector, as _final reads it: not yet done, then done."""

    def __init__(self, request_id: str, output):
        self.request_id, self.closed = request_id, False
        self._outs = [SimpleNamespace(finished=False), output]

    def get_nowait(self):
        return None

    async def get(self):
        return self._outs.pop(0)

    def close(self):
        self.closed = True


class _Engine:
    """The calls AsyncFrontend makes of AsyncLLM, recorded."""

    def __init__(self, fail_at: int | None = None):
        self.added, self.aborted, self.queues, self.fail_at = [], [], [], fail_at
        self.vllm_config = SimpleNamespace(name="config")
        self.model_config = SimpleNamespace(is_encoder_decoder=False)
        self.renderer = SimpleNamespace(default_cmpl_tok_params="defaults", render_cmpl_async=self._render)
        self.rendered = []

    async def _render(self, prompts, tok_params):
        """The renderer's EngineInput for each prompt (a tokens prompt, marked rendered)."""
        self.rendered.append(tok_params)
        return [{"type": "token", **p} for p in prompts]

    async def add_request(self, request_id, prompt, params):
        if len(self.added) == self.fail_at:
            raise RuntimeError("engine dead")
        self.added.append((request_id, prompt, params))
        self.queues.append(_Queue(f"{request_id}-internal", SimpleNamespace(finished=True, request_id=request_id)))
        return self.queues[-1]

    async def abort(self, request_ids, internal=False):
        self.aborted.append((list(request_ids), internal))

    async def reset_prefix_cache(self, reset_running_requests, reset_connector):
        return (reset_running_requests, reset_connector) == (False, False)


def _async_frontend(engine: _Engine) -> frontend.AsyncFrontend:
    """An AsyncFrontend around a stand-in engine (its constructor builds a real one)."""
    fe = frontend.AsyncFrontend.__new__(frontend.AsyncFrontend)
    fe._loop, fe._ids, fe.engine = asyncio.new_event_loop(), iter(range(10**6)), engine
    return fe


needs_vllm = pytest.mark.skipif(not have_vllm(), reason="vLLM (CPU profile) is not installed")


@needs_vllm
def test_async_requests_enter_in_order_numbered_as_llm_numbers_them_with_final_only_outputs():
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    engine = _Engine()
    fe = _async_frontend(engine)
    sp = SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True, logprobs=2, seed=0)
    before = copy.deepcopy(sp)
    outs = fe.generate([{"prompt_token_ids": [1, 2]}, {"prompt_token_ids": [3]}], sp, use_tqdm=False)
    outs += fe.generate([{"prompt_token_ids": [4]}], sp)
    assert [o.request_id for o in outs] == ["0", "1", "2"]  # in input order, numbered across calls
    assert [(rid, p["prompt_token_ids"]) for rid, p, _ in engine.added] == [("0", [1, 2]), ("1", [3]), ("2", [4])]
    assert all(p["type"] == "token" for _, p, _ in engine.added)  # rendered, with the default tokenization
    assert engine.rendered == ["defaults", "defaults"]
    params = engine.added[0][2]
    assert params.output_kind == RequestOutputKind.FINAL_ONLY  # one output per request, when done: as LLM
    assert (params.temperature, params.max_tokens, params.logprobs, params.ignore_eos) == (0.0, 3, 2, True)
    assert sp.output_kind == before.output_kind  # the caller's params are not changed under it
    assert all(q.closed for q in engine.queues) and engine.aborted == []
    assert fe.reset_prefix_cache() is True
    assert frontend.vllm_config_of(fe) is engine.vllm_config and frontend.frontend_name(fe) == "async"


@needs_vllm
def test_an_async_failure_leaves_no_request_running():
    from vllm import SamplingParams

    engine = _Engine(fail_at=1)
    fe = _async_frontend(engine)
    with pytest.raises(RuntimeError, match="engine dead"):
        fe.generate([{"prompt_token_ids": [1]}, {"prompt_token_ids": [2]}], SamplingParams(max_tokens=1))
    assert engine.aborted == [(["0-internal"], True)] and all(q.closed for q in engine.queues)


def test_the_sync_front_end_is_llm_and_its_config_is_its_engines():
    llm = SimpleNamespace(llm_engine=SimpleNamespace(vllm_config="cfg"))
    assert frontend.vllm_config_of(llm) == "cfg" and frontend.frontend_name(llm) == "sync"


def test_a_front_end_in_the_callers_environment_never_reaches_a_child_the_kit_did_not_tell():
    """The detection study, the margins and the model checks build their children's environment with
    child_env and no front end: a KVKIT_FRONTEND in the caller's shell must not switch their engines."""
    from repro.run.runner import child_env

    env = child_env({cli.FRONTEND_ENV: "async", "PATH": "/bin"}, hashseed="0", extra={})
    assert cli.FRONTEND_ENV not in env and env["PATH"] == "/bin"
    told = child_env({cli.FRONTEND_ENV: "async"}, hashseed="0", extra={cli.FRONTEND_ENV: "sync"})
    assert told[cli.FRONTEND_ENV] == "sync"
