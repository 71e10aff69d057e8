"""A blueprint whose routes carry their contract: one decorator registers the Flask view and its `Operation`.

    routes = Routes("chat", __name__)

    @routes.post("/chat", "One chat turn, answered as JSON", body=ChatRequest, answer=Answer)
    def chat(): ...

The app registers `routes.blueprint`; /openapi.json is assembled from every table's `operations`, so a route
cannot exist without its description, nor a description without its route.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from flask import Blueprint

from ..openapi import Operation, openapi_path


class Routes:
    def __init__(self, name: str, import_name: str, url_prefix: str = ""):
        self.blueprint = Blueprint(name, import_name, url_prefix=url_prefix or None)
        self.prefix = url_prefix
        self.operations: list[Operation] = []

    def route(self, method: str, rule: str, summary: str, **contract: Any) -> Callable:
        op = Operation(method, self.prefix + openapi_path(rule), summary, **contract)

        def register(view: Callable) -> Callable:
            self.blueprint.add_url_rule(rule, view_func=view, methods=[method.upper()])
            self.operations.append(op)
            return view

        return register

    def get(self, rule: str, summary: str, **contract: Any) -> Callable:
        return self.route("get", rule, summary, **contract)

    def post(self, rule: str, summary: str, **contract: Any) -> Callable:
        return self.route("post", rule, summary, **contract)

    def delete(self, rule: str, summary: str, **contract: Any) -> Callable:
        return self.route("delete", rule, summary, **contract)
