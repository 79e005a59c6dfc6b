"""Entity-graph retriever: rule-based entities, an entity-record incidence matrix, hop scores.

* :func:`extract_entities`: capitalised spans, the speaker and quoted titles of a
  text, as lowercase keys (no model, no download).
* :class:`EntityGraph`: the records of a memory and the entities they mention,
  kept in :mod:`scipy.sparse` matrices and updated incrementally on ``add`` and
  ``remove``; :meth:`EntityGraph.score` ranks records by their hop distance from
  the query's entities with Arc Labs' scores :data:`HOP_SCORES`.

See ``docs/entity-graph.md`` for the rules and the measured figures.
"""

from __future__ import annotations

import functools
import json
import os
import re
import threading
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from ..storage.files import fsync_dir, sha256_file

__all__ = ["COMMON_WORDS", "HOP_SCORES", "EntityGraph", "extract_entities", "is_multi_hop_query"]

#: Score of a record whose best path from a query entity has 0, 1, 2, 3 hops (Arc Labs).
HOP_SCORES: tuple[float, ...] = (1.0, 0.6, 0.35, 0.15)

#: Capitalised words that are never (part of) an entity: function words,
#: pronouns, question words, auxiliaries, conversational openers, the days and
#: the months ("May", "March" and "Sunday" are far more often dates or verbs than
#: names in chat). They break a capitalised span wherever they occur.
_COMMON_TEXT = """
a about above after again against all almost also although always am among an and another any anybody anyone
anything anyway anyways are around as at away back be because been before being below besides between both but
by can cannot could did do does doing done down during each either else enough even ever every everybody
everyone everything few first for from further had has have having he her here hers herself him himself his how
however i if in into is it its itself just last least less let like made make many may maybe me might mine more
most much must my myself neither never next no nobody none nor not nothing now of off often on once one only
or other others our ours ourselves out over own perhaps please quite rather really same several shall she should
since so some somebody someone something sometimes soon still such than that the their theirs them themselves
then there these they this those though through thus to today together tomorrow too toward towards under
unless until up upon us very was we well were what whatever when whenever where whether which while who whoever
whom whose why will with within without would yet you your yours yourself yourselves yesterday tonight
i'm i've i'd i'll im ive id it's that's what's there's here's let's he's she's we're we've we'd we'll they're
they've they'd they'll you're you've you'd you'll don't doesn't didn't can't won't isn't aren't wasn't weren't
haven't hasn't hadn't wouldn't couldn't shouldn't how's where's who's when's why's
hey hi hello hiya howdy bye goodbye oh ooh ah aah aw aww awww wow whoa yay yeah yes yep yup no nope nah ok okay
okey hmm hm um uh haha hahaha lol omg btw thanks thank thx ty congrats congratulations sorry sure cool great
nice awesome amazing wonderful fantastic lovely good glad happy sounds sound love totally definitely absolutely
exactly true right indeed agreed anyways alright besides plus yea guess wish hope dear
woah whoah woohoo wanna gonna gotta cheers oof yikes whew phew dude bro ugh eh
mr mrs ms dr st mt jr sr
monday tuesday wednesday thursday friday saturday sunday weekend
january february march april june july august september october november december
jan feb mar apr jun jul aug sep sept oct nov dec
"""
COMMON_WORDS: frozenset[str] = frozenset(_COMMON_TEXT.split())

_CONNECTORS = frozenset({"of", "the", "de", "da", "du", "del", "la", "le", "van", "von", "al"})
_WORD = re.compile(r"[A-Za-z0-9]+(?:['\u2019&.-][A-Za-z0-9]+)*")
_SENTENCE_END = re.compile(r"[.!?\u2026\n]")
_ABBREV = frozenset({"mr", "mrs", "ms", "dr", "st", "mt", "jr", "sr", "prof", "vs", "etc", "e.g", "i.e"})
_INITIAL_VERBISH = re.compile(r"(?:ing|ed|ly)$")
_QUOTED = re.compile(r"[\"\u201c]([^\"\u201c\u201d\n]{2,80})[\"\u201d]")
_POSSESSIVE = re.compile(r"['\u2019]s?$")
_MULTI_HOP = re.compile(
    r"\b(both|in common|together|between|related|relationship|connect(?:ed|ion)?|same|also|each other|"
    r"compare|similar|who else|what other|and)\b", re.IGNORECASE)


