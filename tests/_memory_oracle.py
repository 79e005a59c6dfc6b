"""An independent model of a memory, for the Memory tests (imported, not fixtures).

The model keeps the live records in add order (a plain dict, ids -> record) and
answers a search by building a fresh :class:`~gpuir.engine.BM25Index` over them,
with each query's ``where`` evaluated here in plain Python on the record dicts
(a second implementation of the filter semantics), turned into an allow-list of
user ids.
"""

from __future__ import annotations

from datetime import datetime, timezone

import numpy as np

from gpuir import BM25Index

WORDS = [f"w{i}" for i in range(30)]
TENANTS = ["acme", "globex", "initech", "umbrella"]
ROLES = ["user", "assistant", "tool", "system"]
DAY = 86_400_000
T0 = 1_700_000_000_000


def ms(t) -> int | None:
    """A record's time in epoch ms, computed independently of gpuir."""
    if t is None:
        return None
    if isinstance(t, int):  # a record read back from a snapshot (the canonical form)
        return t
    dt = datetime.fromisoformat(t.replace("Z", "+00:00"))
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=timezone.utc)
    return round(dt.timestamp() * 1000)


def iso_out(t: int) -> str:
    """How a memory gives a time back: ISO 8601 UTC, milliseconds only when not zero (computed here)."""
    dt = datetime.fromtimestamp(t // 1000, tz=timezone.utc).replace(microsecond=(t % 1000) * 1000)
    return dt.isoformat(timespec="milliseconds" if t % 1000 else "seconds")


def iso(t: int) -> str:
    """Epoch ms as an ISO 8601 string with milliseconds (as a caller would send it)."""
    dt = datetime.fromtimestamp(t // 1000, tz=timezone.utc)
    return dt.strftime("%Y-%m-%dT%H:%M:%S") + f".{t % 1000:03d}Z"


def random_record(rng: np.random.Generator, rid: str) -> dict:
    """A record with Zipfian short text (many exact ties) and random optional fields."""
    p = 1.0 / np.arange(1, len(WORDS) + 1)
    n = int(rng.integers(0, 9))
    rec = {"id": rid, "text": " ".join(rng.choice(WORDS, size=n, p=p / p.sum()))}
    if rng.random() < 0.9:
        rec["tenant"] = str(rng.choice(TENANTS))
    if rng.random() < 0.8:
        rec["role"] = str(rng.choice(ROLES))
    if rng.random() < 0.7:
        rec["session"] = f"s{int(rng.integers(0, 5))}"
    if rng.random() < 0.5:
        rec["agent"] = f"agent{int(rng.integers(0, 3))}"
    if rng.random() < 0.85:
        t = T0 + int(rng.integers(0, 12 * DAY))
        if rng.random() < 0.3:  # whole seconds, without the milliseconds
            t -= t % 1000
            rec["time"] = datetime.fromtimestamp(t / 1000, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        else:
            rec["time"] = iso(t)
    if rng.random() < 0.6:
        rec["importance"] = float(np.round(rng.random(), 2))
    if rng.random() < 0.4:
        rec["type"] = str(rng.choice(["event", "fact", "preference"]))
    if rng.random() < 0.6:
        meta = {"speaker": str(rng.choice(["Ann", "Bob", "Cy"])), "n": int(rng.integers(0, 5))}
        if rng.random() < 0.3:
            meta["flag"] = bool(rng.random() < 0.5)
        rec["metadata"] = meta
    return rec


def random_query(rng: np.random.Generator) -> str:
    words = list(rng.choice(WORDS + ["zzz", "the"], size=int(rng.integers(1, 5))))
    if rng.random() < 0.3:
        words.append(words[0])  # a repeated term
    return " ".join(words)


def random_where(rng: np.random.Generator, timed: bool = True) -> dict:
    """A random filter over every kind of field and operator."""
    w: dict = {}
    r = rng.random()
    if r < 0.4:
        w["tenant"] = str(rng.choice(TENANTS))
    if rng.random() < 0.3:
        w["role"] = {"in": [str(x) for x in rng.choice(ROLES, size=2, replace=False)]}
    if timed and rng.random() < 0.3:
        lo = T0 + int(rng.integers(0, 8)) * DAY
        w["time"] = {"gte": iso(lo), "lt": iso(lo + int(rng.integers(1, 5)) * DAY)}
    elif timed and rng.random() < 0.15:
        w["time"] = {"lte": iso(T0 + int(rng.integers(0, 12)) * DAY)}  # records without a time never match
    elif timed and rng.random() < 0.05:
        w["time"] = None  # only records without a time
    if rng.random() < 0.2:
        w["importance"] = {"gte": 0.3}
    if rng.random() < 0.2:
        w["metadata.speaker"] = str(rng.choice(["Ann", "Bob"]))
    if rng.random() < 0.15:
        w["metadata"] = {"n": {"lt": 3}}
    if rng.random() < 0.1:
        w["metadata.flag"] = bool(rng.random() < 0.5)
    if rng.random() < 0.1:
        w["importance"] = None
    if rng.random() < 0.1:
        w["session"] = None
    if rng.random() < 0.1:
        w["type"] = {"gte": "f"}
    if not w:
        w["agent"] = {"in": ["agent0", "agent2"]}
    return w


def _eq(val, x) -> bool:
    if x is None:
        return val is None  # absent (or JSON null in metadata)
    if val is None:
        return False
    if isinstance(x, bool) or isinstance(val, bool):
        return isinstance(x, bool) and isinstance(val, bool) and x == val
    if isinstance(x, (int, float)):
        return isinstance(val, (int, float)) and val == x
    return isinstance(val, str) and val == x


def _cmp(val, op, x) -> bool:
    if val is None or isinstance(val, bool):
        return False
    if isinstance(x, str) != isinstance(val, str):
        return False
    return {"gt": val > x, "gte": val >= x, "lt": val < x, "lte": val <= x}[op]


def _check(val, cond) -> bool:
    if not isinstance(cond, dict):
        cond = {"eq": cond}
    for op, x in cond.items():
        if op == "eq":
            ok = _eq(val, x)
        elif op == "in":
            ok = any(_eq(val, y) for y in x)
        else:
            ok = _cmp(val, op, x)
        if not ok:
            return False
    return True


def matches(rec: dict, where: dict | None) -> bool:
    """The filter semantics, written independently of gpuir.memory.where."""
    if where is None:
        return True
    for k, c in where.items():
        if k == "metadata":
            if not all(matches(rec, {f"metadata.{mk}": mc}) for mk, mc in c.items()):
                return False
        elif k.startswith("metadata."):
            if not _check((rec.get("metadata") or {}).get(k[len("metadata."):]), c):
                return False
        elif k == "time":
            if isinstance(c, dict):
                c = {op: ([ms(y) for y in x] if op == "in" else ms(x)) for op, x in c.items()}
            else:
                c = ms(c)
            if not _check(ms(rec.get("time")), c):
                return False
        elif not _check(rec.get(k), c):
            return False
    return True


class Model:
    """The live records in add order (an update moves a record to the end)."""

    def __init__(self, **params):
        self.params = params
        self.live: dict[str, dict] = {}
        self._fresh = None

    def add(self, recs):
        for r in recs:
            assert r["id"] not in self.live
            self.live[r["id"]] = r
        self._fresh = None

    def update(self, recs):
        for r in recs:
            del self.live[r["id"]]
            self.live[r["id"]] = r
        self._fresh = None

    def delete(self, ids):
        for i in ids:
            del self.live[i]
        self._fresh = None

    def fresh(self) -> BM25Index | None:
        """A fresh index over the live records in add order (None when there are none)."""
        recs = list(self.live.values())
        if not recs:
            return None
        if self._fresh is None:
            self._fresh = BM25Index.build([r["text"] for r in recs], ids=[r["id"] for r in recs], progress=False,
                                          **self.params)
        return self._fresh

    def search(self, queries, k, where=None, allowed_ids=None, ties="oldest"):
        """(ids list per query, scores (B, k) float32) from a fresh index.

        ``ties="newest"``: equal scores newest first (later time first, records without a time after the
        timed ones, then later add order), from every match of the fresh index re-sorted here.
        """
        if ties == "newest":
            n = max(1, len(self.live))
            ids, scores = self.search(queries, n, where, allowed_ids)
            pos = {rid: i for i, rid in enumerate(self.live)}
            out_ids, out_sc = [], np.full((len(queries), k), -np.inf, np.float32)
            for i, row in enumerate(ids):
                t = [ms(self.live[r].get("time")) for r in row]
                order = sorted(range(len(row)), key=lambda j: (-float(scores[i, j]), t[j] is None,
                                                               -(t[j] or 0), -pos[row[j]]))[:k]
                out_ids.append([row[j] for j in order])
                out_sc[i, : len(order)] = scores[i, order]
            return out_ids, out_sc
        idx = self.fresh()
        B = len(queries)
        if idx is None:
            return [[] for _ in range(B)], np.full((B, k), -np.inf, np.float32)
        ws = where if isinstance(where, list) else [where] * B
        filters = []
        for w in ws:
            ok = [r["id"] for r in self.live.values() if matches(r, w)
                  and (allowed_ids is None or r["id"] in allowed_ids)]
            filters.append(np.array(ok, dtype=object) if (w is not None or allowed_ids is not None) else None)
        if all(f is None for f in filters):
            filters = None
        else:
            filters = [f if f is None or f.size else np.zeros(0, np.int64) for f in filters]
        res = idx.search(queries, k=k, filters=filters, backend="numpy")
        return [[idx.ids[d] for d in row if d >= 0] for row in res.ids], res.scores


def grow_both(memory, model: Model, rng: np.random.Generator, step: int, n: int, every: int) -> None:
    """One batch of ``n`` random records ``r{step}-{i}`` added to the memory and its model, then every
    ``every``-th of them deleted from both (tombstones for the memory)."""
    recs = [random_record(rng, f"r{step}-{i}") for i in range(n)]
    memory.add(recs)
    model.add(recs)
    dead = [f"r{step}-{i}" for i in range(0, n, every)]
    memory.delete(dead)
    model.delete(dead)


def assert_same(mem_res, ids, scores, what=""):
    """Memory results equal the fresh index's: ids in order, float32 scores bit for bit."""
    for i in range(len(ids)):
        assert mem_res.ids(i) == ids[i], f"{what} query {i}: ids {mem_res.ids(i)} != {ids[i]}"
    # BM25Index and Memory rows are min(k, N) wide (k clamped to the collection); an expectation may be k wide:
    # the columns both have must be equal, and whatever one has beyond the other must be padding
    got, want = np.asarray(mem_res.scores), np.asarray(scores)
    w = min(got.shape[1], want.shape[1])
    np.testing.assert_array_equal(got[:, :w], want[:, :w], err_msg=what)
    assert np.all(np.isneginf(got[:, w:])) and np.all(np.isneginf(want[:, w:])), what
