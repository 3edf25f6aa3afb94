"""The committed protobuf/gRPC stubs are exactly what the .proto generates."""

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_generated_stubs_are_current(tmp_path):
    spec = importlib.util.spec_from_file_location("gen_proto", ROOT / "scripts" / "gen_proto.py")
    gen = importlib.util.module_from_spec(spec)
    sys.modules["gen_proto"] = gen
    spec.loader.exec_module(gen)
    gen.generate(tmp_path)
    produced = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*_pb2*"))
    assert produced, "protoc produced nothing"
    for rel in produced:
        committed = ROOT / "api" / rel
        assert committed.read_bytes() == (tmp_path / rel).read_bytes(), (
            f"{rel} is stale: run `make proto`"
        )
