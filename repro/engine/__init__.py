"""The engine boundary: the only package that imports vllm, torch or lmcache.

Everything here runs in an engine child process (or in vLLM's own workers): the child entry
(`python -m repro.engine JOB.json`, repro.engine.child), the preflight, the connectors and the
engine half of the model calibration. The parent side talks to it only through repro.contract.
"""
