"""The npm client tests' server: ``sandbox-workspace dev`` with the scripted model."""

from ui_script import ui_replicas, ui_server

__all__ = ["ui_replicas", "ui_server"]
