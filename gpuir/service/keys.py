"""API keys of the memory service, one or more per tenant, stored hashed.

A key reads ``gpuir.TENANT.SECRET`` (an operator key ``gpuir._operator.SECRET``:
it opens ``/metrics`` and the counts of ``/healthz``, and no tenant's records;
``_operator`` is not a valid tenant name, so it can name no tenant) (``SECRET`` from :func:`secrets.token_urlsafe`,
32 bytes of randomness). The tenant part lets a client find its tenant from the
key alone; it grants nothing by itself: the server looks the key up by its id
(the first 8 characters of the secret) and compares ``sha256(salt || key)``
with the stored digest in constant time (:func:`hmac.compare_digest`), and the
tenant it serves is the one stored with the digest, never the one written in
the key. The salt is 16 random bytes per key. A key has 256 bits of entropy,
so a fast salted hash suffices (a slow password hash defends guessable
passwords, which these are not).

The file ``service-keys.json`` in the memory directory holds::

    {"format": "gpuir-service-keys", "version": 1,
     "keys": [{"tenant": ..., "key_id": ..., "salt": hex, "sha256": hex, "created": ISO time}]}

It is written atomically (a temporary file, fsync, ``os.replace``, directory
fsync) with permissions 0600 whatever the umask; a running server notices a changed file (its
size and modification time) and reloads it, so ``gpuir serve-keys add`` and
``revoke`` take effect without a restart.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import os
import secrets
import threading
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from ..storage.files import fsync_dir
from .errors import TENANT_RE, check_tenant

KEYS_FILE = "service-keys.json"
FORMAT = "gpuir-service-keys"
PREFIX = "gpuir"
#: The owner stored with an operator key (not a valid tenant name: it starts with '_').
OPERATOR = "_operator"


class KeyFileError(ValueError):
    """The keys file is damaged or not a keys file (the message names it)."""


def _digest(salt: bytes, key: str) -> str:
    return hashlib.sha256(salt + key.encode("utf-8")).hexdigest()


def parse_key(key: str) -> tuple[str, str] | None:
    """(tenant, key id) written in a key, or None when it is not shaped like one."""
    parts = key.split(".", 2) if isinstance(key, str) else []
    if len(parts) != 3 or parts[0] != PREFIX or len(parts[2]) < 16 or not (
            parts[1] == OPERATOR or TENANT_RE.fullmatch(parts[1])):
        return None
    return parts[1], parts[2][:8]


def tenant_of_key(key: str) -> str:
    """The tenant a key names (for clients; the server trusts only the stored digest)."""
    got = parse_key(key)
    if got is None:
        raise ValueError("not a gpuir service key (expected gpuir.TENANT.SECRET, as `gpuir serve-keys add` prints)")
    return got[0]


class KeyStore:
    """The keys file of a memory directory: read, verify, add, revoke.

    Parameters
    ----------
    root : the memory directory
    """

    def __init__(self, root: str | os.PathLike):
        self.root = Path(root)
        self.path = self.root / KEYS_FILE
        self._stamp: tuple[int, int, int] | None = None
        self._entries: list[dict[str, Any]] = []
        self._by_id: dict[str, list[dict[str, Any]]] = {}
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ file
    def _read(self) -> list[dict[str, Any]]:
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return []
        except (OSError, ValueError) as e:
            raise KeyFileError(f"{self.path}: unreadable keys file ({e})") from None
        if not isinstance(data, dict) or data.get("format") != FORMAT or not isinstance(data.get("keys"), list):
            raise KeyFileError(f"{self.path}: not a {FORMAT} file")
        for e in data["keys"]:
            if not isinstance(e, dict) or not {"tenant", "key_id", "salt", "sha256"} <= set(e):
                raise KeyFileError(f"{self.path}: a damaged key entry {e!r}")
        return data["keys"]

    def _write(self, entries: list[dict[str, Any]]) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        tmp = self.root / f"{KEYS_FILE}.tmp-{secrets.token_hex(4)}"
        body = json.dumps({"format": FORMAT, "version": 1, "keys": entries}, indent=1) + "\n"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            if hasattr(os, "fchmod"):
                os.fchmod(fd, 0o600)  # whatever the umask
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(body)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            with contextlib.suppress(OSError):
                tmp.unlink()
            raise
        fsync_dir(self.root)

    def refresh(self) -> None:
        """Reload the file when it changed since the last read."""
        try:
            st = self.path.stat()
            stamp = (st.st_ino, st.st_mtime_ns, st.st_size)
        except FileNotFoundError:
            stamp = None
        if stamp == self._stamp and self._stamp is not None:
            return
        with self._lock:
            entries = self._read()
            by_id: dict[str, list[dict[str, Any]]] = {}
            for e in entries:
                by_id.setdefault(e["key_id"], []).append(e)
            self._entries, self._by_id, self._stamp = entries, by_id, stamp

    # ------------------------------------------------------------------ use
    def tenant_for(self, key: str) -> str | None:
        """The tenant of a valid key, or None (unknown, revoked or malformed key)."""
        got = parse_key(key)
        if got is None:
            return None
        self.refresh()
        found = None
        for e in self._by_id.get(got[1], ()):
            # compare every candidate (no early exit on the digest), constant time each
            if hmac.compare_digest(_digest(bytes.fromhex(e["salt"]), key), e["sha256"]):
                found = e["tenant"]
        return found

    def _editing(self):
        """A lock serialising read-modify-write of the file between processes (``gpuir serve-keys``)."""
        import filelock

        self.root.mkdir(parents=True, exist_ok=True)
        return filelock.FileLock(str(self.root / f"{KEYS_FILE}.lock"), timeout=30, mode=0o600)

    def add(self, tenant: str) -> str:
        """Create a key for ``tenant``; returns it (the only time it is ever shown)."""
        check_tenant(tenant)
        with self._editing():
            return self._add(tenant)[0]

    def add_operator(self) -> str:
        """Create an operator key (``/metrics``, the counts of ``/healthz``); returns it (shown only now)."""
        with self._editing():
            return self._add(OPERATOR)[0]

    def add_many(self, tenants: list[str]) -> list[str]:
        """A new key for each tenant (one file write); returns them in order."""
        for t in tenants:
            check_tenant(t)
        with self._editing():
            return self._add(*tenants)

    def _add(self, *tenants: str) -> list[str]:
        entries = self._read()
        keys = []
        for tenant in tenants:
            key = f"{PREFIX}.{tenant}.{secrets.token_urlsafe(32)}"
            salt = secrets.token_bytes(16)
            entries.append({"tenant": tenant, "key_id": parse_key(key)[1], "salt": salt.hex(),
                            "sha256": _digest(salt, key),
                            "created": datetime.now(timezone.utc).isoformat(timespec="seconds")})
            keys.append(key)
        self._write(entries)
        return keys

    def revoke(self, what: str) -> list[dict[str, Any]]:
        """Remove every key of tenant ``what``, else the keys whose id (or full key) starts with ``what``.

        Returns the removed entries (empty: nothing matched, the file is unchanged).
        """
        with self._editing():
            return self._revoke(what)

    def _revoke(self, what: str) -> list[dict[str, Any]]:
        entries = self._read()
        if any(e["tenant"] == what for e in entries):
            gone = [e for e in entries if e["tenant"] == what]
        else:
            kid = parse_key(what)
            prefix = kid[1] if kid else what
            if len(prefix) < 4:
                raise ValueError(f"{what!r} names no tenant, and a key id prefix needs at least 4 characters "
                                 "(see `gpuir serve-keys MEMORY_DIR list`)")
            gone = [e for e in entries if prefix and (e["key_id"].startswith(prefix) or prefix.startswith(e["key_id"]))]
            if kid:
                gone = [e for e in gone if e["tenant"] == kid[0]]
        if gone:
            self._write([e for e in entries if e not in gone])
        return gone

    def list(self) -> list[dict[str, Any]]:
        """Tenant, key id and creation time of every key (never the digest)."""
        return [{"tenant": e["tenant"], "key_id": e["key_id"], "created": e.get("created")} for e in self._read()]
