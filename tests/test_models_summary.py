"""repro.models.check's verdict on its readings (pure): every step that ran must match, a greedy difference
is located, a child that failed is an error and never a match."""

from __future__ import annotations

from repro.models.check import compare_runs, summarize


def _run(tokens, logprobs, ids=(1, 2, 3), text="x"):
    return {"prompt_ids": list(ids), "tokens": list(tokens), "logprobs": list(logprobs), "text": text}


def _results(hf_tokens=(5, 6, 7), identical=True):
    return {
        "tensors": {"tensors": [{"name": "a", "identical": True}], "gguf_package": "0.19.0"},
        "transformers": {
            "weights": [{"name": "w", "identical": identical}],
            "unmatched": [],
            "runs": {"q": _run(hf_tokens, [-0.1, -0.2, -0.3])},
            "transformers": "5.24.0",
        },
        "vllm": {"runs": {"q": _run((5, 6, 7), [-0.1, -0.2, -0.30001], text="Paris")}, "vllm": "0.28.0"},
    }


def test_everything_identical_matches():
    s = summarize(_results())
    assert s["matched"] is True and s["errors"] == []
    g = s["figures"]["greedy"]["q"]
    assert g["match"] and g["first_diff"] is None and abs(g["max_logprob_gap"] - 1e-5) < 1e-9 and g["text"] == "Paris"
    assert s["figures"]["gguf_dequantize"] == "1/1 tensors identical"


def test_a_token_or_a_weight_that_differs_is_no_match():
    s = summarize(_results(hf_tokens=(5, 9, 7)))
    assert s["matched"] is False and s["figures"]["greedy"]["q"]["first_diff"] == 1
    assert summarize(_results(identical=False))["matched"] is False


def test_a_failed_step_is_an_error_and_only_the_steps_that_ran_count():
    results = _results()
    results["vllm"] = {"error": "vllm: exit 1 (boom)"}
    s = summarize(results)
    assert s["matched"] is False and s["errors"] == ["vllm: exit 1 (boom)"]
    assert summarize({"tensors": _results()["tensors"]})["matched"] is True


def test_a_prompt_transformers_did_not_run_does_not_match():
    assert compare_runs({"q": _run((1,), [0.0])}, {})["q"]["match"] is False
