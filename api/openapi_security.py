"""The document's security schemes: how a caller authenticates, as a generated client
reads it (``api/identity.py`` is what the server does).

Contract: ``document_security(schema, auth_mode)`` declares two schemes — ``bearer``
(HTTP bearer: a JWT whose subject is the user, or the service token) and ``userId`` (the
``X-User-Id`` header) — and requires them on every operation but the health probes,
which need none: in ``required`` mode a bearer token with ``X-User-Id`` (the service
token speaking for a user) or a bearer token alone (a JWT); in ``dev`` mode ``X-User-Id``,
optional (absent, the user is ``dev``).
"""

from __future__ import annotations

SCHEMES = {
    "bearer": {
        "type": "http",
        "scheme": "bearer",
        "bearerFormat": "JWT",
        "description": "A JWT whose subject (or configured claim) is the user; or this "
        "deployment's service token, sent with `X-User-Id` naming the user it speaks for.",
    },
    "userId": {
        "type": "apiKey",
        "in": "header",
        "name": "X-User-Id",
        "description": "The user: alone in dev mode (absent: `dev`); with the service token "
        "in required mode.",
    },
}
REQUIREMENTS = {
    "required": [{"bearer": [], "userId": []}, {"bearer": []}],
    "dev": [{"userId": []}, {}],
}
UNAUTHENTICATED_TAGS = {"health"}


def document_security(schema: dict, auth_mode: str) -> None:
    schema.setdefault("components", {})["securitySchemes"] = SCHEMES
    schema["security"] = REQUIREMENTS[auth_mode]
    for operations in schema.get("paths", {}).values():
        for operation in operations.values():
            if UNAUTHENTICATED_TAGS & set(operation.get("tags", [])):
                operation["security"] = []
