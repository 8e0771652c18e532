"""The file service every file route calls (see ``files.base``): ``CacheFiles`` or
``StoredFiles``, chosen once in ``app.create_app``."""

from __future__ import annotations

from .base import FileService, Opened, Records, Upload
from .cache import CacheFiles

__all__ = ["CacheFiles", "FileService", "Opened", "Records", "Upload"]
