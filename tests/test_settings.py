"""Settings: environment, TOML file, and one clear line per bad setting."""

from __future__ import annotations

from pathlib import Path

import pytest

from router.settings import SettingsError, load_settings


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
