"""/openapi.json is the worker's public contract in machine-readable form: it must be valid and complete."""

from __future__ import annotations

import json

import jsonschema

from rag_worker.openapi import spec

ROUTES = {
    "/chat",
    "/chat_stream",
    "/create_title",
    "/add_document",
    "/get_documents",
    "/get_datasets",
    "/get_document",
    "/delete",
    "/index",
    "/indexes/{index}",
    "/config",
    "/health",
    "/v1/models",
    "/v1/models/{model}",
    "/v1/chat/completions",
}


def refs(node) -> set[str]:
    if isinstance(node, dict):
        return {node["$ref"]} if "$ref" in node else set().union(*(refs(v) for v in node.values()))
    if isinstance(node, list):
        return set().union(*(refs(v) for v in node)) if node else set()
    return set()


def test_every_route_of_the_contract_is_described():
    assert set(spec()["paths"]) == ROUTES


def test_component_schemas_are_valid_and_every_reference_resolves():
    doc = spec()
    schemas = doc["components"]["schemas"]
    for schema in schemas.values():
        jsonschema.Draft202012Validator.check_schema(schema)
    assert {r.rsplit("/", 1)[1] for r in refs(doc)} <= schemas.keys()


def test_a_chat_request_validates_against_the_published_schema():
    doc = spec()
    standalone = {"$defs": doc["components"]["schemas"], **doc["components"]["schemas"]["ChatRequest"]}
    text = json.dumps(standalone).replace("#/components/schemas/", "#/$defs/")
    validator = jsonschema.Draft202012Validator(json.loads(text))
    validator.validate({"prompt": "hi", "history": [{"role": "user", "content": "x"}], "datasets": ["hr"]})
    assert not validator.is_valid({"history": []}), "prompt is required"
