"""Booster's typed settings: environment variables ``GEMINI_BOOSTER_*`` over an optional TOML file.

Defaults are safe for a single machine: embedded PostgreSQL under ``data_dir``, loopback-only
listeners, and no credential that is not created on purpose.
"""

from __future__ import annotations

import os
import tomllib
from pathlib import Path

from pydantic import Field, SecretStr, model_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

CONFIG_FILE_ENV = "GEMINI_BOOSTER_CONFIG"
RUNTIME_DIR = "run"  # under data_dir: XDG_RUNTIME_DIR for the embedded server
GRPC_EXPERIMENTS_ENV = "GRPC_EXPERIMENTS"  # read by gRPC core once, when it initialises
# Measured with the pinned grpcio (booster/pyproject.toml); re-measure when it changes, since a
# later gRPC may drop the experiment (it then warns once at start and keeps its default).
GRPC_CORE_EXPERIMENTS = "-event_engine_listener"


def apply_grpc_core_experiments(experiments: str) -> None:
    """Hand ``experiments`` to gRPC core through its environment variable, for this process
    and the processes it starts; before anything has initialised gRPC, or it has no effect."""
    if experiments:
        os.environ[GRPC_EXPERIMENTS_ENV] = experiments


class ConfigFileError(ValueError):
    """The settings file named by GEMINI_BOOSTER_CONFIG (or ``booster --config``) cannot be
    used. Never ignored: a mistyped path must not leave Booster on its defaults (the embedded
    database) while an operator believes it acts on the fleet's."""


