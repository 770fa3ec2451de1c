"""Planning a run: the verifier's options, the fixture and its probes, the arms each run has."""
