"""When a backend that cannot be reached is warned about, and what the warning says."""

from __future__ import annotations

import pytest

from router.health.notices import Notices
from router.health.trouble import WARN_AFTER, WARN_EVERY, Failure, Trouble, after_probe, warning

REFUSED = Failure("refused", "cannot connect to http://127.0.0.1:1: Connection refused")


def fold(
    trouble: Trouble | None, failure: Failure | None, times: list[float]
) -> tuple[Trouble | None, list[float]]:
    """Fold one probe at each of ``times``; the times it warned at."""
    warned = []
    for now in times:
        trouble, warn = after_probe(trouble, failure, now)
        if warn:
            warned.append(now)
    return trouble, warned


def test_a_backend_failing_is_warned_about_after_a_few_probes_then_rarely() -> None:
    times = [2.0 * i for i in range(400)]  # 800 s of probes every 2 s
    trouble, warned = fold(None, REFUSED, times)
    assert warned[0] == times[WARN_AFTER - 1]  # the fifth failed probe in a row
    assert [b - a for a, b in zip(warned, warned[1:], strict=False)] == [WARN_EVERY] * (
        len(warned) - 1
    )
    assert len(warned) == 3 and trouble is not None and trouble.since == 0.0


def test_a_good_probe_ends_it_and_a_new_run_starts_over() -> None:
    trouble, warned = fold(None, REFUSED, [0, 1, 2, 3, 4])
    assert warned == [4]
    trouble, _ = after_probe(trouble, None, 5)
    assert trouble is None
    _, warned = fold(trouble, REFUSED, [6, 7, 8, 9, 10])
    assert warned == [10]  # warned again, not held back by the old warning


def test_a_new_cause_is_warned_about_at_once() -> None:
    trouble, warned = fold(None, REFUSED, [0, 1, 2, 3, 4, 5])
    assert warned == [4]
    not_found = Failure("not_found", "/health: HTTP 404")
    trouble, warned = fold(trouble, not_found, [6, 7])
    assert warned == [6] and trouble is not None and trouble.since == 0.0


@pytest.mark.parametrize(
    ("url", "failure", "says"),
    [
        (
            "http://sglang-eagle3x:30000",
            Failure("unresolved", "cannot resolve 'sglang-eagle3x': Name or service not known"),
            ["its host 'sglang-eagle3x' does not resolve", "typo", "namespace"],
        ),
        ("http://127.0.0.1:1", REFUSED, ["Connection refused", "on 127.0.0.1:1", "port"]),
        (
            "http://gw:80/sglang",
            Failure("not_found", "/health: HTTP 404"),
            ["GET /sglang/health answers 404", "the URL's path /sglang is put before"],
        ),
        (
            "http://gw",
            Failure("not_found", "/health: HTTP 404"),
            ["GET /health answers 404", "all answer GET /health"],
        ),
        ("http://e:1", Failure("failing", "/ready: HTTP 503"), ["/ready: HTTP 503", "loads"]),
    ],
)
def test_the_warning_names_the_cause_and_what_to_check(
    url: str, failure: Failure, says: list[str]
) -> None:
    text = warning(url, failure, 10.4)
    assert text.startswith(f"backend {url} has failed every health probe for 10 s: ")
    for part in says:
        assert part in text
    assert "\n" not in text


def test_notices_keep_one_per_key_and_its_first_time(caplog: pytest.LogCaptureFixture) -> None:
    notices = Notices()
    notices.raise_("backend:a", "a", "first", 1.0)
    notices.raise_("backend:a", "a", "second", 5.0, log_it=False)
    notices.raise_("backend:b", "b", "other", 2.0, level="error")
    assert [(n.subject, n.message, n.since) for n in notices.current()] == [
        ("a", "second", 1.0),
        ("b", "other", 2.0),
    ]
    assert [r.getMessage() for r in caplog.records] == ["first", "other"]
    assert notices.document(6.0)[0] == {
        "kind": "backend",
        "level": "warning",
        "subject": "a",
        "message": "second",
        "for_s": 5.0,
    }
    assert notices.clear("backend:a") and not notices.clear("backend:a")
    notices.clear_prefix("backend:")
    assert notices.current() == []