def config_file_source(settings_cls: type[BaseSettings]) -> PydanticBaseSettingsSource | None:
    """The TOML source of the file named by GEMINI_BOOSTER_CONFIG; None when none is named.
    Raises ConfigFileError naming the file when it is missing, unreadable or not TOML."""
    path = os.environ.get(CONFIG_FILE_ENV)
    if not path:
        return None
    named = f"(named by {CONFIG_FILE_ENV} or --config)"
    if not Path(path).is_file():
        why = "is a directory" if Path(path).is_dir() else "does not exist"
        raise ConfigFileError(f"settings file {path} {why} {named}")
    try:
        return TomlConfigSettingsSource(settings_cls, toml_file=path)
    except OSError as e:
        raise ConfigFileError(
            f"settings file {path} cannot be read {named}: {e.strerror}"
        ) from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigFileError(f"settings file {path} is not TOML {named}: {e}") from None


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="GEMINI_BOOSTER_", extra="forbid")

    database_url: SecretStr | None = Field(
        default=None,
        description="postgresql+psycopg://… of an external PostgreSQL; unset = embedded server",
    )
    data_dir: Path = Field(
        default=Path("var/booster"), description="embedded PostgreSQL lives here"
    )
    grpc_listen: str = "127.0.0.1:50051"
    http_host: str = "127.0.0.1"
    http_port: int = 8080
    grpc_tls_cert_file: Path | None = Field(
        default=None, description="PEM certificate chain: the agent port speaks TLS when set"
    )
    grpc_tls_key_file: Path | None = Field(default=None, description="PEM private key for it")
    grpc_tls_client_ca_file: Path | None = Field(
        default=None,
        description="PEM CA bundle: agents must then present a certificate it signed, whose "
        "Common Name is the host id they may speak for (mutual TLS)",
    )
    grpc_processes: int = Field(
        default=1,
        ge=1,
        le=64,
        description="processes serving the agent port (SO_REUSEPORT); more ingest faster",
    )
    grpc_core_experiments: str = Field(
        default=GRPC_CORE_EXPERIMENTS,
        pattern=r"^([+-]?[a-z0-9_]+(,[+-]?[a-z0-9_]+)*)?$",
        description="gRPC core's GRPC_EXPERIMENTS for Booster's processes, set when `booster "
        "serve` starts (before gRPC does); '' leaves gRPC's own. The default serves accepted "
        "connections from the completion-queue poller itself instead of EventEngine threads: "
        "a third fewer thread switches and CPU per report (benchmarks/results/replicas.md)",
    )
    parameters_listen: str | None = Field(
        default=None,
        description="a second agent port that answers GetParameters only, from processes of "
        "its own that store no reports, so ingest cannot slow the read (docs/operating.md, "
        "'A read port'); unset = GetParameters only on grpc_listen, as before",
    )
    parameters_processes: int = Field(
        default=1,
        ge=1,
        le=64,
        description="processes serving parameters_listen (SO_REUSEPORT when more than one); "
        "one answers about 1,000 GetParameters/s per core",
    )
    max_report_bytes: int = Field(default=1 << 20, ge=1024)
    max_aggregates_per_report: int = Field(default=4096, ge=1)
    ingest_batch_max: int = Field(default=256, ge=1)
    ingest_linger_ms: float = Field(
        default=100.0,
        ge=0,
        le=1000,
        description="the longest the writer waits for more reports before storing a batch "
        "(it stores sooner when a full batch waits or the reports stop coming): each "
        "transaction costs Booster and PostgreSQL CPU whatever its size, so a replica below "
        "its capacity stores more per transaction and less per report (benchmarks/results/"
        "replicas.md); a report's answer comes at most this much later",
    )
    ingest_queue_max: int = Field(
        default=2048,
        ge=1,
        description="reports waiting to be stored, per process, beyond which more are refused "
        "at once (RESOURCE_EXHAUSTED with a retry hint) instead of queueing past deadlines",
    )
    gc_freeze_at_start: bool = Field(
        default=True,
        description="move every object alive once the agent port serves out of the garbage "
        "collector's reach (gc.freeze): its full passes then walk only what was made since, "
        "instead of stopping every call for 100-600 ms while the replica ingests",
    )
    refit_interval_s: float = Field(default=10.0, gt=0)
    refresh_after_s: int = Field(default=300, ge=1)
    replica_name: str | None = Field(
        default=None,
        description="this replica's name in refit ownership records; unset = host name and pid",
    )
    lease_poll_s: float = Field(
        default=1.0,
        gt=0,
        le=30,
        description="how often a replica tries to take refits of policies nobody owns",
    )
    max_new_contexts_per_host_day: int = Field(
        default=256,
        ge=1,
        le=1_000_000,
        description="new contexts one host may add to a policy in 24 hours (the rest refused)",
    )
    refit_processes: int = Field(
        default=2,
        ge=0,
        le=64,
        description="worker processes that fit models and plan (0: in the serving process)",
    )
    max_contexts_per_refit: int = Field(
        default=200,
        ge=1,
        le=100_000,
        description="contexts planned per refit; contexts with new data first, the rest next",
    )
    fold_interval_s: float = Field(
        default=5.0,
        gt=0,
        le=60,
        description="how often a policy's refit owner folds the aggregates stored since into "
        "the trial sums (a report is folded within about this long of being stored)",
    )
    raw_retention_days: int = Field(
        default=15,
        ge=1,
        le=3650,
        description="days raw aggregates (and their sketches, for percentiles) are kept, in "
        "daily partitions dropped once folded; trial sums are kept whatever this is",
    )
    guardrail_interval_s: float = Field(
        default=300.0,
        ge=0,
        le=86_400,
        description="how often the experiments' guardrails are checked (one replica at a time "
        "across the fleet); 0: only when an operator asks",
    )
    token_max_stale_s: float = Field(
        default=600.0,
        ge=0,
        le=86_400,
        description="while the database is unreachable, cached tokens are honoured this long",
    )
    max_request_body_bytes: int = Field(
        default=1 << 20, ge=1024, le=64 << 20, description="REST request bodies above this: 413"
    )
    grpc_max_connection_age_s: float = Field(
        default=600.0, gt=0, description="agent connections are recycled after this long"
    )
    grpc_max_connection_idle_s: float = Field(
        default=300.0, gt=0, description="agent connections idle this long are closed"
    )
    grpc_max_concurrent_rpcs: int = Field(
        default=512,
        ge=1,
        description="calls in progress per process (each may buffer a message of up to "
        "max_report_bytes); more get RESOURCE_EXHAUSTED",
    )
    bootstrap_operator_token: SecretStr | None = Field(
        default=None, description="if set, an operator token with this value exists at start"
    )
    bootstrap_agent_token: SecretStr | None = Field(
        default=None,
        description="if set, a fleet-wide agent token (bound to no host) with this value exists "
        "at start; it is only accepted with allow_unbound_agent_tokens (labs, demos, upgrades)",
    )
    allow_unbound_agent_tokens: bool = Field(
        default=False,
        description="accept agent tokens bound to no host, which may report as any host: only "
        "while moving a fleet from one shared token to a token per host",
    )
    log_level: str = "INFO"

    @model_validator(mode="after")
    def _bootstrap_agent_needs_unbound(self) -> Settings:
        if self.bootstrap_agent_token is not None and not self.allow_unbound_agent_tokens:
            raise ValueError(
                "bootstrap_agent_token is a fleet-wide agent token: it needs "
                "allow_unbound_agent_tokens = true (or create a token per host instead)"
            )
        return self

    @model_validator(mode="after")
    def _parameters_port_is_another(self) -> Settings:
        same = self.parameters_listen == self.grpc_listen
        if same and not self.grpc_listen.endswith(":0"):  # :0, two ports the kernel picks
            raise ValueError(
                f"parameters_listen is grpc_listen ({self.grpc_listen}): the read port must be "
                "a port of its own (or unset)"
            )
        return self

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
        from_file = config_file_source(settings_cls)
        if from_file is not None:
            sources.append(from_file)
        return tuple(sources)


def runtime_dir(data_dir: Path) -> None:
    """The embedded server's runtime files (its socket's lock) go under ``data_dir`` unless
    XDG_RUNTIME_DIR is set: in a directory of their own, private (0700) as a runtime directory
    must be (``data_dir`` itself is not: the server's initdb leaves it 0755)."""
    run = data_dir / RUNTIME_DIR
    run.mkdir(parents=True, exist_ok=True)
    run.chmod(0o700)
    os.environ.setdefault("XDG_RUNTIME_DIR", str(run.resolve()))
