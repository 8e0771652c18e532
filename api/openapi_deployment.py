"""What only one deployment's OpenAPI document can say, patched into the generated one.

Contract: ``document_deployment(schema, ceiling, policies, allowed_types)`` states this
deployment's upload ceiling per size unit (``UploadConfig.anyOf``), the tool policies a
chat request may choose per tool (only stricter than configured), the file types new
sessions accept (on the upload's ``file`` part and its 415: a filename's extension is
beyond what a multipart schema can constrain), drops the ``null`` FastAPI
derives for optional query/header parameters (an absent parameter is left out, never
sent as null), and states a parameter's one allowed value as a one-value ``enum``, not
``const`` (the same rule; client generators refuse a ``const`` header —
openapi-python-client dropped the file operations over ``subdir``). With these, a
request valid against the document is one the server accepts.
"""

from __future__ import annotations


def document_deployment(
    schema: dict,
    upload_ceiling: int,
    tool_policies: dict[str, list[str]],
    allowed_types: list[str] | None = None,
) -> None:
    _upload_ceiling(schema, upload_ceiling)
    if allowed_types is not None:
        _allowed_types(schema, allowed_types)
    _tool_policies(schema, tool_policies)
    _parameters_not_null(schema)
    _parameters_enum_not_const(schema)


_UNIT_BYTES = {"B": 1, "KB": 1024, "MB": 1024**2, "GB": 1024**3}


def _upload_ceiling(schema: dict, ceiling: int) -> None:
    """State the platform's upload ceiling per unit, so a schema-valid config is accepted."""
    config = schema.get("components", {}).get("schemas", {}).get("UploadConfig")
    if config is None:
        return
    fields = config["properties"]
    default_size, default_unit = (
        fields["max_file_size"]["default"],
        fields["max_file_size_unit"]["default"],
    )
    branches = []
    for unit, factor in _UNIT_BYTES.items():
        largest = ceiling // factor
        if largest < 1:
            continue
        branch: dict = {"properties": {"max_file_size": {"maximum": largest}}, "required": []}
        if unit == default_unit:  # the unit may be left out
            branch["properties"]["max_file_size_unit"] = {"enum": [unit]}
        else:
            branch["properties"]["max_file_size_unit"] = {"const": unit}
            branch["required"].append("max_file_size_unit")
        if default_size > largest:  # the default size would exceed it: must be given
            branch["required"].append("max_file_size")
        branches.append(branch)
    config["anyOf"] = branches
    config["description"] = (
        f"{config.get('description', '')} The file size may not exceed this platform's "
        f"ceiling of {ceiling} bytes (the `anyOf` states it per unit)."
    ).strip()


def _allowed_types(schema: dict, allowed: list[str]) -> None:
    """Say which file types an upload may have: the session's config, by default these."""
    upload = schema.get("paths", {}).get("/api/v1/sessions/{session_id}/files/upload", {})
    operation = upload.get("post")
    if operation is None:
        return
    types = ", ".join(f"`.{t}`" for t in allowed) if allowed else "every type"
    rule = (
        "The extension of the part's filename must be one of the session's "
        f"`file_upload_config.allowed_file_types` (sessions created without one: {types})."
    )
    body = operation["requestBody"]["content"]["multipart/form-data"]["schema"]
    body["properties"]["file"]["description"] = rule
    refused = operation["responses"]["415"]
    refused["description"] = f"{refused['description']} {rule}"


def _tool_policies(schema: dict, allowed: dict[str, list[str]]) -> None:
    """Name each tool and the policies a request may pick for it here (only stricter)."""
    chat = schema.get("components", {}).get("schemas", {}).get("ChatRequest")
    if chat is None:
        return
    field = chat["properties"]["tool_policies"]
    field["anyOf"] = [
        {
            "type": "object",
            "properties": {name: {"enum": values} for name, values in allowed.items()},
            "additionalProperties": False,
        },
        {"type": "null"},
    ]


def _parameters_not_null(schema: dict) -> None:
    """An absent query parameter or header is left out, never sent as null: drop the
    ``null`` branch FastAPI derives from ``X | None`` (a client would send "null")."""
    for operations in schema.get("paths", {}).values():
        for operation in operations.values():
            for parameter in operation.get("parameters", []):
                options = parameter.get("schema", {}).get("anyOf")
                if options and {"type": "null"} in options:
                    rest = [o for o in options if o != {"type": "null"}]
                    extra = {k: v for k, v in parameter["schema"].items() if k != "anyOf"}
                    parameter["schema"] = (
                        {**extra, **rest[0]}
                        if len(rest) == 1
                        else {
                            **extra,
                            "anyOf": rest,
                        }
                    )


def _parameters_enum_not_const(schema: dict) -> None:
    """``Literal["temparea"]`` comes out as ``const``; a one-value ``enum`` says the same."""
    for operations in schema.get("paths", {}).values():
        for operation in operations.values():
            for parameter in operation.get("parameters", []):
                value_schema = parameter.get("schema", {})
                if "const" in value_schema:
                    value_schema["enum"] = [value_schema.pop("const")]
