"""``/docs`` needs no internet: every asset it names is served by the app."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from api.main import create_app
from runyard.platform.settings import Settings

ASSET = re.compile(r"""(?:src|href)\s*=\s*["']([^"']+)["']""")
# The document the page loads is named in its inline script.
SPEC = re.compile(r"""url:\s*["']([^"']+)["']""")


@pytest.fixture
def client() -> Iterator[TestClient]:
    """The app without its lifespan: these routes touch no database."""
    app = create_app(Settings(database_url="postgresql://unused@127.0.0.1:9/unused"))
    yield TestClient(app, base_url="http://api.test")


def test_docs_page__every_asset_is_same_origin_and_served(client: TestClient):
    response = client.get("/docs")
    assert response.status_code == 200
    html = response.text
    # No absolute or scheme-relative URL anywhere in the page.
    assert not re.search(r"https?:|[\"'(]//", html), html
    urls = ASSET.findall(html)
    assert {url.rsplit("/", 1)[-1] for url in urls} == {
        "swagger-ui-bundle.js",
        "swagger-ui.css",
        "favicon.png",
    }
    for url in [*urls, *SPEC.findall(html)]:
        assert url.startswith("/") and not url.startswith("//"), url
        fetched = client.get(url)
        assert fetched.status_code == 200, url
        assert len(fetched.content) > 0
    assert SPEC.findall(html) == ["/openapi.json"]


def test_docs_page__swagger_sends_nothing_to_the_online_validator(client: TestClient):
    assert '"validatorUrl": null' in client.get("/docs").text


def test_docs_page__assets_have_script_and_style_types(client: TestClient):
    js = client.get("/docs-assets/swagger-ui-bundle.js")
    css = client.get("/docs-assets/swagger-ui.css")
    assert js.headers["content-type"].startswith(("text/javascript", "application/javascript"))
    assert css.headers["content-type"].startswith("text/css")
    assert "content-security-policy" not in client.get("/docs").headers


def test_redoc__is_not_served(client: TestClient):
    assert client.get("/redoc").status_code == 404


def test_front_door__redirects_to_the_dashboard(client: TestClient):
    response = client.get("/", follow_redirects=False)
    assert response.status_code == 307
    assert response.headers["location"] == "/ui/"


def test_front_door__redirects_to_the_docs_without_the_dashboard():
    settings = Settings(database_url="postgresql://unused@127.0.0.1:9/unused", ui_enabled=False)
    client = TestClient(create_app(settings), base_url="http://api.test")
    response = client.get("/", follow_redirects=False)
    assert response.status_code == 307
    assert response.headers["location"] == "/docs"
    assert "/" not in client.get("/openapi.json").json()["paths"]
