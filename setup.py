"""The compiled part and the one file installed beside the package.

router/upstream/_relay.c is the relay of a chunked stream's common case. Optional: where it
cannot be built (no compiler, no Python headers) the router runs the same relay in Python
(router.upstream.relay says which is in use).

router/spec_router_uvicorn.pth goes to the top of site-packages, where the interpreter reads
it at start-up: it refuses `uvicorn router.app:app --workers N` in uvicorn's own process, before
uvicorn binds its socket (router/uvicorn_guard.py), and does nothing in any other process. The
build_py below puts it at the root of the wheel, or of the editable wheel (`pip install -e`).
"""

from pathlib import Path

from setuptools import Extension, setup
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


setup(
    cmdclass={"build_py": BuildPyWithPth},
    ext_modules=[
        Extension(
            "router.upstream._relay",
            ["router/upstream/_relay.c"],
            optional=True,
            extra_compile_args=["-O2", "-Wall", "-Wextra", "-Wno-missing-field-initializers"],
        )
    ],
)
