"""The planted connector's scenario gates end to end on the real vLLM CPU engine (gate logic alone:
tests/test_planted_gates_scenarios.py).

- Plain probes (the verifier, one request at a time): a zero_blocks fault gated on `when: in_flight` and
  one gated on `when: after_eviction` both PASS, every reuse hit, and each reuse's recorded gate figures
  say why its load was faithful (one request in flight; every block from the local tier, though the
  tier overflowed between probes). Read on the session's planted scenarios run (tests/e2e_runs.py), whose
  plain probes are these two arms.
- The same connector driven directly (a vLLM LLM built as the kit's child builds it, this file run as a
  script in a fresh process): three prompts in one generate call with max_num_seqs 3 fault on their
  reuse, and A, B, A with a local tier smaller than A and B together faults A's reload, and only that.
- Preemption (a small KV cache, three requests decoding together): a request resumed after preemption
  loads its prompt's stored blocks again, so the faithful connector keeps every answer its cold one.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import have_vllm
from e2e_runs import PLANTED_SCENARIOS_FIXTURE, shared_run

from repro.plan.settings import engine_layout_env

pytestmark = [pytest.mark.e2e, pytest.mark.skipif(not have_vllm(), reason="vLLM (CPU profile) is not installed")]

ROOT = Path(__file__).resolve().parent.parent
IN_FLIGHT_ARM = "PlantedFault-in-flight"
EVICTION_ARM = "PlantedFault-after-eviction"
BLOCK = 16
# The local tier of the plain-probe run (the planted scenarios fixture's, 100): at least the longest probe's stored
# blocks (the fixture probe, 1502 tokens: 93), less than the probes' sum (93 + 31 + 32 + 32), so the tier overflows
# between probes.
PLAIN_CAPACITY = next(
    a["extra_config"]["local_capacity_blocks"]
    for a in json.loads((ROOT / PLANTED_SCENARIOS_FIXTURE).read_text(encoding="utf-8"))["arms"]
    if a["name"] == EVICTION_ARM
)
# A, B, A below: chat-511 stores 31 blocks, chat-512 32; 48 holds either, not both.
ABA_CAPACITY = 48
ZERO16 = {"fault": "zero_blocks", "first_block": 0, "num_blocks": 16}


PLAIN_PROBES = ("fixture", "chat-511", "chat-512", "chat-513")


def _arm(report: dict, name: str) -> dict:
    return next(a for a in report["arms"] if a["name"] == name)


def test_plain_probes_never_open_the_scenario_gates(planted_scenarios_run):
    """Both gated faults, expected (by the fixture) to PASS with EXACT KV on every probe of the acceptance suite: the
    kit's own acceptance check says the gates stayed shut, the test reads why from each reuse's figures."""
    assert 93 <= PLAIN_CAPACITY < 93 + 31 + 32 + 32
    proc, data = planted_scenarios_run.proc, planted_scenarios_run.data
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    fixture = json.loads((ROOT / PLANTED_SCENARIOS_FIXTURE).read_text(encoding="utf-8"))
    for arm in (IN_FLIGHT_ARM, EVICTION_ARM):
        assert fixture["expected"][arm] == dict.fromkeys(PLAIN_PROBES, "PASS"), fixture["expected"][arm]
        assert fixture["expected_kv"][arm] == dict.fromkeys(PLAIN_PROBES, "EXACT"), fixture["expected_kv"][arm]
    assert data["acceptance"]["matched"] is True, data["acceptance"]
    evictions = 0
    for name, figures_key in ((IN_FLIGHT_ARM, "in_flight"), (EVICTION_ARM, "after_eviction")):
        arm = _arm(data, name)
        assert arm["verdict"] == "PASS", arm
        assert tuple(p["name"] for p in arm["probes"]) == PLAIN_PROBES
        for probe in arm["probes"]:
            assert probe["verdict"] == "PASS" and probe["kv"]["verdict"] == "EXACT", (name, probe["name"])
            for reuse in probe["requests"][1:]:
                planted = reuse["kv_transfer_params"]["planted_fault"]
                loaded = planted["loaded_tokens"] // BLOCK
                assert reuse["cached_tokens"] > 0 and loaded > 0 and planted["faulted_blocks"] == []
                gate = planted["gate"]
                assert gate["apply"] is False and set(gate) == {"apply", figures_key}, gate
                figures = gate[figures_key]
                if figures_key == "in_flight":
                    assert figures == {"scheduled": 1, "unfinished": 1, "in_flight": 1, "min": 2, "open": False}
                else:
                    assert figures["capacity_blocks"] == PLAIN_CAPACITY and figures["open"] is False
                    assert (figures["local_blocks"], figures["next_tier_blocks"]) == (loaded, 0), figures
                    evictions = max(evictions, figures["evictions"])
    # the tier did overflow (chat-511's cold request pushed out the fixture probe's first blocks), yet no
    # reuse came from the next tier: plain probe order never reloads an evicted block
    assert evictions > 0


# ---- the connector driven directly
def _drive(tiny_model: str, tmp_path: Path, extra: dict, steps: list[list[str]], max_num_seqs: int, **engine) -> dict:
    """Run this file as a script: one engine with the planted connector, each step one generate call
    over the named acceptance probes. Returns the requests per step and the connector's audit lines.
    engine: kv_cache_tokens (the KV cache's size, as a scenario's engine.kv_cache_tokens), max_tokens."""
    audit = tmp_path / "audit.jsonl"
    config = {
        "model": tiny_model,
        "extra": {"store_dir": str(tmp_path / "store"), "audit_path": str(audit), **extra},
        "steps": steps,
        "max_num_seqs": max_num_seqs,
        **engine,
        "out": str(tmp_path / "driven.json"),
    }
    # the engine layout of the kit's CPU children (engine core and worker in this process, one OpenMP thread), as the
    # driver builds the engine as the kit's child does: vLLM's own layout would spawn two more interpreters a drive
    # (about 27 s of CPU on two cores) for what this file checks, the connector's gates
    env = dict(os.environ, PYTHONPATH=str(ROOT), VLLM_NO_USAGE_STATS="1", VLLM_CPU_NUM_OF_RESERVED_CPU="1")
    env.update(engine_layout_env("one-process"))
    proc = subprocess.run(
        [sys.executable, __file__, json.dumps(config)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    out = json.loads(Path(config["out"]).read_text())
    out["audit"] = [json.loads(line) for line in audit.read_text().splitlines()]
    return out


def _in_flight_drive(model: str, tmp: Path) -> dict:
    probes = ["chat-511", "chat-512", "chat-513"]
    return _drive(model, tmp, {**ZERO16, "when": "in_flight"}, [probes, probes, ["chat-511"]], 3)


def _aba_drive(model: str, tmp: Path) -> dict:
    steps = [["chat-511"], ["chat-511"], ["chat-512"], ["chat-511"], ["chat-511"]]
    return _drive(model, tmp, {**ZERO16, "when": "after_eviction", "local_capacity_blocks": ABA_CAPACITY}, steps, 1)


def _preemption_drive(model: str, tmp: Path) -> dict:
    probes = ["chat-511", "chat-512", "chat-513"]
    engine = {"kv_cache_tokens": 1600, "max_tokens": 48, "max_model_len": 1024}
    return _drive(model, tmp, {"fault": "none"}, [[p] for p in probes] + [probes], 3, **engine)


# each drive is one engine: made ahead by the tests' lane (tests/e2e_runs.py)
in_flight_drive = shared_run("in_flight_drive", _in_flight_drive, lane=True)
aba_drive = shared_run("aba_drive", _aba_drive, lane=True)
preemption_drive = shared_run("preemption_drive", _preemption_drive, lane=True)


def test_in_flight_faults_requests_submitted_together(in_flight_drive):
    """Three prompts in one generate call are in flight together, but not always from the first step: the engine
    core may schedule the first request alone before the others reach it (seen on a fresh clone's `make test`
    on 2 loaded cores: chat-511's load had 1 request in flight and stayed faithful). So the test checks that each
    load's fault follows its own recorded gate figures, and that the two requests that arrive while the first
    one still runs (it decodes 16 tokens) load with it in flight and fault."""
    out = in_flight_drive
    cold, together, alone = out["steps"]
    assert all(r["cached_tokens"] == 0 and r["planted_fault"]["loaded_tokens"] == 0 for r in cold)
    opened = []
    for c, r in zip(cold, together):
        planted = r["planted_fault"]
        figures = planted["gate"]["in_flight"]
        assert r["cached_tokens"] > 0 and figures["min"] == 2, r
        assert figures["open"] is (figures["in_flight"] >= 2) and planted["gate"]["apply"] is figures["open"], r
        assert planted["faulted_blocks"] == (list(range(16)) if figures["open"] else []), r
        # the zeroed KV changed the answer; a faithful load kept it
        assert (r["token_ids"] != c["token_ids"]) is figures["open"], r["probe"]
        opened.append(figures["open"])
    assert opened[1:] == [True, True], opened
    (single,) = alone
    assert single["cached_tokens"] > 0 and single["planted_fault"]["faulted_blocks"] == []
    assert single["planted_fault"]["gate"] == {
        "apply": False,
        "in_flight": {"scheduled": 1, "unfinished": 1, "in_flight": 1, "min": 2, "open": False},
    }
    # what the worker did: each together load zeroed 16 blocks where its gate opened, the rest exact; then one
    # faithful load
    assert [len(line["faulted_blocks"]) for line in out["audit"]] == [16 if o else 0 for o in opened] + [0]
    for line in out["audit"]:
        assert line["clean_max_abs_diff"] == 0.0 and all(d > 0 for _, d in line["faulted_max_abs_diff"])


def test_after_eviction_faults_the_reload_of_a_b_a(aba_drive):
    out = aba_drive
    (a_cold,), (a_reuse,), (b_cold,), (a_reload,), (a_again,) = out["steps"]
    assert a_cold["cached_tokens"] == 0 and b_cold["cached_tokens"] == 0
    # right after its cold request A is served from the local tier: faithful, the cold answer
    gate = a_reuse["planted_fault"]["gate"]
    assert a_reuse["planted_fault"]["faulted_blocks"] == [] and gate["apply"] is False
    assert (gate["after_eviction"]["local_blocks"], gate["after_eviction"]["next_tier_blocks"]) == (31, 0)
    assert a_reuse["token_ids"] == a_cold["token_ids"]
    # B's 32 blocks pushed A's 15 least recently used out of the 48: A's reload takes them from the next tier
    gate = a_reload["planted_fault"]["gate"]
    assert gate["apply"] is True and a_reload["planted_fault"]["faulted_blocks"] == list(range(16))
    figures = gate["after_eviction"]
    assert figures["evicted_blocks"] == list(range(15)), figures
    assert (figures["local_blocks"], figures["next_tier_blocks"], figures["never_local_blocks"]) == (16, 15, 0)
    assert a_reload["token_ids"] != a_cold["token_ids"]
    # the reload promoted A's blocks: A once more is local again, faithful, the cold answer
    assert a_again["planted_fault"]["faulted_blocks"] == [] and a_again["planted_fault"]["gate"]["apply"] is False
    assert a_again["token_ids"] == a_cold["token_ids"]
    assert [len(line["faulted_blocks"]) for line in out["audit"]] == [0, 16, 0]


def main(config: dict) -> None:
    """The driver: the engine as repro.engine.child builds it for a connector arm (its _engine_kwargs), but
    max_num_seqs from the config, so several requests can be in flight."""
    from vllm import LLM, SamplingParams
    from vllm.config import KVTransferConfig

    from repro.engine.child import build_chat_prompt
    from repro.engine.engine_args import kv_bytes_per_token
    from repro.plan.suite import boundary_probe

    sized = {}
    if config.get("kv_cache_tokens"):
        per_token = kv_bytes_per_token(config["model"], None, "float32")
        sized["kv_cache_memory_bytes"] = config["kv_cache_tokens"] * per_token
    llm = LLM(
        **sized,
        model=config["model"],
        tokenizer=config["model"],
        dtype="float32",
        seed=0,
        enforce_eager=True,
        gpu_memory_utilization=0.1,
        max_model_len=config.get("max_model_len", 2048),
        block_size=BLOCK,
        max_num_batched_tokens=2048,
        max_num_seqs=config["max_num_seqs"],
        enable_prefix_caching=False,
        kv_transfer_config=KVTransferConfig(
            kv_connector="PlantedFaultConnector",
            kv_role="kv_both",
            kv_connector_extra_config=config["extra"],
            kv_connector_module_path="repro.engine.connectors.planted_fault",
        ),
    )
    tokenizer = llm.get_tokenizer()
    prompts = {}
    for names in config["steps"]:
        for name in names:
            prompts[name] = build_chat_prompt(tokenizer, boundary_probe(int(name.split("-")[1])).chat)[0]
    params = SamplingParams(temperature=0.0, max_tokens=config.get("max_tokens", 16), seed=0)
    steps = []
    for names in config["steps"]:
        outs = llm.generate([{"prompt_token_ids": prompts[n]} for n in names], params, use_tqdm=False)
        steps.append(
            [
                {
                    "probe": name,
                    "token_ids": list(o.outputs[0].token_ids),
                    "cached_tokens": o.num_cached_tokens,
                    "planted_fault": (o.kv_transfer_params or {}).get("planted_fault"),
                }
                for name, o in zip(names, outs)
            ]
        )
    Path(config["out"]).write_text(json.dumps({"steps": steps}, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def test_a_request_preempted_and_resumed_loads_its_blocks_again(preemption_drive):
    """A KV cache of 100 blocks, three reuses of about 33 blocks each in flight together, 48 tokens each: the
    cache runs out while they decode, vLLM preempts one, and on resuming it is promised its prompt's stored
    blocks again. The faithful connector (fault none) must load them: every answer is its cold one. Before
    the resumed load existed, chat-513 resumed on whatever its fresh blocks held and answered otherwise."""
    out = preemption_drive
    cold = {r["probe"]: r["token_ids"] for step in out["steps"][:3] for r in step}
    together = out["steps"][3]
    resumed = [r for r in together if any(ld["resumed"] for ld in r["planted_fault"].get("loads", []))]
    assert resumed, [r["planted_fault"] for r in together]  # preemption happened
    for r in together:
        assert r["cached_tokens"] > 0 and r["token_ids"] == cold[r["probe"]], r["probe"]
    assert any(line.get("resumed") for line in out["audit"])


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
