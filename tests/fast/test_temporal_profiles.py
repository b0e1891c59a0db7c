"""Temporal connection profiles: a temporal.toml profile (temporalio.envconfig) becomes the
connect configuration every process uses (inboxcrm/platform/temporal.py connect_config), with
the standard TEMPORAL_* variables over the file and the INBOXCRM_* settings over both.
Temporal Cloud with an API key and with mTLS, loaded from files as an operator writes them."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from pydantic import SecretStr
from temporalio.service import TLSConfig

from inboxcrm.platform.config import Settings
from inboxcrm.platform.temporal import ConnectConfig, connect_config, effective_namespace
from tests.helpers.stack import ROOT

EXAMPLE = ROOT / "deploy" / "temporal" / "temporal.toml.example"

PROFILES = """
[profile.default]
address = "temporal.internal:7233"
namespace = "inbox"

[profile.cloud-api-key]
address = "us-east-1.aws.api.temporal.io:7233"
namespace = "inbox.a1b2c"
api_key = "profile-key"

[profile.cloud-mtls]
address = "inbox.a1b2c.tmprl.cloud:7233"
namespace = "inbox.a1b2c"
[profile.cloud-mtls.tls]
client_cert_path = "{cert}"
client_key_path = "{key}"
server_name = "inbox.a1b2c.tmprl.cloud"
[profile.cloud-mtls.grpc_meta]
x-inboxcrm-deployment = "eu"
"""


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No setting or Temporal variable of the machine running the test leaks in; the default
    profile location points into the test's folder."""
    for key in list(os.environ):
        if key.startswith(("INBOXCRM_", "TEMPORAL_")) or key == "DATABASE_URL":
            monkeypatch.delenv(key)
    monkeypatch.setenv("INBOXCRM_MAIL_FROM", "Sales <sales@example.com>")  # required outside local
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))


@pytest.fixture
def profiles(tmp_path: Path) -> Path:
    cert, key = tmp_path / "client.pem", tmp_path / "client.key"
    cert.write_bytes(b"CLIENT CERT")
    key.write_bytes(b"CLIENT KEY")
    path = tmp_path / "temporal.toml"
    path.write_text(PROFILES.format(cert=cert, key=key))
    return path


def settings(monkeypatch: pytest.MonkeyPatch, **env: str) -> Settings:
    """Settings as a process gets them: from its environment."""
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    return Settings()


def test_without_a_profile_the_settings_and_defaults_apply(monkeypatch: pytest.MonkeyPatch
                                                           ) -> None:
    assert connect_config(settings(monkeypatch)) == ConnectConfig(
        target_host="127.0.0.1:7233", namespace="default")


def test_the_default_profile_location_is_read_only_when_asked(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, profiles: Path) -> None:
    """A developer's own Temporal CLI profile (e.g. Temporal Cloud) never redirects the local
    stack; naming a profile reads the CLI's default file."""
    default_file = tmp_path / "xdg" / "temporalio" / "temporal.toml"
    default_file.parent.mkdir(parents=True)
    default_file.write_text(profiles.read_text())
    assert connect_config(settings(monkeypatch)).target_host == "127.0.0.1:7233"
    asked = connect_config(settings(monkeypatch, TEMPORAL_PROFILE="default"))
    assert (asked.target_host, asked.namespace) == ("temporal.internal:7233", "inbox")


def test_temporal_cloud_with_an_api_key(monkeypatch: pytest.MonkeyPatch, profiles: Path) -> None:
    config = connect_config(settings(monkeypatch, TEMPORAL_CONFIG_FILE=str(profiles),
                                     TEMPORAL_PROFILE="cloud-api-key"))
    assert config == ConnectConfig(
        target_host="us-east-1.aws.api.temporal.io:7233", namespace="inbox.a1b2c",
        api_key="profile-key", tls=True, profile="cloud-api-key")


def test_temporal_cloud_with_mtls(monkeypatch: pytest.MonkeyPatch, profiles: Path) -> None:
    config = connect_config(settings(monkeypatch, TEMPORAL_CONFIG_FILE=str(profiles),
                                     TEMPORAL_PROFILE="cloud-mtls"))
    assert (config.target_host, config.namespace, config.api_key) == (
        "inbox.a1b2c.tmprl.cloud:7233", "inbox.a1b2c", None)
    assert isinstance(config.tls, TLSConfig)
    assert (config.tls.client_cert, config.tls.client_private_key, config.tls.domain) == (
        b"CLIENT CERT", b"CLIENT KEY", "inbox.a1b2c.tmprl.cloud")
    assert config.rpc_metadata == {"x-inboxcrm-deployment": "eu"}


