"""The version matrix: cells (an environment, a connector, a fixture, a model, a seed, flags) each run
by the normal verifier as a Ray task, one normal report per cell, a summary and a page over them.

`spec` loads the matrix file, `status` decides what a cell's report says and which cells --resume
reruns (pure), `cell` is what one Ray task runs, `cluster` is the only module that imports Ray,
`page` renders the matrix page, `commands` is `python -m repro matrix`."""
