"""Sandbox Workspace: per-user sandbox sessions and per-conversation workspaces."""

__version__ = "0.1.0"
