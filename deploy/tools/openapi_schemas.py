"""JSON schemas for kubeconform, one per Kubernetes kind, from the API server's own OpenAPI.

Kubernetes publishes its API as an OpenAPI v2 document (``api/openapi-spec/swagger.json`` in the
``k8s.io/kubernetes`` module). kubeconform validates a manifest against a JSON schema per kind,
found by a path template. This turns the one document into those files:

    <out>/<kind>-<group>-<version>.json    e.g. deployment-apps-v1.json, service-v1.json

(kubeconform's own naming, `{{ .ResourceKind }}{{ .KindSuffix }}.json`: the group's first label
only, lower case, so networking.k8s.io/v1 Ingress is ingress-networking-v1.json.)

Each file is self-contained: the kind's definition is the root, and every definition it reaches
through ``$ref`` is copied under ``definitions`` (a closure, so cyclic types need no inlining).
The schemas are *strict*: an object with declared properties refuses any other, as the API
server's strict field validation does, unless the API marks it as keeping unknown fields. Two
OpenAPI types are widened to what the API server's decoder accepts: int-or-string fields take
either, and a resource quantity may be written as a number (``cpu: 2``).

    python3 deploy/tools/openapi_schemas.py swagger.json var/tools/schemas/v1.31.3
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

REF_PREFIX = "#/definitions/"
QUANTITY = "io.k8s.apimachinery.pkg.api.resource.Quantity"
GVK_EXTENSION = "x-kubernetes-group-version-kind"
PRESERVE_UNKNOWN = "x-kubernetes-preserve-unknown-fields"

Schema = dict[str, Any]


def widen(node: Any) -> Any:
    """A copy of ``node`` made strict, with int-or-string and quantities widened."""
    if isinstance(node, list):
        return [widen(item) for item in node]
    if not isinstance(node, dict):
        return node
    if node.get("format") == "int-or-string" or node.get("x-kubernetes-int-or-string"):
        return {
            "description": node.get("description", ""),
            "oneOf": [{"type": "string"}, {"type": "integer"}],
        }
    out = {key: widen(value) for key, value in node.items()}
    if "properties" in out and "additionalProperties" not in out and not out.get(PRESERVE_UNKNOWN):
        out["additionalProperties"] = False
    return out


def quantity_schema(definition: Schema) -> Schema:
    return {
        "description": definition.get("description", ""),
        "oneOf": [{"type": "string"}, {"type": "number"}],
    }


def references(node: Any) -> set[str]:
    """Names of the definitions ``node`` refers to directly."""
    found: set[str] = set()
    stack = [node]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            ref = item.get("$ref")
            if isinstance(ref, str) and ref.startswith(REF_PREFIX):
                found.add(ref[len(REF_PREFIX) :])
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return found


def closure(root: str, definitions: dict[str, Schema]) -> list[str]:
    """Every definition reachable from ``root``, root included, in a stable order."""
    seen: set[str] = set()
    pending = [root]
    while pending:
        name = pending.pop()
        if name in seen:
            continue
        if name not in definitions:
            raise SystemExit(f"openapi_schemas: {root} refers to {name}, which is not defined")
        seen.add(name)
        pending.extend(references(definitions[name]) - seen)
    return sorted(seen)


def kind_schema(root: str, definitions: dict[str, Schema]) -> Schema:
    names = closure(root, definitions)
    return {
        "$schema": "http://json-schema.org/draft-07/schema#",
        "allOf": [{"$ref": REF_PREFIX + root}],
        "definitions": {name: definitions[name] for name in names},
    }


def schema_path(out: Path, group: str, version: str, kind: str) -> Path:
    suffix = f"-{group.split('.')[0]}-{version}" if group else f"-{version}"
    return out / f"{kind.lower()}{suffix.lower()}.json"


def generate(spec: Schema, out: Path) -> int:
    raw = spec.get("definitions")
    if not isinstance(raw, dict) or not raw:
        raise SystemExit("openapi_schemas: the document has no definitions (not OpenAPI v2?)")
    definitions = {
        name: quantity_schema(d) if name == QUANTITY else widen(d) for name, d in raw.items()
    }
    out.mkdir(parents=True, exist_ok=True)
    owners: dict[Path, str] = {}
    for name, definition in sorted(raw.items()):
        for gvk in definition.get(GVK_EXTENSION, []):
            group = gvk.get("group", "")
            path = schema_path(out, group, gvk["version"], gvk["kind"])
            if path in owners:
                # Meta kinds (DeleteOptions, WatchEvent) are declared for every group; the
                # first definition serves them all. Two real kinds on one file would be a bug.
                if owners[path] != name and not name.startswith("io.k8s.apimachinery."):
                    raise SystemExit(
                        f"openapi_schemas: {path.name} is both {owners[path]} and {name}"
                    )
                continue
            owners[path] = name
            path.write_text(json.dumps(kind_schema(name, definitions), sort_keys=True))
    return len(owners)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("swagger", type=Path, help="Kubernetes' api/openapi-spec/swagger.json")
    parser.add_argument("out", type=Path, help="directory for <kind>-<group>-<version>.json")
    args = parser.parse_args(argv)
    try:
        spec = json.loads(args.swagger.read_text())
    except (OSError, json.JSONDecodeError) as e:
        print(f"openapi_schemas: {args.swagger}: {e}", file=sys.stderr)
        return 1
    written = generate(spec, args.out)
    print(f"{written} schemas in {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
