"""Python clients of the memory service (on httpx): :class:`MemoryClient` and :class:`AsyncMemoryClient`.

>>> c = MemoryClient("http://127.0.0.1:8080", key)           # doctest: +SKIP
>>> c.add([{"id": "m1", "text": "Caroline went to the support group"}])  # doctest: +SKIP
1
>>> c.search(["support group"], k=5)[0][0]["id"]              # doctest: +SKIP
'm1'

The tenant is read from the key (``gpuir.TENANT.SECRET``) unless given. Every
method raises :class:`ServiceError` (with ``.status`` and the server's
``.detail``) for an HTTP error reply.

Beyond add, search, get and delete: ``update`` (PATCH: fields merged, metadata
key by key; ``replace=True``: PUT), ``upsert``, ``list`` (a
:class:`~gpuir.memory.listing.Page` with a cursor) and ``iter_records`` (every
page), ``count``, ``history`` and ``export`` (to a file, the exact format of
:mod:`gpuir.memory.export`), ``delete`` by ids or ``where`` (one request;
unknown ids raise :class:`~gpuir.memory.UnknownIdError` unless
``missing_ok=True``, as ``Memory.delete`` does) and ``delete_all``, as
:class:`gpuir.Memory` (and its scopes) have them.
"""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator, Iterable, Iterator, Mapping, Sequence
from typing import Any
from urllib.parse import quote

try:
    import httpx
except ImportError as e:  # pragma: no cover
    raise ImportError("the memory service client needs httpx: pip install 'gpuir[service]'") from e

from ..memory.errors import UnknownIdError
from ..memory.listing import Page
from ..results import HitLists
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


def _changed(reply: dict[str, Any]) -> int:
    """Records a PATCH or PUT changed: updated, or created (a PUT of a new id answers ``"created": 1``)."""
    return int(reply.get("updated", 0)) + int(reply.get("created", 0))


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


def _search_body(queries, k, where, config, min_score=None, time_unit=None, ranking=None) -> dict[str, Any]:
    if isinstance(queries, str):
        queries = [queries]
    body: dict[str, Any] = {"queries": list(queries), "k": int(k)}
    for key, v in (("where", where), ("config", config), ("min_score", min_score), ("time_unit", time_unit),
                   ("ranking", ranking)):
        if v is not None:
            body[key] = v
    return body


def _add_body(records, time_unit) -> dict[str, Any]:
    body: dict[str, Any] = {"records": _records(records)}
    if time_unit is not None:
        body["time_unit"] = time_unit
    return body


def _list_params(where, order_by, descending, limit, cursor, time_unit) -> dict[str, Any]:
    params: dict[str, Any] = {"order_by": order_by, "descending": "true" if descending else "false",
                              "limit": int(limit)}
    for key, v in (("where", None if where is None else json.dumps(where)), ("cursor", cursor),
                   ("time_unit", time_unit)):
        if v is not None:
            params[key] = v
    return params


