"""The one compiled part: router/forward/_relay.c, the relay of a chunked stream's common case.

Optional: where it cannot be built (no compiler, no Python headers) the router runs the same
relay in Python (router.forward.relay says which is in use)."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "router.forward._relay",
            ["router/forward/_relay.c"],
            optional=True,
            extra_compile_args=["-O2", "-Wall", "-Wextra", "-Wno-missing-field-initializers"],
        )
    ]
)
