"""The one compiled part: router/upstream/_relay.c, the relay of a chunked stream's common case.

Optional: where it cannot be built (no compiler, no Python headers) the router runs the same
relay in Python (router.upstream.relay says which is in use)."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "router.upstream._relay",
            ["router/upstream/_relay.c"],
            optional=True,
            extra_compile_args=["-O2", "-Wall", "-Wextra", "-Wno-missing-field-initializers"],
        )
    ]
)
