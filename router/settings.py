"""Configuration: one frozen value object, read once at start-up and passed in.

Sources, strongest first: keyword arguments (tests), environment variables with the
``SPEC_ROUTER_`` prefix, the TOML file named by ``SPEC_ROUTER_CONFIG``, then the defaults below.
List settings take comma-separated values in the environment (``a,b``) or a TOML array; maps take
``name=other,name2=other2`` or JSON in the environment, or a TOML table.
"""

from __future__ import annotations

import ipaddress
import json
import os
import tomllib
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, SecretStr, ValidationError, field_validator, model_validator
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

ENV_PREFIX = "SPEC_ROUTER_"
CONFIG_ENV = "SPEC_ROUTER_CONFIG"

PolicyName = Literal["slo", "spillover", "crossover", "round_robin", "predictive"]
LoadSignal = Literal["local", "engine", "max"]
DiscoveryMode = Literal["static", "dns"]
CsvList = Annotated[list[str], NoDecode]
NameMap = Annotated[dict[str, str], NoDecode]

# Chosen for the simulated presets (their analytic crossing is ~6.8 concurrent requests); a real
# deployment should calibrate (``spec-router calibrate``) or set SPEC_ROUTER_CROSSOVER.
DEFAULT_CROSSOVER = 7


class SettingsError(Exception):
    """A setting is invalid; the message is one line naming it."""


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
            unknown = sorted(set(self._data) - set(settings_cls.model_fields))
            if unknown:
                raise SettingsError(f"{CONFIG_ENV}={path}: unknown setting {unknown[0]!r}")

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
    discovery_interval: float = Field(default=5.0, gt=0)
    # host:port,... of the DNS servers to ask, by address (as nginx's `resolver`; port 53 by
    # default); unset: the system resolver (getaddrinfo: /etc/hosts, resolv.conf's search
    # domains, as every program in the pod resolves)
    dns_servers: CsvList = Field(default_factory=list)
    # How long empty answers (NXDOMAIN/NODATA) for a name that had addresses must last before
    # its backends leave. A failed resolution (timeout, SERVFAIL) never empties a pool.
    discovery_grace: float = Field(default=30.0, ge=0)
    # How long a backend that left (its address gone from DNS, or removed through the admin
    # API) may finish the requests it has in flight; then they are cut, as on an upstream
    # failure (streams end with an error event).
    drain_timeout: float = Field(default=300.0, gt=0)
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
    slo_ttft_ms: float = Field(default=1000.0, gt=0)
    slo_tpot_ms: float = Field(default=25.0, gt=0)
    crossover: int | None = Field(default=None, ge=0)
    hysteresis: int = Field(default=1, ge=0)
    # A router-side queue (0: none) for requests the slo policy finds no backend can serve
    # within even the relaxed SLO: they wait here up to QUEUE_TIMEOUT seconds for a request in
    # flight to end, then get 503; a full queue answers 429. Both with Retry-After.
    queue_size: int = Field(default=0, ge=0)
    queue_timeout: float = Field(default=5.0, gt=0)

    # -- upstream client ----------------------------------------------------------------------
    connect_timeout: float = Field(default=5.0, gt=0)
    # A stream: request sent -> first body byte (its queueing and prefill; vLLM and SGLang 0.5.3
    # send the headers before the request is queued).
    first_byte_timeout: float = Field(default=600.0, gt=0)
    # Longest silence between two chunks of a stream once it has started. No total deadline.
    idle_timeout: float = Field(default=120.0, gt=0)
    # A non-streamed request: sent -> whole answer (headers and body come when it is generated).
    non_stream_timeout: float = Field(default=1800.0, gt=0)
    max_connections_per_backend: int = Field(default=8192, ge=1)
    max_idle_per_backend: int = Field(default=1024, ge=0)
    keepalive_expiry: float = Field(default=4.0, ge=0)
    max_body_bytes: int = Field(default=32 * 1024 * 1024, ge=1024)
    # Absolute deadline for receiving a whole request, headers and body (slowloris): 408 after.
    request_timeout: float = Field(default=30.0, gt=0)
    # How long a client's connection is kept open with no request on it. Behind a load balancer
    # it must outlast the balancer's own idle timeout, or the balancer may send a request on a
    # connection the router is closing (a 502 to its client).
    client_keep_alive: float = Field(default=CLIENT_KEEP_ALIVE, gt=0)
    max_attempts: int = Field(default=3, ge=1)
    # Microseconds the event loop keeps polling after activity before it may sleep (0: never
    # spins). Saves ~0.1 ms per request at low load for CPU just after activity (busypoll.py).
    busy_poll_us: int = Field(default=50, ge=0, le=100_000)
    # Hold busy polling while the router's core looks shared with other busy processes
    # (busypoll.ShareWatch); false: spin whatever the core's neighbours do.
    busy_poll_yield: bool = True

    # -- access -------------------------------------------------------------------------------
    api_keys: Annotated[list[SecretStr], NoDecode] = Field(default_factory=list)
    # Addresses (IPs or CIDRs) of proxies in front of the router whose X-Forwarded-For is kept;
    # anyone else's is replaced by the client's own address.
    trusted_proxies: CsvList = Field(default_factory=list)
    admin_token: SecretStr | None = None

    # -- health -------------------------------------------------------------------------------
    health_interval: float = Field(default=2.0, gt=0)
    # A probe of /ready (SGLang 0.5.23) or of vLLM's /health, both flag checks.
    health_timeout: float = Field(default=2.0, gt=0)
    # A probe of SGLang's /health where it has no /ready (0.5.3): a one-token generation that
    # answers after >= 1 s, and 503 only after the engine's own SGLANG_HEALTH_CHECK_TIMEOUT (20 s).
    health_generate_timeout: float = Field(default=25.0, gt=0)
    startup_grace: float = Field(default=900.0, ge=0)
    fall: int = Field(default=3, ge=1)
    rise: int = Field(default=2, ge=1)
    eject_base: float = Field(default=1.0, gt=0)
    eject_max: float = Field(default=60.0, gt=0)
    ramp_seconds: float = Field(default=10.0, ge=0)
    load_signal: LoadSignal = "local"
    # LOAD_SIGNAL engine/max: how stale an SGLang engine's load gauges may be. It refreshes them
    # on a prefill batch (without that batch's own requests) and every --decode-log-interval
    # (40) decode steps; this replica's requests of that long before a scrape count on top.
    engine_gauge_lag: float = Field(default=2.0, ge=0)
    # How long a request whose client left still counts against an SGLang backend's load: it
    # aborts a started stream 2 s after the disconnect, and one not started yet (or a
    # non-stream) at its next 4-s poll. vLLM aborts at once.
    engine_abort_lag: float = Field(default=2.0, ge=0)
    scrape_metrics: bool = True

    # -- crossover table and learning ---------------------------------------------------------
    # JSON table from `spec-router calibrate`; the learned table is written back here.
    table_path: Path | None = None
    learn: bool = True
    learn_interval: float = Field(default=5.0, gt=0)  # seconds between crossover updates
    learn_max_step: int = Field(default=1, ge=1)  # most the crossover moves per update
    learn_min_samples: int = Field(default=20, ge=1)  # per pool, before samples move it
    learn_decay: float = Field(default=0.99, gt=0, lt=1)  # weight a sample keeps per new one
    persist_interval: float = Field(default=60.0, gt=0)
    # Share of requests near the crossover sent the other way, so both curves stay measured.
    explore_share: float = Field(default=0.02, ge=0, le=0.2)
    explore_band: int = Field(default=2, ge=0)

    # -- live page ----------------------------------------------------------------------------
    # Seconds between two snapshots of the live page's feed (/router/ui/events).
    ui_interval: float = Field(default=1.0, ge=0.05, le=60)

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
        if isinstance(value, str):
            return [part.strip() for part in value.split(",") if part.strip()]
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
            Origin.parse(url)  # raises ValueError naming the URL
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


def _describe(exc: ValidationError) -> str:
    err = exc.errors()[0]
    loc = err.get("loc") or ()
    name = str(loc[0]) if loc else ""
    where = f"{ENV_PREFIX}{name.upper()}" if name else "settings"
    value = err.get("input")
    shown = "" if (value is None or isinstance(value, dict) or "key" in name) else f"={value!r}"
    msg = str(err.get("msg", "invalid")).removeprefix("Value error, ")
    more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
    return f"invalid setting {where}{shown}: {msg}{more}"


def load_settings(**overrides: Any) -> Settings:
    """Build the settings, turning any problem into one ``SettingsError`` line."""
    try:
        return Settings(**overrides)
    except ValidationError as exc:
        raise SettingsError(_describe(exc)) from None
    except json.JSONDecodeError as exc:
        raise SettingsError(f"invalid setting: bad JSON: {exc}") from None
