"""Planning a run: the verifier's options and the fixture, read once into the run's plan (run_plan; its parts,
one per stage, in settings), the probes, the scenarios and the arms each run has."""
