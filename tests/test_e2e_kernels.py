"""End to end on the real vLLM CPU engine under another kernel variant (`make repro KERNELS=...`): the self-test's
expectations hold on kernels other than the machine's best, and the report says which kernels it asked for. The
run is the session's self-test (tests/e2e_runs.py), which tests/test_e2e_cpu.py reads too."""

from __future__ import annotations

import pytest
from conftest import have_vllm
from e2e_runs import SELFTEST_KERNELS
from kvkit_testutil import SELFTEST_VERDICTS

from repro.record.provenance import KERNEL_VARIANTS

pytestmark = [pytest.mark.e2e, pytest.mark.skipif(not have_vllm(), reason="vLLM (CPU profile) is not installed")]

# ATen's portable kernels (ATEN_CPU_CAPABILITY=default) instead of its AVX-512/AVX2 ones: on a 2-core AMD EPYC
# (reports/kernels/README.md) they changed the baseline's KV bits and moved native-matched's floor, where avx2 moved
# no KV bit. .ci/run runs the same variant through make.
VARIANT = "generic"


@pytest.fixture
def selftest(selftest_run):
    """The self-test once under the variant, two arms at a time, as `make repro KERNELS=generic` runs it."""
    assert SELFTEST_KERNELS == VARIANT
    return selftest_run.proc, selftest_run.data


def test_the_selftest_holds_under_the_variant(selftest):
    proc, data = selftest
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert data["acceptance"]["matched"] is True, [c for c in data["acceptance"]["checked"] if not c["ok"]]
    verdicts = {a["name"]: a["verdict"] for a in data["arms"]}
    assert verdicts == SELFTEST_VERDICTS
    assert sum(c.get("check") == "kv" for c in data["acceptance"]["checked"]) == 18


def test_the_report_names_the_kernels_it_asked_for(selftest):
    """The variant reached the engines' environment and is recorded: by name, with its variables, and with the
    inductor caches off that torch 2.13 shares across vector ISAs (repro.run.runner.child_env)."""
    _, data = selftest
    prov = data["provenance"]
    assert prov["kernels"] == {"name": VARIANT, "env": KERNEL_VARIANTS[VARIANT]}
    for name, value in KERNEL_VARIANTS[VARIANT].items():
        assert prov["env"][name] == value
    assert prov["env"]["TORCHINDUCTOR_FX_GRAPH_CACHE"] == prov["env"]["TORCHINDUCTOR_AUTOGRAD_CACHE"] == "0"
