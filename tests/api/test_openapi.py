"""The OpenAPI document tells the truth, and the server keeps what it promises.

The generated-request side is tests/api/test_contract_schemathesis.py; here: the shape of
the document (errors, ids, naming, per-deployment limits) and the HTTP behaviours it
implies (405 + Allow, OPTIONS, Retry-After), each checked against the live server.
"""

from __future__ import annotations

import re
from pathlib import Path

import httpx
import pytest

from sandbox_workspace.api.names import CONVERSATION_ID_PATTERN, NAME_PATTERN
from sandbox_workspace.runtime import pathsafe


@pytest.fixture(scope="module")
def document(dev_server) -> dict:
    return httpx.get(f"{dev_server.url}/openapi.json", timeout=30).json()


def api_operations(document: dict):
    for path, operations in document["paths"].items():
        if path.startswith("/api/"):
            for method, operation in operations.items():
                yield path, method, operation


# seed 002's /sandboxes answers an action's errors in its frontend's shape
# {success: false, output, error, data: {code}}; malformed requests as everywhere.
SEED_SHAPED = {"sandboxes": ("404", "409", "503"), "sandbox_status": ("404", "409", "503")}


def test_every_error_status_is_documented_with_the_error_model(document):
    for path, method, operation in api_operations(document):
        responses = operation["responses"]
        assert {"400", "401", "422"} <= set(responses), (method, path)
        for status, response in responses.items():
            if int(status) < 400:
                continue
            schema = response["content"]["application/json"]["schema"]
            model = "ErrorBody"
            if status in SEED_SHAPED.get(operation["operationId"], ()):
                model = "SandboxAnswer"
            assert schema == {"$ref": f"#/components/schemas/{model}"}, (method, path, status)
            if status in ("429", "503"):
                assert "Retry-After" in response["headers"], (method, path, status)
    error = document["components"]["schemas"]["ErrorDetail"]
    assert set(error["required"]) == {"code", "message"}


def test_operation_ids_are_readable_and_unique(document):
    ids = [op["operationId"] for _, _, op in api_operations(document)]
    assert len(ids) == len(set(ids))
    assert all(re.fullmatch(r"[a-z]+(_[a-z]+)*", i) for i in ids), ids
    expected = {"create_session", "upload_file", "list_files", "download_file", "get_conversation"}
    assert expected <= set(ids)
    assert {"list_runs", "create_stream_token", "chat", "run_events"} <= set(ids)


# Bodies whose field names another protocol defines: AG-UI's RunAgentInput (threadId…),
# the Vercel AI SDK's useChat request (messageId) and seed 002's sidebar (chatHistory…).
# Everything of our own is snake_case.
FOREIGN_PROTOCOLS = {"RunAgentInput", "ResumeEntry", "UiChatRequest", "AgentRequest"}


def test_one_naming_convention_snake_case_everywhere(document, api, session_url):
    def keys(schema):
        for name, prop in schema.get("properties", {}).items():
            yield name
            yield from keys(prop)

    for name, schema in document["components"]["schemas"].items():
        if name in FOREIGN_PROTOCOLS:
            continue
        for key in keys(schema):
            assert re.fullmatch(r"[a-z0-9_]+", key), (name, key)
    # The answer matches the declared model: the camelCase/snake_case split.
    created = api.post("/api/v1/sessions", json={}).json()
    declared = document["components"]["schemas"]["UploadConfig"]["properties"]
    assert set(created["file_upload_config"]) == set(declared)


def test_upload_ceiling_is_stated_per_unit(document, api):
    config = document["components"]["schemas"]["UploadConfig"]
    gb = next(
        b for b in config["anyOf"] if b["properties"]["max_file_size_unit"].get("const") == "GB"
    )
    ceiling = gb["properties"]["max_file_size"]["maximum"]
    body = {"max_file_size": ceiling, "max_file_size_unit": "GB"}
    assert (
        api.post("/api/v1/sessions", json={"config": {"file_upload_config": body}}).status_code
        == 201
    )


def test_upload_states_the_file_types_new_sessions_accept(document, api, session_url):
    upload = document["paths"]["/api/v1/sessions/{session_id}/files/upload"]["post"]
    part = upload["requestBody"]["content"]["multipart/form-data"]["schema"]
    rule = part["properties"]["file"]["description"]
    assert "`.csv`" in rule and rule in upload["responses"]["415"]["description"]
    r = api.post(
        f"{session_url}/files/upload",
        files={"file": ("tool.exe", b"MZ")},
        data={"conversation_id": "types"},
    )
    assert r.status_code == 415 and r.json()["error"]["code"] == "unsupported_file_type"


def test_upload_ceiling_refused_above(document, api):
    config = document["components"]["schemas"]["UploadConfig"]
    gb = next(
        b for b in config["anyOf"] if b["properties"]["max_file_size_unit"].get("const") == "GB"
    )
    body = {
        "max_file_size": gb["properties"]["max_file_size"]["maximum"] + 1,
        "max_file_size_unit": "GB",
    }
    r = api.post("/api/v1/sessions", json={"config": {"file_upload_config": body}})
    assert r.status_code == 400 and r.json()["error"]["code"] == "upload_limit_too_high"


