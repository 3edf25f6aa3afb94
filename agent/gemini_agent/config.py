"""Agent settings: environment (GEMINI_AGENT_*) over a TOML file (GEMINI_AGENT_CONFIG), with
defaults that are safe on a host that has never seen Booster."""

from __future__ import annotations

import os
import tomllib
from pathlib import Path
from typing import Any

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

# Where tcp_fusion's sysctls are. A container sees the host's /proc/sys read-only, so the Helm
# chart mounts the host's /proc/sys/net writable elsewhere and points sysctl_root there.
SYSCTL_ROOT = Path("/proc/sys/net/fusion")
# net.ipv4.tcp_*congestion_control of the agent's network namespace (an experiment's arm).
NET_IPV4_ROOT = Path("/proc/sys/net/ipv4")
# The TOML settings file's path, from the environment.
CONFIG_ENV = "GEMINI_AGENT_CONFIG"


class _TomlSource(PydanticBaseSettingsSource):
    def get_field_value(self, field: Any, field_name: str) -> tuple[Any, str, bool]:
        return None, field_name, False

    def __call__(self) -> dict[str, Any]:
        path = os.environ.get(CONFIG_ENV)
        if not path:
            return {}
        return tomllib.loads(Path(path).read_text())


class AgentSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="GEMINI_AGENT_", extra="forbid")

    host_id: str = Field(default_factory=lambda: os.uname().nodename)
    policy: str = "default"
    booster_address: str = "127.0.0.1:50051"
    # Booster's read port (its parameters_listen), for GetParameters only: there the fleet's
    # ingest cannot slow the answer. Unset: GetParameters goes to booster_address, as reports
    # do. Same TLS files and token as booster_address.
    parameters_address: str | None = None
    token: SecretStr = SecretStr("")
    # or a file holding only the token, re-read when it changes (gemini_agent.credentials)
    token_file: Path | None = None
    tls_ca_file: Path | None = None  # TLS to Booster when set
    # mutual TLS: this host's client certificate (its Common Name is the host) and key, for a
    # Booster that asks for one (grpc_tls_client_ca_file); read at start
    tls_cert_file: Path | None = None
    tls_key_file: Path | None = None

    src_region: str = "unknown"
    src_isp: str = "unknown"
    geo_mmdb: Path | None = None  # MaxMind-format database: dst → region, ISP
    geo_csv: Path | None = None  # or a CSV prefix table: prefix,region,isp
    mmdb_region_field: str = "region"
    mmdb_isp_field: str = "isp"
    # destination places asked about per GetParameters, the busiest first; the rest run the
    # default θ (the kernel's table holds at most FUSION_MAX_PROFILES distinct θ anyway)
    max_contexts: int = Field(default=512, ge=1, le=10_000)

    interval_s: float = 300.0
    rpc_deadline_s: float = 10.0
    retry_initial_s: float = 0.5
    retry_max_s: float = 60.0
    spool_dir: Path = Path("/var/lib/gemini-agent/spool")
    spool_max_bytes: int = 64 * 1024 * 1024
    staleness_s: float = 1800.0  # after this without Booster, fall back to the safe default
    apply_to_kernel: bool = True  # False: ask and log, never write θ (dry run)
    sysctl_root: Path = SYSCTL_ROOT  # net.fusion.* as files (the chart mounts the host's)
    net_ipv4_root: Path = NET_IPV4_ROOT  # net.ipv4.* as files, for an experiment arm's CC
    metrics_listen: str = "127.0.0.1:9465"
    sockdiag: bool = False  # also watch flows of other CCs (socket diagnostics)
    sockdiag_dump_s: float = 5.0  # dump of open sockets: counters an abortive close erases

    @field_validator("interval_s", "rpc_deadline_s", "staleness_s")
    @classmethod
    def _positive(cls, v: float) -> float:
        if v <= 0:
            raise ValueError("must be > 0")
        return v

    @model_validator(mode="after")
    def _one_token_source(self) -> AgentSettings:
        if self.token_file is not None and self.token.get_secret_value():
            raise ValueError("set token or token_file, not both")
        return self

    @model_validator(mode="after")
    def _whole_client_certificate(self) -> AgentSettings:
        if (self.tls_cert_file is None) != (self.tls_key_file is None):
            raise ValueError("set tls_cert_file and tls_key_file together")
        if self.tls_cert_file is not None and self.tls_ca_file is None:
            raise ValueError("a client certificate needs tls_ca_file (TLS to Booster)")
        return self

    @classmethod
    def settings_customise_sources(
        cls, settings_cls, init_settings, env_settings, dotenv_settings, file_secret_settings
    ):
        return init_settings, env_settings, _TomlSource(settings_cls), file_secret_settings
