"""LMCache, parent side: its compiled ops or fallback, its MP server (and whose sockets answer on its ports),
its log and counters."""
