"""The one file installed beside the package.

router/spec_router_uvicorn.pth goes to the top of site-packages, where the interpreter reads
it at start-up: it refuses `uvicorn router.app:app --workers N` in uvicorn's own process, before
uvicorn binds its socket (router/uvicorn_guard.py), and does nothing in any other process. The
build_py below puts it at the root of the wheel, or of the editable wheel (`pip install -e`).
"""

from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

PTH = Path("router") / "spec_router_uvicorn.pth"


class BuildPyWithPth(build_py):
    def run(self) -> None:
        super().run()
        # A wheel is made of build_lib; an editable wheel of the directory "install" writes
        # to (its build_lib is thrown away, the package being used where it is).
        editable = getattr(self, "editable_mode", False)
        root = self.get_finalized_command("install").install_lib if editable else self.build_lib
        self.copy_file(str(PTH), str(Path(root) / PTH.name), preserve_mode=0)


setup(cmdclass={"build_py": BuildPyWithPth})
