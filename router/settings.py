"""Configuration: one frozen value object, read once at start-up and passed in.

Sources, strongest first: keyword arguments (tests), environment variables with the
``SPEC_ROUTER_`` prefix, the TOML file named by ``SPEC_ROUTER_CONFIG``, then the defaults below.
List settings take comma-separated values in the environment (``a,b``) or a TOML array; maps take
``name=other,name2=other2`` or JSON in the environment, or a TOML table.
"""

from __future__ import annotations

import difflib
import ipaddress
import json
import logging
import os
import re
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BeforeValidator,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic.fields import FieldInfo
from pydantic_settings import (
    BaseSettings,
    NoDecode,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from router.keepalive import CLIENT_KEEP_ALIVE
from router.origin import Origin
from router.pools import SPECULATIVE, Pool
from router.units import duration_field, size_field

ENV_PREFIX = "SPEC_ROUTER_"
CONFIG_ENV = "SPEC_ROUTER_CONFIG"

PolicyName = Literal["slo", "spillover", "crossover", "round_robin", "predictive"]
LoadSignal = Literal["local", "engine", "max"]
DiscoveryMode = Literal["static", "dns"]
CsvList = Annotated[list[str], NoDecode]
NameMap = Annotated[dict[str, str], NoDecode]
# Values with a unit, as the docs write them (router.units): a plain number is in the unit the
# setting's name or docs give (bytes, seconds, ms, µs); "32 MiB", "30 s", "500ms" are read too.
Bytes = Annotated[int, BeforeValidator(size_field)]
Seconds = Annotated[float, BeforeValidator(duration_field("s"))]
Millis = Annotated[float, BeforeValidator(duration_field("ms"))]
Micros = Annotated[int, BeforeValidator(duration_field("us", whole=True))]

# Chosen for the simulated presets (their analytic crossing is ~6.8 concurrent requests); a real
# deployment should calibrate (``spec-router calibrate``) or set SPEC_ROUTER_CROSSOVER.
DEFAULT_CROSSOVER = 7


# Variables with the prefix that are not settings: read by the project's own scripts, tests and
# deployment files, never by the router. Any other SPEC_ROUTER_* variable must be a setting
# (a misspelt one would otherwise be ignored, and its default used in silence).
NOT_SETTINGS = frozenset(
    {
        CONFIG_ENV,  # the TOML file itself
        "SPEC_ROUTER_TAG",  # deploy/docker-compose.yml: the image tag
        "SPEC_ROUTER_CHROMIUM",  # tests/ui, scripts/ui_screenshot.py: the browser
        "SPEC_ROUTER_UI_SCREENSHOT",  # tests/ui: where to save a screenshot
        "SPEC_ROUTER_LLAMA_SERVER",  # the llama.cpp tier (scripts/real-engine, tests/real)
        "SPEC_ROUTER_REAL_MODELS",  # ditto
        "SPEC_ROUTER_REAL_ENGINE_CACHE",  # ditto: the build cache
        "SPEC_ROUTER_FUZZ_PROFILE",  # tests/forward/test_fuzz_e2e.py
        "SPEC_ROUTER_FUZZ_SCALE",  # ditto
        "SPEC_ROUTER_BENCH_DECISIONS",  # bench/lab/decision_log: where routers log decisions
        "SPEC_ROUTER_PURE",  # router/compiled.py, setup.py: build or run pure Python
        "SPEC_ROUTER_EXPECT_BUILD",  # tests/test_compiled.py: what make test must run on
    }
)


# Settings that existed once and were removed: set in an environment or TOML file left from an
# earlier release, each is ignored with a warning that says why (not refused: an upgrade must
# not stop a router that starts today), rather than treated as a misspelling.
RETIRED = {
    "start_first_ms": "the hold of running streams' chunks was removed (it never engaged "
    "under uvicorn); nothing replaces it",
}

log = logging.getLogger("router.settings")


def retired_notes(given: Mapping[str, str]) -> list[str]:
    """One warning per retired setting in ``given`` (lower-case field name -> the name as it
    was given: an environment variable, or a TOML key and its file)."""
    return [
        f"setting {shown} is ignored: {RETIRED[name]}; remove it"
        for name, shown in sorted(given.items())
        if name in RETIRED
    ]


class SettingsError(Exception):
    """A setting is invalid; the message is one line naming it."""


def closest(name: str, known: list[str]) -> str | None:
    """The known name ``name`` was most likely meant to be (a typo, a missing plural)."""
    found = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
    return found[0] if found else None


def unknown_variables(environ: Mapping[str, str]) -> list[str]:
    """One line per ``SPEC_ROUTER_*`` variable in ``environ`` that is no setting, naming the
    closest setting. (pydantic-settings reads the names in any case: so does this.)"""
    settings = [name.upper() for name in Settings.model_fields]
    retired = {ENV_PREFIX + name.upper() for name in RETIRED}
    known = {ENV_PREFIX + name for name in settings} | NOT_SETTINGS | retired
    lines = []
    for key in sorted(environ):
        name = key.upper()
        if not name.startswith(ENV_PREFIX) or name in known:
            continue
        close = closest(name.removeprefix(ENV_PREFIX), settings)  # (not the shared prefix)
        hint = f"did you mean {ENV_PREFIX}{close}?" if close else "no setting is named like it"
        lines.append(
            f"unknown setting {key} in the environment: {hint} "
            "(every SPEC_ROUTER_* variable must be a setting; see docs/configuration.md)"
        )
    return lines


def refuse_api_path(url: str, path: str) -> None:
    """An engine URL whose path holds ``/v1`` (an OpenAI ``base_url`` habit) cannot be right:
    the router sends each request to its own path (``/v1/chat/completions``) after the URL's
    path, so the engine would be asked for ``/v1/v1/...``, and ``/v1/health`` answers 404.
    Any other path is kept as a prefix (an engine behind a path-routing proxy)."""
    segments = path.split("/")
    if "v1" not in segments:
        return
    keep = "/".join(segments[: segments.index("v1")])
    fixed = url[: url.index(path)] + keep if path in url else url
    raise ValueError(
        f"drop the {path[len(keep) :]} from {url} (use {fixed}): the router adds each "
        "request's own path, /v1/chat/completions and the rest"
    )


class _TomlSource(PydanticBaseSettingsSource):
    """Values from the TOML file named by SPEC_ROUTER_CONFIG (weaker than the environment)."""

    def __init__(self, settings_cls: type[BaseSettings]) -> None:
        super().__init__(settings_cls)
        path = os.environ.get(CONFIG_ENV)
        self._data: dict[str, Any] = {}
        if path:
            try:
                with open(path, "rb") as fh:
                    raw = tomllib.load(fh)
            except OSError as exc:
                raise SettingsError(f"{CONFIG_ENV}={path}: cannot read: {exc.strerror}") from None
            except tomllib.TOMLDecodeError as exc:
                raise SettingsError(f"{CONFIG_ENV}={path}: invalid TOML: {exc}") from None
            # Accept both `crossover = 4` and `[spec_router] crossover = 4`.
            table = raw.get("spec_router", raw)
            self._data = {str(k).lower(): v for k, v in table.items()}
            for note in retired_notes({k: f"{k!r} in {CONFIG_ENV}={path}" for k in self._data}):
                log.warning(note)
            self._data = {k: v for k, v in self._data.items() if k not in RETIRED}
            unknown = sorted(set(self._data) - set(settings_cls.model_fields))
            if unknown:
                close = closest(unknown[0], list(settings_cls.model_fields))
                hint = f": did you mean {close!r}?" if close else ""
                raise SettingsError(f"{CONFIG_ENV}={path}: unknown setting {unknown[0]!r}{hint}")

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return self._data.get(field_name), field_name, False

    def __call__(self) -> dict[str, Any]:
        return dict(self._data)


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, frozen=True, extra="forbid")

    # -- pools --------------------------------------------------------------------------------
    speculative_urls: CsvList = Field(default_factory=lambda: ["http://127.0.0.1:30001"])
    baseline_urls: CsvList = Field(default_factory=lambda: ["http://127.0.0.1:30002"])
    speculative_api_key: SecretStr | None = None
    baseline_api_key: SecretStr | None = None
    # Public model name -> the name this pool serves it under (e.g. {"kimi": "kimi-eagle3"}).
    speculative_model_map: NameMap = Field(default_factory=dict)
    baseline_model_map: NameMap = Field(default_factory=dict)

    # -- membership (router/members) ----------------------------------------------------------
    # static: the URLs above are the backends. dns: each URL's host name is a set: every A/AAAA
    # record is one backend at that URL's scheme, port and path (a headless Service), resolved
    # again every DISCOVERY_INTERVAL seconds. The admin API adds and removes backends in both.
    discovery: DiscoveryMode = "static"
    discovery_interval: Seconds = Field(default=5.0, gt=0)
    # host:port,... of the DNS servers to ask, by address (as nginx's `resolver`; port 53 by
    # default); unset: the system resolver (getaddrinfo: /etc/hosts, resolv.conf's search
    # domains, as every program in the pod resolves)
    dns_servers: CsvList = Field(default_factory=list)
    # How long empty answers (NXDOMAIN/NODATA) for a name that had addresses must last before
    # its backends leave. A failed resolution (timeout, SERVFAIL) never empties a pool.
    discovery_grace: Seconds = Field(default=30.0, ge=0)
    # How long a backend that left (its address gone from DNS, or removed through the admin
    # API) may finish the requests it has in flight; then they are cut, as on an upstream
    # failure (streams end with an error event).
    drain_timeout: Seconds = Field(default=300.0, gt=0)
    # The most backends at once, draining ones included (the size of serve --workers' table).
    max_backends: int = Field(default=64, ge=2, le=4096)

    # -- routing ------------------------------------------------------------------------------
    # slo: each request where it adds the most goodput under the SLO below, predicted from the
    # engines' curves, its prompt, length and temperature (bench/results/traffic.md); without
    # curves yet it decides as predictive, which without curves decides as spillover.
    policy: PolicyName = "slo"
    # The service-level objective the slo policy routes for, in wall-clock milliseconds: time to
    # first token and mean time per output token after it. A request may set its own with the
    # x-slo-ttft-ms / x-slo-tpot-ms headers. The policy also values a relaxed tier of 3x / 2x.
    slo_ttft_ms: Millis = Field(default=1000.0, gt=0)
    slo_tpot_ms: Millis = Field(default=25.0, gt=0)
    crossover: int | None = Field(default=None, ge=0)
    hysteresis: int = Field(default=1, ge=0)
    # A router-side queue (0: none) for requests the slo policy finds no backend can serve
    # within even the relaxed SLO, held only under measured overload (router.forward.admission:
    # the engine is measured past the relaxed SLO, and none is loading, draining or switching;
    # off by default: over sockets it raised azure-conv 70% and 110% but cost bursty 70% about
    # 2.5 points on both tiers, bench/results/traffic.md, session 7).
    # They wait up to QUEUE_TIMEOUT seconds (unset: the request's strict TTFT target, leaving it
    # twice that within the relaxed TTFT) for a request in flight to end, then get 503; a full
    # queue answers 429. Both with Retry-After.
    queue_size: int = Field(default=0, ge=0)
    queue_timeout: Seconds | None = Field(default=None, gt=0)

    # -- upstream client ----------------------------------------------------------------------
    connect_timeout: Seconds = Field(default=5.0, gt=0)
    # A stream: request sent -> first body byte (its queueing and prefill; vLLM and SGLang 0.5.3
    # send the headers before the request is queued).
    first_byte_timeout: Seconds = Field(default=600.0, gt=0)
    # Longest silence between two chunks of a stream once it has started. No total deadline.
    idle_timeout: Seconds = Field(default=120.0, gt=0)
    # A non-streamed request: sent -> whole answer (headers and body come when it is generated).
    non_stream_timeout: Seconds = Field(default=1800.0, gt=0)
    max_connections_per_backend: int = Field(default=8192, ge=1)
    max_idle_per_backend: int = Field(default=1024, ge=0)
    keepalive_expiry: Seconds = Field(default=4.0, ge=0)
    max_body_bytes: Bytes = Field(default=32 * 1024 * 1024, ge=1024)
    # Absolute deadline for receiving a whole request, headers and body (slowloris): 408 after.
    request_timeout: Seconds = Field(default=30.0, gt=0)
    # How long a client's connection is kept open with no request on it. Behind a load balancer
    # it must outlast the balancer's own idle timeout, or the balancer may send a request on a
    # connection the router is closing (a 502 to its client).
    client_keep_alive: Seconds = Field(default=CLIENT_KEEP_ALIVE, gt=0)
    max_attempts: int = Field(default=3, ge=1)
    # Microseconds the event loop keeps polling after activity before it may sleep (0: never
    # spins). Saves ~0.1 ms per request at low load for CPU just after activity (busypoll.py).
    busy_poll_us: Micros = Field(default=50, ge=0, le=100_000)
    # Hold busy polling while the router's core looks shared with other busy processes
    # (busypoll.ShareWatch); false: spin whatever the core's neighbours do.
    busy_poll_yield: bool = True
    # Under ``uvicorn router.app:app``: serve plain streamed completions from uvicorn's socket
    # callbacks, with no ASGI task per request (router/forward/callback.py). On while a
    # same-run A/B shows it pays (bench/results/fast-path.md, session 10); false: every request
    # through the proxy's coroutine.
    callback_streams: bool = True
    # On the callback path: where no kept-alive upstream connection is idle (the first
    # requests, a wave past the idle ones, connections closed by KEEPALIVE_EXPIRY), open one
    # from the callbacks (a task for the connect alone) and serve the stream there; false: such
    # a request goes to the proxy's coroutine. (bench/results/fast-path.md, session 13.)
    callback_connect: bool = True
    # Run the accounting of finished requests (metrics, the learner's curves, the recent
    # window) at later turns of the loop (within ~0.25 s; earlier in turns with no request
    # head), settled before anything reads it (router/forward/ended.py); false: as each
    # request ends. On: in session 14's same-hold tail.py A/Bs (a core with time to spare
    # between waves) it was ahead of accounting at once on TTFT p99 in most paired rounds
    # (bench/results/fast-path.md, session 14); session 12's, on a saturated core, had not told
    # it apart.
    defer_accounting: bool = True

    # -- access -------------------------------------------------------------------------------
    api_keys: Annotated[list[SecretStr], NoDecode] = Field(default_factory=list)
    # Addresses (IPs or CIDRs) of proxies in front of the router whose X-Forwarded-For is kept;
    # anyone else's is replaced by the client's own address.
    trusted_proxies: CsvList = Field(default_factory=list)
    admin_token: SecretStr | None = None

    # -- health -------------------------------------------------------------------------------
    health_interval: Seconds = Field(default=2.0, gt=0)
    # A probe of /ready (SGLang 0.5.23) or of vLLM's /health, both flag checks.
    health_timeout: Seconds = Field(default=2.0, gt=0)
    # A probe of SGLang's /health where it has no /ready (0.5.3): a one-token generation that
    # answers after >= 1 s, and 503 only after the engine's own SGLANG_HEALTH_CHECK_TIMEOUT (20 s).
    health_generate_timeout: Seconds = Field(default=25.0, gt=0)
    startup_grace: Seconds = Field(default=900.0, ge=0)
    fall: int = Field(default=3, ge=1)
    rise: int = Field(default=2, ge=1)
    eject_base: Seconds = Field(default=1.0, gt=0)
    eject_max: Seconds = Field(default=60.0, gt=0)
    ramp_seconds: Seconds = Field(default=10.0, ge=0)
    load_signal: LoadSignal = "local"
    # LOAD_SIGNAL engine/max: how stale an SGLang engine's load gauges may be. It refreshes them
    # on a prefill batch (without that batch's own requests) and every --decode-log-interval
    # (40) decode steps; this replica's requests of that long before a scrape count on top.
    engine_gauge_lag: Seconds = Field(default=2.0, ge=0)
    # How long a request whose client left still counts against an SGLang backend's load: it
    # aborts a started stream 2 s after the disconnect, and one not started yet (or a
    # non-stream) at its next 4-s poll. vLLM aborts at once.
    engine_abort_lag: Seconds = Field(default=2.0, ge=0)
    scrape_metrics: bool = True

    # -- crossover table and learning ---------------------------------------------------------
    # JSON table from `spec-router calibrate`; the learned table is written back here. A path
    # that does not exist is a start-up error unless TABLE_FRESH is set (router.decide.table:
    # ``starting_table``).
    table_path: Path | None = None
    # TABLE_PATH may not exist yet: start uncalibrated, and write the table there only once the
    # router has one of its own (learned curves for both pools, or a PUT table; never the
    # default). An existing file is read as always, so a restart resumes from what was learned.
    table_fresh: bool = False
    learn: bool = True
    learn_interval: Seconds = Field(default=5.0, gt=0)  # seconds between crossover updates
    learn_max_step: int = Field(default=1, ge=1)  # most the crossover moves per update
    learn_min_samples: int = Field(default=20, ge=1)  # per pool, before samples move it
    learn_decay: float = Field(default=0.99, gt=0, lt=1)  # weight a sample keeps per new one
    persist_interval: Seconds = Field(default=60.0, gt=0)
    # Most of the router's core the learner's work on the event loop (the step, the slo
    # policy's surfaces) takes while requests are in flight: after each stretch it leaves the
    # core to them for (1 - share) / share times as long; idle, it runs at full speed. 1: never
    # pauses. (0.1: tail.py's TTFT p99, bench/results/fast-path.md, session 13.)
    learn_share: float = Field(default=0.1, gt=0, le=1)
    # Share of requests near the crossover sent the other way, so both curves stay measured.
    explore_share: float = Field(default=0.02, ge=0, le=0.2)
    explore_band: int = Field(default=2, ge=0)

    # -- live page ----------------------------------------------------------------------------
    # Seconds between two snapshots of the live page's feed (/router/ui/events).
    ui_interval: Seconds = Field(default=1.0, ge=0.05, le=60)

    # -- the fleet planner (router/planning, docs/fleet.md) ----------------------------------
    # off: none. advisory: plan every PLAN_INTERVAL and show it (GET /router/plan, the
    # spec_router_plan_* gauges, the live page), spec_router_plan_desired_engines holding each
    # pool at what it runs. autoscale: the same, with spec_router_plan_desired_engines the
    # plan's next step for the autoscalers (or an actuator) to follow. The router itself never
    # restarts an engine.
    planner: Literal["off", "advisory", "autoscale"] = "off"
    plan_interval: Seconds = Field(default=60.0, gt=0)  # planner seconds between two plans
    # The forecast's season, planner seconds: a day (its shape comes from yesterday's).
    plan_season: Seconds = Field(default=86400.0, gt=0)
    # Requests whose lengths the router must have seen before it plans on their mix (the
    # forecast learns meanwhile): the mean of 50 conversation prompts is known to about +-28%.
    plan_min_requests: int = Field(default=50, ge=1)
    # Wall seconds per planner second: 1, except in front of sims run at --time-scale on a day
    # compressed for a bench (``spec-router fleet``).
    plan_time_scale: float = Field(default=1.0, gt=0)
    # Seconds (planner) an engine is out of service when it switches mode, until the router has
    # seen one do it (a member that left and came back healthy in the other pool).
    restart_s: Seconds = Field(default=600.0, gt=0)
    # The most engines holding a GPU at once (up, draining or loading); unset: the engines seen.
    gpu_budget: int | None = Field(default=None, ge=1)
    # Where the forecast's state (a day of arrival rates) is kept across restarts; unset: none.
    plan_state_path: Path | None = None
    # Where the plan's worker appends every round's inputs and outcome, for replaying the
    # plans offline (``router.planning.worker.rounds``); unset: none. Grows by a few kB a plan.
    plan_record_path: Path | None = None

    # -- process ------------------------------------------------------------------------------
    log_level: Literal["critical", "error", "warning", "info", "debug"] = "info"

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (init_settings, env_settings, _TomlSource(settings_cls))

    @field_validator(
        "speculative_urls",
        "baseline_urls",
        "api_keys",
        "trusted_proxies",
        "dns_servers",
        mode="before",
    )
    @classmethod
    def _split_csv(cls, value: Any) -> Any:
        # commas, whitespace or both: none of these values (URLs, keys, addresses) has either
        if isinstance(value, str):
            return [part for part in re.split(r"[\s,]+", value) if part]
        return value

    @field_validator("speculative_model_map", "baseline_model_map", mode="before")
    @classmethod
    def _parse_map(cls, value: Any) -> Any:
        if not isinstance(value, str):
            return value
        text = value.strip()
        if text.startswith("{"):
            return json.loads(text)
        pairs = [item.split("=", 1) for item in text.split(",") if item.strip()]
        if any(len(pair) != 2 for pair in pairs):
            raise ValueError("expected name=other,name2=other2 or a JSON object")
        return {k.strip(): v.strip() for k, v in pairs}

    @field_validator("speculative_urls", "baseline_urls")
    @classmethod
    def _check_urls(cls, urls: list[str]) -> list[str]:
        if not urls:
            raise ValueError("at least one backend URL is needed")
        cleaned = []
        for url in urls:
            origin = Origin.parse(url)  # raises ValueError naming the URL
            refuse_api_path(url, origin.base_path.decode())
            cleaned.append(url.rstrip("/"))
        if len(set(cleaned)) != len(cleaned):
            raise ValueError("a backend URL is listed twice")
        return cleaned

    @field_validator("trusted_proxies")
    @classmethod
    def _check_networks(cls, values: list[str]) -> list[str]:
        for value in values:
            ipaddress.ip_network(value, strict=False)  # raises ValueError naming it
        return values

    @field_validator("dns_servers")
    @classmethod
    def _check_dns_servers(cls, values: list[str]) -> list[str]:
        for value in values:
            parse_dns_server(value)  # raises ValueError naming it
        return values

    @model_validator(mode="after")
    def _check_membership(self) -> Settings:
        urls = [*self.speculative_urls, *self.baseline_urls]
        if len(urls) > self.max_backends:
            raise ValueError(
                f"{len(urls)} backend URLs, more than max_backends={self.max_backends}"
            )
        long = next((url for url in urls if len(url.encode()) > MAX_URL_BYTES), None)
        if long is not None:
            raise ValueError(f"a backend URL is longer than {MAX_URL_BYTES} bytes: {long[:60]}...")
        return self

    @model_validator(mode="after")
    def _check_pools_disjoint(self) -> Settings:
        shared = set(self.speculative_urls) & set(self.baseline_urls)
        if shared:
            raise ValueError(f"{sorted(shared)[0]} is in both pools")
        if self.eject_max < self.eject_base:
            raise ValueError("eject_max must be at least eject_base")
        return self

    def pool_api_key(self, pool: Pool) -> SecretStr | None:
        return self.speculative_api_key if pool == SPECULATIVE else self.baseline_api_key

    def pool_authorization(self, pool: Pool) -> bytes | None:
        """The ``Authorization`` value for requests to ``pool`` (its own key), if it has one."""
        key = self.pool_api_key(pool)
        return None if key is None else b"Bearer " + key.get_secret_value().encode()

    def pool_model_map(self, pool: Pool) -> dict[str, str]:
        return self.speculative_model_map if pool == SPECULATIVE else self.baseline_model_map

    def retry_after(self) -> int:
        """Seconds a refused client should wait: about one health round."""
        return max(1, round(self.health_interval))


