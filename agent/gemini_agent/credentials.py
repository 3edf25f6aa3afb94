"""The agent's token, re-read when the file it came from changes, so that rotating a host's
token (``booster token rotate`` or ``POST /v1/tokens/rotate`` with a grace period, then writing
the new token on the host) needs no agent restart.

Where the token comes from decides whether it can rotate:

- ``token_file``: a file holding only the token (a Kubernetes Secret volume, which swaps the
  file by renaming a symlink, or a file written by node bootstrap);
- the TOML file named by ``GEMINI_AGENT_CONFIG``, when its ``token`` key set it;
- the environment (``GEMINI_AGENT_TOKEN``) or the constructor: fixed for the process's life.

The file is checked before each call to Booster by its identity (inode, size, modification
time), a stat per call; it is read again only when that changes. A file that cannot be read
or holds no token keeps the last good token in use: a half-written rotation must not cost the
host its reports while the old token is still inside its grace period. The token itself is
never logged.
"""

from __future__ import annotations

import logging
import os
import tomllib
from collections.abc import Callable
from pathlib import Path

from gemini_agent.config import CONFIG_ENV, AgentSettings
from gemini_agent.metrics import AgentMetrics

log = logging.getLogger(__name__)

TOKEN_ENV = "GEMINI_AGENT_TOKEN"
Metadata = tuple[tuple[str, str], ...]
FileIdentity = tuple[int, int, int, int]  # device, inode, size, mtime in ns


def _read_token_file(path: Path) -> str:
    return path.read_text().strip()


def _read_toml_token(path: Path) -> str:
    token = tomllib.loads(path.read_text()).get("token", "")
    if not isinstance(token, str):
        raise ValueError("'token' is not a string")
    return token.strip()


def file_identity(path: Path) -> FileIdentity:
    st = path.stat()  # follows symlinks: a Secret volume swaps the target, not the name
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


def token_origin(settings: AgentSettings) -> tuple[Path, Callable[[Path], str]] | None:
    """The file the token is re-read from and how, or None when it cannot rotate."""
    if settings.token_file is not None:
        return settings.token_file, _read_token_file
    if os.environ.get(TOKEN_ENV):
        return None
    config = os.environ.get(CONFIG_ENV)
    if config and settings.token.get_secret_value():
        return Path(config), _read_toml_token
    return None


class AgentToken:
    """The bearer credential for every call to Booster, kept current with its file."""

    def __init__(self, settings: AgentSettings, metrics: AgentMetrics) -> None:
        self.metrics = metrics
        self.origin = token_origin(settings)
        self.token = settings.token.get_secret_value()
        self.seen: FileIdentity | None = None
        if settings.token_file is not None:
            self.token = self._read_or_fail((settings.token_file, _read_token_file))
        if self.origin is not None:
            self.seen = file_identity(self.origin[0])

    @staticmethod
    def _read_or_fail(origin: tuple[Path, Callable[[Path], str]]) -> str:
        """The first read: a token file that gives no token stops the agent at start."""
        path, read = origin
        try:
            token = read(path)
        except OSError as exc:
            raise ValueError(f"cannot read token_file {path}: {exc.strerror}") from None
        if not token:
            raise ValueError(f"token_file {path} holds no token")
        return token

    def metadata(self) -> Metadata:
        """gRPC call metadata with the current token (re-read first if its file changed)."""
        self._refresh()
        return (("authorization", f"Bearer {self.token}"),)

    def _refresh(self) -> None:
        if self.origin is None:
            return
        path, read = self.origin
        try:
            now: FileIdentity | None = file_identity(path)
        except OSError:
            now = None
        if now == self.seen:
            return  # unchanged, or still missing (said once when it went)
        self.seen = now
        if now is None:
            self._keep(path, "missing or unreadable")
            return
        try:
            token = read(path)
        except (OSError, ValueError) as exc:  # TOMLDecodeError is a ValueError
            self._keep(path, type(exc).__name__)
            return
        if not token:
            self._keep(path, "no token in it")
        elif token != self.token:
            self.token = token
            self.metrics.token_reloads.labels("reloaded").inc()
            log.info("agent token re-read from %s: the new token is used from now on", path)

    def _keep(self, path: Path, why: str) -> None:
        self.metrics.token_reloads.labels("unreadable").inc()
        log.error("cannot re-read the agent token from %s (%s): keeping the current one", path, why)
