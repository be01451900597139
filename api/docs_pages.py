"""The interactive API docs at ``/docs`` (Swagger UI), its script and style served by this
app: the page loads nothing from any other host.

There is no ``/redoc``: ReDoc's bundle fetches its vendor's logo from the vendor's host.
"""

from __future__ import annotations

from importlib import resources

from fastapi import FastAPI, Request
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse, RedirectResponse
from fastapi.staticfiles import StaticFiles

ASSETS_PREFIX = "/docs-assets"
# The online validator badge would send the document's URL to a third party.
SWAGGER_PARAMETERS = {"validatorUrl": None}


def install_docs(app: FastAPI) -> None:
    """Mount the bundled Swagger UI assets and the page that uses them.

    The app must be created with ``docs_url=None, redoc_url=None``.
    """
    # The fastapi-offline distribution ships the assets (Swagger UI 5).
    assets = resources.files("fastapi_offline") / "static"
    app.mount(ASSETS_PREFIX, StaticFiles(directory=str(assets)), name="docs-assets")

    def base(request: Request) -> str:
        return str(request.scope.get("root_path", "")).rstrip("/")

    @app.get("/docs", include_in_schema=False)
    async def swagger_ui(request: Request) -> HTMLResponse:
        root = base(request)
        return get_swagger_ui_html(
            openapi_url=f"{root}{app.openapi_url}",
            title=f"{app.title} - API docs",
            swagger_js_url=f"{root}{ASSETS_PREFIX}/swagger-ui-bundle.js",
            swagger_css_url=f"{root}{ASSETS_PREFIX}/swagger-ui.css",
            swagger_favicon_url=f"{root}{ASSETS_PREFIX}/favicon.png",
            swagger_ui_parameters=SWAGGER_PARAMETERS,
        )


def install_front_door(app: FastAPI, landing: str) -> None:
    """``GET /`` sends a browser on to ``landing`` (the dashboard, or the docs without it)."""

    @app.get("/", include_in_schema=False)
    async def front_door(request: Request) -> RedirectResponse:
        root = str(request.scope.get("root_path", "")).rstrip("/")
        return RedirectResponse(f"{root}{landing}", status_code=307)
