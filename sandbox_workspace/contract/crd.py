"""The custom resources' names and the labels, annotations and finalizer on them.

Contract: these strings are what the API, the operator and the tools outside them agree
on about the Kubernetes objects; changing one is a breaking change of the cluster's
contents (objects already written carry the old one). Labels and annotations are
prefixed with the API group, so they never clash with others'. The resources' schemas
are the operator's models (operator/models.py); their condition reasons are
``contract.conditions``.
"""

from __future__ import annotations

GROUP = "sandboxworkspace.io"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
SESSION_KIND = "SandboxSession"
SESSION_PLURAL = "sandboxsessions"
WORKSPACE_KIND = "ConversationWorkspace"
WORKSPACE_PLURAL = "conversationworkspaces"

# Labels and annotations (prefix = the API group, so they never clash with others').
PREFIX = GROUP
LABEL_COMPONENT = f"{PREFIX}/component"  # "runtime" on sandbox pods (NetworkPolicy, agent)
LABEL_SESSION = f"{PREFIX}/session"  # the SandboxSession's name, on every child
LABEL_USER = f"{PREFIX}/user"  # DNS slug of the user id (label values are restricted)
LABEL_CONVERSATION = f"{PREFIX}/conversation"  # DNS slug of the conversation id
ANNOTATION_USER_ID = f"{PREFIX}/user-id"  # the user id verbatim
ANNOTATION_CONVERSATION_ID = f"{PREFIX}/conversation-id"
# The caller's tenant verbatim, on the sessions and workspaces of a tenant other than
# "default" (whose sessions are one per tenant and user: naming.session_id_for).
ANNOTATION_TENANT_ID = f"{PREFIX}/tenant-id"
# Set (any value, conventionally an RFC 3339 time) by the API to start a Stopped session
# again; the operator recreates the pod and removes the annotation.
ANNOTATION_RESUME = f"{PREFIX}/resume-requested"
# Set by the API while chat runs are open or approvals pending (activity the runtime
# cannot see); the idle check uses the later of this and the runtime's own activity.
ANNOTATION_LAST_ACTIVITY = f"{PREFIX}/last-activity"
# Written by the API with a create or a resume request when it traces (sandbox_workspace/
# tracing.py): the W3C traceparent of its request, whose child the operator's handler of
# that change becomes.
ANNOTATION_TRACEPARENT = f"{PREFIX}/traceparent"
# On a ConversationWorkspace a fork created (set by the API in the create itself, never
# changed): what it is a fork of, JSON {"conversation_id", "snapshot_id"} — so a fork cut
# off before its store mark is told from any other conversation (api/files/copies.py).
ANNOTATION_FORK_ORIGIN = f"{PREFIX}/fork-origin"
# On a ConversationWorkspace its session adopted (with the owner reference): that
# session's uid. The reference gone while this names it means the session's deletion
# orphaned the workspace (``kubectl delete --cascade=orphan``): kept on purpose.
ANNOTATION_ADOPTED_BY = f"{PREFIX}/adopted-by"
# On a sandbox pod: digest of the spec it was built from (a different digest: the session's
# spec changed in a way that needs a new pod).
ANNOTATION_POD_SPEC = f"{PREFIX}/pod-spec"
# On a pool pod: which claim key its runtime was started with (a digest of it, never
# the key): a free pod of another key is stale once the key is rotated.
ANNOTATION_CLAIM_KEY_ID = f"{PREFIX}/claim-key-id"
# On a cleanup pod and its Secret: the orphaned claim it serves.
LABEL_CLEANUP = f"{PREFIX}/cleanup-of"
# On a warm-pool sandbox pod for its whole life: "free", then "claimed" (operator/pool).
LABEL_POOL = f"{PREFIX}/pool"
FINALIZER_FILES = f"{PREFIX}/files"
# On a ConversationWorkspace while an API process writes to its store prefix (store mode
# s3): one annotation per writer, ``writers.sandboxworkspace.io/w-{id}: {lease end, Unix
# s}``. The finalizer does not look for the prefix to be empty while a live one is there
# (so no object lands after it looked); one whose lease ended (its API process died) is
# removed, and the prefix cleared after it.
ANNOTATION_WRITER_PREFIX = f"writers.{PREFIX}/"
WRITER_LEASE_SECONDS = 30
COMPONENT_RUNTIME = "runtime"
