"""Judging a run: exact comparison, replays, verdicts, each run's report entry, trials and confirmations, the
KV audit's classes."""
