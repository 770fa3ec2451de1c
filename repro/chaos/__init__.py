"""The chaos run: real kit runs (with the failure-handling tests' fake engine and MP stand-in), one fault each.

`python -m repro chaos [--faults N] [--seed S]` (`make chaos`) draws N faults from the seed (repro.chaos.faults),
runs the kit once per fault and injects it at a random moment (repro.chaos.inject), then checks what the kit
left (repro.chaos.checks: processes, report, exit code and message) and prints a table (repro.chaos.commands).
"""
