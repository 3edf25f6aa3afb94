"""The agent port's TLS material, followed as it is renewed.

cert-manager renews Booster's serving certificate before it expires (the chart asks for 90
days, renewed 15 days ahead) and rewrites the Secret's files in place, and a hosts' CA bundle
changes when a CA is rolled. Read only at start, the old certificate would be served until
the pod restarted, and a fleet's agents would stop connecting the day it expired.

gRPC asks ``fetch`` before every new connection's handshake (``dynamic_ssl_server_credentials``).
It compares the files' identities (device, inode, size, modification time: a stat each, after
symlinks, since a Secret volume swaps a symlink) with those last loaded and reads them again
only when they changed. A new pair is used only once it loads as a matching certificate and
key (``ssl.SSLContext.load_cert_chain``); a half-written or mismatched one keeps the current
pair in service and is logged once per change. Connections already open keep the pair they
were made with, as TLS does.
"""

from __future__ import annotations

import logging
import ssl
from dataclasses import dataclass
from pathlib import Path

import grpc

log = logging.getLogger(__name__)

FileIdentity = tuple[int, int, int, int]  # device, inode, size, mtime in ns
UNREADABLE: tuple[FileIdentity, ...] = ()  # the files' identity while one cannot be stat'ed


def _identity(path: Path) -> FileIdentity:
    st = path.stat()
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


@dataclass(frozen=True)
class TlsMaterial:
    """One consistent read of the files: the PEM bytes gRPC takes."""

    cert: bytes
    key: bytes
    client_ca: bytes | None


class TlsFiles:
    """The serving pair and the optional client CA bundle, re-read when they change."""

    def __init__(self, cert: Path, key: Path, client_ca: Path | None) -> None:
        self.paths = (cert, key) + ((client_ca,) if client_ca is not None else ())
        self.seen = self._identities()
        self.current = self._load()  # at start a bad file is the operator's error: raise

    def _identities(self) -> tuple[FileIdentity, ...]:
        return tuple(_identity(p) for p in self.paths)

    def _load(self) -> TlsMaterial:
        cert, key = self.paths[0], self.paths[1]
        ssl.create_default_context().load_cert_chain(cert, key)  # a matching, parsable pair
        ca = self.paths[2].read_bytes() if len(self.paths) > 2 else None
        if ca is not None:
            ssl.create_default_context(cadata=ca.decode("ascii", "replace"))
        return TlsMaterial(cert.read_bytes(), key.read_bytes(), ca)

    def configuration(self) -> grpc.ServerCertificateConfiguration:
        m = self.current
        return grpc.ssl_server_certificate_configuration([(m.key, m.cert)], m.client_ca)

    def fetch(self) -> grpc.ServerCertificateConfiguration | None:
        """gRPC's per-handshake callback: a new configuration if the files changed and load,
        else None (keep serving the current one). Never raises into gRPC's core."""
        error: Exception | None = None
        try:
            now = self._identities()
        except OSError as exc:
            now, error = UNREADABLE, exc
        if now == self.seen:
            return None  # unchanged, or still as unusable as when it was last said
        self.seen = now
        if error is None:
            try:
                self.current = self._load()
            except (OSError, ssl.SSLError, ValueError) as exc:
                error = exc
        if error is not None:
            log.error(
                "agent port TLS: cannot use %s (%s: %s); still serving the previous one",
                self._names(),
                type(error).__name__,
                error,
            )
            return None
        log.info("agent port TLS: %s re-read; new connections use it", self._names())
        return self.configuration()

    def _names(self) -> str:
        return ", ".join(str(p) for p in self.paths)
