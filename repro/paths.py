"""Where the kit's own files are: one definition of the kit root and the folders under it."""

from __future__ import annotations

from pathlib import Path

# The folder that holds repro/: a checkout or an unpacked kit, or site-packages once `pip install .` has copied the
# package there. What a child interpreter's PYTHONPATH names, so it imports this very code.
KIT_ROOT = Path(__file__).resolve().parent.parent
# Where an installed copy carries the kit's templates/, schemas/ and fixtures/ (setup.py copies them into the wheel;
# a checkout or an unpacked kit has no such folder and reads them beside repro/).
INSTALLED_FILES = Path(__file__).resolve().parent / "_kit_files"
KIT_FILES_ROOT = INSTALLED_FILES if INSTALLED_FILES.is_dir() else KIT_ROOT
TEMPLATES_DIR = KIT_FILES_ROOT / "templates"
FIXTURES_DIR = KIT_FILES_ROOT / "fixtures"
SCHEMAS_DIR = KIT_FILES_ROOT / "schemas"
# The site's (and the kit's evidence/) folder for copies of reports and the logs they cite.
RAW_DIR = "raw"