def test_standard_variables_override_the_file_and_inboxcrm_settings_override_both(
        monkeypatch: pytest.MonkeyPatch, profiles: Path) -> None:
    base = {"TEMPORAL_CONFIG_FILE": str(profiles), "TEMPORAL_PROFILE": "cloud-api-key"}
    standard = connect_config(settings(monkeypatch, **base, TEMPORAL_NAMESPACE="from-env",
                                       TEMPORAL_API_KEY="env-key"))
    assert (standard.namespace, standard.api_key) == ("from-env", "env-key")
    ours = connect_config(settings(monkeypatch, INBOXCRM_TEMPORAL_NAMESPACE="ours",
                                   INBOXCRM_TEMPORAL_API_KEY="our-key",
                                   TEMPORAL_ADDRESS="elsewhere:7233"))
    assert (ours.target_host, ours.namespace, ours.api_key, ours.tls) == (
        "elsewhere:7233", "ours", "our-key", True)


def test_inboxcrm_mtls_settings_replace_the_profiles_tls(
        monkeypatch: pytest.MonkeyPatch, profiles: Path, tmp_path: Path) -> None:
    cert, key = tmp_path / "ours.pem", tmp_path / "ours.key"
    cert.write_bytes(b"OUR CERT")
    key.write_bytes(b"OUR KEY")
    config = connect_config(settings(
        monkeypatch, TEMPORAL_CONFIG_FILE=str(profiles), TEMPORAL_PROFILE="cloud-mtls",
        INBOXCRM_TEMPORAL_TLS_CERT=str(cert), INBOXCRM_TEMPORAL_TLS_KEY=str(key)))
    assert isinstance(config.tls, TLSConfig)
    assert (config.tls.client_cert, config.tls.domain) == (b"OUR CERT", None)
    assert config.target_host == "inbox.a1b2c.tmprl.cloud:7233"


def test_an_unknown_profile_is_an_error_naming_it(monkeypatch: pytest.MonkeyPatch,
                                                  profiles: Path) -> None:
    with pytest.raises(Exception, match="nope"):
        connect_config(settings(monkeypatch, TEMPORAL_CONFIG_FILE=str(profiles),
                                TEMPORAL_PROFILE="nope"))


def test_the_codec_serves_the_profiles_namespace(monkeypatch: pytest.MonkeyPatch,
                                                 profiles: Path) -> None:
    assert effective_namespace(settings(monkeypatch)) == "default"
    assert effective_namespace(settings(monkeypatch, TEMPORAL_CONFIG_FILE=str(profiles))) \
        == "inbox"
    assert effective_namespace(Settings(temporal_namespace="set")) == "set"


MOUNT = "/etc/inboxcrm/temporal-tls/"  # where the manifests mount inboxcrm-temporal-tls


@pytest.mark.parametrize("profile", ["default", "cloud-api-key", "cloud-mtls"])
def test_the_shipped_example_profiles_load(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                           profile: str) -> None:
    """deploy/temporal/temporal.toml.example, as the deploy README tells operators to use it
    (an API key from a Secret as TEMPORAL_API_KEY; mTLS files mounted where it says)."""
    text = EXAMPLE.read_text()
    assert MOUNT in text
    for name in ("tls.crt", "tls.key"):
        (tmp_path / name).write_bytes(name.encode())
    copy = tmp_path / "temporal.toml"
    copy.write_text(text.replace(MOUNT, f"{tmp_path}/"))
    env = {"TEMPORAL_CONFIG_FILE": str(copy), "TEMPORAL_PROFILE": profile}
    if profile == "cloud-api-key":
        env["TEMPORAL_API_KEY"] = "from-a-secret"
    config = connect_config(settings(monkeypatch, **env))
    assert config.profile == profile and config.namespace
    if profile == "cloud-api-key":
        assert (config.api_key, config.tls) == ("from-a-secret", True)
    if profile == "cloud-mtls":
        assert isinstance(config.tls, TLSConfig) and config.api_key is None
        assert config.tls.client_cert == b"tls.crt"
    if profile == "default":
        assert config.tls is None and config.api_key is None


def test_secret_api_key_setting_is_a_secret() -> None:
    assert isinstance(Settings(temporal_api_key=SecretStr("k")).temporal_api_key, SecretStr)
