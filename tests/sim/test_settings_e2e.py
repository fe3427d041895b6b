"""Engine settings under SGLang's flag names, over a socket: what ``/server_info`` reports,
and that the sims run at the speed the model gives them."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from router.calibrate.loadgen import run_closed_loop, window_stats
from router.sim.model import BASELINE, EAGLE3, closed_loop
from tests.support.processes import Proc, running, sim_args


def test_server_info_reports_the_settings() -> None:
    args = ["--time-scale", "0.05", "--max-running-requests", "32", "--cuda-graph-max-bs", "8"]
    with running(sim_args("eagle3", *args)) as sim:
        info = httpx.get(sim.url + "/server_info").json()
    assert info["max_running_requests"] == 32
    assert info["cuda_graph_max_bs_decode"] == 8  # 0.5.23's flag as given, and the resolved
    assert info["cuda_graph_config"]["decode"] == {"backend": "full", "max_bs": 8}
    assert info["disable_overlap_schedule"] is True  # the seed was measured without it
    assert info["enable_metrics"] is True
    assert (
        info["speculative_num_steps"],
        info["speculative_eagle_topk"],
        info["speculative_num_draft_tokens"],
    ) == (3, 1, 4)
    args = ["--time-scale", "0.05", "--engine-version", "0.5.3", "--disable-overlap-schedule"]
    with running(sim_args("baseline", *args, "--disable-metrics")) as sim:
        info = httpx.get(sim.url + "/get_server_info").json()
        assert httpx.get(sim.url + "/metrics").status_code == 404  # not mounted, as SGLang
    assert info["cuda_graph_max_bs"] == 256  # 0.5.3's flat name and its uncapped default
    assert info["disable_overlap_schedule"] is True
    assert info["enable_metrics"] is False
    assert info["speculative_algorithm"] is None and info["speculative_num_draft_tokens"] is None


def test_server_info_of_the_tree(eagle3: Proc) -> None:
    with running(sim_args("eagle3-tree", "--time-scale", "0.05")) as sim:
        info = httpx.get(sim.url + "/server_info").json()
    assert (info["speculative_eagle_topk"], info["speculative_num_draft_tokens"]) == (4, 22)
    assert info["max_running_requests"] == 256
    assert info["cuda_graph_config"]["decode"]["max_bs"] == 256
    assert info["cuda_graph_max_bs_decode"] is None  # not given
    # the seed: SGLang's speculative defaults (48 running, graphs up to 48)
    seed = httpx.get(eagle3.url + "/server_info").json()
    assert seed["max_running_requests"] == 48
    assert seed["cuda_graph_config"]["decode"]["max_bs"] == 48


def test_the_settings_slow_the_sim_as_the_model_says() -> None:
    # 16 baseline requests with CUDA graphs only up to 8 and no overlap scheduler: each
    # iteration pays 1.5 a more and then 10% on all of it
    flags = ["--cuda-graph-max-bs", "8", "--disable-overlap-schedule"]
    scale, n, prompt, output = 0.1, 16, 32, 64
    model = closed_loop(
        BASELINE.replace(cuda_graph_max_bs=8, disable_overlap_schedule=True), n, prompt, output
    )
    plain = closed_loop(BASELINE, n, prompt, output)
    assert model.per_request_tps < 0.8 * plain.per_request_tps  # far enough apart to tell
    with running(sim_args("baseline", "--time-scale", str(scale), "--seed", "1", *flags)) as sim:
        warm, window = 0.4, 1.2
        t0 = time.monotonic()
        results = asyncio.run(
            run_closed_loop(
                sim.url + "/v1",
                concurrency=n,
                prompt_tokens=prompt,
                output_tokens=output,
                duration=warm + window,
            )
        )
    stats = window_stats(results, t0 + warm, t0 + warm + window)
    assert stats.per_request_tps == pytest.approx(model.per_request_tps / scale, rel=0.05)
    assert stats.total_tps == pytest.approx(model.total_tps / scale, rel=0.05)
    # and a speculative preset's overlap flag changes nothing (measured without it)
    assert closed_loop(EAGLE3.replace(disable_overlap_schedule=True), n, prompt, output) == (
        closed_loop(EAGLE3, n, prompt, output)
    )
