"""api/openapi_security.py: what each auth mode's document requires."""

from __future__ import annotations

from sandbox_workspace.api.openapi_security import document_security


def _schema() -> dict:
    return {
        "paths": {
            "/healthz": {"get": {"tags": ["health"]}},
            "/api/v1/sessions": {"post": {"tags": ["sessions"]}},
        }
    }


def test_required_mode_asks_for_a_bearer_token_with_or_without_a_user():
    schema = _schema()
    document_security(schema, "required")
    # The service token speaks for X-User-Id; a JWT names its user itself.
    assert schema["security"] == [{"bearer": [], "userId": []}, {"bearer": []}]
    assert schema["components"]["securitySchemes"]["bearer"]["bearerFormat"] == "JWT"
    assert schema["paths"]["/healthz"]["get"]["security"] == []
    assert "security" not in schema["paths"]["/api/v1/sessions"]["post"]


def test_dev_mode_user_header_is_optional():
    schema = _schema()
    document_security(schema, "dev")
    assert schema["security"] == [{"userId": []}, {}]