def _patch(rec: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
    rid = rec.get("id")
    if not isinstance(rid, str) or not rid:
        raise ValueError(f"each record needs its 'id' (a non-empty string), got {rid!r}")
    return rid, {k: v for k, v in rec.items() if k != "id"}


def _delete_body(ids, missing_ok, where, time_unit) -> dict[str, Any]:
    if (ids is None) == (where is None):
        raise TypeError("delete: give ids or where= (not both); delete_all() deletes every record")
    if where is not None:
        return {"where": where, **_unit(time_unit)}
    return {"ids": [ids] if isinstance(ids, str) else list(ids), "missing_ok": bool(missing_ok)}


def _deleted(r: httpx.Response) -> int:
    """The count of a bulk delete's reply; a 404 naming unknown ids is :class:`~gpuir.memory.UnknownIdError`."""
    if r.status_code == 404:
        try:
            detail = r.json().get("detail")
        except ValueError:
            detail = None
        if isinstance(detail, dict) and isinstance(detail.get("unknown_ids"), list):
            raise UnknownIdError(detail["unknown_ids"], "delete")
    return int(_check(r)["deleted"])


def _unit(time_unit: str | None) -> dict[str, str]:
    return {} if time_unit is None else {"time_unit": time_unit}


class _Base:
    def __init__(self, base_url: str, key: str, tenant: str | None = None):
        self.base_url = base_url.rstrip("/")
        self.key = key
        self.tenant = tenant if tenant is not None else tenant_of_key(key)
        self._prefix = f"/v1/tenants/{quote(self.tenant, safe='')}"
        self._headers = {"Authorization": f"Bearer {key}"}

    def _rec(self, rid: str) -> str:
        return f"{self._prefix}/records/{quote(rid, safe='')}"

    @staticmethod
    def _page(out: dict[str, Any]) -> Page:
        return Page(out["records"], out.get("cursor"))


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

    def add(self, records: Iterable[Mapping[str, Any]], time_unit: str | None = None) -> int:
        """Add records (dicts as ``gpuir memory add`` takes them); returns the count, once durable."""
        return int(_check(self._http.post(f"{self._prefix}/records", json=_add_body(records, time_unit)))["added"])

    def search(self, queries: str | Sequence[str], k: int = 10, where: Any = None, config: str | None = None,
               min_score: float | None = None, time_unit: str | None = None,
               ranking: str | None = None) -> HitLists:
        """One list of hits per query (dicts with ``id``, ``score``, ``text`` and the record's fields).

        Parameters
        ----------
        queries : str or sequence of str
        k : int
        where : dict or list of (dict or None), optional
            As :meth:`gpuir.Memory.search` takes it (the key's tenant is forced).
        config : str, optional
            A retriever configuration saved beside the memory (``<MEMORY_DIR>.configs/NAME.json``).
        min_score : float, optional
            Drop hits scoring below it, as :meth:`gpuir.Memory.search` does: with the hybrid
            ranking a calibrated relevance in [0, 1] (0.5: as likely relevant as not; outside
            [0, 1] the server answers 422, :class:`ServiceError`), with BM25 a BM25 score. Not
            with ``config`` (422: a fused score has no calibrated scale for records).
        time_unit : {"s", "ms", "us", "ns"}, optional
            The unit of bare numbers given as times in ``where``.
        ranking : {"bm25", "hybrid"}, optional
            Without ``config``: default the memory's (``gpuir serve --ranking``); "bm25" asks a
            hybrid memory for exact BM25.

        Returns
        -------
        HitLists
            ``res[i]`` / ``res.hits(i)`` and ``res.ids(i)``, as every search of gpuir.
        """
        body = _search_body(queries, k, where, config, min_score, time_unit, ranking)
        out = _check(self._http.post(f"{self._prefix}/search", json=body))
        return HitLists(r["hits"] for r in out["results"])

    def update(self, records: Mapping[str, Any] | Iterable[Mapping[str, Any]], replace: bool = False,
               time_unit: str | None = None) -> int:
        """Change records (each an ``id`` and the fields to change; PATCH merges, ``replace=True`` PUTs whole
        records); returns how many, once durable. An unknown id raises ServiceError 404."""
        n = 0
        for rec in _records(records):
            rid, body = _patch(rec)
            method = self._http.put if replace else self._http.patch
            n += _changed(_check(method(self._rec(rid), json=body, params=_unit(time_unit))))
        return n

    def upsert(self, records: Mapping[str, Any] | Iterable[Mapping[str, Any]], replace: bool = False,
               time_unit: str | None = None) -> int:
        """Update the records that exist (merging, or replacing with ``replace``) and create the others."""
        n = 0
        for rec in _records(records):
            rid, body = _patch(rec)
            r = None if replace else self._http.patch(self._rec(rid), json=body, params=_unit(time_unit))
            if r is None or r.status_code == 404:
                r = self._http.put(self._rec(rid), json=body, params=_unit(time_unit))
            n += _changed(_check(r))
        return n

    def list(self, where: Any = None, order_by: str = "seq", descending: bool = False, limit: int = 100,
             cursor: str | None = None, time_unit: str | None = None) -> Page:
        """One page of the tenant's records (``page.records``, ``page.cursor``: None on the last page)."""
        params = _list_params(where, order_by, descending, limit, cursor, time_unit)
        return self._page(_check(self._http.get(f"{self._prefix}/records", params=params)))

    def iter_records(self, where: Any = None, order_by: str = "seq", descending: bool = False,
                     page_size: int = 1000) -> Iterator[dict[str, Any]]:
        """Every record passing ``where``, page after page."""
        cursor = None
        while True:
            page = self.list(where, order_by, descending, page_size, cursor)
            yield from page.records
            cursor = page.cursor
            if cursor is None:
                return

    def count(self, where: Any = None, time_unit: str | None = None) -> int:
        """The number of the tenant's records passing ``where``."""
        params = {**_unit(time_unit), **({} if where is None else {"where": json.dumps(where)})}
        return int(_check(self._http.get(f"{self._prefix}/count", params=params))["count"])

    def history(self, id: str) -> list[dict[str, Any]]:
        """The record's earlier versions, oldest first."""
        return _check(self._http.get(self._rec(id) + "/history"))["versions"]

    def export(self, path: str | os.PathLike) -> int:
        """Write the tenant's records to ``path`` (JSON lines, :mod:`gpuir.memory.export`); returns the count."""
        with self._http.stream("GET", f"{self._prefix}/export") as r:
            if r.status_code >= 400:
                r.read()
                _check(r)
            with open(path, "w", encoding="utf-8") as f:
                f.writelines(line + "\n" for line in r.iter_lines())
        with open(path, encoding="utf-8") as f:
            return int(json.loads(f.readline())["records"])

    def get(self, id: str) -> dict[str, Any] | None:
        """The record, or None when the tenant has no record with this id."""
        r = self._http.get(self._rec(id))
        return None if r.status_code == 404 else _check(r)

    def delete(self, ids: str | Iterable[str] | None = None, missing_ok: bool = False, where: Any = None,
               time_unit: str | None = None) -> int:
        """Delete records by id, or those passing ``where``, in one request; returns how many were deleted.

        Raises
        ------
        UnknownIdError
            Unless ``missing_ok``: ids the tenant does not hold (nothing is deleted), as ``Memory.delete``.
        """
        return _deleted(self._http.post(f"{self._prefix}/delete", json=_delete_body(ids, missing_ok, where,
                                                                                     time_unit)))

    def delete_all(self) -> int:
        """Delete every record of the tenant; returns how many."""
        return _deleted(self._http.post(f"{self._prefix}/delete", json={"all": True}))

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

    async def add(self, records: Iterable[Mapping[str, Any]], time_unit: str | None = None) -> int:
        r = await self._http.post(self._url(f"{self._prefix}/records"), json=_add_body(records, time_unit),
                                  headers=self._headers)
        return int(_check(r)["added"])

    async def search(self, queries: str | Sequence[str], k: int = 10, where: Any = None, config: str | None = None,
                     min_score: float | None = None, time_unit: str | None = None,
                     ranking: str | None = None) -> HitLists:
        """:meth:`MemoryClient.search` as a coroutine (the same arguments: ``min_score`` is a relevance in
        [0, 1] with the hybrid ranking, a BM25 score with BM25)."""
        body = _search_body(queries, k, where, config, min_score, time_unit, ranking)
        r = await self._http.post(self._url(f"{self._prefix}/search"), json=body, headers=self._headers)
        return HitLists(x["hits"] for x in _check(r)["results"])

    async def update(self, records: Mapping[str, Any] | Iterable[Mapping[str, Any]], replace: bool = False,
                     time_unit: str | None = None) -> int:
        n = 0
        for rec in _records(records):
            rid, body = _patch(rec)
            method = self._http.put if replace else self._http.patch
            r = await method(self._url(self._rec(rid)), json=body, params=_unit(time_unit), headers=self._headers)
            n += _changed(_check(r))
        return n

    async def upsert(self, records: Mapping[str, Any] | Iterable[Mapping[str, Any]], replace: bool = False,
                     time_unit: str | None = None) -> int:
        n = 0
        for rec in _records(records):
            rid, body = _patch(rec)
            url, params = self._url(self._rec(rid)), _unit(time_unit)
            r = None if replace else await self._http.patch(url, json=body, params=params, headers=self._headers)
            if r is None or r.status_code == 404:
                r = await self._http.put(url, json=body, params=params, headers=self._headers)
            n += _changed(_check(r))
        return n

    async def list(self, where: Any = None, order_by: str = "seq", descending: bool = False, limit: int = 100,
                   cursor: str | None = None, time_unit: str | None = None) -> Page:
        params = _list_params(where, order_by, descending, limit, cursor, time_unit)
        r = await self._http.get(self._url(f"{self._prefix}/records"), params=params, headers=self._headers)
        return self._page(_check(r))

    async def iter_records(self, where: Any = None, order_by: str = "seq", descending: bool = False,
                           page_size: int = 1000) -> AsyncIterator[dict[str, Any]]:
        cursor = None
        while True:
            page = await self.list(where, order_by, descending, page_size, cursor)
            for rec in page.records:
                yield rec
            cursor = page.cursor
            if cursor is None:
                return

    async def count(self, where: Any = None, time_unit: str | None = None) -> int:
        params = {**_unit(time_unit), **({} if where is None else {"where": json.dumps(where)})}
        r = await self._http.get(self._url(f"{self._prefix}/count"), params=params, headers=self._headers)
        return int(_check(r)["count"])

    async def history(self, id: str) -> list[dict[str, Any]]:
        r = await self._http.get(self._url(self._rec(id) + "/history"), headers=self._headers)
        return _check(r)["versions"]

    async def get(self, id: str) -> dict[str, Any] | None:
        r = await self._http.get(self._url(self._rec(id)), headers=self._headers)
        return None if r.status_code == 404 else _check(r)

    async def delete(self, ids: str | Iterable[str] | None = None, missing_ok: bool = False, where: Any = None,
                     time_unit: str | None = None) -> int:
        r = await self._http.post(self._url(f"{self._prefix}/delete"), headers=self._headers,
                                  json=_delete_body(ids, missing_ok, where, time_unit))
        return _deleted(r)

    async def delete_all(self) -> int:
        r = await self._http.post(self._url(f"{self._prefix}/delete"), headers=self._headers, json={"all": True})
        return _deleted(r)

    async def health(self) -> dict[str, Any]:
        return _check(await self._http.get(self._url("/healthz")))

    async def aclose(self) -> None:
        if self._own:
            await self._http.aclose()

    async def __aenter__(self) -> AsyncMemoryClient:  # noqa: PYI034
        return self

    async def __aexit__(self, *exc) -> None:
        await self.aclose()
