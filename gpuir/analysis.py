"""The analyzer: text -> tokens, configured by name, saved with the index.

Pipeline: optional Unicode normalisation (NFKC) -> optional lowercasing ->
regular-expression token pattern (Unicode-aware ``\\w``) -> optional stopword
removal -> optional stemming (PyStemmer: Snowball English or Porter).

Named configurations (:data:`ANALYZERS`):

==========  ==================  ========  =========  =========  =======
name        pattern             lower     stopwords  stemmer    NFKC
==========  ==================  ========  =========  =========  =======
default     ``\\w+``              yes       en         english    yes
bm25s       ``(?u)\\b\\w\\w+\\b``     yes       en         english    no
porter      ``\\w+``              yes       en         porter     yes
nostem      ``\\w+``              yes       en         --         yes
nostop      ``\\w+``              yes       --         english    yes
plain       ``\\w+``              yes       --         --         yes
en-large    ``\\w+``              yes       en-large   english    yes
==========  ==================  ========  =========  =========  =======

``bm25s`` reproduces ``bm25s.tokenize(texts, stopwords="en",
stemmer=Stemmer.Stemmer("english"))`` exactly: lowercase, its token pattern, its
33-word English list (Lucene's), stopwords removed *before* stemming.

Stopword lists ship in ``gpuir/data``: ``en`` is Lucene's/bm25s's 33 English
stopwords; ``en-large`` is NLTK's 179-word English list (bm25s's ``en_plus``).
"""

from __future__ import annotations

import re
import threading
import unicodedata
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from functools import cache
from importlib import resources
from typing import Any

import numpy as np

STOPWORD_LISTS = {"en": "stopwords_en.txt", "en-large": "stopwords_en_large.txt"}
STEMMERS = ("english", "porter")
#: Token patterns whose tokens are the maximal runs of word characters (``\\w``,
#: as the ``re`` module defines it) at least this long: the index build can
#: find them in compiled code (:mod:`gpuir.index.compiled_build`).
RUN_PATTERNS = {r"\w+": 1, r"(?u)\b\w\w+\b": 2}


@cache
def word_chars(ascii_only: bool = False) -> np.ndarray:
    """Which code points ``re`` counts as ``\\w`` in a str pattern.

    Returns
    -------
    ndarray, shape (0x110000,) (or (128,) with ``ascii_only``), bool, host
        Computed by the ``re`` module itself (every code point through ``\\W``),
        so compiled tokenisation agrees with :meth:`Analyzer.__call__` exactly.
    """
    n = 128 if ascii_only else 0x110000
    every = "".join(map(chr, range(n)))
    marked = re.sub(r"\W", "\x00", every)  # chr(0) is not a word character either
    return np.frombuffer(marked.encode("utf-32-le", "surrogatepass"), dtype=np.uint32) != 0


@cache
def stopwords(name: str) -> frozenset[str]:
    """The shipped stopword list ``name`` ("en" or "en-large")."""
    if name not in STOPWORD_LISTS:
        raise ValueError(f"unknown stopword list {name!r}: choose one of {', '.join(STOPWORD_LISTS)}")
    text = resources.files("gpuir").joinpath("data", STOPWORD_LISTS[name]).read_text("utf-8")
    return frozenset(w for w in text.split() if w)


@dataclass(frozen=True)
class AnalyzerConfig:
    """Everything that determines tokenisation; saved in the index manifest."""

    pattern: str = r"\w+"
    lowercase: bool = True
    stopwords: str | None = "en"
    stemmer: str | None = "english"
    normalize: str | None = "NFKC"

    def __post_init__(self) -> None:
        if self.stopwords is not None and self.stopwords not in STOPWORD_LISTS:
            raise ValueError(
                f"unknown stopword list {self.stopwords!r}: choose one of {', '.join(STOPWORD_LISTS)} or None"
            )
        if self.stemmer is not None and self.stemmer not in STEMMERS:
            raise ValueError(f"unknown stemmer {self.stemmer!r}: choose one of {', '.join(STEMMERS)} or None")
        if self.normalize not in (None, "NFC", "NFKC", "NFD", "NFKD"):
            raise ValueError(f"normalize must be None, NFC, NFKC, NFD or NFKD, got {self.normalize!r}")
        if not isinstance(self.pattern, str):
            raise TypeError(f"the token pattern must be a str, got {type(self.pattern).__name__}")
        try:
            re.compile(self.pattern)
        except (re.error, RecursionError, OverflowError) as e:
            raise ValueError(f"invalid token pattern {self.pattern!r}: {e}") from None
        check_pattern_linear(self.pattern)