# The longest backend URL (the --workers shared table keeps each in a fixed-size record).
MAX_URL_BYTES = 240


def parse_dns_server(text: str) -> tuple[str, int]:
    """A DNS server's ``address:port`` (``[v6]:port``; the port defaults to 53), as
    SPEC_ROUTER_DNS_SERVERS gives it; raises ValueError naming it."""
    text = text.strip()
    host, port_text = text, "53"
    if text.startswith("["):
        host, close, rest = text[1:].partition("]")
        if not close or (rest and not rest.startswith(":")):
            raise ValueError(f"bad DNS server {text!r}: expected [address]:port")
        port_text = rest[1:] or "53"
    elif text.count(":") == 1:
        host, _, port_text = text.partition(":")
    try:
        ipaddress.ip_address(host)
        port = int(port_text)
    except ValueError:
        raise ValueError(f"bad DNS server {text!r}: expected address:port") from None
    if not 0 < port < 65536:
        raise ValueError(f"bad DNS server {text!r}: port out of range")
    return host, port


# The settings that are durations of the engines' own behaviour (and the SLO on it): a router
# in front of sims that run ``time_scale`` times as long as the engines they model needs them in
# the sims' time (``sim_time_env``).
ENGINE_TIMES = ("slo_ttft_ms", "slo_tpot_ms", "engine_abort_lag", "engine_gauge_lag")


