"""llama.cpp behind the kit's engine boundary: its child (`python -m repro.llamacpp JOB.json`, run in
.venvs/llamacpp), the same job and result contract as vLLM's (repro.contract), judged by the same judge. Its build
is repro.llamacpp.build's."""
