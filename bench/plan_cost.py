"""CPU of the planner's rounds, replayed from records, and whether two versions decide alike.

A record (``PLAN_RECORD_PATH``; ``spec-router fleet`` keeps one per run as ``plan-rounds.bin``)
holds each round the plan worker was given and the outcome it sent back. ``replay`` runs every
round of each record through ``router.planning.service.decide`` in one process, in order (the
goodput model's caches carried from round to round as in the worker), timing each in the
process's CPU time, and writes per round: the CPU, whether it was cold (the first plan, or one
on curves or a model mix other than the last plan's: the model's caches keyed on them are
cold), its decision (status, desired split, action, reason) and its numbers (each option's
gains and cost, the splits' values). ``compare`` reads two such files (say, the code before a
change and after, each replayed from its own tree) and counts the rounds decided alike, the
largest relative difference of the expected gains and values, and the cold rounds' CPU.

    PYTHONPATH=/tmp/old python bench/plan_cost.py replay --out /tmp/old.pkl run/plan-rounds.bin
    python bench/plan_cost.py replay --out /tmp/new.pkl run/plan-rounds.bin
    python bench/plan_cost.py compare /tmp/old.pkl /tmp/new.pkl

(``compare`` also takes directories of replay files: one process per record keeps each record's
caches its own, as each run's worker had them.)
"""

from __future__ import annotations

import argparse
import pickle
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import router
from router.planning.service import decide
from router.planning.worker import rounds


def summary(outcome: Any) -> dict[str, Any]:
    """A round's decision and numbers, as plain values."""
    status, p, _ = outcome
    if p is None:
        return {"decision": (status, None, None, None), "numbers": {}}
    numbers: dict[str, float] = {f"value{k}": v for k, v in enumerate(p.values)}
    for o in p.options:
        key = f"{o.action.mode}:{o.action.engine}"
        for name in ("gain", "gain_upper", "gain_lower", "cost", "need", "have"):
            numbers[f"{key}:{name}"] = getattr(o, name)
    decision = (status, p.desired, p.action, p.reason, tuple(o.blocked for o in p.options),
                p.schedule)  # fmt: skip
    return {"decision": decision, "numbers": numbers}


def replay(path: Path) -> list[dict[str, Any]]:
    out = []
    key = None  # (curves, mix) of the last plan
    for r, (_, recorded) in rounds(path):
        t0 = time.process_time()
        got = decide(r)
        cpu = time.process_time() - t0
        p = got[1]
        row = summary(got)
        row["cpu"] = cpu
        row["recorded_same"] = summary(recorded)["decision"] == row["decision"]
        row["cold"] = False
        if p is not None:
            now = (r.setting, p.state.mix)
            row["cold"] = now != key
            key = now
        out.append(row)
    return out


def _rel(a: float, b: float) -> float:
    if a == b:
        return 0.0
    return abs(a - b) / max(abs(a), abs(b), 1e-12)


def compare(old: dict[str, list[dict[str, Any]]], new: dict[str, list[dict[str, Any]]]) -> None:
    total = same = rec_old = rec_new = 0
    worst = 0.0
    worst_at = ""
    cold_old: list[float] = []
    cold_new: list[float] = []
    warm_new: list[float] = []
    for name in sorted(set(old) ^ set(new)):
        print(f"only in one of the two (left out): {name}")
    for name, rows in old.items():
        if name not in new:
            continue
        other = new[name]
        assert len(other) == len(rows), name
        for i, (a, b) in enumerate(zip(rows, other, strict=True)):
            total += 1
            same += a["decision"] == b["decision"]
            if a["decision"] != b["decision"]:
                print(f"DIFF {name} round {i}: {a['decision']} != {b['decision']}")
            rec_old += a["recorded_same"]
            rec_new += b["recorded_same"]
            for k, x in a["numbers"].items():
                d = _rel(x, b["numbers"].get(k, float("nan")))
                if d > worst:
                    worst, worst_at = d, f"{name} round {i} {k}"
            if a["cold"]:
                cold_old.append(a["cpu"])
                cold_new.append(b["cpu"])
            elif b["decision"][1] is not None:
                warm_new.append(b["cpu"])
    both = len(set(old) & set(new))
    print(f"records {both}, rounds {total}, decided alike {same}; "
          f"as recorded: old {rec_old}, new {rec_new}")  # fmt: skip
    print(f"largest relative difference of gains, costs and values: {worst:.3g} ({worst_at})")
    for label, xs in (("old", cold_old), ("new", cold_new)):
        print(f"cold plans ({len(xs)}), {label}: CPU median {statistics.median(xs):.2f} s, "
              f"max {max(xs):.2f} s, total {sum(xs):.1f} s")  # fmt: skip
    ratio = [a / b for a, b in zip(cold_old, cold_new, strict=True) if b > 0]
    print(f"cold plans' speed-up: median {statistics.median(ratio):.1f}x, "
          f"least {min(ratio):.1f}x")  # fmt: skip
    print(f"warm plans ({len(warm_new)}), new: CPU median {statistics.median(warm_new):.3f} s, "
          f"max {max(warm_new):.3f} s")  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("replay")
    a.add_argument("--out", type=Path, required=True)
    a.add_argument("records", type=Path, nargs="+")
    c = sub.add_parser("compare")
    c.add_argument("old", type=Path, help="a replay file, or a directory of them")
    c.add_argument("new", type=Path)
    args = ap.parse_args(argv)
    if args.cmd == "replay":
        print(f"router from {Path(router.__file__).parent}", file=sys.stderr)
        result = {}
        for path in args.records:
            result[str(path)] = rows = replay(path)
            cold = [r["cpu"] for r in rows if r["cold"]]
            print(f"{path}: {len(rows)} rounds, CPU {sum(r['cpu'] for r in rows):.1f} s, "
                  f"cold {len(cold)}: {[round(x, 2) for x in cold]}", file=sys.stderr)  # fmt: skip
        args.out.write_bytes(pickle.dumps(result))
        return
    compare(_load(args.old), _load(args.new))


def _load(path: Path) -> dict[str, list[dict[str, Any]]]:
    """One ``replay`` file, or every ``*.pkl`` in a directory of them."""
    out: dict[str, list[dict[str, Any]]] = {}
    for f in sorted(path.glob("*.pkl")) if path.is_dir() else [path]:
        out.update(pickle.loads(f.read_bytes()))
    return out


if __name__ == "__main__":
    main()
