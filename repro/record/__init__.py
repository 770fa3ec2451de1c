"""Recording a run: the report file (schema, loading, exit code), provenance, the one file writer."""
