"""``spec-router calibrate`` against the simulated engines: measured crossover vs the model's.

For each workload this starts an eagle3 and a baseline sim pinned to CPU 0 (``taskset -c 0``),
runs ``python -m router calibrate`` against them as its own process pinned to CPU 1, and
compares the table it writes with ``router.sim.model``: the crossover against
``model.crossover`` (where the per-request decode curves cross; the table's crossover is the
lowest whole number of requests from which the baseline is as good, so the model's whole
number is that crossing rounded up), and every measured point against ``model.closed_loop``.
Writes the tables and plots to ``bench/results/calibration-<prompt>-<output>.{json,png}`` and
the report to ``bench/results/calibration.md``.

    python bench/calibration.py            # the three 1024-token cases, about 6 minutes
    python bench/calibration.py --all      # and the short-prompt case, about a minute more
    python bench/calibration.py --only 1024x64   # one case; the report keeps the others
    python bench/calibration.py --report   # the report again from bench/results/

Exit status 1 if a crossover is off by more than one request. A case whose table names
doubtful levels (see the report's *Disturbances*) is run again, at most three times.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from router.decide.table import Table, from_json, to_json
from router.sim.model import BASELINE, EAGLE3, closed_loop, crossover
from router.tools.processes import Proc, pinned, spawn

RESULTS = Path("bench/results")
SIM_CPU, CALIBRATOR_CPU = "0", "1"
ATTEMPTS = 3  # per case, while the calibrator reports doubtful levels


@dataclass(frozen=True)
class Case:
    prompt: int
    output: int
    scale: float
    levels: tuple[int, ...]
    requests: int | None  # --requests-per-level; None: the calibrator's default
    why: str

    @property
    def name(self) -> str:
        return f"{self.prompt}x{self.output}"

    @property
    def stem(self) -> str:
        return f"calibration-{self.prompt}-{self.output}"


AROUND = (1, 2, 4, 5, 6, 7, 8, 10, 12)  # dense where the model's curves cross (6-7)
CASES = (
    Case(
        1024,
        64,
        0.1,
        AROUND,
        96,
        "short requests vary most in speed on the speculative pool (about 8% each), and near "
        "the crossing the curves differ by 1-3% a level, so 96 requests a level (median noise "
        "about 1%); time scale 0.1, because a stall of the sim hurts short requests most",
    ),
    Case(1024, 256, 0.05, AROUND, 32, "32 requests a level keep the median's noise near 1%"),
    Case(
        1024,
        2048,
        0.05,
        (1, 2, 4, 6, 7, 8, 10),
        8,
        "long requests vary little (about 1.5%), so 8 a level suffice; each takes 25-100 "
        "model seconds, hence fewer levels",
    ),
)
EXTRA = (  # with --all
    Case(
        32,
        256,
        0.05,
        (1, 4, 6, 7, 8, 10),
        48,
        "short prompts, where prefill hardly matters; at 7 the model's curves are 1.3% apart, "
        "so 48 requests a level",
    ),
)


def start_sim(preset: str, scale: float, seed: int) -> Proc:
    args = ["-m", "router.sim", "--preset", preset, "--port", "0"]
    args += ["--time-scale", str(scale), "--seed", str(seed)]
    return spawn(args, prefix=pinned(int(SIM_CPU)))


def calibrate_args(case: Case, spec: str, base: str) -> list[str]:
    args = ["--speculative", spec, "--baseline", base]
    args += ["--concurrency", ",".join(map(str, case.levels))]
    args += ["--prompt-tokens", str(case.prompt), "--output-tokens", str(case.output)]
    if case.requests is not None:
        args += ["--requests-per-level", str(case.requests)]
    args += ["--time-scale", f"{case.scale:g}"]
    args += ["--out", str(RESULTS / f"{case.stem}.json")]
    args += ["--plot", str(RESULTS / f"{case.stem}.png")]
    return args


@dataclass
class CaseRun:
    """One calibration case as run: the table it gave and how the run went."""

    case: Case
    table: Table
    seconds: float
    analytic: float | None
    command: str
    retried: list[str]  # the calibrator's lines about levels it measured again
    earlier: list[str] = field(default_factory=list)  # doubts of earlier attempts at the case

    @property
    def doubtful(self) -> str:
        """The table's note on levels that failed a check even when measured again."""
        found = re.search(r"Levels that failed a check[^:]*: ([^.]*)\.", self.table.notes)
        return f"doubtful levels: {found.group(1)}" if found else ""

    def save(self) -> None:
        """What the report needs besides the table, next to it (``--report`` rebuilds it)."""
        run = {"seconds": self.seconds, "command": self.command, "retried": self.retried}
        run["earlier"] = self.earlier
        (RESULTS / f"{self.case.stem}.run.json").write_text(json.dumps(run, indent=2) + "\n")

    @classmethod
    def load(cls, case: Case) -> CaseRun | None:
        try:
            run = json.loads((RESULTS / f"{case.stem}.run.json").read_text())
            table = from_json(json.loads((RESULTS / f"{case.stem}.json").read_text()))
        except FileNotFoundError:
            return None
        analytic = crossover(EAGLE3, BASELINE, case.prompt, case.output)
        return cls(
            case, table, run["seconds"], analytic, run["command"], run["retried"], run["earlier"]
        )

    @property
    def analytic_whole(self) -> int | None:
        return None if self.analytic is None else math.ceil(self.analytic)

    @property
    def ok(self) -> bool:
        whole = self.analytic_whole
        found = self.table.crossover
        return whole is not None and found is not None and abs(found - whole) <= 1


