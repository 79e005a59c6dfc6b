"""Where the evaluation data lives: one setting, ``GPUIR_DATA``."""

from __future__ import annotations

import os
from pathlib import Path

_REPO = Path(__file__).resolve().parent.parent


def data_dir() -> Path:
    """The evaluation data folder.

    ``GPUIR_DATA`` when set, else ``../shared/data`` beside the repository
    checkout (where CI and developers have it). The data is never copied into
    the repository.
    """
    env = os.environ.get("GPUIR_DATA")
    if env:
        return Path(env).expanduser().resolve()
    return (_REPO.parent / "shared" / "data").resolve()


def locomo_path() -> Path:
    return data_dir() / "locomo" / "locomo10.json"


def longmemeval_path(split: str = "s") -> Path:
    name = {"s": "longmemeval_s_cleaned_499.json.gz", "oracle": "longmemeval_oracle.json.gz"}[split]
    return data_dir() / "longmemeval" / name