def _parse_pattern(pattern: str):
    try:
        from re import _parser as parser  # Python 3.11+
    except ImportError:  # pragma: no cover - Python 3.10
        import sre_parse as parser
    return parser, parser.parse(pattern)


def check_pattern_linear(pattern: str) -> None:
    """Refuse a token pattern that can backtrack catastrophically (``ValueError`` naming it).

    Python's ``re`` backtracks: a repetition holding another repetition or an
    alternation (``(a+)+``, ``(\\w|\\d)*``, ``(?:a*b*)*``) or a back-reference can
    take exponential time on one line of text, and a pattern comes with every
    saved index and memory. Such patterns are refused when an analyzer is made,
    whether given in code or read from a manifest; single repetitions of
    character classes (``\\w+``, ``[^,]+``, ``(?u)\\b\\w\\w+\\b``) are what
    tokenisers need and stay linear.
    """
    parser, tree = _parse_pattern(pattern)
    const = parser  # the opcode names live in the parser module's namespace (via re._constants)
    repeats = {getattr(const, n) for n in ("MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT") if hasattr(const, n)}
    branch, groupref = const.BRANCH, const.GROUPREF

    def walk(items, inside: bool) -> None:
        for op, av in items:
            if op is groupref:
                raise ValueError(f"token pattern {pattern!r}: a back-reference can take exponential time; "
                                 "use a pattern without one")
            if op in repeats:
                _, hi, sub = av
                if inside and hi != 1:
                    raise ValueError(f"token pattern {pattern!r}: a repetition inside a repetition can take "
                                     "exponential time (catastrophic backtracking); repeat a character class "
                                     "once instead, e.g. [\\w-]+")
                walk(sub, inside or hi not in (0, 1))
            elif op is branch:
                if inside:
                    raise ValueError(f"token pattern {pattern!r}: an alternation inside a repetition can take "
                                     "exponential time (catastrophic backtracking); use a character class, "
                                     "e.g. [\\w-]+ instead of (\\w|-)+")
                for alt in av[1]:
                    walk(alt, inside)
            elif isinstance(av, (list, tuple)):
                for x in av:
                    if isinstance(x, parser.SubPattern):
                        walk(x, inside)
                    elif isinstance(x, (list, tuple)):
                        for y in x:
                            if isinstance(y, parser.SubPattern):
                                walk(y, inside)
            elif isinstance(av, parser.SubPattern):
                walk(av, inside)

    walk(tree, False)


ANALYZERS: dict[str, AnalyzerConfig] = {
    "default": AnalyzerConfig(),
    "bm25s": AnalyzerConfig(pattern=r"(?u)\b\w\w+\b", normalize=None),
    "porter": AnalyzerConfig(stemmer="porter"),
    "nostem": AnalyzerConfig(stemmer=None),
    "nostop": AnalyzerConfig(stopwords=None),
    "plain": AnalyzerConfig(stopwords=None, stemmer=None),
    "en-large": AnalyzerConfig(stopwords="en-large"),
}


