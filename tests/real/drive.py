"""Traffic for the real-engine tests: fixed prompts (so that streams can be compared byte for
byte), a closed loop, and the comparison of two bodies."""

from __future__ import annotations

import asyncio
import itertools
import json
import re
import time
from typing import Any

import httpx

from router.calibrate.loadgen import RequestResult, send_one
from router.tools.llamacpp import MODEL

# Four prompts of ~40 words with distinct first words. Every request sends cache_prompt: false,
# so the engine computes each from scratch and its timings do not depend on what came before.
PROMPTS = tuple(
    " ".join([first, *itertools.repeat("hello", 39)])
    for first in ("alpha", "bravo", "carbon", "delta")
)
CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"


def chat_body(
    prompt: int, *, stream: bool = True, usage: bool = True, max_tokens: int = 64
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": MODEL,
        "messages": [{"role": "user", "content": PROMPTS[prompt % len(PROMPTS)]}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "cache_prompt": False,
        "stream": stream,
    }
    if stream and usage:
        body["stream_options"] = {"include_usage": True}
    return body


def completion_body(prompt: int, max_tokens: int = 64) -> dict[str, Any]:
    return {
        "model": MODEL,
        "prompt": PROMPTS[prompt % len(PROMPTS)],
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "cache_prompt": False,
        "stream": True,
    }


# What differs between two answers to the same request: the id, the second it was made, and
# how long each phase took (llama.cpp's timings object has no nested objects).
_PER_REQUEST = (
    (re.compile(rb'"id":"[^"]*"'), b'"id":"-"'),
    (re.compile(rb'"created":\d+'), b'"created":0'),
    (re.compile(rb'"timings":\{[^{}]*\}'), b'"timings":{-}'),
)


def masked(body: bytes) -> bytes:
    for pattern, repl in _PER_REQUEST:
        body = pattern.sub(repl, body)
    return body


def text_of(body: bytes) -> str:
    """The generated text of an SSE body (chat deltas or completion text)."""
    out = []
    for line in body.split(b"\n"):
        if not line.startswith(b"data: {"):
            continue
        for choice in json.loads(line[6:]).get("choices") or ():
            out.append((choice.get("delta") or {}).get("content") or choice.get("text") or "")
    return "".join(out)


async def post(client: httpx.AsyncClient, url: str, body: dict[str, Any]) -> RequestResult:
    """One streamed request, its body kept."""
    result = RequestResult(0, 0, time.monotonic(), body["max_tokens"])
    return await send_one(client, url, body, result, keep_body=True)


async def closed_loop(
    client: httpx.AsyncClient, url: str, concurrency: int, requests: int, first: int = 0
) -> list[RequestResult]:
    """``concurrency`` clients back to back until ``requests`` in all, prompts in turn."""
    tickets = itertools.count(first)
    results: list[RequestResult] = []
    last = first + requests

    async def worker(i: int) -> None:
        while (n := next(tickets)) < last:
            result = RequestResult(i, n, time.monotonic(), 64)
            results.append(result)
            await send_one(client, url + CHAT, chat_body(n), result, keep_body=True)

    await asyncio.gather(*(worker(i) for i in range(concurrency)))
    return results
