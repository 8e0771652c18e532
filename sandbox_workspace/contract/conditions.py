"""The conditions on the custom resources and the reasons the operator gives: every one
named once, with what it means.

Contract: ``ConditionType`` names each ``status.conditions[].type``; ``Reason`` each
``reason`` the operator writes into a condition or an Event (the Kubernetes vocabulary a
client can match on: ``kubectl wait --for=condition=Ready``, an alert on
``reason=VolumeRetained``). The operator spells a reason only through these constants
(tests/unit/test_conditions.py looks for a literal); a pod's own waiting reason from the
kubelet (``ErrImagePull``, ``ContainerCreating`` …) is passed on verbatim and is not ours
to name. Changing a value is a breaking change for anyone matching on it.
"""

from __future__ import annotations

from typing import Final


class ConditionType:
    """``status.conditions[].type`` of a SandboxSession (the ConversationWorkspace has
    ``Ready`` only)."""

    READY: Final = "Ready"  # the runtime answers (a workspace: its directory exists)
    STOPPED: Final = "Stopped"  # the pod is gone on purpose (idle); resumed on request
    EXPIRED: Final = "Expired"  # ttlSeconds has passed: the session is being deleted
    CONFINED: Final = "Confined"  # the runtime confines executed code (Landlock)
    RESTART_REQUIRED: Final = "RestartRequired"  # the pod runs an older spec


class Reason:
    """``reason`` of a condition or an Event, by the condition it explains."""

    # -- a session's Ready (from its pod; see operator/status.observe_pod) ---------------
    POD_MISSING: Final = "PodMissing"  # no sandbox pod exists (yet, or any more)
    POD_TERMINATING: Final = "PodTerminating"  # the pod is being deleted
    POD_PENDING: Final = "PodPending"  # the pod waits to be scheduled or started
    POD_FAILED: Final = "PodFailed"  # the pod ended (a Warning; it is replaced)
    UNSCHEDULABLE: Final = "Unschedulable"  # no node can run it (reported, not replaced)
    RUNTIME_NOT_READY: Final = "RuntimeNotReady"  # the container runs; the runtime not yet
    RUNTIME_READY: Final = "RuntimeReady"  # the runtime answers
    OLD_INCARNATION: Final = "OldIncarnation"  # an earlier incarnation's children still go
    INVALID_SPEC: Final = "InvalidSpec"  # a spec that can never work (phase Error)
    CLAIM_LOST: Final = "ClaimLost"  # the volume claim vanished (phase Error, not replaced)
    # -- Stopped -------------------------------------------------------------------------
    STOPPED: Final = "Stopped"  # Ready is False because the session is stopped
    IDLE_TIMEOUT: Final = "IdleTimeout"  # stopped after idleTimeoutSeconds of no activity
    RESUMED: Final = "Resumed"  # started again on request (the resume annotation)
    ACTIVE: Final = "Active"  # never stopped
    # -- Expired -------------------------------------------------------------------------
    NO_TTL: Final = "NoTTL"  # ttlSeconds is not set
    NOT_EXPIRED: Final = "NotExpired"  # the message says when it expires
    TTL_EXPIRED: Final = "TTLExpired"  # ttlSeconds elapsed: the session is deleted
    EXPIRED: Final = "Expired"  # the Event of that deletion
    # -- Confined ------------------------------------------------------------------------
    LANDLOCK: Final = "Landlock"  # confined; the message names the ABI and features
    CONFINEMENT_DISABLED: Final = "ConfinementDisabled"  # turned off (mode none)
    LANDLOCK_UNAVAILABLE: Final = "LandlockUnavailable"  # the kernel offers none
    # -- RestartRequired -----------------------------------------------------------------
    SPEC_CHANGED: Final = "SpecChanged"  # the pod is replaced once the session is idle
    UP_TO_DATE: Final = "UpToDate"  # the pod runs the current spec
    # -- a ConversationWorkspace's Ready -------------------------------------------------
    DIRECTORY_READY: Final = "DirectoryReady"  # the conversation's directory exists
    SESSION_GONE: Final = "SessionGone"  # its session is gone or going: deleted with it
    ORPHANED: Final = "Orphaned"  # its session's deletion orphaned it: kept, waits for one
    SESSION_NOT_RUNNING: Final = "SessionNotRunning"  # the session is starting
    SESSION_STOPPED: Final = "SessionStopped"  # waits for the session to be resumed
    TOKEN_MISSING: Final = "TokenMissing"  # the runtime's token Secret is not there yet
    RUNTIME_BUSY: Final = "RuntimeBusy"  # the runtime refused for now (429/503)
    RUNTIME_UNAVAILABLE: Final = "RuntimeUnavailable"  # the runtime did not answer
    REFUSED: Final = "Refused"  # the runtime refuses this conversation for good (Error)
    # -- a ConversationWorkspace being deleted (why the finalizer still waits) -----------
    DELETING: Final = "Deleting"  # deletion started: the files are being deleted
    RUNTIME_REFUSED: Final = "RuntimeRefused"  # the runtime would not delete (a Warning)
    STILL_EXISTS: Final = "StillExists"  # the files are not verified gone yet
    CLEANUP_POD_STARTING: Final = "CleanupPodStarting"  # a pod to delete them is starting
    STORE_UNAVAILABLE: Final = "StoreUnavailable"  # the object store did not answer
    STORE_NOT_EMPTY: Final = "StoreNotEmpty"  # objects remain under the prefix
    WRITERS_IN_FLIGHT: Final = "WritersInFlight"  # an API process still writes there
    CLAIM_TERMINATING: Final = "ClaimTerminating"  # the volume claim is being deleted
    CLAIM_OF_OLD_SESSION: Final = "ClaimOfOldSession"  # the claim is an earlier session's
    VOLUME_RECLAIMING: Final = "VolumeReclaiming"  # the volume is being reclaimed
    VOLUME_RETAINED: Final = "VolumeRetained"  # the volume outlives its claim (a Warning)
    # -- Events only ---------------------------------------------------------------------
    POD_CREATED: Final = "PodCreated"  # a sandbox pod was created
    POD_CLAIMED: Final = "PodClaimed"  # a ready pod was taken from the warm pool
    CLAIM_ADOPTED: Final = "ClaimAdopted"  # an earlier incarnation's claim was adopted
    CLEANUP_POD: Final = "CleanupPod"  # a pod deleting an orphaned claim's files
