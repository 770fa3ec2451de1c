"""The publishing side: the report site, its view models and the issue Markdown (one Jinja environment)."""
