"""The wheel's one addition to pyproject.toml: it carries the kit's templates/, schemas/ and fixtures/ as
repro/_kit_files/, where repro.paths reads them in an installed copy (`kvkit site` renders with those templates and
`kvkit verify` checks its report against those schemas, from any folder)."""

from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

KIT_FILE_FOLDERS = ("templates", "schemas", "fixtures")  # beside repro/ in a checkout; repro.paths.INSTALLED_FILES


class BuildPyWithKitFiles(build_py):
    def run(self) -> None:
        super().run()
        root = Path(__file__).resolve().parent
        for name in KIT_FILE_FOLDERS:
            self.copy_tree(str(root / name), str(Path(self.build_lib) / "repro" / "_kit_files" / name))


setup(cmdclass={"build_py": BuildPyWithKitFiles})
