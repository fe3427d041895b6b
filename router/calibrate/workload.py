"""What calibration sends: a synthetic workload or a JSONL dataset's requests in a cycle. Pure.

Dataset format (``--dataset FILE.jsonl``), one JSON object per line, blank lines skipped:

* an OpenAI chat request body, recognised by ``messages``; sent to ``/v1/chat/completions``::

    {"messages": [{"role": "user", "content": "Summarise ..."}], "max_tokens": 256}

* a completions body, recognised by ``prompt``; sent to ``/v1/completions``::

    {"prompt": "Once upon a time", "max_tokens": 256, "temperature": 0}

Every other field (``temperature``, ``top_p``, ``stop``, ...) is sent as it is; a line without
``temperature`` gets the server's default (1.0 on SGLang, vLLM and OpenAI). ``max_tokens`` (or
``max_completion_tokens``) is required unless ``--output-tokens`` gives a default. The
calibrator sets ``stream``, ``stream_options``, ``model`` and (unless ``--no-ignore-eos``)
``ignore_eos``. Lines are sent in order and start over at the end; a line sent twice (in this
sweep or an earlier one) may find its prompt in the engine's prefix cache, which shortens its
time to first token (not its decode speed), so give a dataset at least as long as the sweep,
or one whose lines differ from earlier runs', when TTFT matters. Synthetic prompts begin with a
word unique to the request and the run, so they never hit the cache.
"""

from __future__ import annotations

import itertools
import json
import secrets
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from router.decide.table import Workload

Endpoint = Literal["chat", "completions"]
PATHS: dict[Endpoint, str] = {"chat": "/v1/chat/completions", "completions": "/v1/completions"}


class DatasetError(ValueError):
    """A dataset that cannot be used; the message names the line."""


@dataclass(frozen=True)
class Template:
    """One request to send: an endpoint and a JSON body whose ``max_tokens`` is set."""

    endpoint: Endpoint
    body: dict[str, Any] = field(hash=False, compare=False)
    max_tokens: int


def parse_dataset(lines: Iterable[str], default_max_tokens: int | None = None) -> list[Template]:
    """Read a JSONL dataset (the format is in the module docstring)."""
    templates = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        where = f"dataset line {number}"
        try:
            body = json.loads(line)
        except ValueError as exc:
            raise DatasetError(f"{where} is not JSON: {exc}") from None
        if not isinstance(body, dict):
            raise DatasetError(f"{where} must be a JSON object")
        endpoint: Endpoint
        if "messages" in body:
            endpoint = "chat"
            if not isinstance(body["messages"], list) or not body["messages"]:
                raise DatasetError(f"{where}: messages must be a non-empty list")
        elif "prompt" in body:
            endpoint = "completions"
            if not isinstance(body["prompt"], str | list):
                raise DatasetError(f"{where}: prompt must be a string or a list of token ids")
        else:
            raise DatasetError(f"{where} has neither messages nor prompt")
        raw = body.pop("max_completion_tokens", None)
        raw = body.get("max_tokens", default_max_tokens) if raw is None else raw
        if raw is None:
            raise DatasetError(f"{where} has no max_tokens (and no --output-tokens default)")
        if type(raw) is not int or raw < 2:
            raise DatasetError(f"{where}: max_tokens must be an integer >= 2, got {raw!r}")
        body["max_tokens"] = raw
        templates.append(Template(endpoint, body, raw))
    if not templates:
        raise DatasetError("the dataset has no requests")
    return templates


def synthetic(
    serial: int,
    prompt_tokens: int,
    output_tokens: int,
    temperature: float,
    endpoint: Endpoint,
    nonce: str = "",
) -> Template:
    """A prompt of ``prompt_tokens`` words whose first word is unique in the sweep (``serial``)
    and to the run (``nonce``), so that an engine's prefix cache cannot make it free."""
    words = itertools.repeat("hello", max(0, prompt_tokens - 1))
    prompt = " ".join([f"{nonce}r{serial}", *words])
    body: dict[str, Any] = {"max_tokens": output_tokens, "temperature": temperature}
    if endpoint == "chat":
        body["messages"] = [{"role": "user", "content": prompt}]
    else:
        body["prompt"] = prompt
    return Template(endpoint, body, output_tokens)


class RequestSource:
    """Hands out request bodies: the synthetic workload, or the dataset's lines in a cycle."""

    def __init__(
        self,
        *,
        dataset: Sequence[Template] | None = None,
        prompt_tokens: int = 1024,
        output_tokens: int = 256,
        temperature: float = 0.0,
        endpoint: Endpoint = "chat",
        model: str | None = None,
        ignore_eos: bool = True,
    ) -> None:
        self._dataset: Iterator[Template] | None = itertools.cycle(dataset) if dataset else None
        self._serial = itertools.count()
        self.prompt_tokens, self.output_tokens = prompt_tokens, output_tokens
        self.temperature, self.endpoint = temperature, endpoint
        self.model, self.ignore_eos = model, ignore_eos
        self.nonce = secrets.token_hex(3)  # per run: an earlier run's prompts are not cached

    @property
    def dataset(self) -> bool:
        return self._dataset is not None

    def variant(
        self, *, prompt_tokens: int | None = None, temperature: float | None = None
    ) -> RequestSource:
        """The same synthetic requests with another prompt length or temperature."""
        return RequestSource(
            prompt_tokens=self.prompt_tokens if prompt_tokens is None else prompt_tokens,
            output_tokens=self.output_tokens,
            temperature=self.temperature if temperature is None else temperature,
            endpoint=self.endpoint,
            model=self.model,
            ignore_eos=self.ignore_eos,
        )

    def next(self, share: float = 1.0) -> tuple[str, dict[str, Any]]:
        """(path, body) of the next request; ``share`` < 1 shortens its output (warm-up)."""
        if self._dataset is not None:
            template = next(self._dataset)
        else:
            template = synthetic(
                next(self._serial),
                self.prompt_tokens,
                self.output_tokens,
                self.temperature,
                self.endpoint,
                self.nonce,
            )
        body = dict(template.body)
        body["max_tokens"] = max(2, round(template.max_tokens * share))
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
        if self.model is not None:
            body["model"] = self.model
        if self.ignore_eos:
            # SGLang, vLLM, llama.cpp: exactly max_tokens, so the workload is the one asked for.
            body["ignore_eos"] = True
        return PATHS[template.endpoint], body


def dataset_workload(templates: Sequence[Template], name: str) -> Workload:
    """The table's workload for a dataset: its name, mean ``max_tokens``, mean temperature."""
    temps = [_temperature(t.body.get("temperature")) for t in templates]
    return Workload(
        prompt_tokens=None,
        output_tokens=round(sum(t.max_tokens for t in templates) / len(templates)),
        dataset=name,
        temperature=sum(temps) / len(temps),
    )


def _temperature(value: object) -> float:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    return 1.0  # unset (or odd): the servers' default
