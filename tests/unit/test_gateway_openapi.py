"""The gateway's /api/openapi.json: generated from the models the routes use, and covering every route."""

from __future__ import annotations

import re

import pytest
from starlette.routing import Route
from starlette.testclient import TestClient

from gateway.app import create_app
from tests.unit.test_gateway_api import make_settings

PUBLIC = {
    ("post", "/api/auth/register"),
    ("post", "/api/auth/login"),
    ("post", "/api/auth/logout"),
    ("get", "/api/auth/session"),
    ("get", "/health"),
    ("get", "/api/openapi.json"),
}


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    app = create_app(make_settings(tmp_path_factory.mktemp("openapi"), MAX_MESSAGE_CHARS=500))
    with TestClient(app) as client:
        r = client.get("/api/openapi.json")
        assert r.status_code == 200 and r.headers["content-type"].startswith("application/json")
        yield app, r.json()


def _app_operations(app) -> set[tuple[str, str]]:
    ops = set()
    for route in app.routes:
        if not isinstance(route, Route) or "{rest:path}" in route.path:
            continue  # the JSON 404/405 for any other /api path is not an operation
        path = re.sub(r"\{(\w+):\w+\}", r"{\1}", route.path)
        for method in route.methods or ():
            if method != "HEAD":
                ops.add((method.lower(), path))
    return ops


def test_every_route_of_the_app_is_in_the_document_and_nothing_else(served) -> None:
    app, doc = served
    documented = {(m, p) for p, item in doc["paths"].items() for m in item}
    assert documented == _app_operations(app)


def test_public_routes_need_no_sign_in_and_the_rest_take_a_token_or_the_cookie(served) -> None:
    _app, doc = served
    schemes = doc["components"]["securitySchemes"]
    assert schemes["bearer"] == {"type": "http", "scheme": "bearer", "bearerFormat": "JWT"}
    assert schemes["session"] == {"type": "apiKey", "in": "cookie", "name": "rag_session"}
    assert doc["security"] == [{"bearer": []}, {"session": []}]
    for path, item in doc["paths"].items():
        for method, op in item.items():
            if (method, path) in PUBLIC:
                assert op["security"] == [], (method, path)  # (login's 401 is for wrong credentials)
            elif (method, path) == ("get", "/metrics"):  # loopback clients need no sign-in, others do
                assert op["security"] == [{}, {"bearer": []}, {"session": []}] and "401" in op["responses"]
            else:
                assert "security" not in op and "401" in op["responses"], (method, path)


def test_bodies_and_answers_come_from_the_models(served) -> None:
    _app, doc = served
    schemas = doc["components"]["schemas"]
    turn = doc["paths"]["/api/chats/{id}/messages"]["post"]
    assert turn["requestBody"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/TurnRequest"
    }
    # A server setting narrows the model's own limit (MAX_MESSAGE_CHARS=500 here).
    assert schemas["TurnRequest"]["properties"]["message"]["maxLength"] == 500
    index = doc["paths"]["/api/indexes/{id}"]["get"]["responses"]["200"]["content"]["application/json"]
    assert index["schema"] == {"$ref": "#/components/schemas/IndexFull"}
    assert schemas["IndexFull"]["properties"]["documents"]["type"] == "array"
    assert schemas["IndexFull"]["properties"]["document_count"]["type"] == "integer"
    stream = doc["paths"]["/api/chats/{id}/messages/stream"]["post"]["responses"]["200"]["content"]
    assert "text/event-stream" in stream
    assert "content" not in doc["paths"]["/api/chats/{id}"]["delete"]["responses"]["204"]


def test_other_api_paths_are_json_404_and_known_paths_with_other_methods_json_405(served) -> None:
    app, _doc = served
    with TestClient(app) as client:
        r = client.post("/api/chats/not-a-number/stop")
        assert r.status_code == 404 and r.json()["code"] == "not_found"
        r = client.put("/api/chats")
        assert r.status_code == 405 and r.headers["allow"] == "GET, HEAD, POST"
        assert r.json()["code"] == "method_not_allowed"


def test_an_id_past_the_database_integers_is_a_404_not_a_500(served) -> None:
    app, _doc = served
    with TestClient(app) as client:
        token = client.post("/api/auth/register", json={"username": "ids", "password": "password123"}).json()[
            "token"
        ]
        client.cookies.clear()
        r = client.get(f"/api/chats/{2**63}", headers={"Authorization": f"Bearer {token}"})
        assert r.status_code == 404 and r.json()["error"].startswith("no id")
