"""Synthetic agent memory with known gold records, for stress tests and benchmarks.

In the spirit of the AgentIR agent-memory stress generator ("80/20"): many agents
write turns into sessions over months; queries ask about recent work four times
out of five. Everything is seeded and vectorised with NumPy, so one million
records take a few seconds and five million fit comfortably in memory.

The model
---------
**Agents and sessions.** ``n_agents`` agents with Gamma-distributed activity
levels own sessions; session lengths are ``1 + Geometric`` turns (mean
:data:`MEAN_SESSION_TURNS`). Sessions start uniformly over :data:`TIME_SPAN_DAYS`
days ending at :data:`T_END` (a fixed epoch, never the wall clock), and records
are laid out session by session in order of session start: record numbers
roughly follow time, as in an append-only memory log.

**Turns.** The first turn of every session is a ``user`` turn; later roles follow
a Markov chain over (user, assistant, tool) (:data:`ROLE_TRANSITIONS`).
Timestamps (float seconds since the Unix epoch) strictly increase within a
session, with role-dependent gaps (users think, tools answer at once).

**Text.** Each turn has a role-dependent Gamma length (user turns short, assistant
turns long). A token is an English stopword (30%: "the", "to", "we", ..., so
stopword removal has real work), a word of the session's topic (15%: 8 words per
session, so a session's turns share vocabulary) or a word of the global Zipfian
vocabulary (55%, exponent :data:`ZIPF_S`). Words are synthetic and pronounceable
(consonant-vowel syllables, "kalomi", "tresuna"), lowercase letters only, so
tokenisers, stemmers and stopword lists all behave as on English text.

**Rare identifiers.** About 30% of the records carry one rare identifier --
a ticket, error code, pull request, build, ... (``TKT4821093``, ``ERR7730146``,
``pr5518012``): letters then digits, a single token under every tokeniser
(``\\w+``, bm25s, tantivy, SQLite unicode61) and untouched by stemming. An
identifier occurs in a block of 1-3 consecutive turns of one session
(probabilities 0.5/0.3/0.2), and nowhere else: it is the unique key of its block.

**Importance.** ``Beta(2, 5)``, raised by 0.25 for records carrying an identifier
and by 0.1 for user turns, clipped to [0, 1].

**Queries (80/20 recency).** Each query targets one record that carries an
identifier: with probability 0.8 among records of the most recent 20% of the
time span (``time >= start + 0.8 * span``), else among the older ones. The query
text is a short template ("any update on {ident} {words}") filled with the
target's identifier and 2-4 of its content words (rarer words preferred), with
noise: each content word is dropped with probability 0.3 (at least one stays),
the identifier is dropped with probability 0.15 (the query then leans on content
words alone), and half the queries get one distractor word from the global
vocabulary. So recall is high but not trivially 1.0. The gold set of a query is
every record carrying the target's identifier (its block: 1-3 records), known
exactly. ``query_times`` lie just after the end of the log ("now");
``query_agents`` is the target's agent.

Records
-------
:meth:`SyntheticMemory.record` / :meth:`SyntheticMemory.records` and
:func:`iter_records` (streaming) give the log in the memory record model
(:mod:`gpuir.memory.records`): session, role, agent, a tenant per group of
agents, time in epoch milliseconds, importance, type and the turn position in
``metadata``.

Determinism
-----------
Same ``(n_records, n_queries, seed, n_agents)`` -> identical output, on every
platform NumPy's PCG64 gives identical streams. Texts are made in fixed-size
chunks of :data:`CHUNK_RECORDS` records, each from its own seeded stream, so
:func:`iter_texts` streams exactly the texts of :func:`generate` without holding
them all.

Examples
--------
>>> from gpuir.synthetic import generate
>>> mem = generate(10_000, n_queries=100, seed=0)
>>> len(mem.texts), len(mem.queries)
(10000, 100)
>>> all(mem.query_identifiers[0] in mem.texts[int(r)] for r in mem.gold[0])
True
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np

from .memory.records import format_time

__all__ = [
    "ROLES",
    "SyntheticMemory",
    "generate",
    "iter_records",
    "iter_texts",
]

#: Role names, indexed by the int8 codes of :attr:`SyntheticMemory.roles`.
ROLES: tuple[str, ...] = ("user", "assistant", "tool")
#: Row r: probabilities of the next role after role r (user, assistant, tool).
ROLE_TRANSITIONS = np.array(
    [
        [0.05, 0.80, 0.15],  # after user
        [0.55, 0.10, 0.35],  # after assistant
        [0.05, 0.80, 0.15],  # after tool
    ]
)
#: Mean number of tokens of a turn per role (user, assistant, tool).
MEAN_TOKENS = np.array([14.0, 36.0, 24.0])
#: Mean seconds between a turn and the previous one, per role of the new turn.
MEAN_GAP_S = np.array([75.0, 12.0, 3.0])
MEAN_SESSION_TURNS = 12.0
TIME_SPAN_DAYS = 180.0
#: End of the synthetic timeline: 2024-06-01T00:00:00Z.
T_END = 1_717_200_000.0
ZIPF_S = 1.07
#: Records per text chunk (fixed: part of the definition of the output).
CHUNK_RECORDS = 65_536
#: Fraction of records carrying an identifier.
IDENT_FRACTION = 0.3
#: Share of queries that target the most recent 20% of the time span.
RECENT_SHARE = 0.8
RECENT_WINDOW = 0.2
P_DROP_IDENT = 0.15
P_DROP_WORD = 0.3

#: Largest number of tenants records are grouped into (by agent).
N_TENANTS = 16

#: Common English stopwords mixed into turns, most frequent first.
STOPWORDS: tuple[str, ...] = (
    "the", "to", "and", "a", "of", "is", "in", "it", "that", "for", "we", "you",
    "this", "on", "with", "be", "was", "are", "i", "as", "have", "not", "at",
    "but", "or", "so", "if", "can", "will", "there", "from", "by", "an", "they",
    "do", "what", "all", "then", "about", "our", "me", "my", "just", "into", "now",
)
_ONSETS = (
    "b", "c", "d", "f", "g", "h", "j", "k", "l", "m", "n", "p", "r", "t", "v", "z",
    "br", "cl", "dr", "fl", "gr", "pl", "st", "tr", "sh", "ch", "th", "sk",
)
_VOWELS = ("a", "e", "i", "o", "u", "ai", "ou", "ei")
_CODAS = ("", "", "", "", "n", "r", "l", "m", "k", "nd", "rt")
#: Identifier kinds: the prefix, with its casing in the texts.
_IDENT_KINDS = ("TKT", "ERR", "INC", "pr", "build", "job", "run", "cfg", "sha", "ord")
_QUERY_TEMPLATES_ID = (
    "{ident} {words}",
    "{words} {ident}",
    "what did we decide about {ident} and {words}",
    "any update on {ident} {words}",
    "where is the {words} for {ident}",
    "remind me of {ident} {words}",
    "{ident} {words} status",
)
_QUERY_TEMPLATES_NOID = (
    "{words}",
    "what was the {words}",
    "what did we say about {words}",
    "the {words} thing from before",
)


@dataclass
class SyntheticMemory:
    """A synthetic agent-memory log with queries whose relevant records are known.

    Attributes
    ----------
    ids : list of str, length N
        Record ids ``"m00000000"``..., in record order.
    texts : list of str, length N
        Turn texts (lowercase synthetic words, stopwords, identifiers).
    roles : ndarray, shape (N,), int8
        Role codes into :data:`ROLES` (0 user, 1 assistant, 2 tool).
    sessions : ndarray, shape (N,), int32
        Session number; records of a session are contiguous.
    agents : ndarray, shape (N,), int32
        Agent number (``0 .. n_agents-1``) owning the record's session.
    times : ndarray, shape (N,), float64
        Seconds since the Unix epoch; strictly increasing within a session.
    importance : ndarray, shape (N,), float32
        Importance in [0, 1].
    turns : ndarray, shape (N,), int32
        Position of the record within its session (0 = first turn).
    queries : list of str, length Q
    query_ids : list of str, length Q
        ``"q000000"``...
    gold : list of Q ndarrays, each shape (g,), int64, 1 <= g <= 3
        Record numbers carrying the query's identifier, ascending.
    query_agents : ndarray, shape (Q,), int32
        Agent of the target record.
    query_times : ndarray, shape (Q,), float64
        When the query is asked: just after the end of the log.
    query_targets : ndarray, shape (Q,), int64
        The record each query was built from (a member of its gold set).
    query_identifiers : list of str, length Q
        The identifier of each query's gold block, as it appears in the texts
        (whether or not the query text kept it).
    query_has_identifier : ndarray, shape (Q,), bool
        Whether the query text contains its identifier.
    query_recent : ndarray, shape (Q,), bool
        Whether the target lies in the most recent 20% of the time span.
    recent_cutoff : float
        ``start + 0.8 * span``: records at or after it are "recent".
    seed : int
    """

    ids: list[str]
    texts: list[str]
    roles: np.ndarray
    sessions: np.ndarray
    agents: np.ndarray
    times: np.ndarray
    importance: np.ndarray
    turns: np.ndarray
    queries: list[str]
    query_ids: list[str]
    gold: list[np.ndarray]
    query_agents: np.ndarray
    query_times: np.ndarray
    query_targets: np.ndarray
    query_identifiers: list[str]
    query_has_identifier: np.ndarray
    query_recent: np.ndarray
    recent_cutoff: float
    seed: int
    extra: dict = field(default_factory=dict)

    @property
    def n_records(self) -> int:
        return len(self.texts)

    @property
    def n_queries(self) -> int:
        return len(self.queries)

    def role_names(self) -> list[str]:
        """Role of every record as a string ("user", "assistant", "tool")."""
        names = np.array(ROLES, dtype=object)
        return names[self.roles].tolist()

    def record(self, i: int) -> dict:
        """Record ``i`` in the memory record model (:mod:`gpuir.memory.records`).

        Fields: id, text, session (``"s<n>"``), role, agent (``"agent<n>"``),
        tenant (``"tenant<agent % n_tenants>"``), time (an ISO 8601 UTC string, to the millisecond),
        importance, type (``"event"``) and metadata (``{"turn": position in the session}``).
        """
        return _record(self.ids[i], self.texts[i], int(self.sessions[i]), int(self.roles[i]), int(self.agents[i]),
                       float(self.times[i]), float(self.importance[i]), int(self.turns[i]), self.n_tenants)

    @property
    def n_tenants(self) -> int:
        """Tenants of the records: agents are grouped into ``min(N_TENANTS, n_agents)`` tenants."""
        return min(N_TENANTS, int(self.extra.get("n_agents", N_TENANTS)))

    def records(self, start: int = 0, stop: int | None = None) -> list[dict]:
        """Records ``start .. stop - 1`` (see :meth:`record`), in record order."""
        stop = self.n_records if stop is None else min(stop, self.n_records)
        return [self.record(i) for i in range(start, stop)]


def _record(rid: str, text: str, session: int, role: int, agent: int, t: float, imp: float, turn: int,
            n_tenants: int) -> dict:
    return {
        "id": rid, "text": text, "session": f"s{session}", "role": ROLES[role], "agent": f"agent{agent}",
        "tenant": f"tenant{agent % n_tenants}", "time": format_time(round(t * 1000.0)), "importance": imp,
        "type": "event", "metadata": {"turn": turn},
    }


def iter_records(n_records: int, seed: int = 0, n_agents: int | None = None) -> Iterator[list[dict]]:
    """Stream the records of :func:`generate` (``SyntheticMemory.records()``) chunk by chunk.

    Yields lists of at most :data:`CHUNK_RECORDS` record dicts; only the O(N)
    metadata arrays and one chunk of texts are held at a time.
    """
    n_records, n_agents = _check(n_records, 0, n_agents)
    plan = _plan(n_records, seed, n_agents)
    width = max(8, len(str(n_records - 1)))
    nt = min(N_TENANTS, n_agents)
    for c in range(_n_chunks(plan.n)):
        tok, bounds = _chunk_tokens(plan, c)
        texts = _render(plan, tok, bounds)
        a = c * CHUNK_RECORDS
        yield [_record(f"m{i:0{width}d}", t, int(plan.sessions[i]), int(plan.roles[i]), int(plan.agents[i]),
                       float(plan.times[i]), float(plan.importance[i]), int(plan.turns[i]), nt)
               for i, t in zip(range(a, a + len(texts)), texts)]


# ---------------------------------------------------------------------------
# Plan: every per-record quantity except the texts (O(N) small arrays).
# ---------------------------------------------------------------------------


def _categorical_table(p: np.ndarray, size: int = 1 << 22) -> np.ndarray:
    """Lookup table for fast categorical sampling: ``table[floor(u * size)]``.

    Category ``i`` occupies ``round(cdf[i] * size) - round(cdf[i-1] * size)``
    slots: an exact sampler of ``p`` quantised to multiples of ``1/size``
    (categories rarer than that still get one slot).

    Returns
    -------
    ndarray, shape (>= size,), int32
    """
    p = np.asarray(p, dtype=np.float64)
    p = p / p.sum()
    counts = np.maximum(1, np.round(p * size).astype(np.int64))
    return np.repeat(np.arange(p.size, dtype=np.int32), counts)


def _sample(table: np.ndarray, rng: np.random.Generator, n: int) -> np.ndarray:
    """``n`` draws from a :func:`_categorical_table`: ndarray (n,), int32."""
    return table[(rng.random(n) * table.size).astype(np.int64)]


def _make_words(rng: np.random.Generator, n: int) -> list[str]:
    """``n`` distinct pronounceable lowercase words, shorter words first (Zipf's
    law of abbreviation: frequent words are short): 2 syllables for the first
    2,000 ranks, 3 up to rank 60,000, 4 beyond; an optional coda ends each word."""
    exclude = set(STOPWORDS)
    words: list[str] = []
    seen: set[str] = set()
    for n_syl, upto in ((2, 2_000), (3, 60_000), (4, n)):
        upto = min(upto, n)
        while len(words) < upto:
            batch = 2 * (upto - len(words)) + 64
            on = rng.integers(0, len(_ONSETS), size=(batch, n_syl)).tolist()
            vo = rng.integers(0, len(_VOWELS), size=(batch, n_syl)).tolist()
            co = rng.integers(0, len(_CODAS), size=batch).tolist()
            for oj, vj, cj in zip(on, vo, co):
                w = "".join([_ONSETS[o] + _VOWELS[v] for o, v in zip(oj, vj)]) + _CODAS[cj]
                if w in seen or w in exclude:
                    continue
                seen.add(w)
                words.append(w)
                if len(words) >= upto:
                    break
    return words


def _vocab_size(n_records: int) -> int:
    return int(min(400_000, 20_000 + n_records // 12))


@dataclass
class _Plan:
    n: int
    seed: int
    n_agents: int
    roles: np.ndarray
    sessions: np.ndarray
    turns: np.ndarray
    agents: np.ndarray
    times: np.ndarray
    importance: np.ndarray
    ident: np.ndarray  # (N,) int32, -1 = none
    block_start: np.ndarray  # (n_ident,) int64
    block_len: np.ndarray  # (n_ident,) int64
    topics: np.ndarray  # (n_sessions, 8) int32, content-word ranks
    lex_bytes: np.ndarray  # uint8, every lexicon entry followed by one space
    lex_off: np.ndarray  # int64
    lex_len: np.ndarray  # int64 (incl. the space)
    n_stop: int
    n_words: int
    stop_table: np.ndarray
    word_table: np.ndarray
    t_start: float
    t_end: float

    def lexeme(self, j: int) -> str:
        o, ln = int(self.lex_off[j]), int(self.lex_len[j]) - 1
        return self.lex_bytes[o : o + ln].tobytes().decode("ascii")


def _ident_strings(n_ident: int) -> list[str]:
    """Distinct identifiers: kind prefix + 7 digits (a bijection of the index)."""
    m = 9_000_000
    if n_ident > m:
        raise ValueError(f"too many identifiers ({n_ident}); at most {m} are supported")
    j = np.arange(n_ident, dtype=np.int64)
    nums = (1_000_000 + (j * 2_750_159) % m).tolist()  # 2750159 is prime, coprime with m
    kinds = (j % len(_IDENT_KINDS)).tolist()
    return [f"{_IDENT_KINDS[k]}{x}" for k, x in zip(kinds, nums)]


def _build_lexicon(words: list[str], idents: list[str]):
    entries = list(STOPWORDS) + words + idents
    blob = (" ".join(entries) + " ").encode("ascii")
    lex_len = np.fromiter((len(e) + 1 for e in entries), dtype=np.int64, count=len(entries))
    lex_off = np.zeros(len(entries), dtype=np.int64)
    np.cumsum(lex_len[:-1], out=lex_off[1:])
    return np.frombuffer(blob, dtype=np.uint8), lex_off, lex_len


def _plan(n_records: int, seed: int, n_agents: int) -> _Plan:
    n = int(n_records)
    rng = np.random.default_rng([seed, 0])

    # Sessions: lengths 1 + Geometric, cut to n records.
    p_geo = 1.0 / (MEAN_SESSION_TURNS - 1.0 + 1.0)
    est = int(n / MEAN_SESSION_TURNS * 1.3) + 16
    lens = rng.geometric(p_geo, size=est).astype(np.int64)
    while lens.sum() < n:
        lens = np.concatenate([lens, rng.geometric(p_geo, size=est).astype(np.int64)])
    cum = np.cumsum(lens)
    n_sess = int(np.searchsorted(cum, n) + 1)
    lens = lens[:n_sess]
    lens[-1] -= int(cum[n_sess - 1] - n)
    sess_start = np.zeros(n_sess, dtype=np.int64)
    np.cumsum(lens[:-1], out=sess_start[1:])
    sessions = np.repeat(np.arange(n_sess, dtype=np.int32), lens)
    turns = (np.arange(n, dtype=np.int64) - sess_start[sessions]).astype(np.int32)

    # Agents: Gamma activity levels.
    act = rng.gamma(1.0, size=n_agents)
    sess_agent = _sample(_categorical_table(act, 1 << 16), rng, n_sess)
    agents = sess_agent[sessions]

    # Roles: Markov chain, vectorised over sessions one turn position at a time.
    roles = np.zeros(n, dtype=np.int8)
    cum_t = np.cumsum(ROLE_TRANSITIONS, axis=1)
    order = np.argsort(-lens, kind="stable")  # sessions by length, longest first
    sorted_lens = lens[order]
    for pos in range(1, int(lens.max())):
        k = int(np.searchsorted(-sorted_lens, -pos, side="left"))  # sessions with len > pos
        idx = sess_start[order[:k]] + pos
        prev = roles[idx - 1]
        u = rng.random(k)
        roles[idx] = (u[:, None] > cum_t[prev]).sum(axis=1).astype(np.int8)

    # Times: session starts uniform over the span, role-dependent gaps within.
    span = TIME_SPAN_DAYS * 86400.0
    t_start = T_END - span
    starts = np.sort(rng.uniform(t_start, T_END - 3600.0, size=n_sess))
    gaps = 0.5 + rng.exponential(1.0, size=n) * MEAN_GAP_S[roles]
    gaps[turns == 0] = 0.0
    csum = np.cumsum(gaps)
    times = starts[sessions] + (csum - csum[sess_start][sessions])

    # Identifiers: non-overlapping blocks of 1-3 turns inside one session.
    mean_m = 1.7
    mean_gap = mean_m * (1.0 / IDENT_FRACTION - 1.0)
    nb = int(n / (mean_m + mean_gap) * 1.3) + 16
    m = rng.choice(np.array([1, 2, 3]), size=nb, p=[0.5, 0.3, 0.2]).astype(np.int64)
    g = rng.geometric(1.0 / (1.0 + mean_gap), size=nb).astype(np.int64) - 1
    step = g.copy()
    step[1:] += m[:-1]
    anchor = np.cumsum(step)
    keep = anchor < n
    anchor, m = anchor[keep], m[keep]
    sess_end = sess_start[sessions[anchor]] + lens[sessions[anchor]]
    m = np.minimum(m, sess_end - anchor)
    n_ident = int(anchor.size)
    ident = np.full(n, -1, dtype=np.int32)
    within = np.arange(int(m.sum()), dtype=np.int64) - np.repeat(np.cumsum(m) - m, m)
    ident[np.repeat(anchor, m) + within] = np.repeat(np.arange(n_ident, dtype=np.int32), m)

    # Importance.
    imp = rng.beta(2.0, 5.0, size=n) + 0.25 * (ident >= 0) + 0.1 * (roles == 0)
    importance = np.clip(imp, 0.0, 1.0).astype(np.float32)

    # Vocabulary and topics.
    V = _vocab_size(n)
    words = _make_words(np.random.default_rng([seed, 3]), V)
    ranks = np.arange(1, V + 1, dtype=np.float64)
    word_table = _categorical_table(ranks ** -ZIPF_S, 1 << 24)
    stop_p = np.arange(1, len(STOPWORDS) + 1, dtype=np.float64) ** -1.0
    stop_table = _categorical_table(stop_p, 1 << 16)
    # Topic words: mid-frequency ranks (log-uniform between 100 and V).
    topics = np.exp(rng.uniform(np.log(100), np.log(V), size=(n_sess, 8))).astype(np.int32)
    topics = np.minimum(topics, V - 1)

    lex_bytes, lex_off, lex_len = _build_lexicon(words, _ident_strings(n_ident))
    return _Plan(
        n=n, seed=seed, n_agents=n_agents, roles=roles, sessions=sessions, turns=turns,
        agents=agents.astype(np.int32), times=times, importance=importance, ident=ident,
        block_start=anchor, block_len=m, topics=topics, lex_bytes=lex_bytes,
        lex_off=lex_off, lex_len=lex_len, n_stop=len(STOPWORDS), n_words=V,
        stop_table=stop_table, word_table=word_table, t_start=t_start, t_end=T_END,
    )


# ---------------------------------------------------------------------------
# Texts, chunk by chunk.
# ---------------------------------------------------------------------------


def _chunk_tokens(plan: _Plan, c: int) -> tuple[np.ndarray, np.ndarray]:
    """Lexicon ids of chunk ``c``'s tokens and each record's token offsets.

    Returns
    -------
    tok : ndarray, shape (T,), int64
    bounds : ndarray, shape (n_c + 1,), int64
    """
    a = c * CHUNK_RECORDS
    b = min(plan.n, a + CHUNK_RECORDS)
    nc = b - a
    rng = np.random.default_rng([plan.seed, 1, c])
    roles = plan.roles[a:b]
    mean = MEAN_TOKENS[roles] - 3.0
    L = 3 + np.minimum(rng.gamma(2.0, 1.0, size=nc) * (mean / 2.0), 400).astype(np.int64)
    bounds = np.zeros(nc + 1, dtype=np.int64)
    np.cumsum(L, out=bounds[1:])
    T = int(bounds[-1])
    rec = np.repeat(np.arange(nc, dtype=np.int64), L)
    u = rng.random(T)
    tok = plan.n_stop + _sample(plan.word_table, rng, T).astype(np.int64)
    is_stop = u < 0.30
    tok[is_stop] = _sample(plan.stop_table, rng, int(is_stop.sum()))
    is_topic = (u >= 0.30) & (u < 0.45)
    nt = int(is_topic.sum())
    sess = plan.sessions[a:b][rec[is_topic]]
    tok[is_topic] = plan.n_stop + plan.topics[sess, rng.integers(0, plan.topics.shape[1], nt)]
    # One identifier per carrying record, at a random position.
    carriers = np.flatnonzero(plan.ident[a:b] >= 0)
    pos = bounds[carriers] + (rng.random(carriers.size) * L[carriers]).astype(np.int64)
    tok[pos] = plan.n_stop + plan.n_words + plan.ident[a:b][carriers].astype(np.int64)
    return tok, bounds


def _render(plan: _Plan, tok: np.ndarray, bounds: np.ndarray) -> list[str]:
    """Join lexicon entries into one string per record (vectorised byte gather)."""
    tl = plan.lex_len[tok]
    ends = np.cumsum(tl)
    total = int(ends[-1]) if ends.size else 0
    src = np.repeat(plan.lex_off[tok] - (ends - tl), tl) + np.arange(total, dtype=np.int64)
    buf = plan.lex_bytes[src]
    buf[ends[bounds[1:] - 1] - 1] = ord("\n")  # the space after a record's last token
    return buf.tobytes().decode("ascii").split("\n")[:-1]


def _n_chunks(n: int) -> int:
    return (n + CHUNK_RECORDS - 1) // CHUNK_RECORDS


def _default_agents(n_records: int) -> int:
    return int(max(4, min(1000, n_records // 10_000)))


def iter_texts(
    n_records: int, seed: int = 0, n_agents: int | None = None
) -> Iterator[list[str]]:
    """Stream the texts of :func:`generate` chunk by chunk.

    Yields lists of at most :data:`CHUNK_RECORDS` strings; their concatenation
    equals ``generate(n_records, seed=seed, n_agents=n_agents).texts`` (whatever
    ``n_queries``). Only the O(N) metadata arrays and one chunk are held at a time.

    Parameters
    ----------
    n_records : int
        Number of records N (>= 1).
    seed : int
    n_agents : int, optional
        As in :func:`generate`.
    """
    n_records, n_agents = _check(n_records, 0, n_agents)
    plan = _plan(n_records, seed, n_agents)
    for c in range(_n_chunks(plan.n)):
        tok, bounds = _chunk_tokens(plan, c)
        yield _render(plan, tok, bounds)


def _check(n_records, n_queries, n_agents) -> tuple[int, int]:
    if isinstance(n_records, bool) or not isinstance(n_records, (int, np.integer)) or n_records < 1:
        raise ValueError(f"n_records must be a positive integer, got {n_records!r}")
    if isinstance(n_queries, bool) or not isinstance(n_queries, (int, np.integer)) or n_queries < 0:
        raise ValueError(f"n_queries must be a non-negative integer, got {n_queries!r}")
    if n_agents is None:
        n_agents = _default_agents(int(n_records))
    if not isinstance(n_agents, (int, np.integer)) or n_agents < 1:
        raise ValueError(f"n_agents must be a positive integer or None, got {n_agents!r}")
    return int(n_records), int(n_agents)


# ---------------------------------------------------------------------------
# Queries.
# ---------------------------------------------------------------------------


def _pick_targets(plan: _Plan, n_queries: int, seed: int) -> tuple[np.ndarray, np.ndarray, float]:
    rng = np.random.default_rng([seed, 2])
    cutoff = plan.t_start + (1.0 - RECENT_WINDOW) * (plan.t_end - plan.t_start)
    carriers = np.flatnonzero(plan.ident >= 0)
    if carriers.size == 0:
        raise ValueError(
            "no record carries an identifier, so no query can be made: "
            "use more records (n_records >= 20) or n_queries=0"
        )
    recent = plan.times[carriers] >= cutoff
    pools = (carriers[recent], carriers[~recent])
    want_recent = rng.random(n_queries) < RECENT_SHARE
    n_r = int(want_recent.sum())
    targets = np.empty(n_queries, dtype=np.int64)
    for pool, mask, cnt in ((pools[0], want_recent, n_r), (pools[1], ~want_recent, n_queries - n_r)):
        if cnt == 0:
            continue
        if pool.size == 0:  # tiny logs: fall back to the other pool
            pool = carriers
        targets[mask] = rng.choice(pool, size=cnt, replace=cnt > pool.size)
    return targets, plan.times[targets] >= cutoff, cutoff


def _make_query(plan: _Plan, rng: np.random.Generator, rec_tokens: np.ndarray, ident_str: str):
    lo, hi = plan.n_stop, plan.n_stop + plan.n_words
    content = np.unique(rec_tokens[(rec_tokens >= lo) & (rec_tokens < hi)])
    n_pick = int(rng.integers(2, 5))
    words: list[int] = []
    if content.size:
        # Rarer words (higher rank) preferred: weight ~ sqrt(rank).
        w = np.sqrt((content - lo + 1).astype(np.float64))
        n_pick = min(n_pick, content.size)
        words = rng.choice(content, size=n_pick, replace=False, p=w / w.sum()).tolist()
        kept = [t for t in words if rng.random() >= P_DROP_WORD]
        words = kept or words[:1]
    if rng.random() < 0.5:  # a distractor word from the global vocabulary
        d = lo + int(_sample(plan.word_table, rng, 1)[0])
        words.insert(int(rng.integers(0, len(words) + 1)), d)
    word_str = " ".join(plan.lexeme(t) for t in words)
    has_id = (rng.random() >= P_DROP_IDENT) or not word_str
    if has_id:
        tpl = _QUERY_TEMPLATES_ID[int(rng.integers(0, len(_QUERY_TEMPLATES_ID)))]
        ident = ident_str if rng.random() < 0.7 else ident_str.lower()
        q = tpl.format(ident=ident, words=word_str)
    else:
        tpl = _QUERY_TEMPLATES_NOID[int(rng.integers(0, len(_QUERY_TEMPLATES_NOID)))]
        q = tpl.format(words=word_str)
    return " ".join(q.split()), has_id


def generate(
    n_records: int,
    n_queries: int = 2000,
    seed: int = 0,
    n_agents: int | None = None,
) -> SyntheticMemory:
    """Generate a synthetic agent-memory log and recency-biased queries with gold.

    Parameters
    ----------
    n_records : int
        Number of records (turns) N, >= 1. One million take a few seconds.
    n_queries : int, default 2000
        Number of queries Q (>= 0). Targets are drawn without replacement when
        there are enough records carrying identifiers.
    seed : int, default 0
        Same seed (and sizes) -> identical output.
    n_agents : int, optional
        Number of agents; default ``max(4, min(1000, N // 10000))``.

    Returns
    -------
    SyntheticMemory
    """
    n_records, n_agents = _check(n_records, n_queries, n_agents)
    plan = _plan(n_records, seed, n_agents)
    if n_queries:
        targets, recent, cutoff = _pick_targets(plan, n_queries, seed)
    else:
        targets = np.zeros(0, dtype=np.int64)
        recent = np.zeros(0, dtype=bool)
        cutoff = plan.t_start + (1.0 - RECENT_WINDOW) * (plan.t_end - plan.t_start)

    texts: list[str] = []
    chunk_of = targets // CHUNK_RECORDS
    queries: list[str] = [""] * n_queries
    has_ident = np.zeros(n_queries, dtype=bool)
    ident_strs: list[str] = [""] * n_queries
    for c in range(_n_chunks(plan.n)):
        tok, bounds = _chunk_tokens(plan, c)
        texts.extend(_render(plan, tok, bounds))
        for qi in np.flatnonzero(chunk_of == c).tolist():
            r = int(targets[qi])
            lr = r - c * CHUNK_RECORDS
            ident_strs[qi] = plan.lexeme(plan.n_stop + plan.n_words + int(plan.ident[r]))
            qrng = np.random.default_rng([seed, 4, qi])
            queries[qi], has_ident[qi] = _make_query(
                plan, qrng, tok[bounds[lr] : bounds[lr + 1]], ident_strs[qi]
            )
        del tok, bounds

    gold = []
    for r in targets.tolist():
        j = int(plan.ident[r])
        s = int(plan.block_start[j])
        gold.append(np.arange(s, s + int(plan.block_len[j]), dtype=np.int64))
    qrng = np.random.default_rng([seed, 5])
    width = max(8, len(str(n_records - 1)))
    return SyntheticMemory(
        ids=[f"m{i:0{width}d}" for i in range(n_records)],
        texts=texts,
        roles=plan.roles,
        sessions=plan.sessions,
        agents=plan.agents,
        times=plan.times,
        importance=plan.importance,
        turns=plan.turns,
        queries=queries,
        query_ids=[f"q{i:06d}" for i in range(n_queries)],
        gold=gold,
        query_agents=plan.agents[targets].astype(np.int32),
        query_times=plan.t_end + qrng.uniform(60.0, 3600.0, size=n_queries),
        query_targets=targets,
        query_identifiers=ident_strs,
        query_has_identifier=has_ident,
        query_recent=recent,
        recent_cutoff=float(cutoff),
        seed=int(seed),
        extra={"n_agents": n_agents, "vocab_size": plan.n_words, "n_identifiers": int(plan.block_start.size)},
    )
