"""Moved to :mod:`gpuir.storage.files`; this name stays only while ``gpuir/memory/persist.py`` imports it."""

from ..storage.files import fsync_dir, sha256_file

__all__ = ["fsync_dir", "sha256_file"]