def run_case(case: Case) -> CaseRun:
    spec = start_sim("eagle3", case.scale, 1)
    spec_url = spec.url
    try:
        base = start_sim("baseline", case.scale, 2)
        base_url = base.url
        try:
            args = calibrate_args(case, spec_url, base_url)
            cmd = ["taskset", "-c", CALIBRATOR_CPU, sys.executable, "-m", "router", "calibrate"]
            began = time.monotonic()
            proc = subprocess.Popen(
                [*cmd, *args], text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE
            )
            assert proc.stderr is not None and proc.stdout is not None
            retried = []
            for line in proc.stderr:  # the progress lines: pass them on, keep the retries
                sys.stderr.write(line)
                if line.startswith("  ") or "(again)" in line:
                    retried.append(line.strip())
            out = proc.stdout.read()
            proc.wait()
            seconds = time.monotonic() - began
        finally:
            base.stop()
    finally:
        spec.stop()
    if proc.returncode != 0:
        raise RuntimeError(f"calibrate failed for {case.name}:\n{out}")
    shown = " ".join(shlex.quote(a) for a in ["spec-router", "calibrate", *args])
    shown = shown.replace(spec_url, "$SPEC").replace(base_url, "$BASE")
    table = from_json(json.loads((RESULTS / f"{case.stem}.json").read_text()))
    analytic = crossover(EAGLE3, BASELINE, case.prompt, case.output)
    return CaseRun(case, table, seconds, analytic, shown, retried)


