"""The OpenAI-compatible wire format of the simulator: parse a request, render the answer.

Shapes follow SGLang's OpenAI server (``entrypoints/openai/protocol.py``): ids are 32 hex
digits, chat chunks are ``chat.completion.chunk`` with a first role-only delta, the finish
reason comes in its own chunk, ``stream_options.include_usage`` adds a chunk with empty
``choices``, and the stream ends with ``data: [DONE]``. Errors: SGLang's flat
``{"object": "error", "message", "type", "param", "code"}`` or vLLM's nested OpenAI shape
``{"error": {"message", "type", "param", "code"}}`` (``error_body(..., flat=)``); errors
inside a stream are nested on both. What differs between the engines in parsing (usage
defaults, model names) is in ``Limits``, filled from ``router.sim.behaviour``.

Tokens are counted so that a test can check them exactly:

* a prompt is as many tokens as it has whitespace-separated words (all message contents,
  text parts of list contents), or the length of a token-id list, and at least 1;
* the completion is filler text of exactly ``max_tokens`` tokens, each a 3-letter word and a
  space, so ``len(text.split()) == completion_tokens``.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any, Literal

Kind = Literal["chat", "completions"]
SEP = (",", ":")

_WORDS = ("the", "cat", "sat", "and", "ran", "far", "off", "now")
_TOKEN_CHARS = 4
_CYCLE = "".join(w + " " for w in _WORDS)


def filler(start: int, count: int) -> str:
    """Tokens ``start .. start + count - 1`` of the deterministic completion text."""
    offset = (start % len(_WORDS)) * _TOKEN_CHARS
    repeats = (offset + count * _TOKEN_CHARS) // len(_CYCLE) + 1
    return (_CYCLE * repeats)[offset : offset + count * _TOKEN_CHARS]


def count_words(text: str) -> int:
    return len(text.split())


class BadRequest(Exception):
    def __init__(self, message: str, param: str | None = None, status: int = 400) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.status = status


# vLLM's error types (``type`` of its ErrorResponse) and SGLang's (``serving_base``).
_VLLM_TYPES = {
    400: "BadRequestError",
    404: "NotFoundError",
    429: "Too Many Requests",
    500: "InternalServerError",
    503: "Service Unavailable",
}
_SGLANG_TYPES = {400: "BadRequest", 500: "InternalServerError"}


def error_body(status: int, message: str, param: str | None = None, flat: bool = False) -> bytes:
    """An error as the engine answers it: SGLang flat (``type`` is the status for HTTP errors,
    as ``str(e.status_code)``), vLLM nested."""
    if flat:
        body: dict[str, Any] = {
            "object": "error",
            "message": message,
            "type": _SGLANG_TYPES.get(status, str(status)),
            "param": param,
            "code": status,
        }
    else:
        type_ = _VLLM_TYPES.get(
            status, "BadRequestError" if status < 500 else "InternalServerError"
        )
        body = {"error": {"message": message, "type": type_, "param": param, "code": status}}
    return json.dumps(body, separators=SEP).encode()


def stream_error_event(status: int, message: str, type_: str) -> str:
    """An error inside a stream (both engines nest it), as SGLang writes it: Python
    ``json.dumps`` spacing, ``object`` included."""
    error = {"object": "error", "message": message, "type": type_, "param": None, "code": status}
    return f"data: {json.dumps({'error': error})}\n\n"


@dataclass(frozen=True)
class Job:
    """A validated completion request, reduced to what the simulator needs."""

    kind: Kind
    model: str
    prompt_tokens: int
    max_tokens: int
    temperature: float
    stream: bool
    include_usage: bool
    seed: int | None
    continuous_usage: bool = False  # usage in every chunk
    priority: int | None = None


@dataclass(frozen=True)
class Limits:
    served_model: str
    default_max_tokens: int = 128
    context_length: int = 131072
    strict_model: bool = False  # unknown model names get a 404, as vLLM answers
    missing_model: str | None = None  # a request without one: this name (SGLang "default"),
    # or None: the served name (vLLM)
    empty_options_include_usage: bool = False  # vLLM 0.11: {} asks for usage
    continuous_usage: bool = True  # honours continuous_usage_stats (not SGLang 0.5.3)
    continuous_needs_usage: bool = True  # vLLM: only together with include_usage
    options_need_stream: bool = False  # vLLM: stream_options on a non-stream is a 400
    flat_errors: bool = False


def _int(body: dict[str, Any], key: str) -> int | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadRequest(f"{key} must be an integer", key)
    return value


def _prompt_tokens_chat(messages: object) -> int:
    if not isinstance(messages, list) or not messages:
        raise BadRequest("messages must be a non-empty list", "messages")
    words = 0
    for i, msg in enumerate(messages):
        if not isinstance(msg, dict) or not isinstance(msg.get("role"), str):
            raise BadRequest(f"messages[{i}] must be an object with a string role", "messages")
        content = msg.get("content")
        if isinstance(content, str):
            words += count_words(content)
        elif isinstance(content, list):
            for part in content:
                if not isinstance(part, dict) or not isinstance(part.get("type"), str):
                    raise BadRequest(f"messages[{i}].content parts must be objects", "messages")
                if part["type"] == "text" and isinstance(part.get("text"), str):
                    words += count_words(part["text"])
        elif content is not None:
            raise BadRequest(f"messages[{i}].content must be a string or a list", "messages")
    return max(1, words)


def _prompt_tokens_completion(prompt: object) -> int:
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, str):
        return max(1, count_words(prompt))
    if (
        isinstance(prompt, list)
        and prompt
        and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt)
    ):
        return len(prompt)
    if isinstance(prompt, list) and prompt:
        raise BadRequest("batched prompts are not supported by the simulator", "prompt")
    raise BadRequest("prompt must be a string or a non-empty list of token ids", "prompt")


def parse_job(kind: Kind, raw: bytes, limits: Limits) -> Job:
    """Validate a request body; raises ``BadRequest`` for anything the simulator refuses."""
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadRequest(f"invalid JSON body: {exc}") from None
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object")
    if kind == "chat":
        if "messages" not in body:
            raise BadRequest("messages is required", "messages")
        prompt_tokens = _prompt_tokens_chat(body["messages"])
        max_tokens = _int(body, "max_completion_tokens") or _int(body, "max_tokens")
    else:
        if "prompt" not in body:
            raise BadRequest("prompt is required", "prompt")
        prompt_tokens = _prompt_tokens_completion(body["prompt"])
        max_tokens = _int(body, "max_tokens")
    for key in ("max_tokens", "max_completion_tokens"):
        value = _int(body, key)
        if value is not None and value < 1:
            raise BadRequest(f"{key} must be at least 1, got {value}", key)
    max_tokens = limits.default_max_tokens if max_tokens is None else max_tokens
    if prompt_tokens + max_tokens > limits.context_length:
        raise BadRequest(
            f"requested {prompt_tokens + max_tokens} tokens ({prompt_tokens} in the prompt), "
            f"more than the context length of {limits.context_length}"
        )
    n = _int(body, "n")
    if n is not None and n != 1:
        raise BadRequest(f"only n=1 is supported, got n={n}", "n")
    temperature = body.get("temperature")
    if temperature is None:
        temperature = 1.0  # the OpenAI default, as in SGLang
    elif isinstance(temperature, bool) or not isinstance(temperature, int | float):
        raise BadRequest("temperature must be a number", "temperature")
    elif not 0 <= temperature <= 2:
        raise BadRequest("temperature must be between 0 and 2", "temperature")
    stream = body.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise BadRequest("stream must be a boolean", "stream")
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise BadRequest("stream_options must be an object", "stream_options")
    if limits.options_need_stream and options and not stream:
        raise BadRequest("Stream options can only be defined when `stream=True`.")
    stop = body.get("stop")
    if not (
        stop is None
        or isinstance(stop, str)
        or (isinstance(stop, list) and all(isinstance(s, str) for s in stop))
    ):
        raise BadRequest("stop must be a string or a list of strings", "stop")
    model = body.get("model")
    if model is None or model == "":
        model = limits.missing_model or limits.served_model
    if not isinstance(model, str):
        raise BadRequest("model must be a string", "model")
    if limits.strict_model and model != limits.served_model:
        raise BadRequest(f"The model `{model}` does not exist.", "model", status=404)
    include_usage = False
    continuous = False
    if isinstance(options, dict):
        asked = options.get("include_usage")
        include_usage = bool(limits.empty_options_include_usage if asked is None else asked)
        continuous = limits.continuous_usage and bool(options.get("continuous_usage_stats"))
        if limits.continuous_needs_usage:
            continuous = continuous and include_usage
    priority = _int(body, "priority")
    return Job(
        kind=kind,
        model=model,
        prompt_tokens=prompt_tokens,
        max_tokens=max_tokens,
        temperature=float(temperature),
        stream=stream,
        include_usage=include_usage,
        seed=_int(body, "seed"),
        continuous_usage=continuous,
        priority=priority,
    )


def new_id() -> str:
    return uuid.uuid4().hex


def usage(job: Job, completion_tokens: int) -> dict[str, Any]:
    return {
        "prompt_tokens": job.prompt_tokens,
        "total_tokens": job.prompt_tokens + completion_tokens,
        "completion_tokens": completion_tokens,
        "prompt_tokens_details": None,
        "reasoning_tokens": 0,
    }


class StreamFormat:
    """Renders the SSE events of one streamed answer; the per-token path is two joins."""

    def __init__(self, job: Job, rid: str, created: int) -> None:
        self.job = job
        obj = "chat.completion.chunk" if job.kind == "chat" else "text_completion"
        self._head = (
            f'data: {{"id":"{rid}","object":"{obj}","created":{created},'
            f'"model":{json.dumps(job.model)},"choices":['
        )
        if job.kind == "chat":
            self._pre = self._head + '{"index":0,"delta":{"role":null,"content":"'
            self._post = (
                '","reasoning_content":null,"tool_calls":null},"logprobs":null,'
                '"finish_reason":null,"matched_stop":null}],"usage":null}\n\n'
            )
        else:
            self._pre = self._head + '{"index":0,"text":"'
            self._post = (
                '","logprobs":null,"finish_reason":null,"matched_stop":null}],"usage":null}\n\n'
            )

    def role(self) -> str:
        """Chat only: the first event, role and empty content, as SGLang sends it."""
        now = (
            json.dumps(usage(self.job, 0), separators=SEP) if self.job.continuous_usage else "null"
        )
        return (
            self._head + '{"index":0,"delta":{"role":"assistant","content":"",'
            '"reasoning_content":null,"tool_calls":null},"logprobs":null,'
            '"finish_reason":null,"matched_stop":null}],"usage":' + now + "}\n\n"
        )

    def tokens(self, start: int, count: int) -> str:
        if self.job.continuous_usage:
            usage_now = json.dumps(usage(self.job, start + count), separators=SEP)
            return (
                self._pre
                + filler(start, count)
                + self._post[: -len("null}\n\n")]
                + usage_now
                + "}\n\n"
            )
        return self._pre + filler(start, count) + self._post

    def end(self, completion_tokens: int) -> str:
        """The finish-reason event, the usage event if asked for, and ``[DONE]``."""
        if self.job.kind == "chat":
            choice = (
                '{"index":0,"delta":{"role":null,"content":null,"reasoning_content":null,'
                '"tool_calls":null},"logprobs":null,"finish_reason":"length","matched_stop":null}'
            )
        else:
            choice = (
                '{"index":0,"text":"","logprobs":null,"finish_reason":"length","matched_stop":null}'
            )
        now = "null"
        if self.job.continuous_usage:
            now = json.dumps(usage(self.job, completion_tokens), separators=SEP)
        out = self._head + choice + '],"usage":' + now + "}\n\n"
        return out + self.usage_and_done(completion_tokens)

    def usage_and_done(self, completion_tokens: int) -> str:
        """The usage event if asked for (also after an error event), then ``[DONE]``."""
        out = ""
        if self.job.include_usage:
            out += (
                self._head
                + '],"usage":'
                + json.dumps(usage(self.job, completion_tokens), separators=SEP)
            )
            out += "}\n\n"
        return out + "data: [DONE]\n\n"


def full_response(job: Job, rid: str, created: int, completion_tokens: int) -> bytes:
    text = filler(0, completion_tokens)
    common = {"logprobs": None, "finish_reason": "length", "matched_stop": None}
    if job.kind == "chat":
        message = {
            "role": "assistant",
            "content": text,
            "reasoning_content": None,
            "tool_calls": None,
        }
        choice: dict[str, Any] = {"index": 0, "message": message, **common}
        obj = "chat.completion"
    else:
        choice = {"index": 0, "text": text, **common}
        obj = "text_completion"
    body = {
        "id": rid,
        "object": obj,
        "created": created,
        "model": job.model,
        "choices": [choice],
        "usage": usage(job, completion_tokens),
        "metadata": {"weight_version": "default"},
    }
    return json.dumps(body, separators=SEP).encode()
