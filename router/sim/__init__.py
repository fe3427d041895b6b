"""Simulated engines: a pure performance model (``model``), a batching loop that runs it
against a clock (``engine``) and an SGLang-shaped OpenAI server around it (``server``)."""
