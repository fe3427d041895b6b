"""spec-router: route OpenAI-compatible traffic between a speculative and a baseline pool by
load."""

__version__ = "0.1.0"
