"""Assembling a running Booster: database, schema check, credentials, core, gRPC and REST."""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field

import uvicorn
from sqlalchemy import Engine

from ..config import Settings
from ..storage import credentials as token_store
from ..storage import database
from .auth import TokenAuthority
from .core import Booster
from .fronts import Fronts
from .grpc_server import AgentServer, ListenError, tls_credentials
from .rest import charts, create_app, uvicorn_limits

log = logging.getLogger(__name__)


def database_url(settings: Settings) -> str:
    if settings.database_url is not None:
        return settings.database_url.get_secret_value()
    return database.start_embedded(settings.data_dir / "postgres")


def bootstrap_tokens(engine: Engine, settings: Settings) -> None:
    for name, role, value in (
        ("bootstrap-operator", "operator", settings.bootstrap_operator_token),
        ("bootstrap-agent", "agent", settings.bootstrap_agent_token),
    ):
        if value is not None:
            token_store.ensure_token(engine, name, role, value.get_secret_value())


@dataclass
class BoosterServer:
    """A whole Booster in this process; ``start`` returns once both ports are listening."""

    settings: Settings
    # Bring the schema to head at start: True, False (refuse to start unless it is at head),
    # or None: only an embedded PostgreSQL, which this process alone owns; an external one is
    # migrated by ``booster migrate`` (the chart's hook Job), never by a starting replica.
    migrate: bool | None = None
    engine: Engine = field(init=False)  # set by start()
    booster: Booster = field(init=False)
    grpc_server: AgentServer | None = None
    grpc_port: int = 0
    parameters_port: int = 0  # the read port (parameters_listen); 0 when there is none
    http_port: int = 0
    fronts: Fronts | None = None
    _uvicorn: uvicorn.Server | None = None
    _http_thread: threading.Thread | None = field(default=None, repr=False)

    def start(self) -> BoosterServer:
        s = self.settings
        url = database_url(s)
        self.engine = database.make_engine(url)
        try:
            if self.migrate or (self.migrate is None and s.database_url is None):
                database.migrate(self.engine)
            else:
                database.require_head(self.engine)
        except BaseException:
            self.engine.dispose()
            raise
        bootstrap_tokens(self.engine, s)
        self.booster = Booster(self.engine, s)
        self.booster.start()
        auth = TokenAuthority(self.engine, s.token_max_stale_s, s.allow_unbound_agent_tokens)
        self.booster.on_tokens_changed(auth.invalidate)
        self.grpc_server = AgentServer(
            self.booster,
            auth,
            s.grpc_listen,
            s.max_report_bytes,
            share_port=s.grpc_processes > 1,
            tls=tls_credentials(s),
        )
        self.grpc_port = self.grpc_server.start()
        self.fronts = Fronts(self.booster, s, url)
        self.fronts.start(self.grpc_port)
        self.parameters_port = self.fronts.parameters_port
        rest_app = create_app(self.booster, auth)
        rest_app.include_router(charts.router)  # the dashboard's chart data (read-only)
        config = uvicorn.Config(
            rest_app,
            host=s.http_host,
            port=s.http_port,
            log_level="warning",
            access_log=False,
            **uvicorn_limits(s),
        )
        self._uvicorn = uvicorn.Server(config)
        self._http_thread = threading.Thread(target=self._uvicorn.run, name="http", daemon=True)
        self._http_thread.start()
        while not self._uvicorn.started:
            if not self._http_thread.is_alive():
                raise ListenError(
                    f"REST: cannot listen on {s.http_host}:{s.http_port} (in use, or not an "
                    "address)"
                )
            threading.Event().wait(0.02)
        self.http_port = self._uvicorn.servers[0].sockets[0].getsockname()[1]
        log.info(
            "Booster serving: gRPC on port %d, REST on http://%s:%d",
            self.grpc_port,
            s.http_host,
            self.http_port,
        )
        return self

    def stop(self) -> None:
        if self._uvicorn is not None:
            self._uvicorn.should_exit = True
        if self._http_thread is not None:
            self._http_thread.join(timeout=10)
        if self.fronts is not None:
            self.fronts.stop()
        if self.grpc_server is not None:
            self.grpc_server.stop(grace=2)
        if hasattr(self, "booster"):
            self.booster.stop()
        if hasattr(self, "engine"):
            self.engine.dispose()

    def __enter__(self) -> BoosterServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
