"""What pyproject.toml cannot say: the .pth file installed beside the package, and the compiled
modules.

router/spec_router_uvicorn.pth goes to the top of site-packages, where the interpreter reads
it at start-up: it refuses `uvicorn router.app:app --workers N` in uvicorn's own process, before
uvicorn binds its socket (router/uvicorn_guard.py), and does nothing in any other process. The
build_py below puts it at the root of the wheel, or of the editable wheel (`pip install -e`).

The modules in router.compiled.MODULES (the decision's hot path) are compiled with mypyc, the
same typed source as C extension modules (bench/results/compiled.md: the slo decision and the
surfaces two to seven times faster), when a C compiler is present. SPEC_ROUTER_PURE=1 builds
pure Python; a build that cannot compile says why and installs pure Python. Either way the
router behaves the same: router.compiled runs the sources instead of a build they no longer
match, and /router/status says which ran.
"""

import importlib.util
import json
import os
import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent
PTH = Path("router") / "spec_router_uvicorn.pth"

# router/compiled.py by path: importing the package would run its __init__
_spec = importlib.util.spec_from_file_location(
    "_spec_router_compiled", HERE / "router" / "compiled.py"
)
assert _spec is not None and _spec.loader is not None
compiled = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(compiled)

PURE = os.environ.get(compiled.PURE_ENV, "") not in ("", "0")


class BuildPyWithPth(build_py):
    def run(self) -> None:
        super().run()
        # A wheel is made of build_lib; an editable wheel of the directory "install" writes
        # to (its build_lib is thrown away, the package being used where it is).
        editable = getattr(self, "editable_mode", False)
        root = self.get_finalized_command("install").install_lib if editable else self.build_lib
        self.copy_file(str(PTH), str(Path(root) / PTH.name), preserve_mode=0)


def _say(message: str) -> None:
    print(f"spec-router: {message}", file=sys.stderr, flush=True)


def _remove_built(package_dir: Path) -> None:
    """An earlier build's extension modules and record where this build puts its own (the source
    tree for an editable install): a pure build must not leave them to be imported."""
    names = [*compiled.MODULES, compiled.SHARED_LIB]
    for name in names:
        stem = compiled.source_path(name, package_dir).with_suffix("")
        for path in stem.parent.glob(stem.name + ".*.so"):
            path.unlink()
    (package_dir / compiled.RECORD).unlink(missing_ok=True)


class BuildExtOrPure(build_ext):
    """Compiles router.compiled.MODULES with mypyc; pure Python when it cannot.

    mypycify (mypy's analysis, ~25 s) runs when this command is set up, not when setup.py is
    read: the build backend reads setup.py several times per install (metadata, requirements,
    the build), and only the build runs build_ext."""

    def finalize_options(self) -> None:
        self.distribution.ext_modules = self._mypycify()
        super().finalize_options()

    def _mypycify(self) -> list[Extension]:
        if PURE:
            _say(f"{compiled.PURE_ENV} is set: building pure Python (nothing compiled)")
            return []
        try:
            from mypyc.build import mypycify

            HERE.joinpath("build").mkdir(exist_ok=True)
            config = HERE / "build" / "mypyc.ini"
            # Not pyproject.toml's [tool.mypy]: the build environment has mypy and setuptools
            # only (no pydantic for its plugin, no third-party stubs). What the router imports
            # from them is typed Any here, which compiles to generic (slower) operations only
            # where the compiled modules touch those objects.
            config.write_text("[mypy]\nignore_missing_imports = True\nfollow_imports = silent\n")
            paths = [str(compiled.source_path(m, Path("router"))) for m in compiled.MODULES]
            return mypycify(
                ["--config-file", str(config), *paths],
                group_name=compiled.SHARED_LIB.removesuffix("__mypyc"),
                target_dir=str(HERE / "build" / "mypyc"),
            )
        except KeyboardInterrupt:
            raise
        except BaseException as exc:  # mypyc's own failures exit (SystemExit)
            self._fall_back(exc)
            return []

    def _fall_back(self, exc: BaseException) -> None:
        _say(
            f"compiling {', '.join(compiled.MODULES)} with mypyc failed "
            f"({type(exc).__name__}: {exc}); installing pure Python (same behaviour, slower "
            f"decisions). Set {compiled.PURE_ENV}=1 to skip the attempt."
        )

    def run(self) -> None:
        # where this build puts the package's extension modules (the source tree when editable)
        package_dir = Path(self.get_ext_fullpath(compiled.SHARED_LIB)).parent
        _remove_built(package_dir)
        if not self.extensions:
            return
        try:
            super().run()
        except KeyboardInterrupt:
            raise
        except BaseException as exc:  # the C compiler's failure
            self._fall_back(exc)
            _remove_built(package_dir)
            for ext in self.extensions:
                Path(self.get_ext_fullpath(ext.name)).unlink(missing_ok=True)
            self.extensions = []
            return
        record = compiled.record(HERE / "router")
        (package_dir / compiled.RECORD).write_text(json.dumps(record, indent=1) + "\n")
        _say(f"compiled with mypyc: {', '.join(compiled.MODULES)}")

    def get_outputs(self) -> list[str]:
        outputs: list[str] = super().get_outputs()
        if self.extensions:
            package_dir = Path(self.get_ext_fullpath(compiled.SHARED_LIB)).parent
            outputs.append(str(package_dir / compiled.RECORD))
        return outputs


# A placeholder until build_ext runs mypycify: it makes the wheel a platform one and has
# build_ext run at all. SPEC_ROUTER_PURE=1: none, a pure (py3-none-any) wheel.
EXT = [] if PURE else [Extension(compiled.SHARED_LIB, sources=[])]

setup(
    cmdclass={"build_py": BuildPyWithPth, "build_ext": BuildExtOrPure},
    ext_modules=EXT,
)