def _norm(word: str) -> str:
    return _POSSESSIVE.sub("", word.replace("\u2019", "'")).lower()


def _speaker_key(speaker: str | None) -> str | None:
    if speaker is None:
        return None
    if not isinstance(speaker, str):
        raise TypeError(f"speaker must be a str or None, got {type(speaker).__name__}")
    key = " ".join(_norm(w) for w in _WORD.findall(speaker))
    return key or None


def extract_entities(text: str, speaker: str | None = None) -> list[str]:
    """The entities a text mentions, as normalised keys, deduplicated, in order of first mention.

    Rules (see ``docs/entity-graph.md``):

    * the speaker (when given) comes first; a leading ``"<speaker>: "`` of the
      text (LoCoMo's turn format) is dropped;
    * quoted spans of 1-8 words with a capitalised word (titles: ``"Becoming
      Nicole"``), a leading article dropped (``"The Alchemist"`` -> ``alchemist``);
    * maximal spans of capitalised words (``New York``, ``Pride Parade``,
      ``LGBTQ``), joined across the connectors ``of the de la van von ...`` when a
      capitalised word follows (``Lord of the Rings``), broken by punctuation,
      lowercase words, numbers and :data:`COMMON_WORDS` (``The Beatles`` ->
      ``beatles``, ``Hey Caroline`` -> ``caroline``, ``May`` never);
    * possessives are stripped (``Caroline's`` -> ``caroline``); keys are lowercase,
      words joined by one space. Single letters are never entities.

    Sentence-initial words are ambiguous (``Keep going``, ``Painting looks
    great``): a one-word span at the start of a sentence (the text's start, or
    after ``. ! ? ...`` or a newline) is kept only when it is written in
    capitals (``LGBTQ``), possessive (``Jon's``), or mentioned again inside a
    sentence of the same text (a period after ``Dr``, ``Mr``, ``St`` ... or an
    initial does not end a sentence); a sentence-initial first word ending in
    ``-ing``, ``-ed`` or ``-ly`` is dropped from a longer span (``Visiting New
    York`` -> ``new york``). Names at the start of a sentence are lost by this
    rule unless repeated; the speaker is always kept.

    Parameters
    ----------
    text : str
    speaker : str or None

    Returns
    -------
    list of str
    """
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    found: list[tuple[str, bool]] = []   # (key, tentative) in order of mention
    sk = _speaker_key(speaker)
    if sk is not None:
        found.append((sk, False))
        if text.startswith(speaker + ":"):
            text = text[len(speaker) + 1:]
    for m in _QUOTED.finditer(text):
        words = _WORD.findall(m.group(1))
        while words and words[0].lower() in ("the", "a", "an"):
            words.pop(0)
        if 1 <= len(words) <= 8 and any(w[0].isupper() for w in words):
            found.append((" ".join(_norm(w) for w in words), False))

    span: list[str] = []      # capitalised words of the open span (normalised)
    raw: list[str] = []       # the same words as written
    pending: list[str] = []   # connectors seen after the span, waiting for a capitalised word
    state = {"initial": False}

    def close() -> None:
        if span and state["initial"] and _INITIAL_VERBISH.search(span[0]):
            span.pop(0)
            raw.pop(0)
        if span:
            w = raw[0]
            tentative = (state["initial"] and len(span) == 1 and not w.isupper()
                         and not _POSSESSIVE.search(w))
            found.append((" ".join(span), tentative))
        span.clear()
        raw.clear()
        pending.clear()

    pos = 0
    prev = ""
    sentence_start = True
    for m in _WORD.finditer(text):
        gap = text[pos:m.start()]
        pos = m.end()
        if gap.strip():  # punctuation between words breaks a span
            close()
            if _SENTENCE_END.search(gap) and not (
                    gap.strip() == "." and (prev.lower() in _ABBREV or len(prev) == 1)):
                sentence_start = True
        w = prev = m.group(0)
        low = _norm(w)
        cap = w[0].isupper() and len(w) > 1
        initial, sentence_start = sentence_start, False
        if cap and low not in COMMON_WORDS:
            if pending:
                if span:
                    span.extend(pending)
                    raw.extend(pending)
                pending.clear()
            if not span:
                state["initial"] = initial
            span.append(low)
            raw.append(w)
            continue
        if span and w.islower() and low in _CONNECTORS and len(pending) < 2:
            pending.append(low)
            continue
        close()
    close()
    confirmed = {k for k, t in found if not t}
    out: list[str] = []
    for k, t in found:
        if k and k not in out and (not t or k in confirmed):
            out.append(k)
    return out


