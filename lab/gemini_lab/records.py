"""Guest side: write every flow record of a table datapath (Fusion's unless DATAPATH names
another: gemini, dcvegas) in this network namespace to a JSON-lines file.

    python -m gemini_lab.records OUT.jsonl [DATAPATH]

Prints "ready" once subscribed, so callers start traffic only when no record can be missed;
on SIGTERM it drains what the socket holds, prints a summary line and exits.
"""

from __future__ import annotations

import json
import select
import signal
import sys
from dataclasses import asdict

from gemini_api.datapaths import DEFAULT_DATAPATH, datapath
from gemini_api.fusion_genl import FlowRecordListener, TableFamily


def main() -> None:
    out_path = sys.argv[1]
    name = sys.argv[2] if len(sys.argv) > 2 else DEFAULT_DATAPATH
    listener = FlowRecordListener(family=TableFamily.of(datapath(name)))
    stopping = False

    def stop(*_: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    count = 0
    print("ready", flush=True)
    with open(out_path, "w") as out:
        while True:
            ready, _, _ = select.select([listener], [], [], 0.2)
            if not ready:
                if stopping:
                    break
                continue
            for rec in listener.receive():
                out.write(json.dumps(asdict(rec)) + "\n")
                count += 1
    print(json.dumps({"records": count, "overruns": listener.overruns}), flush=True)


if __name__ == "__main__":
    main()
