"""Loaded by a router started with this directory on ``PYTHONPATH`` (``bench/demo_repeat.py
--log-decisions DIR``): every slo decision, the loads and the surface it used, one JSON line each,
to ``$SPEC_ROUTER_BENCH_DECISIONS/decisions-<pid>.jsonl``. A bench tool, never part of serving."""

from __future__ import annotations

import json
import os
import time
from typing import Any

_DIR = os.environ.get("SPEC_ROUTER_BENCH_DECISIONS")

if _DIR:
    from router.decide import policy as _policy

    _file = open(os.path.join(_DIR, f"decisions-{os.getpid()}.jsonl"), "a")  # noqa: SIM115
    _slo = _policy.slo

    def _logged_slo(snap: Any) -> Any:
        decision, state = _slo(snap)
        surf = snap.surface
        record = {
            "t": time.monotonic(),
            "chosen": decision and [decision.pool, decision.reason],
            "offered": snap.offered,
            "loads": {
                view.name: [b.load for b in view.backends]
                for view in (snap.speculative, snap.baseline)
            },
            "surface": None
            if surf is None
            else {
                "most": surf.most,
                "mix": surf.mix._asdict(),
                "pools": {
                    pool: {
                        "strict": cap.strict,
                        "relaxed": cap.relaxed,
                        "strict_rate": cap.strict_rate,
                        "relaxed_rate": cap.relaxed_rate,
                        "cap": cap.cap,
                        "measured": [cap.lowest, cap.measured],
                    }
                    for pool, cap in surf.pools.items()
                },
            },
        }
        _file.write(json.dumps(record) + "\n")
        _file.flush()
        return decision, state

    _policy.slo = _logged_slo
    _policy.POLICIES["slo"] = _logged_slo

    from router.learn import models as _models

    _record = _models.EngineModels.record

    def _logged_record(self: Any, sample: Any) -> None:
        _record(self, sample)
        _file.write(json.dumps({"t": time.monotonic(), "sample": sample._asdict()}) + "\n")
        _file.flush()

    _models.EngineModels.record = _logged_record  # type: ignore[method-assign]
