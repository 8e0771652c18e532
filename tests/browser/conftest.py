"""The browser test's server: ``sandbox-workspace dev`` with the scripted model."""

from ui_script import ui_server

__all__ = ["ui_server"]