def sim_time_env(time_scale: float = 1.0) -> dict[str, str]:
    """``serve``'s defaults for the engine-time settings (``ENGINE_TIMES``) in the wall-clock
    time of sims at ``time_scale`` (the demo and the benches). Unscaled, a sim at 0.1 is held
    to an SLO ten times laxer than the one it models, and a request whose client left is still
    counted against its engine for ten times as long as the engine runs it."""
    fields = Settings.model_fields
    return {
        f"{ENV_PREFIX}{name.upper()}": f"{fields[name].default * time_scale:g}"
        for name in ENGINE_TIMES
    }


# pydantic's words for a value of the wrong type, replaced by what to write instead.
_EXPECTED = {
    "int_parsing": "expected a whole number, e.g. 7",
    "int_from_float": "expected a whole number, e.g. 7",
    "float_parsing": "expected a number, e.g. 2.5",
    "bool_parsing": "expected true or false",
}


def _describe(exc: ValidationError) -> str:
    err = exc.errors()[0]
    loc = err.get("loc") or ()
    name = str(loc[0]) if loc else ""
    where = f"{ENV_PREFIX}{name.upper()}" if name else "settings"
    value = err.get("input")
    shown = "" if (value is None or isinstance(value, dict) or "key" in name) else f"={value!r}"
    msg = _EXPECTED.get(str(err.get("type")), str(err.get("msg", "invalid")))
    msg = msg.removeprefix("Value error, ")
    more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
    return f"invalid setting {where}{shown}: {msg}{more}"


def load_settings(**overrides: Any) -> Settings:
    """Build the settings, turning any problem into one ``SettingsError`` line. A
    ``SPEC_ROUTER_*`` variable that is no setting is one too (``unknown_variables``)."""
    unknown = unknown_variables(os.environ)
    if unknown:
        more = f" (and {len(unknown) - 1} more)" if len(unknown) > 1 else ""
        raise SettingsError(unknown[0] + more)
    env = {k[len(ENV_PREFIX) :].lower(): k for k in os.environ if k.upper().startswith(ENV_PREFIX)}
    for note in retired_notes(env):
        log.warning(note)
    try:
        return Settings(**overrides)
    except ValidationError as exc:
        raise SettingsError(_describe(exc)) from None
    except json.JSONDecodeError as exc:
        raise SettingsError(f"invalid setting: bad JSON: {exc}") from None