def is_multi_hop_query(query: str) -> bool:
    """True when a question asks to connect entities.

    Rule: the question names at least two distinct entities (by
    :func:`extract_entities`) and contains a connecting word (``both``, ``in
    common``, ``together``, ``between``, ``related``, ``same``, ``also``,
    ``compare``, ``similar``, ``each other``, ``and`` ...).
    """
    return len(extract_entities(query)) >= 2 and _MULTI_HOP.search(query) is not None


def _locked(method):
    """Run a method under the graph's lock (queries flush and cache, so they mutate too)."""

    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        with self._lock:
            return method(self, *args, **kwargs)

    return wrapper


def _check_allowed(allowed: np.ndarray | None) -> np.ndarray | None:
    if allowed is None:
        return None
    allowed = np.asarray(allowed)
    if allowed.ndim != 1 or (allowed.size and not np.issubdtype(allowed.dtype, np.integer)):
        raise ValueError(f"allowed must be a 1-D integer array of seqs, got shape {allowed.shape} "
                         f"dtype {allowed.dtype}")
    return allowed.astype(np.int64, copy=False)


def _csr(indptr: np.ndarray, indices: np.ndarray, shape: tuple[int, int]) -> sp.csr_matrix:
    data = np.ones(len(indices), np.int32)
    return sp.csr_matrix((data, indices.astype(np.int32, copy=False), indptr.astype(np.int64, copy=False)),
                         shape=shape)


def _reshape(m: sp.spmatrix, shape: tuple[int, int]) -> sp.csr_matrix:
    m = m.tocsr()
    indptr = m.indptr
    if shape[0] > m.shape[0]:
        indptr = np.concatenate([indptr, np.full(shape[0] - m.shape[0], indptr[-1], indptr.dtype)])
    return sp.csr_matrix((m.data, m.indices, indptr), shape=shape)


