"""Pure: the dataset format and the request bodies the calibrator sends."""

from __future__ import annotations

import json

import pytest

from router.calibrate.workload import (
    DatasetError,
    RequestSource,
    dataset_workload,
    parse_dataset,
)

CHAT = {"messages": [{"role": "user", "content": "hi there"}], "max_tokens": 32}
COMPLETION = {"prompt": "once upon a time", "max_tokens": 8, "temperature": 0.5}


def lines(*bodies: object) -> list[str]:
    return [json.dumps(b) for b in bodies]


def test_chat_and_completion_lines() -> None:
    templates = parse_dataset([*lines(CHAT), "", "  ", *lines(COMPLETION)])
    assert [(t.endpoint, t.max_tokens) for t in templates] == [("chat", 32), ("completions", 8)]
    assert templates[1].body["temperature"] == 0.5


def test_max_completion_tokens_and_default() -> None:
    chat = {"messages": CHAT["messages"], "max_completion_tokens": 40}
    (t,) = parse_dataset(lines(chat))
    assert t.max_tokens == 40 and t.body["max_tokens"] == 40
    assert "max_completion_tokens" not in t.body
    (t,) = parse_dataset(lines({"prompt": "x"}), default_max_tokens=64)
    assert t.max_tokens == 64


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("{not json", "dataset line 2 is not JSON"),
        ("[1, 2]", "dataset line 2 must be a JSON object"),
        ('{"input": "x", "max_tokens": 4}', "dataset line 2 has neither messages nor prompt"),
        ('{"messages": [], "max_tokens": 4}', "dataset line 2: messages must be a non-empty"),
        ('{"prompt": "x"}', "dataset line 2 has no max_tokens"),
        ('{"prompt": "x", "max_tokens": 1}', "max_tokens must be an integer >= 2, got 1"),
        ('{"prompt": "x", "max_tokens": "9"}', "max_tokens must be an integer >= 2, got '9'"),
    ],
)
def test_bad_lines_are_named(line: str, message: str) -> None:
    with pytest.raises(DatasetError) as info:
        parse_dataset([*lines(CHAT), line])
    assert message in str(info.value)


def test_empty_dataset() -> None:
    with pytest.raises(DatasetError, match="no requests"):
        parse_dataset(["", "\n"])


def test_source_cycles_dataset_and_sets_streaming_fields() -> None:
    source = RequestSource(dataset=parse_dataset(lines(CHAT, COMPLETION)), model="m")
    sent = [source.next() for _ in range(3)]
    assert [path for path, _ in sent] == [
        "/v1/chat/completions",
        "/v1/completions",
        "/v1/chat/completions",
    ]
    path, body = sent[0]
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert body["model"] == "m" and body["ignore_eos"] is True and body["max_tokens"] == 32
    assert "stream" not in CHAT  # the caller's dict is not touched


def test_warm_up_share_shortens_output() -> None:
    source = RequestSource(prompt_tokens=4, output_tokens=100, ignore_eos=False)
    _, body = source.next(0.25)
    assert body["max_tokens"] == 25 and "ignore_eos" not in body and "model" not in body
    _, body = source.next(0.001)
    assert body["max_tokens"] == 2


def test_synthetic_prompts_are_unique_and_sized() -> None:
    source = RequestSource(prompt_tokens=5, output_tokens=7, temperature=0.0)
    (_, a), (_, b) = source.next(), source.next()
    words_a = a["messages"][0]["content"].split()
    assert len(words_a) == 5 and words_a[0] != b["messages"][0]["content"].split()[0]
    assert a["temperature"] == 0.0 and a["max_tokens"] == 7
    path, c = RequestSource(prompt_tokens=3, endpoint="completions").next()
    assert path == "/v1/completions" and len(c["prompt"].split()) == 3
    # another run (source) starts its prompts differently: no prefix-cache hits across runs
    _, again = RequestSource(prompt_tokens=5, output_tokens=7, temperature=0.0).next()
    assert again["messages"][0]["content"].split()[0] != words_a[0]
    assert a["ignore_eos"] is True


def test_dataset_workload() -> None:
    w = dataset_workload(parse_dataset(lines(CHAT, COMPLETION)), "mix.jsonl")
    assert (w.dataset, w.output_tokens, w.prompt_tokens) == ("mix.jsonl", 20, None)
    assert w.temperature == pytest.approx((1.0 + 0.5) / 2)  # unset: the servers' default, 1