def test_types_are_taken_as_documented(api):
    """Strict JSON types: "60" is not a number, 28.0 is an integer (JSON Schema)."""
    r = api.post("/api/v1/sessions", json={"config": {"ttl": "600"}})
    assert r.status_code == 422 and "ttl" in r.json()["error"]["message"]
    assert api.post("/api/v1/sessions", json={"config": {"ttl": 600.0}}).status_code == 201


def test_405_lists_every_method_of_the_path(api, session_url):
    r = api.put(f"{session_url}/files/a.csv")
    assert r.status_code == 405 and r.json()["error"]["code"] == "method_not_allowed"
    assert set(r.headers["allow"].split(", ")) == {"GET", "DELETE", "OPTIONS"}


def test_options_answers_allow_without_cors(api, session_url):
    r = api.options(session_url)
    assert r.status_code == 204
    assert set(r.headers["allow"].split(", ")) == {"GET", "DELETE", "OPTIONS"}
    r = api.options("/api/v1/sessions")
    assert r.status_code == 204 and r.headers["allow"] == "POST, OPTIONS"
    assert api.options("/no/such/path").status_code == 404


def test_a_503_no_retry_cures_has_no_retry_after(api):
    """A client honouring Retry-After would poll forever for a model that only a new
    configuration brings (the transient 503s: tests/unit/test_retry_after.py)."""
    r = api.post("/api/v1/chat", json={"query": "hi", "conversation_id": "c"})
    assert r.status_code == 503 and r.json()["error"]["code"] == "llm_not_configured"
    assert "retry-after" not in r.headers


def test_underscored_header_and_query_are_documented(document):
    params = document["paths"]["/api/v1/sessions/{session_id}/files"]["get"]["parameters"]
    where = {(p["name"], p["in"]) for p in params}
    assert {("conversation_id", "query"), ("conversation_id", "header")} <= where
    header = next(p for p in params if p["name"] == "conversation_id" and p["in"] == "header")
    assert "underscores_in_headers" in header["description"]
    assert all("null" not in str(p["schema"].get("anyOf", "")) for p in params)


NAMES = [
    "a",
    "data.csv",
    "报告 2024.xlsx",
    "📊.csv",
    ".hidden",
    ".",
    "..",
    " lead",
    "trail ",
    "a/b",
    "a\\b",
    "nul\x00",
    "zero\u200bwidth",
    "nbsp\u00a0x",
    "\u2025",
    "\uff0e\uff0e",
    "fullwidth\uff0fslash",
    "c1\x85",
    "\u2100",
]


@pytest.mark.parametrize("name", NAMES, ids=range(len(NAMES)))
def test_name_pattern_matches_exactly_what_the_server_accepts(name):
    try:
        pathsafe.check_name(name)
        accepted = True
    except pathsafe.UnsafePath:
        accepted = False
    assert bool(re.match(NAME_PATTERN, name)) == accepted
    cid_accepted = accepted and not name.startswith(".")
    assert bool(re.match(CONVERSATION_ID_PATTERN, name)) == cid_accepted


README = Path(__file__).resolve().parents[2] / "README.md"


def test_readme_api_table_matches_the_document(document):
    section = README.read_text().split("## API (v1)", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(
        r"^\| (GET|POST|PUT|PATCH|DELETE) \| `([^`]+)` \| .*\(`(\w+)`\) \|$", section, re.M
    )
    in_readme = {(method.lower(), path, op_id) for method, path, op_id in rows}
    in_document = {
        (method, path, op["operationId"]) for path, method, op in api_operations(document)
    }
    assert in_readme == in_document


def test_the_document_says_how_callers_authenticate(document):
    """Generated clients take their auth parameters from the security schemes: dev mode's
    optional X-User-Id here; required mode's in tests/unit/test_openapi_security.py."""
    schemes = document["components"]["securitySchemes"]
    assert schemes["bearer"] == {**schemes["bearer"], "type": "http", "scheme": "bearer"}
    assert (schemes["userId"]["in"], schemes["userId"]["name"]) == ("header", "X-User-Id")
    assert document["security"] == [{"userId": []}, {}]
    assert document["paths"]["/healthz"]["get"]["security"] == []
    assert all("security" not in op for _, _, op in api_operations(document))  # the default


def test_no_parameter_is_a_const(document):
    """Client generators refuse a `const` header (openapi-python-client 0.29 dropped
    list_files, download_file and delete_file over `subdir`): one value is an `enum`."""
    params = [p for _, _, op in api_operations(document) for p in op.get("parameters", [])]
    assert not [p["name"] for p in params if "const" in p["schema"]]
    subdir = [p for p in params if p["name"] == "subdir"]
    assert subdir and all(p["schema"]["enum"] == ["temparea"] for p in subdir)