class EntityGraph:
    """Records, the entities they mention, and the entities' co-mentions, as sparse matrices.

    Storage
    -------
    * record *slots* (0, 1, ...) in order of addition; ``slot -> seq`` in an int64
      array, ``seq -> slot`` in a dict; removed records are tombstoned (a live
      mask) and the store is compacted when more than half the slots are dead;
    * the incidence matrix (slots x entities, binary) in two CSR blocks: a *main*
      block with its CSC transpose cached for queries, and a *tail* block of
      recent additions merged into the main block when it exceeds
      ``max(batch, main rows / 4)`` (amortised appends); new rows wait in a
      pending list until the next query or ``batch`` rows;
    * per-entity live record counts ``df`` (int64) and the co-mention count matrix
      ``A = M_live^T M_live`` (entities x entities, CSR, diagonal dropped), updated
      by ``+= B^T B`` for each appended block and ``-= R^T R`` for removed rows.

    Scoring
    -------
    Query entities (hop 0) expand along co-mentions: hop ``h`` entities are the
    co-mentioned neighbours of hop ``h-1`` entities not reached earlier; a record
    takes its best hop and the score ``HOP_SCORES[hop]``. *Hub* entities (live
    record count > ``hub_fraction`` x live records and >= ``hub_min_records``;
    in a conversation: its speakers) are never expanded through nor reached by
    expansion. With ``hub_mode="demote"`` (default) a hub named by the query
    counts as hop 1 instead of 0 when the query also names a non-hub entity; with
    ``"plain"`` it stays at hop 0.

    Every public method holds the graph's re-entrant lock (queries flush pending
    rows and cache the CSC), so threads may share one graph.

    Parameters
    ----------
    hub_fraction : float or None
        None disables hubs.
    hub_min_records : int
    hub_mode : {"demote", "plain"}
    batch : int
        Pending rows flushed into the matrices once this many accumulate.
    """

    def __init__(self, *, hub_fraction: float | None = 0.1, hub_min_records: int = 20,
                 hub_mode: str = "demote", batch: int = 1024) -> None:
        if hub_fraction is not None and not 0 < hub_fraction <= 1:
            raise ValueError(f"hub_fraction must be in (0, 1] or None, got {hub_fraction!r}")
        if hub_mode not in ("demote", "plain"):
            raise ValueError(f"hub_mode must be 'demote' or 'plain', got {hub_mode!r}")
        if int(batch) < 1 or int(hub_min_records) < 1:
            raise ValueError("batch and hub_min_records must be >= 1")
        self.hub_fraction = hub_fraction
        self.hub_min_records = int(hub_min_records)
        self.hub_mode = hub_mode
        self.batch = int(batch)
        self._lock = threading.RLock()
        self._keys: list[str] = []
        self._key_id: dict[str, int] = {}
        self._slot_seq = np.zeros(0, np.int64)
        self._live = np.zeros(0, bool)
        self._seq_slot: dict[int, int] = {}
        self._main = _csr(np.zeros(1, np.int64), np.zeros(0, np.int32), (0, 0))
        self._main_csc: sp.csc_matrix | None = None
        self._tail = _csr(np.zeros(1, np.int64), np.zeros(0, np.int32), (0, 0))
        self._tail_csc: sp.csc_matrix | None = None
        self._pending_rows: list[np.ndarray] = []   # entity ids of each pending slot
        self._pending_seqs: list[int] = []
        self._df = np.zeros(0, np.int64)
        self._A = sp.csr_matrix((0, 0), dtype=np.int64)

    # ------------------------------------------------------------------ sizes
    @property
    def n_records(self) -> int:
        """Live records (added, not removed), pending ones included."""
        return int(self._live.sum()) + len(self._pending_seqs)

    @property
    @_locked
    def n_entities(self) -> int:
        """Entities mentioned by at least one live record."""
        self._flush()
        return int((self._df > 0).sum())

    def _n_slots(self) -> int:
        return self._main.shape[0] + self._tail.shape[0]

    # ------------------------------------------------------------------ updates
    def _entity_ids(self, keys: list[str]) -> np.ndarray:
        ids = []
        for k in keys:
            i = self._key_id.get(k)
            if i is None:
                i = self._key_id[k] = len(self._keys)
                self._keys.append(k)
            ids.append(i)
        return np.unique(np.asarray(ids, np.int32))

    @_locked
    def add(self, seqs: np.ndarray, texts: Sequence[str], speakers: Sequence[str | None]) -> None:
        """Add records (a seq already present is replaced: upsert).

        Parameters
        ----------
        seqs : ndarray, shape (n,), int64, host
            Record sequence numbers, distinct.
        texts : sequence of str, length n
        speakers : sequence of (str or None), length n
        """
        seqs = np.asarray(seqs)
        if seqs.ndim != 1 or (seqs.size and not np.issubdtype(seqs.dtype, np.integer)):
            raise ValueError(f"seqs must be a 1-D integer array, got shape {seqs.shape} dtype {seqs.dtype}")
        seqs = seqs.astype(np.int64)
        if len(texts) != len(seqs) or len(speakers) != len(seqs):
            raise ValueError(f"seqs, texts and speakers must have one entry per record: "
                             f"{len(seqs)}, {len(texts)}, {len(speakers)}")
        if len(np.unique(seqs)) != len(seqs):
            raise ValueError("seqs must be distinct within one add() call")
        present = [s for s in seqs.tolist() if s in self._seq_slot or s in self._pending_set()]
        if present:
            self.remove(np.asarray(present, np.int64))
        for s, t, who in zip(seqs.tolist(), texts, speakers):
            self._pending_rows.append(self._entity_ids(extract_entities(t, who)))
            self._pending_seqs.append(s)
        self._pending_cache = None
        if len(self._pending_seqs) >= self.batch:
            self._flush()

    def _pending_set(self) -> set[int]:
        cache = getattr(self, "_pending_cache", None)
        if cache is None:
            cache = self._pending_cache = set(self._pending_seqs)
        return cache

    def _flush(self) -> None:
        """Move pending rows into the tail block and the counts."""
        if not self._pending_seqs:
            return
        n_ent = len(self._keys)
        rows = self._pending_rows
        indptr = np.zeros(len(rows) + 1, np.int64)
        np.cumsum([len(r) for r in rows], out=indptr[1:])
        indices = np.concatenate(rows) if rows else np.zeros(0, np.int32)
        block = _csr(indptr, indices, (len(rows), n_ent))
        start = self._n_slots()
        self._slot_seq = np.concatenate([self._slot_seq, np.asarray(self._pending_seqs, np.int64)])
        self._live = np.concatenate([self._live, np.ones(len(rows), bool)])
        for j, s in enumerate(self._pending_seqs):
            self._seq_slot[s] = start + j
        self._pending_rows, self._pending_seqs, self._pending_cache = [], [], None
        # counts
        self._df = np.concatenate([self._df, np.zeros(n_ent - len(self._df), np.int64)])
        self._df += np.bincount(indices, minlength=n_ent).astype(np.int64)
        self._A = _reshape(self._A, (n_ent, n_ent)) + self._comention(block)
        # blocks
        self._main = _reshape(self._main, (self._main.shape[0], n_ent))
        self._tail = sp.vstack([_reshape(self._tail, (self._tail.shape[0], n_ent)), block], format="csr")
        self._tail_csc = None
        # the cached main CSC keeps its column count: main rows only change at a merge
        if self._tail.shape[0] > max(self.batch, self._main.shape[0] // 4):
            self._main = sp.vstack([self._main, self._tail], format="csr")
            self._tail = _csr(np.zeros(1, np.int64), np.zeros(0, np.int32), (0, n_ent))
            self._main_csc = None

    @staticmethod
    def _comention(block: sp.csr_matrix) -> sp.csr_matrix:
        c = (block.T.astype(np.int64) @ block.astype(np.int64)).tocoo()
        off = c.row != c.col
        return sp.csr_matrix((c.data[off], (c.row[off], c.col[off])), shape=c.shape)

    @_locked
    def remove(self, seqs: np.ndarray) -> None:
        """Remove records; seqs not in the graph are ignored.

        Parameters
        ----------
        seqs : ndarray, shape (n,), int64, host
        """
        seqs = np.asarray(seqs)
        if seqs.ndim != 1 or (seqs.size and not np.issubdtype(seqs.dtype, np.integer)):
            raise ValueError(f"seqs must be a 1-D integer array, got shape {seqs.shape} dtype {seqs.dtype}")
        if not seqs.size:
            return
        self._flush()
        slots = [self._seq_slot.pop(s) for s in np.unique(seqs).tolist() if s in self._seq_slot]
        if not slots:
            return
        slots_a = np.asarray(slots, np.int64)
        self._live[slots_a] = False
        m0 = self._main.shape[0]
        parts = []
        if (slots_a < m0).any():
            parts.append(self._main[slots_a[slots_a < m0]])
        if (slots_a >= m0).any():
            parts.append(self._tail[slots_a[slots_a >= m0] - m0])
        removed = sp.vstack(parts, format="csr") if len(parts) > 1 else parts[0]
        self._df -= np.bincount(removed.indices, minlength=len(self._df)).astype(np.int64)
        self._A = (self._A - self._comention(removed)).tocsr()
        self._A.eliminate_zeros()
        if (~self._live).sum() * 2 > len(self._live):
            self._compact()

    def _compact(self) -> None:
        """Drop dead slots: rebuild the blocks from the live rows (slots renumbered)."""
        keep = np.flatnonzero(self._live)
        full = sp.vstack([self._main, self._tail], format="csr")[keep]
        self._main = full.tocsr()
        self._main_csc = None
        self._tail = _csr(np.zeros(1, np.int64), np.zeros(0, np.int32), (0, len(self._keys)))
        self._tail_csc = None
        self._slot_seq = self._slot_seq[keep]
        self._live = np.ones(len(keep), bool)
        self._seq_slot = {s: i for i, s in enumerate(self._slot_seq.tolist())}

    # ------------------------------------------------------------------ queries
    @_locked
    def query_entities(self, query: str) -> list[str]:
        """The query's entities known to the graph (mentioned by a live record), in order.

        A query without any capital letter is matched word n-gram by word n-gram
        (1-3 words) against the graph's entities instead.
        """
        self._flush()
        if not isinstance(query, str):
            raise TypeError(f"query must be a str, got {type(query).__name__}")
        cands = extract_entities(query)
        if not any(c.isupper() for c in query):
            words = [_norm(w) for w in _WORD.findall(query)]
            cands = [" ".join(words[i:i + n]) for i in range(len(words)) for n in (3, 2, 1)
                     if i + n <= len(words) and not (n == 1 and words[i] in COMMON_WORDS)]
        out = []
        for c in cands:
            i = self._key_id.get(c)
            if i is not None and self._df[i] > 0 and c not in out:
                out.append(c)
        return out

    def is_multi_hop(self, query: str) -> bool:
        """Whether the query asks to connect entities (:func:`is_multi_hop_query`)."""
        return is_multi_hop_query(query)

    def _hubs(self, rows: np.ndarray | None = None, df: np.ndarray | None = None) -> np.ndarray:
        """Hub mask over entities, shape (n_entities,), bool: counted over the live slots
        ``rows`` admits (bool mask over slots; ``df`` its column counts when known) or over all live slots."""
        if rows is None:
            n, df = int(self._live.sum()), self._df
        else:
            n = int(rows.sum())
            df = self._column_counts(rows) if df is None else df
        if self.hub_fraction is None or n == 0:
            return np.zeros(len(self._keys), bool)
        return (df > self.hub_fraction * n) & (df >= self.hub_min_records)

    def _column_counts(self, rows: np.ndarray) -> np.ndarray:
        """Records among the slots ``rows`` (bool, shape (n_slots,)) mentioning each entity."""
        m0 = self._main.shape[0]
        out = np.zeros(len(self._keys), np.int64)
        for block, mask in ((self._main, rows[:m0]), (self._tail, rows[m0:])):
            if block.nnz and mask.any():
                out += np.bincount(block[np.flatnonzero(mask)].indices, minlength=len(self._keys))
        return out

    def _csc(self) -> tuple[sp.csc_matrix, sp.csc_matrix]:
        if self._main_csc is None:
            self._main_csc = self._main.tocsc()
            self._main_csc.sort_indices()
        if self._tail_csc is None:
            self._tail_csc = self._tail.tocsc()
        return self._main_csc, self._tail_csc

    def _slots_of(self, ents: np.ndarray, ent_hop: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(slots, hops): every (slot, entity hop) pair of a slot mentioning one of ``ents``."""
        main, tail = self._csc()
        m0 = main.shape[0]
        slots, hops = [], []
        for block, off in ((main, 0), (tail, m0)):
            if not block.nnz:
                continue
            cols = ents[ents < block.shape[1]]
            sub = block[:, cols]
            slots.append(sub.indices.astype(np.int64) + off)
            hops.append(np.repeat(ent_hop[cols], np.diff(sub.indptr)))
        if not slots:
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        return np.concatenate(slots), np.concatenate(hops)

    def _entities_of(self, slots: np.ndarray) -> np.ndarray:
        """Distinct entity ids the slots mention."""
        m0 = self._main.shape[0]
        parts = [self._main[slots[slots < m0]].indices, self._tail[slots[slots >= m0] - m0].indices]
        return np.unique(np.concatenate(parts)).astype(np.int64)

    @_locked
    def entity_hops(self, query: str, max_hops: int = 2, allowed: np.ndarray | None = None) -> dict[str, int]:
        """The hop of each entity reached from the query (for diagnostics)."""
        self._flush()
        hops = self._entity_hops(query, max_hops, self._row_mask(_check_allowed(allowed)))
        return {self._keys[i]: int(h) for i, h in enumerate(hops) if h >= 0}

    def _row_mask(self, allowed: np.ndarray | None) -> np.ndarray | None:
        """Live slots whose seq ``allowed`` admits (bool, shape (n_slots,)), or None for all."""
        if allowed is None:
            return None
        return self._live & np.isin(self._slot_seq, allowed)

    def _entity_hops(self, query: str, max_hops: int, rows: np.ndarray | None) -> np.ndarray:
        """Hop of each entity (int64, shape (n_entities,), -1: unreached).

        ``rows`` None: expansion along the co-mention matrix of all live records;
        otherwise along the records ``rows`` admits only (entity -> records ->
        entities through the incidence matrix), with hubs counted among them.
        """
        if isinstance(max_hops, bool) or not isinstance(max_hops, (int, np.integer)) \
                or not 0 <= max_hops < len(HOP_SCORES):
            raise ValueError(f"max_hops must be an int in 0..{len(HOP_SCORES) - 1}, got {max_hops!r}")
        ids = np.asarray([self._key_id[k] for k in self.query_entities(query)], np.int64)
        n_ent = len(self._keys)
        hop = np.full(n_ent, -1, np.int64)
        if not ids.size:
            return hop
        if rows is not None:  # entities no admitted record mentions are unknown here
            df = self._column_counts(rows)
            ids = ids[df[ids] > 0]
            if not ids.size:
                return hop
        hubs = self._hubs(rows, None if rows is None else df)
        hop[ids] = 0
        if self.hub_mode == "demote" and (~hubs[ids]).any():
            hop[ids[hubs[ids]]] = min(1, max_hops) if max_hops >= 1 else -1
        frontier = ids[~hubs[ids]]
        for h in range(1, max_hops + 1):
            if not frontier.size:
                break
            if rows is None:
                nb = np.unique(self._A[frontier].indices)
            else:
                slots, _ = self._slots_of(frontier, hop)
                nb = self._entities_of(np.unique(slots[rows[slots]]))
            new = nb[(hop[nb] < 0) & ~hubs[nb]]
            hop[new] = h
            frontier = new
        return hop

    @_locked
    def score(self, query: str, allowed: np.ndarray | None = None, max_hops: int = 2,
              depth: int = 100) -> tuple[np.ndarray, np.ndarray]:
        """Records reachable from the query's entities within ``max_hops``, best first.

        Parameters
        ----------
        query : str
        allowed : ndarray, shape (m,), int64, host, optional
            Sorted seqs a where filter admits; None admits all.
        max_hops : int, 0..3
        depth : int, >= 0
            At most this many results.

        Returns
        -------
        seqs : ndarray, shape (n,), int64, host
        scores : ndarray, shape (n,), float32, host
            ``HOP_SCORES[hop]``; order: score desc, seq asc.
        """
        if isinstance(depth, bool) or not isinstance(depth, (int, np.integer)) or depth < 0:
            raise ValueError(f"depth must be an int >= 0, got {depth!r}")
        allowed = _check_allowed(allowed)
        empty = (np.zeros(0, np.int64), np.zeros(0, np.float32))
        self._flush()
        rows = self._row_mask(allowed)
        ent_hop = self._entity_hops(query, max_hops, rows)
        reached = np.flatnonzero(ent_hop >= 0)
        if not reached.size or depth == 0:
            return empty
        slots, hops = self._slots_of(reached, ent_hop)
        rec_hop = np.full(self._n_slots(), len(HOP_SCORES), np.int8)
        for h in range(max_hops, -1, -1):  # deepest first: each record ends with its best hop
            rec_hop[slots[hops == h]] = h
        cand = np.flatnonzero((rec_hop < len(HOP_SCORES)) & (self._live if rows is None else rows))
        seqs = self._slot_seq[cand]
        scores = np.asarray(HOP_SCORES, np.float32)[rec_hop[cand]]
        order = np.lexsort((seqs, -scores))[:depth]
        return seqs[order], scores[order]

    # ------------------------------------------------------------------ persistence
    @_locked
    def save(self, folder: Path) -> None:
        """Write ``entity_graph.npz`` and ``entity_graph.json`` into ``folder`` (each atomically).

        The JSON, written last, holds the npz's sha256, so a torn save is detected by :meth:`load`.
        """
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        self._flush()
        self._compact()
        npz, meta = folder / "entity_graph.npz", folder / "entity_graph.json"
        tmp = folder / "entity_graph.npz.tmp"
        with open(tmp, "wb") as f:
            np.savez(f, seqs=self._slot_seq, indptr=self._main.indptr.astype(np.int64),
                     indices=self._main.indices.astype(np.int32))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, npz)
        doc = {"format": "gpuir-entity-graph", "version": 1, "keys": self._keys,
               "n_records": len(self._slot_seq), "npz_sha256": sha256_file(npz),
               "hub_fraction": self.hub_fraction, "hub_min_records": self.hub_min_records,
               "hub_mode": self.hub_mode, "batch": self.batch}
        tmp = folder / "entity_graph.json.tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(doc, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, meta)
        fsync_dir(folder)

    @classmethod
    def load(cls, folder: Path) -> EntityGraph:
        """Read what :meth:`save` wrote."""
        folder = Path(folder)
        npz, meta = folder / "entity_graph.npz", folder / "entity_graph.json"
        if not meta.is_file() or not npz.is_file():
            raise FileNotFoundError(f"{folder} holds no entity graph (entity_graph.json/.npz): save one first")
        with open(meta, encoding="utf-8") as f:
            doc = json.load(f)
        if doc.get("format") != "gpuir-entity-graph" or doc.get("version") != 1:
            raise ValueError(f"{meta} is not a version-1 gpuir entity graph")
        if sha256_file(npz) != doc["npz_sha256"]:
            raise ValueError(f"{npz} does not match {meta} (torn or edited save): rebuild the graph")
        g = cls(hub_fraction=doc["hub_fraction"], hub_min_records=doc["hub_min_records"],
                hub_mode=doc["hub_mode"], batch=doc["batch"])
        with np.load(npz) as z:
            seqs, indptr, indices = z["seqs"], z["indptr"], z["indices"]
        keys = list(doc["keys"])
        g._keys = keys
        g._key_id = {k: i for i, k in enumerate(keys)}
        n_ent = len(keys)
        g._main = _csr(indptr, indices, (len(seqs), n_ent))
        g._tail = _csr(np.zeros(1, np.int64), np.zeros(0, np.int32), (0, n_ent))
        g._slot_seq = seqs.astype(np.int64)
        g._live = np.ones(len(seqs), bool)
        g._seq_slot = {s: i for i, s in enumerate(g._slot_seq.tolist())}
        g._df = np.bincount(indices, minlength=n_ent).astype(np.int64)
        g._A = g._comention(g._main) if n_ent else sp.csr_matrix((0, 0), dtype=np.int64)
        return g
