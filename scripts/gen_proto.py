"""Regenerate the Python protobuf and gRPC stubs from api/gemini_api/v1/*.proto.

Run after editing a .proto; tests/test_api_contract.py fails while the stubs are stale.
"""

from __future__ import annotations

import sys
from pathlib import Path

from grpc_tools import protoc

API_DIR = Path(__file__).resolve().parents[1] / "api"


def generate(out_dir: Path) -> None:
    protos = sorted(str(p.relative_to(API_DIR)) for p in API_DIR.glob("gemini_api/v1/*.proto"))
    out_dir.mkdir(parents=True, exist_ok=True)
    args = [
        "protoc",
        f"-I{API_DIR}",
        f"--python_out={out_dir}",
        f"--pyi_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        *protos,
    ]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed")


if __name__ == "__main__":
    generate(Path(sys.argv[1]) if len(sys.argv) > 1 else API_DIR)
