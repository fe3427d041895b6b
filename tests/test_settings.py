"""Settings: environment, TOML file, and one clear line per bad setting."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from router.settings import NOT_SETTINGS, RETIRED, Settings, SettingsError, load_settings


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    for key in list(os.environ):
        if key.startswith("SPEC_ROUTER_"):
            monkeypatch.delenv(key)


def test_defaults_match_the_default_sim_ports() -> None:
    s = load_settings()
    assert s.speculative_urls == ["http://127.0.0.1:30001"]
    assert s.baseline_urls == ["http://127.0.0.1:30002"]
    assert s.policy == "slo" and s.crossover is None


def test_env_lists_and_maps(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPEC_ROUTER_SPECULATIVE_URLS", "http://a:1, http://b:2/")
    monkeypatch.setenv("SPEC_ROUTER_BASELINE_MODEL_MAP", "kimi=kimi-base")
    monkeypatch.setenv("SPEC_ROUTER_SPECULATIVE_MODEL_MAP", '{"kimi": "kimi-eagle"}')
    monkeypatch.setenv("SPEC_ROUTER_API_KEYS", "k1,k2")
    s = load_settings()
    assert s.speculative_urls == ["http://a:1", "http://b:2"]
    assert s.baseline_model_map == {"kimi": "kimi-base"}
    assert s.speculative_model_map == {"kimi": "kimi-eagle"}
    assert [k.get_secret_value() for k in s.api_keys] == ["k1", "k2"]


def test_toml_file_with_env_winning(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "router.toml"
    path.write_text('crossover = 5\npolicy = "crossover"\nbaseline_urls = ["http://x:9"]\n')
    monkeypatch.setenv("SPEC_ROUTER_CONFIG", str(path))
    monkeypatch.setenv("SPEC_ROUTER_CROSSOVER", "3")
    s = load_settings()
    assert (s.crossover, s.policy, s.baseline_urls) == (3, "crossover", ["http://x:9"])


@pytest.mark.parametrize(
    ("env", "value", "named"),
    [
        ("CROSSOVER", "many", "SPEC_ROUTER_CROSSOVER"),
        ("CROSSOVER", "-1", "SPEC_ROUTER_CROSSOVER"),
        ("POLICY", "fastest", "SPEC_ROUTER_POLICY"),
        ("BASELINE_URLS", "ftp://x", "SPEC_ROUTER_BASELINE_URLS"),
        ("SPECULATIVE_URLS", "", "SPEC_ROUTER_SPECULATIVE_URLS"),
        ("IDLE_TIMEOUT", "0", "SPEC_ROUTER_IDLE_TIMEOUT"),
        ("LEARN_SHARE", "0", "SPEC_ROUTER_LEARN_SHARE='0': Input should be greater than 0"),
        ("LEARN_SHARE", "1.5", "SPEC_ROUTER_LEARN_SHARE='1.5': Input should be less than or"),
        ("LEARN_SHARE", "most", "SPEC_ROUTER_LEARN_SHARE='most': expected a number"),
        ("BASELINE_URLS", "http://127.0.0.1:30001", "both pools"),
    ],
)
def test_bad_setting_is_one_line_naming_it(
    monkeypatch: pytest.MonkeyPatch, env: str, value: str, named: str
) -> None:
    monkeypatch.setenv(f"SPEC_ROUTER_{env}", value)
    with pytest.raises(SettingsError) as err:
        load_settings()
    message = str(err.value)
    assert named in message and "\n" not in message


def test_unknown_key_in_toml_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "router.toml"
    path.write_text("crosover = 5\n")
    monkeypatch.setenv("SPEC_ROUTER_CONFIG", str(path))
    with pytest.raises(SettingsError, match="crosover"):
        load_settings()


def test_a_retired_setting_is_ignored_with_a_warning_not_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # an environment and a TOML file left from an earlier release still start the router
    path = tmp_path / "router.toml"
    path.write_text("start_first_ms = 5\ncrossover = 4\n")
    monkeypatch.setenv("SPEC_ROUTER_CONFIG", str(path))
    monkeypatch.setenv("SPEC_ROUTER_START_FIRST_MS", "2")
    with caplog.at_level("WARNING", logger="router.settings"):
        s = load_settings()
    assert s.crossover == 4 and not hasattr(s, "start_first_ms")
    notes = [r.getMessage() for r in caplog.records]
    assert any("SPEC_ROUTER_START_FIRST_MS is ignored" in n for n in notes), notes
    assert any(f"'start_first_ms' in SPEC_ROUTER_CONFIG={path} is ignored" in n for n in notes)
    # a misspelling of it is still a misspelling
    monkeypatch.setenv("SPEC_ROUTER_START_FIRST_M", "2")
    with pytest.raises(SettingsError, match="SPEC_ROUTER_START_FIRST_M in the environment"):
        load_settings()


# -- the mistakes operators make most (issue 34) ---------------------------------------------------


@pytest.mark.parametrize(
    ("typo", "meant"),
    [
        ("SPEC_ROUTER_CROSOVER", "SPEC_ROUTER_CROSSOVER"),
        ("SPEC_ROUTER_SPECULATIVE_URL", "SPEC_ROUTER_SPECULATIVE_URLS"),
        ("spec_router_polcy", "SPEC_ROUTER_POLICY"),  # (read in any case, so checked in any)
    ],
)
def test_a_misspelt_variable_is_refused_naming_the_setting_meant(
    monkeypatch: pytest.MonkeyPatch, typo: str, meant: str
) -> None:
    monkeypatch.setenv(typo, "4")
    with pytest.raises(SettingsError) as err:
        load_settings()
    message = str(err.value)
    assert f"unknown setting {typo} in the environment: did you mean {meant}?" in message
    assert "\n" not in message and "'4'" not in message  # (the value may be a secret)


def test_a_variable_like_no_setting_is_refused_too(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPEC_ROUTER_ZZZ", "1")
    with pytest.raises(SettingsError, match="SPEC_ROUTER_ZZZ .*no setting is named like it"):
        load_settings()


def test_the_projects_own_variables_are_not_settings_and_pass(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in NOT_SETTINGS - {"SPEC_ROUTER_CONFIG"}:
        monkeypatch.setenv(name, "x")
    assert load_settings().policy == "slo"


def test_every_variable_the_project_sets_is_a_setting_or_listed() -> None:
    """Any SPEC_ROUTER_* name written in the project's scripts, deploy files and docs is a
    setting or in NOT_SETTINGS (else the router would refuse to start where it is set)."""
    root = Path(__file__).resolve().parent.parent
    names: set[str] = set()
    for pattern in ("router/**/*.py", "bench/**/*.py", "tests/**/*.py", "scripts/**/*",
                    "deploy/**/*", "docs/**/*.md", "README.md", "Makefile"):  # fmt: skip
        for path in root.glob(pattern):
            if path.is_file() and path.suffix not in (".png", ".pyc"):
                names |= set(re.findall(r"SPEC_ROUTER_[A-Z0-9_]*[A-Z0-9]", path.read_text()))
    settings = {f"SPEC_ROUTER_{name.upper()}" for name in Settings.model_fields}
    # (a pattern such as SPEC_ROUTER_*_URLS leaves a stem; the typos are the tests' own)
    stems = {"SPEC_ROUTER_", "SPEC_ROUTER_CROSOVER", "SPEC_ROUTER_SPECULATIVE_URL",
             "SPEC_ROUTER_ZZZ", "SPEC_ROUTER_START_FIRST_M"}  # fmt: skip
    retired = {f"SPEC_ROUTER_{name.upper()}" for name in RETIRED}  # (ignored with a warning)
    unknown = {n for n in names if n not in settings | NOT_SETTINGS | stems | retired}
    assert not unknown


def test_a_typo_in_the_toml_file_names_the_setting_meant(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "router.toml"
    path.write_text("speculative_url = 'http://a:1'\n")
    monkeypatch.setenv("SPEC_ROUTER_CONFIG", str(path))
    with pytest.raises(SettingsError, match="'speculative_url': did you mean 'speculative_urls'"):
        load_settings()


@pytest.mark.parametrize(
    ("value", "fixed"),
    [
        ("http://a:30000/v1", "http://a:30000"),
        ("http://a:30000/v1/", "http://a:30000"),
        ("http://a:30000/v1/chat/completions", "http://a:30000"),
        ("http://gw/engines/eagle/v1", "http://gw/engines/eagle"),
    ],
)
def test_an_engine_url_with_v1_is_refused_with_the_fix(
    monkeypatch: pytest.MonkeyPatch, value: str, fixed: str
) -> None:
    monkeypatch.setenv("SPEC_ROUTER_SPECULATIVE_URLS", value)
    with pytest.raises(SettingsError) as err:
        load_settings()
    assert f"(use {fixed}): the router adds each request's own path" in str(err.value)


def test_any_other_path_is_kept_as_the_engines_prefix(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPEC_ROUTER_BASELINE_URLS", "http://gw/engines/base/")
    assert load_settings().baseline_urls == ["http://gw/engines/base"]


@pytest.mark.parametrize(
    "value", ["http://a:1 http://b:2", "http://a:1,\n http://b:2", " http://a:1 ,http://b:2 "]
)
def test_urls_may_be_separated_by_commas_or_whitespace(
    monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    monkeypatch.setenv("SPEC_ROUTER_SPECULATIVE_URLS", value)
    assert load_settings().speculative_urls == ["http://a:1", "http://b:2"]


def test_a_bad_port_says_what_a_url_looks_like(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPEC_ROUTER_BASELINE_URLS", "http://a:3000x")
    with pytest.raises(SettingsError, match=r"bad port in 'http://a:3000x': expected http\(s\)"):
        load_settings()


@pytest.mark.parametrize("value", ["32MiB", "32 MiB", "33554432", "32 mib", "32Mi"])
def test_sizes_as_the_docs_write_them(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("SPEC_ROUTER_MAX_BODY_BYTES", value)
    assert load_settings().max_body_bytes == 32 * 1024 * 1024


def test_sizes_in_powers_of_ten_and_ambiguous_ones(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPEC_ROUTER_MAX_BODY_BYTES", "32MB")
    assert load_settings().max_body_bytes == 32_000_000
    monkeypatch.setenv("SPEC_ROUTER_MAX_BODY_BYTES", "32M")
    with pytest.raises(SettingsError, match="ambiguous: write 32MiB .* or 32MB"):
        load_settings()
    monkeypatch.setenv("SPEC_ROUTER_MAX_BODY_BYTES", "lots")
    with pytest.raises(SettingsError, match="expected bytes, optionally with a unit: 33554432"):
        load_settings()


@pytest.mark.parametrize(
    ("env", "value", "read"),
    [
        ("REQUEST_TIMEOUT", "30", 30.0),
        ("REQUEST_TIMEOUT", "30 s", 30.0),
        ("REQUEST_TIMEOUT", "500ms", 0.5),
        ("STARTUP_GRACE", "15m", 900.0),
        ("SLO_TTFT_MS", "1000", 1000.0),
        ("SLO_TTFT_MS", "1.5 s", 1500.0),
        ("BUSY_POLL_US", "0.05ms", 50),
    ],
)
def test_durations_as_the_docs_write_them(
    monkeypatch: pytest.MonkeyPatch, env: str, value: str, read: float
) -> None:
    monkeypatch.setenv(f"SPEC_ROUTER_{env}", value)
    assert getattr(load_settings(), env.lower()) == pytest.approx(read)


def test_every_timeout_interval_lag_and_grace_takes_a_unit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """docs/configuration.md: "every timeout, interval, lag and grace" reads `2m` and `500ms`
    (a setting added later with a plain float would not)."""
    names = [
        n for n in Settings.model_fields if n.endswith(("_timeout", "_interval", "_lag", "_grace"))
    ]
    assert len(names) > 10
    for name in names:
        monkeypatch.setenv(f"SPEC_ROUTER_{name.upper()}", "1.5s")
    s = load_settings()
    for name in names:
        assert getattr(s, name) == pytest.approx(1.5), name
    for name in names:
        monkeypatch.setenv(f"SPEC_ROUTER_{name.upper()}", "1500ms")
    s = load_settings()
    assert {name: getattr(s, name) for name in names} == pytest.approx(dict.fromkeys(names, 1.5))


def test_a_number_that_is_not_one_says_what_to_write(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPEC_ROUTER_CROSSOVER", "many")
    with pytest.raises(SettingsError, match="CROSSOVER='many': expected a whole number, e.g. 7"):
        load_settings()
    monkeypatch.delenv("SPEC_ROUTER_CROSSOVER")
    monkeypatch.setenv("SPEC_ROUTER_HEALTH_INTERVAL", "often")
    with pytest.raises(SettingsError, match="expected a duration in s, optionally with a unit"):
        load_settings()
