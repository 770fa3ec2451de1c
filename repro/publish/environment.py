"""The one Jinja environment for every page the kit renders (report site, detection page, kit README)."""

from __future__ import annotations

import jinja2

from repro.paths import TEMPLATES_DIR

GENERATOR = "kvkit-site"  # marks pages the site wrote (repro.publish.site); only those are ever pruned


def make_environment() -> jinja2.Environment:
    """Autoescape on explicitly (names end in .j2, so file-name rules would not apply); undefined names fail."""
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(TEMPLATES_DIR)),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )
