"""The npm client tests' server: ``sandbox-workspace dev`` with the scripted model."""

from ui_script import ui_server

__all__ = ["ui_server"]
