"""E2B compatibility: E2B's SDKs talk to Sandbox Workspace unchanged (issue 37).

One E2B sandbox is one conversation of the caller's session, so confinement, quotas and
the deletion guarantee are the API's own. ``control`` is E2B's control plane
(``/e2b/sandboxes``…), ``envd`` its data plane (``/e2b/envd/…``, routed by the
``E2b-Sandbox-Id`` header as the SDK sends it when ``E2B_SANDBOX_URL`` is set);
``ids`` maps sandbox ids and access tokens to (tenant, user, conversation), ``paths``
maps E2B paths onto the conversation's directory, ``connect`` frames Connect JSON.
"""
