"""Errors of the memory that several of its modules raise (kept low, so that none of them imports the store)."""

from __future__ import annotations

__all__ = ["ReadOnlyError", "UnknownIdError", "UnsavedWritesWarning"]


class UnknownIdError(KeyError, ValueError):
    """Ids that name no live record; ``.ids`` holds them all."""

    def __init__(self, ids: list[str], what: str):
        self.ids = ids
        shown = ", ".join(repr(i) for i in ids[:5]) + (f" and {len(ids) - 5} more" if len(ids) > 5 else "")
        super().__init__(f"{what}: {len(ids)} unknown id(s): {shown} (pass missing_ok=True to skip unknown ids)")

    def __str__(self) -> str:  # KeyError would print the repr
        return str(self.args[0])


class UnsavedWritesWarning(UserWarning):
    """A memory bound to a directory was closed, or left a ``with`` block by an exception, with unsaved writes."""


class ReadOnlyError(ValueError):
    """A memory opened for reading was asked to change."""
