"""FlashPass's receiver: a credit for every emulation packet that arrives, the data stored and
checked, the flow's completion said (DONE) and what is missing (NACK) when probed.

Credits are sent at once, carrying the emulation packet's timestamp; the sender holds each
until that timestamp + T_wait. The paper's delayed credits (several credits of one flow sent
together when their data is due much later) only save reverse-path packets; with the lab's
uncongested return path they would change no send time, so every credit goes alone.

Usage (in the receiver's namespace; SIGTERM ends it and writes its log):
    python -m gemini_lab.flashpass.receiver --log receiver.json
"""

from __future__ import annotations

import argparse
import json
import selectors
import signal
import socket
from dataclasses import dataclass, field
from pathlib import Path

from gemini_lab.flashpass import wire
from gemini_lab.flashpass.sender import payload
from gemini_lab.flashpass.wire import Kind, Packet

IDLE_S = 0.5  # how often the loop looks at its stop flag while nothing arrives


@dataclass
class FlowState:
    total: int = 0
    received: set[int] = field(default_factory=set)
    emulation_in: int = 0
    emulation_ect: int = 0
    corrupt: int = 0
    duplicates: int = 0
    unscheduled_in: int = 0  # data without an emulation timestamp: FlashPass*'s pre-credit phase

    def complete(self) -> bool:
        return self.total > 0 and len(self.received) == self.total

    def missing(self) -> list[int]:
        return [s for s in range(self.total) if s not in self.received]


class Receiver:
    def __init__(self) -> None:
        self.flows: dict[int, FlowState] = {}
        self.stopped = False
        self.sel = selectors.SelectSelector()  # select's timeout is in µs, epoll's in ms
        for port in (wire.DATA_PORT, wire.EMULATION_PORT):
            s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            s.bind(("0.0.0.0", port))
            s.setsockopt(socket.IPPROTO_IP, socket.IP_RECVTOS, 1)
            s.setblocking(False)
            self.sel.register(s, selectors.EVENT_READ)

    def run(self) -> None:
        while not self.stopped:
            for key, _ in self.sel.select(IDLE_S):
                sock = key.fileobj
                assert isinstance(sock, socket.socket)
                self._drain(sock)

    def close(self) -> None:
        """Its sockets closed: the ports are free for the next receiver."""
        for key in list(self.sel.get_map().values()):
            self.sel.unregister(key.fileobj)
            key.fileobj.close()  # type: ignore[union-attr]
        self.sel.close()

    def _drain(self, sock: socket.socket) -> None:
        while True:
            try:
                raw, anc, _, src = sock.recvmsg(2048, socket.CMSG_SPACE(1))
            except BlockingIOError:
                return
            tos = anc[0][2][0] if anc else 0
            reply = self.handle(Packet.decode(raw), tos)
            if reply is not None:
                sock.sendto(reply.encode(), src)

    def handle(self, p: Packet, tos: int) -> Packet | None:
        """The answer to one packet (None when it needs none)."""
        flow = self.flows.setdefault(p.flow, FlowState())
        if p.kind is Kind.EMULATION:
            flow.emulation_in += 1
            flow.emulation_ect += bool(tos & 0x03)
            return Packet(Kind.CREDIT, p.flow, p.seq, p.emu_ts_ns)
        if p.kind is Kind.DATA:
            flow.total = p.total
            flow.unscheduled_in += p.emu_ts_ns == 0
            if p.seq in flow.received:
                flow.duplicates += 1
            flow.received.add(p.seq)
            flow.corrupt += p.body != payload(p.flow, p.seq)
            return Packet(Kind.DONE, p.flow, 0) if flow.complete() else None
        if p.kind is Kind.PROBE:
            flow.total = flow.total or p.total  # none of the flow's data may have arrived
            if flow.complete():
                return Packet(Kind.DONE, p.flow, 0)
            # a probe with seq > 0 (FlashPass*'s pre-credit phase) asks about seqs below it
            missing = [s for s in flow.missing() if not p.seq or s < p.seq]
            return Packet(Kind.NACK, p.flow, 0, body=wire.nack_body(missing)) if missing else None
        return None

    def report(self) -> dict:
        return {
            str(n): {
                "total": f.total,
                "received": len(f.received),
                "bytes": len(f.received) * wire.DATA_PAYLOAD,
                "emulation_in": f.emulation_in,
                "emulation_ect": f.emulation_ect,
                "corrupt": f.corrupt,
                "duplicates": f.duplicates,
                "unscheduled_in": f.unscheduled_in,
            }
            for n, f in self.flows.items()
        }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--log", type=Path, required=True)
    a = ap.parse_args()
    receiver = Receiver()

    def stop(*_: object) -> None:
        receiver.stopped = True

    signal.signal(signal.SIGTERM, stop)
    (a.log.with_suffix(".ready")).write_text("listening\n")
    receiver.run()
    receiver.close()
    a.log.write_text(json.dumps(receiver.report()))


if __name__ == "__main__":
    main()
