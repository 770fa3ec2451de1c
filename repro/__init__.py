"""KV-reuse verifier: proves or rules out silent KV-cache reuse corruption for one serving stack."""

__version__ = "0.1.0"
