"""Loaded by a router started with this directory on ``PYTHONPATH`` (``bench/demo_repeat.py
--log-decisions DIR``): every slo decision's options and the models it used, one JSON line each,
to ``$SPEC_ROUTER_BENCH_DECISIONS/decisions-<pid>.jsonl``. A bench tool, never part of serving."""

from __future__ import annotations

import json
import os
import time
from typing import Any

_DIR = os.environ.get("SPEC_ROUTER_BENCH_DECISIONS")

if _DIR:
    from router.decide import policy as _policy

    _options: list[Any] = []
    _file = open(os.path.join(_DIR, f"decisions-{os.getpid()}.jsonl"), "a")  # noqa: SIM115
    _option, _slo = _policy._option, _policy.slo

    def _logged_option(*args: Any, **kw: Any) -> Any:
        option = _option(*args, **kw)
        _options.append(option)
        return option

    def _logged_slo(snap: Any) -> Any:
        _options.clear()
        decision, state = _slo(snap)
        models = snap.models or {}
        record = {
            "t": time.monotonic(),
            "chosen": decision and [decision.pool, decision.reason],
            "pressure": state.pressure,
            "offered": _policy.offered(snap, models) if models else None,
            "held": _policy.slo_capacities(snap, models) if models else None,
            "models": {
                pool: {
                    "capacity": m.capacity(),
                    "tau": [m.tau_greedy, m.tau_sampling],
                    "cap": m.cap,
                    "spi": [round(x, 4) for x in m.spi[:65]],
                    "prefill_100": m.prefill(100),
                    "prefill_32": m.prefill(32),
                }
                for pool, m in models.items()
            },
            "options": [
                {
                    "pool": o.pool,
                    "load": o.backend.load,
                    "feasible": o.feasible,
                    "value": round(o.value, 3),
                    "strict": round(o.placement.strict, 3),
                    "relaxed": round(o.placement.relaxed, 3),
                    "own": [round(x, 3) for x in o.placement.own],
                    "ttft": round(o.placement.ttft, 4),
                    "tpot": round(o.placement.tpot, 4),
                    "stream_rate": o.backend.stream and round(o.backend.stream.rate, 3),
                    "stream": o.backend.stream and [round(x, 4) for x in o.backend.stream[1:4]],
                    "flights": len(o.backend.flights),
                    "decoding": sum(f.decoding is not None for f in o.backend.flights),
                    "prefill_share": round(o.backend.prefill_share, 3),
                    "batch": o.placement.batch,
                }
                for o in _options
            ],
        }
        _file.write(json.dumps(record) + "\n")
        _file.flush()
        return decision, state

    _policy._option = _logged_option
    _policy.slo = _logged_slo
    _policy.POLICIES["slo"] = _logged_slo

    from router.learn import models as _models

    _record = _models.EngineModels.record

    def _logged_record(self: Any, sample: Any) -> None:
        _record(self, sample)
        _file.write(json.dumps({"t": time.monotonic(), "sample": sample._asdict()}) + "\n")
        _file.flush()

    _models.EngineModels.record = _logged_record  # type: ignore[method-assign]
