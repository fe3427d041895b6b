"""Settings known to make speculation lose under load, or the router misjudge: pure rules over
what the engines say about themselves (``router.health.info.EngineInfo``).

Two sets:

- ``pool_findings``: what the router checks itself, at start-up and when a backend (re)joins
  (``router.health.poller``): an engine in the speculative pool that reports no speculation (or
  a baseline that does), one engine reached under two names, pools serving different models,
  tokenizers or context lengths.
- ``config_findings``: what ``spec-router doctor`` adds: running caps, CUDA graphs, overlap
  scheduling, draft trees, metrics, a ``/health`` that generates; ``table_findings`` with a
  table from calibrate.

Each finding names its level (``error``: the deployment cannot work as meant; ``warning``:
it works, worse than it could; ``info``), what was seen, why it matters, what to change, and
where the engine's source (or our docs) says so. The facts are in docs/engines.md
("Configuration and identity").
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Literal

from router.decide.table import Table, no_crossover_advice
from router.health.info import EngineInfo, same_engine
from router.pools import BASELINE, SPECULATIVE, Pool

Level = Literal["error", "warning", "info"]
LEVELS: tuple[Level, ...] = ("error", "warning", "info")

SG = "https://github.com/sgl-project/sglang/blob/"
VLLM = "https://github.com/vllm-project/vllm/blob/"
LLAMA = "https://github.com/ggml-org/llama.cpp/blob/0c1e570/"
DOCS = "docs/engines.md#13-configuration-and-identity-for-spec-router-doctor-and-the-pool-checks"
# Where each rule's fact is written (the engines' source at the versions read, or our docs).
SOURCES = {
    "speculative-cap": SG
    + "v0.5.3/python/sglang/srt/server_args.py#L1049-L1072 ; "
    + SG
    + "v0.5.23/python/sglang/srt/arg_groups/speculative_hook.py#L1086-L1094",
    "cuda-graphs": SG + "v0.5.23/python/sglang/srt/model_executor/runner/"
    "decode_cuda_graph_runner.py#L845-L890 ; "
    + SG
    + "v0.5.3/python/sglang/srt/model_executor/cuda_graph_runner.py#L375-L389",
    "overlap-0.5.3": SG + "v0.5.3/python/sglang/srt/server_args.py#L1061-L1065",
    "overlap-0.5.10": SG + "v0.5.10/python/sglang/srt/server_args.py#L2996-L3019",
    "overlap-0.5.12": SG + "v0.5.12/python/sglang/srt/server_args.py#L3748-L3771",
    "overlap-0.5.23": SG + "v0.5.23/python/sglang/srt/arg_groups/speculative_hook.py#L1096-L1101",
    "draft-tree": SG + "v0.5.23/python/sglang/srt/arg_groups/speculative_hook.py#L1255-L1266 ; "
    "docs/regimes.md (eagle3-tree: SpecDecode-Bench, arXiv 2601.11580)",
    "metrics-sglang": SG + "v0.5.23/python/sglang/srt/entrypoints/http_server.py#L314-L317",
    "metrics-vllm": VLLM + "v0.34.0/vllm/v1/engine/async_llm.py#L204-L207",
    "metrics-llamacpp": LLAMA + "tools/server/server-context.cpp#L4650-L4652",
    "health-generates": SG + "v0.5.23/python/sglang/srt/entrypoints/http_server.py#L721-L799 ; "
    "docs/engines.md#1-health-readiness-and-info-endpoints",
    "identity": SG + "v0.5.23/python/sglang/srt/arg_groups/serving_hook.py#L660-L665 ; " + DOCS,
    "speculation": DOCS,
    "model": DOCS,
    "vllm-config": VLLM + "v0.34.0/vllm/v1/metrics/loggers.py#L1114-L1134 ; " + DOCS,
    "table": "docs/calibration.md",
}

# SGLang's running cap for a speculative server not given --max-running-requests
SGLANG_SPEC_CAP = 48


@dataclass(frozen=True, slots=True)
class Finding:
    level: Level
    code: str  # stable, for scripts
    message: str  # what was seen, naming the engines and values
    reason: str  # why it matters
    fix: str  # what to change
    source: str  # where the fact is written
    urls: tuple[str, ...] = ()

    def as_dict(self) -> dict[str, object]:
        return {
            "level": self.level,
            "code": self.code,
            "message": self.message,
            "reason": self.reason,
            "fix": self.fix,
            "source": self.source,
            "urls": list(self.urls),
        }


@dataclass(frozen=True, slots=True)
class Described:
    """A backend as configured: its pool, and what it said about itself."""

    pool: Pool
    info: EngineInfo


def _model_key(info: EngineInfo) -> str | None:
    """The weights an engine serves, comparable across hosts: the last component of its model
    path (``/models/Llama-3.1-8B`` and ``meta-llama/Llama-3.1-8B`` agree), lower-cased."""
    path = info.model_path
    if not path:
        return None
    return PurePosixPath(path.rstrip("/")).name.lower() or None


def _spec(info: EngineInfo) -> str:
    if info.spec_algorithm:
        return info.spec_algorithm
    return "speculation"


# -- what the router checks itself -----------------------------------------------------------


def pool_findings(members: Sequence[Described], mapped: bool = False) -> list[Finding]:
    """Pools against what their engines report. ``mapped``: a model map is configured, so
    served names may differ on purpose (the weights must still agree)."""
    out: list[Finding] = []
    spec = [m for m in members if m.pool == SPECULATIVE]
    base = [m for m in members if m.pool == BASELINE]
    silent = [m for m in spec if m.info.speculative is False]
    loud = [m for m in base if m.info.speculative is True]
    if silent and loud:
        out.append(
            Finding(
                "error",
                "pools-swapped",
                f"the speculative pool's {_urls(silent)} report no speculation and the "
                f"baseline pool's {_urls(loud)} speculate",
                "the pools look swapped: the router would send light load to the engines "
                "without speculation and heavy load to the speculative ones, the opposite of "
                "what it is for",
                "swap SPECULATIVE_URLS and BASELINE_URLS",
                SOURCES["speculation"],
                tuple(m.info.url for m in silent + loud),
            )
        )
    else:
        for m in silent:
            out.append(
                Finding(
                    "warning",
                    "speculative-pool-not-speculating",
                    f"{m.info.url} is in the speculative pool but reports no speculation "
                    f"({m.info.label})",
                    "the router sends it the light load where speculation should pay; without "
                    "it, that load runs no faster there, and the crossover table (measured "
                    "with a speculating engine) no longer describes it",
                    "start it with speculation (SGLang --speculative-algorithm, vLLM "
                    "--speculative-config, llama.cpp -md with --spec-type), or move it to "
                    "BASELINE_URLS",
                    SOURCES["speculation"],
                    (m.info.url,),
                )
            )
        for m in loud:
            out.append(
                Finding(
                    "warning",
                    "baseline-pool-speculating",
                    f"{m.info.url} is in the baseline pool but speculates "
                    f"({_spec(m.info)}, {m.info.label})",
                    "the router sends the baseline the load past the crossover, where "
                    "speculation was measured to lose; if the crossover table says none was "
                    "measured (more engines should speculate), this may be meant",
                    "start it without speculation, or move it to SPECULATIVE_URLS",
                    SOURCES["speculation"],
                    (m.info.url,),
                )
            )
    for i, a in enumerate(members):
        for b in members[i + 1 :]:
            if same_engine(a.info, b.info):
                both = a.pool != b.pool
                out.append(
                    Finding(
                        "error" if both else "warning",
                        "same-engine",
                        f"{a.info.url} ({a.pool}) and {b.info.url} ({b.pool}) reach one "
                        f"engine: the same {', '.join(k for k, _ in a.info.identity)}",
                        (
                            "one engine cannot be both speculative and baseline: the router's "
                            "two pools are one"
                            if both
                            else "the router counts it as two engines: it sends it twice the "
                            "load it means one engine to run, and splits one engine's "
                            "metrics in two"
                        ),
                        "list each engine once, under one name",
                        SOURCES["identity"],
                        (a.info.url, b.info.url),
                    )
                )
    out += _differences(members, mapped)
    return out


def _differences(members: Sequence[Described], mapped: bool) -> list[Finding]:
    """Models, tokenizers and context lengths that differ between backends."""
    out: list[Finding] = []

    def differ(
        key: Callable[[EngineInfo], object | None],
        level: Level,
        code: str,
        what: str,
        reason: str,
    ) -> None:
        seen: dict[object, list[str]] = {}
        for m in members:
            value = key(m.info)
            if value is not None:
                seen.setdefault(value, []).append(m.info.url)
        if len(seen) > 1:
            parts = "; ".join(f"{value} at {', '.join(urls)}" for value, urls in seen.items())
            urls = tuple(u for urls in seen.values() for u in urls)
            out.append(Finding(level, code, f"{what} differ: {parts}", reason,
                               "serve one model, with one tokenizer and context length, "
                               "behind every backend", SOURCES["model"], urls))  # fmt: skip

    model_reason = (
        "the router sends a request to either pool by load: its answer would come from one "
        "model or the other depending on how busy the router is"
    )
    differ(_model_key, "error", "different-models", "the models served (weights)", model_reason)
    if not mapped:
        differ(
            lambda i: i.served_model,
            "error",
            "different-model-names",
            "the model names served",
            model_reason + "; a client's model name is unknown to one of them (vLLM answers "
            "404), unless SPECULATIVE_MODEL_MAP / BASELINE_MODEL_MAP map it",
        )
    if not out:  # (other weights have other tokenizers: said once is enough)
        differ(
            lambda i: i.tokenizer,
            "error",
            "different-tokenizers",
            "the tokenizers",
            "the same prompt becomes different tokens: answers differ by pool, and the token "
            "counts the router learns from disagree",
        )
    differ(
        lambda i: i.context_length,
        "warning",
        "different-context-lengths",
        "the context lengths",
        "a long prompt accepted by one pool is refused (400) by the other, depending on load",
    )
    return out


def _urls(members: Sequence[Described]) -> str:
    return ", ".join(m.info.url for m in members)


# -- what the doctor adds ----------------------------------------------------------------------


def config_findings(members: Sequence[Described]) -> list[Finding]:
    """Engine settings that make speculation lose under load or the router misjudge."""
    out: list[Finding] = []
    spec = [m.info for m in members if m.pool == SPECULATIVE]
    base = [m.info for m in members if m.pool == BASELINE]
    base_caps = [i.running_cap for i in base if i.running_cap is not None]
    for info in spec:
        cap = info.running_cap
        if cap is not None and base_caps and cap < max(base_caps):
            default = info.flavor == "sglang" and cap == SGLANG_SPEC_CAP
            out.append(
                Finding(
                    "warning",
                    "speculative-cap",
                    f"{info.url} runs at most {cap} requests at once, the baseline "
                    f"{max(base_caps)}"
                    + (" (SGLang's default for speculation)" if default else ""),  # fmt: skip
                    "past its cap the speculative engine queues requests instead of batching "
                    "them: its throughput stops growing, and a crossover measured there is the "
                    "cap's, not speculation's",
                    f"give it --max-running-requests {max(base_caps)} (SGLang sets "
                    f"{SGLANG_SPEC_CAP} for speculation unless it is given)",
                    SOURCES["speculative-cap"],
                    (info.url,),
                )
            )
        if info.spec_topk is not None and info.spec_topk > 1:
            out.append(
                Finding(
                    "warning",
                    "draft-tree",
                    f"{info.url} drafts a tree: topk {info.spec_topk}, "
                    f"{info.spec_draft_tokens} draft tokens verified per request",
                    "every request verifies that many tokens per step: the batch turns "
                    "compute-bound early, and published trees lose to the baseline from about "
                    "20 concurrent requests (a chain of the same depth does not within 64)",
                    "--speculative-eagle-topk 1 (a chain; draft tokens = steps + 1), or "
                    "calibrate and let the router hold it below its crossover",
                    SOURCES["draft-tree"],
                    (info.url,),
                )
            )
        if info.overlap_disabled:
            out.append(_overlap(info))
    for m in members:
        out += _engine_findings(m.pool, m.info)
    return out


def _overlap(info: EngineInfo) -> Finding:
    """Overlap scheduling off for speculation: the fix depends on the SGLang version."""
    version = _version(info.version)
    if version is None or version <= (0, 5, 5):
        fix = "this version turns it off for EAGLE whatever is given: SGLang 0.5.14+ overlaps "
        fix += "speculation by default"
        source = SOURCES["overlap-0.5.3"]
    elif version <= (0, 5, 10):
        fix = "set SGLANG_ENABLE_SPEC_V2=1 (or upgrade to 0.5.14+, where it is the default)"
        source = SOURCES["overlap-0.5.10"]
    elif version <= (0, 5, 13):
        fix = "it is on unless SGLANG_ENABLE_SPEC_V2=0 or --speculative-eagle-topk > 1"
        source = SOURCES["overlap-0.5.12"]
    else:
        fix = "drop --disable-overlap-schedule (on by default for speculation since 0.5.14)"
        source = SOURCES["overlap-0.5.23"]
    return Finding(
        "warning",
        "overlap-off",
        f"{info.url} runs speculation without overlap scheduling ({info.label})",
        "the CPU's scheduling work is no longer hidden behind the GPU's: every step is slower "
        "(SGLang: about 1.1x), so speculation loses to the baseline at a lower load",
        fix,
        source,
        (info.url,),
    )


def _version(text: str | None) -> tuple[int, ...] | None:
    if not text:
        return None
    parts = []
    for piece in text.split("-")[0].split("+")[0].split("."):
        if not piece.isdigit():
            break
        parts.append(int(piece))
    return tuple(parts) or None


def _engine_findings(pool: Pool, info: EngineInfo) -> list[Finding]:
    out: list[Finding] = []
    url = (info.url,)
    cap = info.running_cap
    if info.cuda_graphs_disabled:
        out.append(
            Finding(
                "warning",
                "cuda-graphs",
                f"{info.url} runs without CUDA graphs",
                "every decode step pays its kernel launches: a fixed cost per step that "
                "makes small batches (where speculation pays) slower",
                "leave CUDA graphs on",
                SOURCES["cuda-graphs"],
                url,
            )  # fmt: skip
        )
    elif info.cuda_graph_max_bs is not None and cap is not None and info.cuda_graph_max_bs < cap:
        out.append(
            Finding(
                "warning",
                "cuda-graphs",
                f"{info.url} captures CUDA graphs up to {info.cuda_graph_max_bs} running "
                f"requests, but runs up to {cap}",
                "batches above the largest captured size run eagerly: each step pays its "
                "kernel launches, and the engine slows past that batch",
                f"--cuda-graph-max-bs {cap} (SGLang 0.5.14+: --cuda-graph-max-bs-decode)",
                SOURCES["cuda-graphs"],
                url,
            )
        )
    if pool == BASELINE and info.overlap_disabled:
        out.append(
            Finding(
                "warning",
                "overlap-off",
                f"{info.url} (baseline) runs without overlap scheduling",
                "every step is about 1.1x slower: the crossover the router uses moves with it",
                "drop --disable-overlap-schedule",
                SOURCES["overlap-0.5.23"],
                url,
            )  # fmt: skip
        )
    if info.metrics is False:
        source = {"vllm": "metrics-vllm", "llamacpp": "metrics-llamacpp"}.get(
            info.flavor, "metrics-sglang"
        )
        flag = {"vllm": "drop --disable-log-stats", "llamacpp": "--metrics"}.get(
            info.flavor, "--enable-metrics"
        )
        out.append(
            Finding(
                "warning",
                "metrics-off",
                f"{info.url} serves no load metrics ({info.label})",
                "the router sees neither the engine's running and queued requests (LOAD_SIGNAL="
                "engine falls back to its own counts: other routers' requests go unseen) nor, "
                "speculating, its acceptance length (learning cannot follow it)",
                flag,
                SOURCES[source],
                url,
            )
        )
    if info.health_generates and info.has_ready is False:
        out.append(
            Finding(
                "warning",
                "health-generates",
                f"{info.url}: /health runs a one-token generation, and there is no /ready "
                f"({info.label})",
                "each health probe is a generation (up to SGLANG_HEALTH_CHECK_TIMEOUT, 20 s, "
                "on a busy engine): the router probes /health with HEALTH_GENERATE_TIMEOUT, "
                "which must stay above 20 s, and other probes (Kubernetes) the same",
                "SGLang 0.5.23+ has /ready (a flag check, which the router uses when it is "
                "there); keep HEALTH_GENERATE_TIMEOUT above 20 s",
                SOURCES["health-generates"],
                url,
            )
        )
    elif info.health_generates:
        out.append(
            Finding(
                "info",
                "health-generates",
                f"{info.url}: /health runs a generation; /ready is there",
                "the router probes /ready; a Kubernetes probe on /health would generate",
                "point liveness and readiness probes at /ready",
                SOURCES["health-generates"],
                url,
            )
        )
    if info.flavor == "vllm":
        out.append(
            Finding(
                "info",
                "vllm-config-hidden",
                f"{info.url}: vLLM shows neither --max-num-seqs, the CUDA-graph sizes nor "
                "the speculative config outside VLLM_SERVER_DEV_MODE",
                "the running cap and CUDA-graph checks cannot be made; speculation is read "
                "from the spec-decode counters (draft length: their positions)",
                "compare --max-num-seqs and --speculative-config by hand",
                SOURCES["vllm-config"],
                url,
            )
        )
    if info.speculative is None:
        out.append(
            Finding(
                "info",
                "speculation-unknown",
                f"{info.url} does not say whether it speculates",
                "the pool checks cannot tell a misplaced engine",
                "expose its metrics (or SGLang /server_info: the API key)",
                SOURCES["speculation"],
                url,
            )  # fmt: skip
        )
    for note in info.notes:
        out.append(Finding("info", "unread", f"{info.url}: could not read {note}", "", "",
                           DOCS, url))  # fmt: skip
    return out


def table_findings(table: Table, members: Sequence[Described]) -> list[Finding]:
    """A calibrated table against the engines it should describe."""
    out: list[Finding] = []
    spec = [m.info for m in members if m.pool == SPECULATIVE]
    if table.crossover is None and table.measured_up_to is not None:
        base = sum(1 for m in members if m.pool == BASELINE)
        out.append(
            Finding(
                "info",
                "no-crossover",
                f"the table measured no crossover up to {table.measured_up_to}"
                + ("" if table.margin is None else f" (x{table.margin:.2f} there)"),
                table.reason,
                no_crossover_advice(table.measured_up_to, table.margin, len(spec), base),
                SOURCES["table"],
            )
        )
    for info in spec:
        cap = info.running_cap
        if cap is None:
            continue
        if table.speculative.cap is not None and table.speculative.cap != cap:
            out.append(
                Finding(
                    "warning",
                    "table-stale",
                    f"the table was measured with the speculative engine running up to "
                    f"{table.speculative.cap}; {info.url} now runs up to {cap}",
                    "the curves (and the crossover) describe another configuration",
                    "calibrate again",
                    SOURCES["table"],
                    (info.url,),
                )
            )
        if table.crossover is not None and table.crossover >= cap:
            out.append(
                Finding(
                    "warning",
                    "crossover-past-cap",
                    f"the table's crossover ({table.crossover}) is at or past {info.url}'s "
                    f"cap ({cap})",
                    "past its cap the engine queues: the router would hold requests there "
                    "that wait instead of running",
                    "raise the speculative engine's --max-running-requests, then calibrate",
                    SOURCES["speculative-cap"],
                    (info.url,),
                )
            )
    return out


def worst(findings: Sequence[Finding]) -> Level | None:
    """The most severe level among ``findings`` (None: none)."""
    for level in LEVELS:
        if any(f.level == level for f in findings):
            return level
    return None


# -- what a short probe adds ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Probe:
    """What ``spec-router doctor --probe`` measured on one engine: ``concurrency`` streams at
    once, the engine's running + queued requests at their peak as its /metrics said (None: no
    metrics), its acceptance length over the probe, each request's decode speed (median) and
    how long ``GET /health`` took."""

    concurrency: int
    peak_load: float | None
    accept_length: float | None
    decode_tps: float | None
    health_seconds: float | None
    errors: int = 0


def probe_findings(probes: Sequence[tuple[Described, Probe]]) -> list[Finding]:
    """What the probe showed that the configuration did not."""
    out: list[Finding] = []
    for m, p in probes:
        info, url = m.info, (m.info.url,)
        if p.errors:
            out.append(
                Finding(
                    "warning",
                    "probe-errors",
                    f"{info.url}: {p.errors} of the probe's requests failed",
                    "the engine refuses or drops requests at this load",
                    "see the engine's log",
                    DOCS,
                    url,
                )  # fmt: skip
            )
        if info.metrics and p.peak_load is not None and p.peak_load < p.concurrency / 2:
            out.append(
                Finding(
                    "warning",
                    "load-not-shown",
                    f"{info.url}: its metrics showed at most {p.peak_load:g} running + queued "
                    f"requests while the probe kept {p.concurrency} in flight",
                    "with LOAD_SIGNAL=engine the router would take it for idle",
                    "check that /metrics is this engine's and refreshes (SGLang: every "
                    "decode_log_interval steps)",
                    SOURCES["metrics-sglang"],
                    url,
                )
            )
        if m.pool == SPECULATIVE and info.metrics and p.accept_length is None:
            out.append(
                Finding(
                    "warning",
                    "no-acceptance",
                    f"{info.url}: no acceptance length in its metrics after the probe",
                    "the router cannot follow the engine's acceptance: a drop in it (a harder "
                    "workload, temperature 1) moves no crossover",
                    "expose the spec-decode metrics (SGLang --enable-metrics; vLLM without "
                    "--disable-log-stats; llama.cpp --metrics)",
                    SOURCES["speculation"],
                    url,
                )
            )
        if p.health_seconds is not None and p.health_seconds >= 0.5 and info.health_generates:
            out.append(
                Finding(
                    "info",
                    "health-took",
                    f"{info.url}: GET /health took {p.health_seconds:.2f} s (it generates)",
                    "the router's probes of it wait as long",
                    "use /ready where the engine has it",
                    SOURCES["health-generates"],
                    url,
                )
            )
    spec = [(m, p) for m, p in probes if m.pool == SPECULATIVE and p.decode_tps]
    base = [(m, p) for m, p in probes if m.pool == BASELINE and p.decode_tps]
    if spec and base:
        s = max(p.decode_tps or 0.0 for _, p in spec)
        b = max(p.decode_tps or 0.0 for _, p in base)
        n = spec[0][1].concurrency
        ratio = s / b if b > 0 else float("inf")
        slower = ratio <= 1.0
        out.append(
            Finding(
                "warning" if slower else "info",
                "probe-speed",
                f"at {n} concurrent requests each engine alone: speculative {s:.1f} tok/s per "
                f"request, baseline {b:.1f} (x{ratio:.2f})",
                "speculation is already slower at this load: the crossover is below it"
                if slower
                else "speculation is ahead at this load",
                "calibrate (spec-router calibrate) for the whole curve",
                SOURCES["table"],
                tuple(m.info.url for m, _ in spec + base),
            )
        )
    return out
