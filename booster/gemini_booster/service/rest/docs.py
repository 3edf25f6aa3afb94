"""The API's documentation pages, served from the installed package: no CDN, so ``/docs`` works
on a network without internet, and under a content security policy that allows this origin only.

Swagger UI comes from the pinned ``swagger-ui-bundle`` wheel (Swagger UI 4.15). No pinned wheel
ships ReDoc, so ``/redoc`` is not served. Swagger UI 4 renders OpenAPI 3.0 only, while FastAPI
writes 3.1, so the page reads ``/docs/openapi.json``: the same document labelled 3.0.3, with
3.1's ``anyOf [X, null]`` written as 3.0's ``nullable``. ``/openapi.json`` stays the 3.1
document for tools.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import swagger_ui_bundle  # type: ignore[import-untyped]
from fastapi import FastAPI, Response
from fastapi.responses import HTMLResponse, JSONResponse
from fastapi.staticfiles import StaticFiles

SWAGGER_UI_DIR = Path(swagger_ui_bundle.swagger_ui_path)
STATIC = "/docs/static"
VIEW_SPEC = "/docs/openapi.json"
OPENAPI_30 = "3.0.3"
# Swagger UI draws its icons from data: URIs and sets element styles from script; nothing may
# come from another origin, nothing may frame the page.
DOCS_HEADERS = {
    "content-security-policy": "default-src 'self'; img-src 'self' data:; "
    "frame-ancestors 'none'; form-action 'self'; base-uri 'none'",
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
}

PAGE = f"""<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>{{title}} — API</title>
<link rel="stylesheet" href="{STATIC}/swagger-ui.css">
<link rel="icon" type="image/png" href="{STATIC}/favicon-32x32.png">
</head>
<body>
<div id="swagger-ui"></div>
<script src="{STATIC}/swagger-ui-bundle.js"></script>
<script src="/docs/init.js"></script>
</body>
</html>
"""

# A file of its own rather than an inline script, which the policy forbids.
INIT = f"""window.ui = SwaggerUIBundle({{
  url: "{VIEW_SPEC}",
  dom_id: "#swagger-ui",
  deepLinking: true,
  presets: [SwaggerUIBundle.presets.apis],
  layout: "BaseLayout",
}});
"""


def as_openapi_30(node: Any) -> Any:
    """A copy of a 3.1 schema tree in 3.0's words: ``anyOf: [X, {type: null}]`` becomes X with
    ``nullable: true`` (the one 3.1 construct FastAPI's models produce that 3.0 lacks)."""
    if isinstance(node, list):
        return [as_openapi_30(v) for v in node]
    if not isinstance(node, dict):
        return node
    out = {k: as_openapi_30(v) for k, v in node.items()}
    options = out.get("anyOf")
    if isinstance(options, list) and {"type": "null"} in options:
        rest = [o for o in options if o != {"type": "null"}]
        del out["anyOf"]
        if len(rest) == 1 and "$ref" not in rest[0]:
            out.update(rest[0])
        else:
            out["anyOf"] = rest
        out["nullable"] = True
    return out


def install(app: FastAPI) -> None:
    """Serve /docs, its script, its copy of the document and Swagger UI's files on ``app``
    (created with ``docs_url=None, redoc_url=None``)."""
    app.mount(STATIC, StaticFiles(directory=SWAGGER_UI_DIR), name="swagger-ui")

    @app.get("/docs", include_in_schema=False)
    def docs() -> HTMLResponse:
        return HTMLResponse(PAGE.format(title=app.title), headers=DOCS_HEADERS)

    @app.get("/docs/init.js", include_in_schema=False)
    def init() -> Response:
        return Response(INIT, media_type="text/javascript", headers=DOCS_HEADERS)

    @app.get(VIEW_SPEC, include_in_schema=False)
    def view_spec() -> JSONResponse:
        document = as_openapi_30(app.openapi())
        document["openapi"] = OPENAPI_30
        return JSONResponse(document)
