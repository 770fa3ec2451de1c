"""Recording a run: the report assembled from the plan and the judged runs, written with its logs together;
the report file (schema, loading, exit code), provenance, the one file writer."""
