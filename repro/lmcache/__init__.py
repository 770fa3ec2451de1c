"""LMCache, parent side: its compiled ops or fallback, its MP server, its log and counters."""