def points_table(o: CaseRun) -> list[str]:
    c = o.case
    lines = [
        "| c | speculative measured | model | baseline measured | model | speculative total "
        "| model | baseline total | model |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    base = {p.concurrency: p for p in o.table.baseline.points}
    for s in o.table.speculative.points:
        n = s.concurrency
        b = base[n]
        me = closed_loop(EAGLE3, n, c.prompt, c.output)
        mb = closed_loop(BASELINE, n, c.prompt, c.output)
        mark = " **<-**" if n == o.table.crossover else ""
        lines.append(
            f"| {n}{mark} | {s.decode_tps_p50:.1f} | {me.per_request_tps:.1f} "
            f"| {b.decode_tps_p50:.1f} | {mb.per_request_tps:.1f} "
            f"| {s.total_tps:.0f} | {me.total_tps:.0f} | {b.total_tps:.0f} | {mb.total_tps:.0f} |"
        )
    return lines


def excerpt(table: Table) -> str:
    """The table's JSON with each pool's points cut to the first one."""
    raw = to_json(table)
    for pool in ("speculative", "baseline"):
        pts = raw[pool]["points"]
        raw[pool]["points"] = [*pts[:1], f"... {len(pts) - 1} more levels"]
    return json.dumps(raw, indent=2)


def report(outcomes: list[CaseRun]) -> str:
    lines = [
        "# Calibration against the simulated engines",
        "",
        "`spec-router calibrate` drove the eagle3 and the baseline sim, each alone, with a "
        "closed loop at each concurrency level and wrote a crossover table; this compares the "
        "crossover it found with the analytic model's (`router.sim.model.crossover`, where the "
        "per-request decode curves cross). The table's crossover is a whole number (the lowest "
        "concurrency from which the baseline is at least as good), so the model's whole number "
        "is its crossing rounded up; the target is to be within 1 of it.",
        "",
        f"Generated by `python bench/calibration.py --all` on {os.cpu_count()} cores (a case "
        "alone: `--only 1024x64`; the report again from the results: `--report`): sims pinned "
        f"to CPU {SIM_CPU}, the calibrator to CPU {CALIBRATOR_CPU}, other jobs running on the "
        "same machine. All numbers are in model time (the sims ran faster by the time scale; "
        "the calibrator converted back). The three 1024-token cases take about 6 minutes "
        "when nothing has to be measured again.",
        "",
        "| prompt | output | measured crossover | model crossing | model, whole | within 1 "
        "| levels | requests/level | time scale | wall time | attempts |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for o in outcomes:
        c = o.case
        x = "none" if o.analytic is None else f"{o.analytic:.2f}"
        lines.append(
            f"| {c.prompt} | {c.output} | **{o.table.crossover}** | {x} | {o.analytic_whole} "
            f"| {'yes' if o.ok else 'NO'} | {','.join(map(str, c.levels))} | {c.requests} "
            f"| {c.scale:g} | {o.seconds:.0f} s | {1 + len(o.earlier)} |"
        )
    lines += [
        "",
        "What was picked, and why:",
        "",
        "- **Time scale 0.05** (the sims run 20x faster than the model; 0.1 for 64-token "
        "outputs): fast enough for the bench to take minutes, slow enough that an iteration "
        "still lasts a millisecond or more of wall time (uvloop's timer resolution), so the sims "
        "follow the model to about 1% (compare the measured and model columns below).",
        "- **Levels** dense from 4 to 8, where the model's curves cross (6.1 to 6.8), a few "
        "below for the shape of the curves and none far above: each level costs about "
        "`requests / N + 1` request lifetimes, and 2048-token requests last 25 to 100 model "
        "seconds.",
        "- **Requests per level** from the noise: on the speculative sim one request's decode "
        "speed varies by about `0.67 / sqrt(output tokens)` (its acceptance is random), the "
        "median of n requests by 1.25 times that over `sqrt(n)`, and at the crossing the two "
        "curves are only 1-2% apart.",
        "",
        "Near the crossing the curves are so close that a 1% error in one level can move the "
        "crossover by one; that is what the tolerance of one request is for.",
        "",
        "**Disturbances.** This machine runs other benchmarks at the same time. When one of "
        "them takes the sims' core for a while, a sim falls behind its schedule and then "
        "catches up by running iterations back to back: the requests that waited see a long "
        "time to first token and then tokens arriving too fast, so their measured decode speed "
        "rises (up to twice the model's) while the total tok/s stays right. The calibrator "
        "catches such a level by its symptom, per-request decode speed rising with concurrency "
        "(or the engine holding fewer requests than driven), and measures it again; a case "
        "whose table still names doubtful levels is run again, at most three times. Every "
        "re-measurement and discarded attempt is listed below. Against real engines the "
        "same checks catch other traffic on a pool or a GPU slowed down for a while.",
    ]
    for o in outcomes:
        c = o.case
        fit = o.table.speculative.fit
        tau = f"{fit.tau:.2f}" if fit else "-"
        lines += [
            "",
            f"## {c.prompt}-token prompts, {c.output}-token outputs",
            "",
            f"Crossover **{o.table.crossover}** (model: curves cross at "
            f"{o.analytic if o.analytic is None else round(o.analytic, 2)}). Settings: {c.why}. "
            f"Acceptance length the sim reported: {tau}.",
            "",
            *(
                ["Levels the calibrator measured again:", "", "```", *o.retried, "```", ""]
                if o.retried
                else ["No level had to be measured again.", ""]
            ),
            *(
                [
                    f"Earlier attempts at this case were discarded because the calibrator "
                    f"flagged them: {'; '.join(o.earlier)}.",
                    "",
                ]
                if o.earlier
                else []
            ),
            "```",
            o.command,
            "```",
            "",
            f"![{c.name}]({c.stem}.png)",
            "",
            "Per-request decode tok/s (p50) and total tok/s, measured and model "
            "(`closed_loop`); **<-** marks the crossover:",
            "",
            *points_table(o),
        ]
    shown = next((o for o in outcomes if o.case.output == 256), outcomes[0])
    lines += [
        "",
        f"## The table for {shown.case.prompt}-token prompts and {shown.case.output}-token "
        f"outputs (`{shown.case.stem}.json`), points cut",
        "",
        "```json",
        excerpt(shown.table),
        "```",
        "",
        "## Reproduce",
        "",
        "```",
        "python -m router.sim --preset eagle3 --port 0 --time-scale 0.05 --seed 1   # -> $SPEC",
        "python -m router.sim --preset baseline --port 0 --time-scale 0.05 --seed 2 # -> $BASE",
        "```",
        "",
        "then the `spec-router calibrate` command of each section (pin the sims and the "
        "calibrator to different cores with `taskset` on a small machine).",
    ]
    return "\n".join(lines) + "\n"


def measure(case: Case) -> CaseRun:
    """Run a case until the calibrator flags no level as doubtful (at most ``ATTEMPTS``)."""
    o = run_case(case)
    for attempt in range(2, ATTEMPTS + 1):
        if not o.doubtful:
            break
        # The calibrator says some levels did not run as driven even when measured again
        # (other jobs on this machine starve the sims): its table is not to be trusted, so run
        # the case again; the report shows every attempt's doubts.
        print(f"{case.name}: {o.doubtful}; attempt {attempt}", file=sys.stderr, flush=True)
        earlier = [*o.earlier, o.doubtful]
        o = run_case(case)
        o.earlier = earlier
    print(
        f"{case.name}: crossover {o.table.crossover}, model {o.analytic:.2f} "
        f"({'ok' if o.ok else 'OFF'}), {o.seconds:.0f} s",
        file=sys.stderr,
        flush=True,
    )
    return o


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", help="comma-separated cases to run, e.g. 1024x64,1024x2048")
    parser.add_argument("--all", action="store_true", help="also the short-prompt case")
    parser.add_argument(
        "--report", action="store_true", help="run nothing, rebuild the report from the results"
    )
    parser.add_argument("--out", type=Path, default=RESULTS / "calibration.md")
    args = parser.parse_args()
    known = CASES + EXTRA
    chosen = CASES + (EXTRA if args.all else ())
    if args.only:
        chosen = tuple(c for c in known if c.name in args.only.split(","))
    RESULTS.mkdir(parents=True, exist_ok=True)
    if not args.report:
        for case in chosen:
            print(f"== {case.name} ==", file=sys.stderr, flush=True)
            measure(case).save()
    # The report holds every case with results on disk, however many runs made them.
    outcomes = [o for o in map(CaseRun.load, known) if o is not None]
    args.out.write_text(report(outcomes))
    print(f"report written to {args.out}", file=sys.stderr)
    return 0 if all(o.ok for o in outcomes) else 1


if __name__ == "__main__":
    raise SystemExit(main())
