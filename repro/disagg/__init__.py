"""Disaggregated prefill (P→D, NixlConnector): its cases, the pair that runs them, its report and command."""
