"""Extra agent-facing processes on Booster's one gRPC port, so ingestion is not bound to one
interpreter.

One Python process tops out well below the ingestion target on two cores: gRPC's own per-call
work and the checks on each report share one interpreter lock. With ``grpc_processes = N``,
Booster starts N − 1 *front* processes that listen on the same port (SO_REUSEPORT), so the
kernel spreads agent connections across processes.

A front is a Booster core without refits: it validates and stores reports itself (its own
group-commit writer; exactly-once rests on the database's unique report id) and answers
GetParameters from plans it follows in PostgreSQL like any replica does (``sync.py``). The
only thing it sends its parent is a snapshot of its metrics, merged into ``/metrics``.

A front never outlives its parent: it watches the parent's process sentinel and exits as soon
as the parent is gone, however the parent died (``kill -9`` included), and it exits on SIGTERM
within a bounded grace.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import signal
import threading
from dataclasses import dataclass, field

from ..config import Settings
from ..storage import database
from .auth import TokenAuthority
from .core import Booster
from .grpc_server import AgentServer, tls_credentials
from .orphans import exit_with_parent

log = logging.getLogger(__name__)
METRICS_EVERY_S = 1.0
STOP_GRACE_S = 1.0  # on SIGTERM: calls in flight may finish
ORPHAN_EXIT_S = 0.3  # parent gone: a moment for calls in flight, then out (agents retry)


def _serve_front(
    front_id: int, settings: Settings, url: str, listen: str, events: mp.Queue, ready
) -> None:
    logging.basicConfig(level=settings.log_level)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    exit_with_parent(stop.set, ORPHAN_EXIT_S)
    engine = database.make_engine(url)
    core = Booster(engine, settings, refits=False)
    core.start()
    auth = TokenAuthority(engine, settings.token_max_stale_s, settings.allow_unbound_agent_tokens)
    core.on_tokens_changed(auth.invalidate)
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
    while not stop.wait(METRICS_EVERY_S):
        events.put((front_id, list(core.metrics.registry.collect())))
    server.stop(grace=STOP_GRACE_S)
    core.stop()
    engine.dispose()


@dataclass
class Fronts:
    """The main process's side: starts the fronts and merges their metrics."""

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
        self._thread = threading.Thread(target=self._merge_loop, name="fronts", daemon=True)
        self._thread.start()
        log.info("%d front process(es) serving gRPC on port %d", n, port)

    def _merge_loop(self) -> None:
        assert self._events is not None
        while True:
            item = self._events.get()
            if item is None:
                return
            sender, families = item
            self.booster.metrics.remote[sender] = families

    def stop(self) -> None:
        for proc in self._procs:
            proc.terminate()
        for proc in self._procs:
            proc.join(timeout=STOP_GRACE_S + 5)
            if proc.is_alive():
                proc.kill()
        if self._thread is not None and self._events is not None:
            self._events.put(None)
            self._thread.join(timeout=5)