class Analyzer:
    """Turns text into index tokens.

    Parameters
    ----------
    spec : str, dict, AnalyzerConfig or Analyzer
        A name from :data:`ANALYZERS`, a configuration dict (as saved in a
        manifest; an optional ``"name"`` key is ignored), or a config.
    """

    def __init__(self, spec: str | dict[str, Any] | AnalyzerConfig | Analyzer = "default"):
        if isinstance(spec, Analyzer):
            spec = spec.config
        if isinstance(spec, str):
            if spec not in ANALYZERS:
                raise ValueError(f"unknown analyzer {spec!r}: choose one of {', '.join(ANALYZERS)}")
            self.name: str | None = spec
            cfg = ANALYZERS[spec]
        elif isinstance(spec, dict):
            d = dict(spec)
            self.name = d.pop("name", None)
            unknown = set(d) - set(AnalyzerConfig.__dataclass_fields__)
            if unknown:
                raise ValueError(f"unknown analyzer setting(s): {', '.join(sorted(unknown))}")
            cfg = AnalyzerConfig(**d)
        elif isinstance(spec, AnalyzerConfig):
            self.name, cfg = None, spec
        else:
            raise TypeError(f"analyzer must be a name, dict or AnalyzerConfig, got {type(spec).__name__}")
        self.cfg = cfg
        self._findall = re.compile(cfg.pattern).findall
        self._stop = stopwords(cfg.stopwords) if cfg.stopwords else frozenset()
        self._stem_cache: dict[str, str] = {}
        self._stemmer = None
        self._stem_lock = threading.Lock()
        if cfg.stemmer:
            import Stemmer  # PyStemmer

            self._stemmer = Stemmer.Stemmer(cfg.stemmer)

    @property
    def config(self) -> dict[str, Any]:
        """The configuration as a JSON-able dict (with ``name`` when it has one)."""
        d = asdict(self.cfg)
        if self.name:
            d["name"] = self.name
        return d

    def __repr__(self) -> str:
        return f"Analyzer({self.name or self.config!r})"

    @property
    def run_min_len(self) -> int | None:
        """The least token length when tokens are maximal ``\\w`` runs (see :data:`RUN_PATTERNS`), else None."""
        return RUN_PATTERNS.get(self.cfg.pattern)

    def prepare(self, text: str) -> str:
        """``text`` normalised and lowercased as configured: what the token pattern runs on."""
        cfg = self.cfg
        if cfg.normalize:
            text = unicodedata.normalize(cfg.normalize, text)
        if cfg.lowercase:
            text = text.lower()
        return text

    def prepare_many(self, texts: list[str]) -> list[str]:
        """:meth:`prepare` of each text (lowercasing alone maps ``str.lower``, without a call per text)."""
        if self.cfg.normalize is None:
            return list(map(str.lower, texts)) if self.cfg.lowercase else list(texts)
        return [self.prepare(t) for t in texts]

    def terms_of(self, surface: list[str]) -> list[str | None]:
        """What each pattern match becomes: None for a stopword, else its stem (or itself).

        Parameters
        ----------
        surface : list of str
            Tokens as the pattern found them in :meth:`prepare`'s output, e.g. the
            distinct ones of a corpus (each is stemmed once).
        """
        stop = self._stop
        keep = [t for t in surface if t not in stop]
        stems = iter(self._stemmer.stemWords(keep) if self._stemmer is not None and keep else keep)
        return [None if t in stop else next(stems) for t in surface]

    def __call__(self, text: str) -> list[str]:
        """Tokens of ``text``, in order, repeats kept."""
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}")
        toks = self._findall(self.prepare(text))
        if self._stop:
            stop = self._stop
            toks = [t for t in toks if t not in stop]
        if self._stemmer is not None and toks:
            cache_ = self._stem_cache
            # a local map: another thread may clear the shared cache at any moment
            stems = {t: cache_.get(t) for t in set(toks)}
            missing = [t for t, s in stems.items() if s is None]
            if missing:
                with self._stem_lock:  # PyStemmer: "must not be called concurrently"
                    stemmed = self._stemmer.stemWords(missing)
                for t, s in zip(missing, stemmed):
                    stems[t] = cache_[t] = s
                if len(cache_) > 2_000_000:  # bound memory on huge vocabularies
                    cache_.clear()
            toks = [stems[t] for t in toks]
        return toks

    def tokenize_many(self, texts: Iterable[str]) -> list[list[str]]:
        """Tokens of each text."""
        return [self(t) for t in texts]
