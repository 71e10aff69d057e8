"""/openapi.json is the worker's public contract in machine-readable form: it must be valid and complete."""

from __future__ import annotations

import json
import re

import jsonschema

from rag_worker import openapi
from rag_worker.app import create_app
from rag_worker.routes.meta import OPERATIONS
from rag_worker.settings import Settings


def app():
    return create_app(Settings(INDEX_STORE="/nonexistent-never-created"))


def spec(auth_required: bool = True) -> dict:
    """The document a worker serves at /openapi.json, assembled from its registered routes."""
    return openapi.spec(app().extensions[OPERATIONS], auth_required=auth_required)


def served_routes() -> set[str]:
    """Every path the worker's app serves, in OpenAPI's spelling (`/indexes/{index}`)."""
    rules = {r.rule for r in app().url_map.iter_rules() if r.endpoint != "static"}
    return {re.sub(r"<(?:\w+:)?(\w+)>", r"{\1}", rule) for rule in rules}


def refs(node) -> set[str]:
    if isinstance(node, dict):
        return {node["$ref"]} if "$ref" in node else set().union(*(refs(v) for v in node.values()))
    if isinstance(node, list):
        return set().union(*(refs(v) for v in node)) if node else set()
    return set()


def test_every_route_of_the_contract_is_described():
    assert set(spec()["paths"]) == served_routes()


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


def test_the_key_is_declared_required_only_when_the_worker_has_one():
    assert spec(auth_required=True)["security"] == [{"bearer": []}]
    open_doc = spec(auth_required=False)
    assert "security" not in open_doc and "securitySchemes" not in open_doc["components"]
    assert all("401" not in op["responses"] for path in open_doc["paths"].values() for op in path.values())
    assert spec(auth_required=True)["paths"]["/health"]["get"]["security"] == []


def test_answers_are_described_by_their_models_not_by_hand():
    schemas = spec()["components"]["schemas"]
    assert {
        "Answer",
        "Document",
        "Citation",
        "Step",
        "ChatRequest",
        "ChatCompletionRequest",
        "OpenAIError",
    } <= set(schemas)
    assert set(schemas["Answer"]["required"]) >= {
        "reply",
        "history",
        "documents",
        "citations",
        "abstained",
        "route",
    }
    answer = spec()["paths"]["/chat"]["post"]["responses"]["200"]["content"]["application/json"]["schema"]
    assert answer == {"$ref": "#/components/schemas/Answer"}


def test_an_upload_documents_its_refusals_and_links_to_the_operations_on_what_it_made():
    upload = spec()["paths"]["/add_document"]["post"]
    refusals = upload["responses"]
    # A name without a known extension is a 415, a file with no text a 400: said, not only numbered.
    assert "extension" in refusals["415"]["description"]
    assert "no text" in refusals["400"]["description"]
    links = refusals["200"]["links"]
    operation_ids = {
        op["operationId"] for path in spec()["paths"].values() for op in path.values() if "operationId" in op
    }
    targets = {link["operationId"] for link in links.values()}
    assert targets <= operation_ids
    # Every operation on an index or one of its documents is reachable from an upload that made them.
    assert {"get_get_documents", "get_get_document", "post_delete", "delete_indexes_{index}"} <= targets
    for link in links.values():
        expressions = [*link.get("parameters", {}).values(), *link.get("requestBody", {}).values()]
        assert expressions and all(e.startswith("$response.body#/") for e in expressions), link
        for expression in expressions:
            assert expression.removeprefix("$response.body#/") in {"index", "dataset", "filename"}
    assert "index" in spec()["components"]["schemas"]["Added"]["properties"]
