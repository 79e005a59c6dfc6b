"""Python clients of the memory service (on httpx): :class:`MemoryClient` and :class:`AsyncMemoryClient`.

>>> c = MemoryClient("http://127.0.0.1:8080", key)           # doctest: +SKIP
>>> c.add([{"id": "m1", "text": "Caroline went to the support group"}])  # doctest: +SKIP
1
>>> c.search(["support group"], k=5)[0][0]["id"]              # doctest: +SKIP
'm1'

The tenant is read from the key (``gpuir.TENANT.SECRET``) unless given. Every
method raises :class:`ServiceError` (with ``.status`` and the server's
``.detail``) for an HTTP error reply.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any
from urllib.parse import quote

try:
    import httpx
except ImportError as e:  # pragma: no cover
    raise ImportError("the memory service client needs httpx: pip install 'gpuir[service]'") from e

from .keys import tenant_of_key

#: Connection limits of a client's own pool: an agent calls its memory every few seconds, so an idle
#: connection is kept 60 s (httpx's default, 5 s, reconnected after every longer pause; the server keeps
#: idle connections 75 s, ``gpuir serve --keep-alive-seconds``).
LIMITS = httpx.Limits(max_connections=100, max_keepalive_connections=20, keepalive_expiry=60.0)


class ServiceError(RuntimeError):
    """An HTTP error reply: ``status`` (int) and ``detail`` (the server's explanation)."""

    def __init__(self, status: int, detail: Any, method: str, url: str):
        self.status, self.detail = status, detail
        super().__init__(f"{method} {url}: HTTP {status}: {detail}")


def _check(r: httpx.Response) -> Any:
    if r.status_code >= 400:
        try:
            detail = r.json().get("detail", r.text)
        except ValueError:
            detail = r.text
        raise ServiceError(r.status_code, detail, r.request.method, str(r.request.url))
    return r.json()


def _records(records: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    if isinstance(records, Mapping):
        records = [records]
    return [dict(r) for r in records]


def _search_body(queries, k, where, config) -> dict[str, Any]:
    if isinstance(queries, str):
        queries = [queries]
    body: dict[str, Any] = {"queries": list(queries), "k": int(k)}
    if where is not None:
        body["where"] = where
    if config is not None:
        body["config"] = config
    return body


class _Base:
    def __init__(self, base_url: str, key: str, tenant: str | None = None):
        self.base_url = base_url.rstrip("/")
        self.key = key
        self.tenant = tenant if tenant is not None else tenant_of_key(key)
        self._prefix = f"/v1/tenants/{quote(self.tenant, safe='')}"
        self._headers = {"Authorization": f"Bearer {key}"}

    def _rec(self, rid: str) -> str:
        return f"{self._prefix}/records/{quote(rid, safe='')}"


class MemoryClient(_Base):
    """Synchronous client of one tenant.

    Parameters
    ----------
    base_url : e.g. ``"http://127.0.0.1:8080"``
    key : the tenant's API key (``gpuir serve-keys MEMORY_DIR add TENANT``)
    tenant : optional; default: the tenant written in the key
    timeout : seconds per request
    """

    def __init__(self, base_url: str, key: str, tenant: str | None = None, timeout: float = 30.0):
        super().__init__(base_url, key, tenant)
        self._http = httpx.Client(base_url=self.base_url, headers=self._headers, timeout=timeout, limits=LIMITS)

    def add(self, records: Iterable[Mapping[str, Any]]) -> int:
        """Add records (dicts as ``gpuir memory add`` takes them); returns the count, once durable."""
        return int(_check(self._http.post(f"{self._prefix}/records", json={"records": _records(records)}))["added"])

    def search(self, queries: str | Sequence[str], k: int = 10, where: Any = None,
               config: str | None = None) -> list[list[dict[str, Any]]]:
        """One list of hits per query (dicts with ``id``, ``score``, ``text`` and the record's fields)."""
        out = _check(self._http.post(f"{self._prefix}/search", json=_search_body(queries, k, where, config)))
        return [r["hits"] for r in out["results"]]

    def get(self, id: str) -> dict[str, Any] | None:
        """The record, or None when the tenant has no record with this id."""
        r = self._http.get(self._rec(id))
        return None if r.status_code == 404 else _check(r)

    def delete(self, ids: str | Iterable[str]) -> int:
        """Delete records by id; returns how many existed (unknown ids are skipped)."""
        n = 0
        for rid in [ids] if isinstance(ids, str) else list(ids):
            r = self._http.delete(self._rec(rid))
            if r.status_code != 404:
                n += int(_check(r)["deleted"])
        return n

    def health(self) -> dict[str, Any]:
        """``GET /healthz``."""
        return _check(self._http.get("/healthz"))

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> MemoryClient:  # noqa: PYI034
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class AsyncMemoryClient(_Base):
    """Asynchronous client of one tenant (the same methods as :class:`MemoryClient`, awaited).

    Parameters
    ----------
    http : httpx.AsyncClient, optional
        Share one connection pool between many clients (e.g. many simulated agents).
    """

    def __init__(self, base_url: str, key: str, tenant: str | None = None, timeout: float = 30.0,
                 http: httpx.AsyncClient | None = None):
        super().__init__(base_url, key, tenant)
        self._own = http is None
        self._http = http if http is not None else httpx.AsyncClient(base_url=self.base_url, timeout=timeout,
                                                                      limits=LIMITS)

    def _url(self, path: str) -> str:
        return self.base_url + path

    async def add(self, records: Iterable[Mapping[str, Any]]) -> int:
        r = await self._http.post(self._url(f"{self._prefix}/records"), json={"records": _records(records)},
                                  headers=self._headers)
        return int(_check(r)["added"])

    async def search(self, queries: str | Sequence[str], k: int = 10, where: Any = None,
                     config: str | None = None) -> list[list[dict[str, Any]]]:
        r = await self._http.post(self._url(f"{self._prefix}/search"), json=_search_body(queries, k, where, config),
                                  headers=self._headers)
        return [x["hits"] for x in _check(r)["results"]]

    async def get(self, id: str) -> dict[str, Any] | None:
        r = await self._http.get(self._url(self._rec(id)), headers=self._headers)
        return None if r.status_code == 404 else _check(r)

    async def delete(self, ids: str | Iterable[str]) -> int:
        n = 0
        for rid in [ids] if isinstance(ids, str) else list(ids):
            r = await self._http.delete(self._url(self._rec(rid)), headers=self._headers)
            if r.status_code != 404:
                n += int(_check(r)["deleted"])
        return n

    async def health(self) -> dict[str, Any]:
        return _check(await self._http.get(self._url("/healthz")))

    async def aclose(self) -> None:
        if self._own:
            await self._http.aclose()

    async def __aenter__(self) -> AsyncMemoryClient:  # noqa: PYI034
        return self

    async def __aexit__(self, *exc) -> None:
        await self.aclose()
