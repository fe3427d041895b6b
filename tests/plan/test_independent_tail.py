"""``bench/independent_tail.py`` keeps the history of bench/results/tail.md: each run of it is a
new section under the title, above the earlier ones, which stay as they were."""

from __future__ import annotations

from pathlib import Path

from tests.support.modules import load_script

it = load_script(Path(__file__).resolve().parents[2] / "bench" / "independent_tail.py")


def run(ratio: float, extra: float) -> dict[str, object]:
    side = {"rps": 1000.0, "ttft_p99_ms": 5.0, "cpu_us_per_stream": 400.0, "errors": 0}
    return {"router": side, "nginx": side, "ratio": ratio, "extra_p99_ms": extra}


def test_a_new_run_goes_above_the_earlier_ones_which_stay() -> None:
    first = it.render([run(0.99, 15.0)] * 3, "python bench/independent_tail.py", "aaa", (0.2, 0.2))
    second = it.render(
        [run(0.93, 40.0)] * 3, "python bench/independent_tail.py", "bbb", (0.2, 0.21)
    )
    assert "**met**" in first and "**not met**" in second
    once = it.with_history("", first)
    assert once.startswith(it.TITLE) and once.count(it.INTRO) == 1
    twice = it.with_history(once, second)
    assert twice.count(it.TITLE) == 1 and twice.count(it.INTRO) == 1
    assert twice.index("`bbb`") < twice.index("`aaa`")
    # the earlier section is kept byte for byte, as are hand-written ones below it
    hand = once + "\n## Written by hand\n\nkept\n"
    assert twice.rstrip("\n").endswith(first.rstrip("\n"))
    assert it.with_history(hand, second).endswith("## Written by hand\n\nkept\n")


def test_a_file_that_is_not_the_harness_s_is_replaced() -> None:
    section = it.render([run(0.99, 15.0)], "c", "ccc", (0.2, 0.2))
    assert it.with_history("# something else\n", section) == it.with_history("", section)
