"""Extra agent-facing processes: fronts on Booster's agent port, so ingestion is not bound to
one interpreter, and readers on its read port, so ingestion cannot slow GetParameters.

One Python process tops out well below the ingestion target on two cores: gRPC's own per-call
work and the checks on each report share one interpreter lock. With ``grpc_processes = N``,
Booster starts N − 1 *front* processes that listen on the same port (SO_REUSEPORT), so the
kernel spreads agent connections across processes.

A front is a Booster core without refits: it validates and stores reports itself (its own
group-commit writer; exactly-once rests on the database's unique report id) and answers
GetParameters from plans it follows in PostgreSQL like any replica does (``sync.py``). The
only thing it sends its parent is a snapshot of its metrics, merged into ``/metrics``.

With ``parameters_listen`` set, Booster also starts ``parameters_processes`` *readers*: the
same kind of process on a port of their own that answers GetParameters only (``Serves``,
``grpc_server.py``). A reader stores no report, so no report's parsing, checks or storing
ever holds its interpreter: an agent that asks for its θ there is not slowed by the fleet's
ingest, on whatever process the ingest lands (measured in
benchmarks/results/get_parameters-ingest.md). Its answers come from the plans it follows in
PostgreSQL, like any other process's; the same tokens and limits hold on both ports.

A front never outlives its parent: it watches the parent's process sentinel and exits as soon
as the parent is gone, however the parent died (``kill -9`` included), and it exits on SIGTERM
within a bounded grace.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import signal
import threading
import time
from dataclasses import dataclass, field, replace
from multiprocessing.connection import wait
from multiprocessing.process import BaseProcess

from ..config import Settings
from ..storage import database
from .auth import TokenAuthority
from .core import Booster
from .grpc_server import AgentServer, ListenError, Serves, can_bind, tls_credentials
from .orphans import exit_with_parent

log = logging.getLogger(__name__)
METRICS_EVERY_S = 1.0
STOP_GRACE_S = 1.0  # on SIGTERM: calls in flight may finish
ORPHAN_EXIT_S = 0.3  # parent gone: a moment for calls in flight, then out (agents retry)
START_S = 60.0  # a process's own start (the core loads policies and plans first)
START_POLL_S = 0.1  # how often a starting process is checked for having died instead
WATCH_S = 1.0  # how often the watcher looks again at what to watch
RESPAWN_BACKOFF_S = 5.0  # a replacement that did not start: tried again after this


@dataclass(frozen=True)
class Role:
    """What a front process serves, and where."""

    name: str  # of the process, as ps shows it
    serves: Serves
    listen: str
    share_port: bool  # SO_REUSEPORT: other processes serve the same port


def _serve_front(
    front_id: int, role: Role, settings: Settings, url: str, events: mp.Queue, ready, port
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
        role.listen,
        settings.max_report_bytes,
        share_port=role.share_port,
        tls=tls_credentials(settings),
        serves=role.serves,
    )
    port.value = server.start()
    ready.set()
    while not stop.wait(METRICS_EVERY_S):
        events.put((front_id, list(core.metrics.registry.collect())))
    server.stop(grace=STOP_GRACE_S)
    core.stop()
    engine.dispose()


@dataclass(frozen=True)
class Child:
    """One front or reader process, with what it serves and its id in merged metrics."""

    proc: BaseProcess
    role: Role  # with the port it bound: what a replacement binds
    sender: int


@dataclass
class Fronts:
    """The main process's side: starts the fronts and the readers, merges their metrics, and
    starts another in the place of one that died while Booster runs (killed for memory, a
    crash): the read port, or a share of the agent port's capacity, is never gone for good."""

    booster: Booster
    settings: Settings
    url: str
    parameters_port: int = 0  # the read port, once started (0: none)
    respawned: int = 0  # processes started in the place of one that died
    _children: list[Child] = field(default_factory=list)
    _senders: int = 0
    _events: mp.Queue | None = None
    _threads: list[threading.Thread] = field(default_factory=list)
    _stopping: threading.Event = field(default_factory=threading.Event)

    def start(self, port: int) -> None:
        """Start the fronts on the agent port ``port`` and the readers on the read port."""
        s = self.settings
        fronts = s.grpc_processes - 1
        if fronts <= 0 and s.parameters_listen is None:
            return
        self._events = mp.get_context("spawn").Queue()
        host = s.grpc_listen.rsplit(":", 1)[0]
        for _ in range(fronts):
            self._spawn(Role("gemini-booster-front", Serves.ALL, f"{host}:{port}", True))
        if s.parameters_listen is not None:
            if not can_bind(s.parameters_listen):
                raise ListenError(
                    f"gRPC read port: cannot listen on {s.parameters_listen} (in use, or not "
                    "an address)"
                )
            shared = s.parameters_processes > 1
            first = Role("gemini-booster-reader", Serves.PARAMETERS, s.parameters_listen, shared)
            self.parameters_port = self._spawn(first)  # the port it bound (``:0`` picks one)
            for _ in range(s.parameters_processes - 1):
                self._spawn(self._children[-1].role)
        for target, name in ((self._merge_loop, "fronts"), (self._watch, "fronts-watch")):
            thread = threading.Thread(target=target, name=name, daemon=True)
            thread.start()
            self._threads.append(thread)
        log.info(
            "%d front process(es) serving gRPC on port %d; read port: %s",
            fronts,
            port,
            self.parameters_port or "none",
        )

    def pids(self, serves: Serves) -> list[int]:
        """The live processes serving ``serves`` (for operators' tools and tests)."""
        return [c.proc.pid for c in self._children if c.role.serves is serves and c.proc.pid]

    def _spawn(self, role: Role) -> int:
        """Start one process in ``role``; the port it serves, once it serves."""
        ctx = mp.get_context("spawn")  # never fork a process that runs gRPC threads
        ready, bound = ctx.Event(), ctx.Value("i", 0)
        sender, self._senders = self._senders, self._senders + 1
        proc = ctx.Process(
            target=_serve_front,
            args=(sender, role, self.settings, self.url, self._events, ready, bound),
            name=f"{role.name}-{sender}",
            daemon=True,
        )
        proc.start()
        deadline = time.monotonic() + START_S
        while not ready.wait(START_POLL_S):
            if not proc.is_alive() or time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError(f"{role.name} process {sender} did not start (its log says why)")
        host = role.listen.rsplit(":", 1)[0]
        self._children.append(Child(proc, replace(role, listen=f"{host}:{bound.value}"), sender))
        return int(bound.value)

    def _watch(self) -> None:
        """Start another process in the place of each that dies before ``stop``."""
        while not self._stopping.is_set():
            watched = list(self._children)
            ended = wait([c.proc.sentinel for c in watched], timeout=WATCH_S)
            for child in (c for c in watched if c.proc.sentinel in ended):
                if self._stopping.is_set():
                    return
                self._replace(child)

    def _replace(self, dead: Child) -> None:
        self._children.remove(dead)
        self.booster.metrics.remote.pop(dead.sender, None)  # counters restart, as on a restart
        log.error(
            "%s process %d exited (code %s): starting another",
            dead.role.name,
            dead.sender,
            dead.proc.exitcode,
        )
        while not self._stopping.is_set():
            try:
                self._spawn(dead.role)
                self.respawned += 1
                return
            except RuntimeError as e:
                log.error("%s; trying again in %g s", e, RESPAWN_BACKOFF_S)
                self._stopping.wait(RESPAWN_BACKOFF_S)

    def _merge_loop(self) -> None:
        assert self._events is not None
        while True:
            item = self._events.get()
            if item is None:
                return
            sender, families = item
            self.booster.metrics.remote[sender] = families

    def stop(self) -> None:
        self._stopping.set()
        if len(self._threads) > 1:
            self._threads[1].join(timeout=START_S)  # the watcher, mid-start perhaps
        for child in self._children:
            child.proc.terminate()
        for child in self._children:
            child.proc.join(timeout=STOP_GRACE_S + 5)
            if child.proc.is_alive():
                child.proc.kill()
        if self._threads and self._events is not None:
            self._events.put(None)
            self._threads[0].join(timeout=5)
