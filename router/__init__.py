"""spec-router: route OpenAI-compatible traffic between a speculative and a baseline pool by
load."""

from router import compiled as _compiled

__version__ = "0.1.0"

# Before any compiled module (router.compiled.MODULES) is imported: a build whose sources were
# edited since runs them from source, never stale.
_compiled.guard()
