"""Judging a run: exact comparison, replays, verdicts, trials, the KV audit's classes."""
