"""Extra agent-facing processes on Booster's one gRPC port, so ingestion is not bound to one
interpreter.

One Python process tops out well below the ingestion target on two cores: gRPC's own per-call
work and the checks on each report share one interpreter lock. With ``grpc_processes = N``,
Booster starts N − 1 *front* processes that listen on the same port (SO_REUSEPORT, which gRPC
sets by default on Linux), so the kernel spreads agent connections across processes.

A front is a Booster core that never refits. It validates and stores reports itself (its own
group-commit writer; exactly-once rests on the database's unique report id, so several writers
are as safe as one) and answers GetParameters from the plans the main process persisted, which
it reloads every ``SYNC_S``. What only the main process may do travels to it over a queue:
which policies got new data (so it refits), which contexts were asked for before they had a plan,
and a snapshot of the front's metrics, merged into the main process's ``/metrics``.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import signal
import threading
from dataclasses import dataclass, field

from sqlalchemy import Engine

from ..config import Settings
from ..storage import database
from .auth import TokenAuthority
from .core import Booster
from .grpc_server import AgentServer, tls_credentials

log = logging.getLogger(__name__)
SYNC_S = 1.0


class FrontCore(Booster):
    """A core for a front process: ingests and answers, leaves refits to the main process."""

    def __init__(self, engine: Engine, settings: Settings, front_id: int, events: mp.Queue):
        super().__init__(engine, settings)
        self._front_id = front_id
        self._events = events
        self._dirty_out: set[int] = set()

    def stop(self) -> None:
        super().stop()
        self._ship()

    def _send(self, kind: str, payload) -> None:
        self._events.put((self._front_id, kind, payload))

    def mark_dirty(self, policy_ids: set[int]) -> None:
        with self._lock:  # sent with the next sync, not per report or per request
            self._dirty_out |= policy_ids

    def _ship(self) -> None:
        with self._lock:
            requested, self._requested = self._requested, {}
            dirty, self._dirty_out = self._dirty_out, set()
        if dirty:
            self._send("dirty", dirty)
        if requested:
            self._send("requested", requested)
        self._send("metrics", list(self.metrics.registry.collect()))

    def _refresh_loop(self) -> None:
        """A front's refresh: plans and policies from PostgreSQL, its news to the main process."""
        while not self._stopping.wait(SYNC_S):
            try:
                self.reload_policies()
                self._load_plans()
            except Exception as e:  # the database may be restarting; try again next round
                log.warning("front sync failed: %s", type(e).__name__)
            self._ship()


def _serve_front(
    front_id: int, settings: Settings, url: str, listen: str, events: mp.Queue, ready
) -> None:
    logging.basicConfig(level=settings.log_level)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    engine = database.make_engine(url)
    core = FrontCore(engine, settings, front_id, events)
    core.start()
    auth = TokenAuthority(engine)
    server = AgentServer(
        core,
        auth,
        listen,
        settings.max_report_bytes,
        share_port=True,
        tls=tls_credentials(settings),
    )
    server.start()
    ready.set()
    stop.wait()
    server.stop(grace=2)
    core.stop()
    engine.dispose()


@dataclass
class Fronts:
    """The main process's side: starts the fronts and applies what they send."""

    booster: Booster
    settings: Settings
    url: str
    _procs: list = field(default_factory=list)
    _events: mp.Queue | None = None
    _thread: threading.Thread | None = None

    def start(self, port: int) -> None:
        n = self.settings.grpc_processes - 1
        if n <= 0:
            return
        ctx = mp.get_context("spawn")  # never fork a process that runs gRPC threads
        self._events = ctx.Queue()
        host = self.settings.grpc_listen.rsplit(":", 1)[0]
        for i in range(n):
            ready = ctx.Event()
            proc = ctx.Process(
                target=_serve_front,
                args=(i, self.settings, self.url, f"{host}:{port}", self._events, ready),
                name=f"gemini-booster-front-{i}",
                daemon=True,
            )
            proc.start()
            if not ready.wait(60):
                raise RuntimeError(f"front process {i} did not start")
            self._procs.append(proc)
        self._thread = threading.Thread(target=self._apply_loop, name="fronts", daemon=True)
        self._thread.start()
        log.info("%d front process(es) serving gRPC on port %d", n, port)

    def _apply(self, sender: int, kind: str, payload) -> None:
        if kind == "dirty":
            self.booster.mark_dirty(payload)
        elif kind == "requested":
            for policy_id, keys in payload.items():
                self.booster.request_contexts(policy_id, keys)
        elif kind == "metrics":
            self.booster.metrics.remote[sender] = payload

    def _apply_loop(self) -> None:
        while True:
            item = self._events.get()
            if item is None:
                return
            self._apply(*item)

    def stop(self) -> None:
        for proc in self._procs:
            proc.terminate()
        for proc in self._procs:
            proc.join(timeout=10)
        if self._thread is not None:
            self._events.put(None)
            self._thread.join(timeout=5)
