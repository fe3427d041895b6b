"""The command line without servers: arguments, the report, the progress bar."""

from __future__ import annotations

import io

import pytest

from router.calibrate.cli import base_url, parse_args, report
from router.calibrate.progress import Progress
from router.decide.table import Point, PoolCurve, Table

REQUIRED = ["--speculative", "http://a", "--baseline", "http://b", "--out", "t.json"]


def test_defaults() -> None:
    args = parse_args(REQUIRED)
    assert args.levels == (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)
    assert args.objective == "tpot" and args.ignore_eos and args.time_scale == 1.0
    assert args.requests_per_level is None and args.min_samples == 8


def test_levels_are_sorted_and_deduplicated() -> None:
    assert parse_args([*REQUIRED, "--concurrency", "8, 2,2,4"]).levels == (2, 4, 8)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--concurrency", "1,x"], "integers separated by commas"),
        (["--concurrency", "0,4"], "levels must be >= 1"),
        (["--prompt-tokens", "8", "--dataset", "d.jsonl"], "not allowed with argument"),
        (["--requests-per-level", "4"], "at least --min-samples"),
        (["--output-tokens", "1"], "a decode speed needs two tokens"),
        (["--time-scale", "0"], "--time-scale and --level-timeout must be > 0"),
    ],
)
def test_bad_arguments(extra: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        parse_args([*REQUIRED, *extra])
    assert info.value.code == 2
    assert message in capsys.readouterr().err


def test_base_url_accepts_v1_and_slashes() -> None:
    for url in ("http://h:1", "http://h:1/", "http://h:1/v1", "http://h:1/v1/"):
        assert base_url(url) == "http://h:1"


def test_report_lists_both_pools_and_the_crossover() -> None:
    point = Point(4, 20.0, 0.1, 0.3, 3.2, 80.0, 16)
    table = Table(6, "calibrated", speculative=PoolCurve((point,)), baseline=PoolCurve((point,)))
    text = report(table)
    assert "   4  speculative       20.0" in text and "   4  baseline" in text
    assert text.splitlines()[-1].startswith("crossover: 6 (objective tpot")


def test_progress_plain_lines_when_not_a_terminal() -> None:
    out = io.StringIO()
    progress = Progress(out, levels=2, tty=False)
    progress.start("speculative", 4, 16)
    progress.update(8)
    progress.finish(Point(4, 20.0, 0.1, 0.3, 3.2, 80.0, 16), 1.5, 4.0)
    assert "\r" not in out.getvalue()
    assert out.getvalue().startswith("[1/2] speculative c=4   decode p50    20.0 tok/s")
    assert "engine load   4.0" in out.getvalue()


def test_progress_bar_redraws_in_place_on_a_terminal() -> None:
    out = io.StringIO()
    progress = Progress(out, levels=2, tty=True)
    progress.start("baseline", 8, 16)
    progress.update(16)
    text = out.getvalue()
    assert text.count("\r\x1b[2K") == 2 and "#" * Progress.WIDTH in text and "16/16" in text
    progress.start("baseline", 8, 16, attempt=1)
    assert "[1/2] baseline    c=8   (again)" in out.getvalue()
