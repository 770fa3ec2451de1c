"""Where the kit's own files are: one definition of the kit root and the folders under it."""

from __future__ import annotations

from pathlib import Path

KIT_ROOT = Path(__file__).resolve().parent.parent
TEMPLATES_DIR = KIT_ROOT / "templates"
FIXTURES_DIR = KIT_ROOT / "fixtures"
SCHEMAS_DIR = KIT_ROOT / "schemas"
# The site's (and the kit's evidence/) folder for copies of reports and the logs they cite.
RAW_DIR = "raw"
