"""Time windows named by the natural-language time expressions of a query.

:func:`parse_time_window` turns "what did I do last Tuesday?", "in May",
"two weeks ago", "between March 1 and April 2, 2023" or "since we last talked"
into a half-open window ``[start_ms, end_ms)`` of epoch milliseconds (UTC),
anchored at the time the question is asked. A question that asks *about* a
time but names none ("When did Caroline go to the support group?") has no
window: the function returns None.

How it works (see ``docs/temporal.md`` for the full rule table):

1. A cheap regular expression looks for any time-ish word (a digit, a month or
   weekday name, "ago", "last", "week", "recently", ...). A query without one
   returns None at once, without importing or calling dateparser.
2. A small grammar of regular expressions finds the *spans* of time
   expressions (absolute dates, months, years, seasons, weekdays, relative
   expressions, the session log) and decides each one's granularity from its
   shape. It is deliberately strict, to avoid the false positives a free
   search produces ("may" and "march" as verbs, "sat", "sun", "second",
   numbers that are not years, "Sunday mass", habitual "on Saturday mornings").
3. The date text of absolute expressions ("7 July, 2023", "Mar 3", "the 5th of
   May", "7/22", "2023-07-07") is parsed by **dateparser** (``DateDataParser``
   with ``RELATIVE_BASE`` = the anchor and ``PREFER_DATES_FROM="past"``, so a
   date without a year is the latest such date not after the anchor);
   calendar arithmetic (weeks, months, weekdays) uses **python-dateutil**'s
   ``relativedelta``. dateparser is imported on first use only (its import and
   first call take ~0.2 s); parsers are cached per anchor.
4. Combinators around the expressions: "between X and Y", "from X to Y",
   "before / after / since / until X", "the day / week / month before X",
   "N days after X". Several separate expressions give their hull.

Both libraries come with the ``routing`` extra (``pip install 'gpuir[routing]'``);
without them a query that needs parsing raises
:class:`~gpuir.retrieve.MissingExtra`.
"""

from __future__ import annotations

import functools
import math
import numbers
import re
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any

from .._compat import MissingExtra

__all__ = [
    "AGO_HALF_WIDTH_DAYS",
    "MAX_MS",
    "MIN_MS",
    "RECENT_DAYS",
    "TimeWindow",
    "may_name_time",
    "parse_time_window",
]

# --------------------------------------------------------------------------- constants

#: Open lower bound ("before X"): 0001-01-01T00:00Z in epoch ms.
MIN_MS = -62_135_596_800_000
#: Open upper bound ("after X" when X is after the anchor): 9999-12-31T00:00Z in epoch ms.
MAX_MS = 253_402_214_400_000

#: "recently" / "lately" / "these days": the last RECENT_DAYS days up to the anchor.
RECENT_DAYS = 30
#: "the other day": the last OTHER_DAY_DAYS days up to the anchor.
OTHER_DAY_DAYS = 7
#: "N <unit>s ago": the calendar day of (anchor - N units), widened by this many
#: days on each side (people round: "two weeks ago" is rarely exactly 14 days).
AGO_HALF_WIDTH_DAYS = {"day": 1, "week": 4, "month": 15, "year": 183}

_EPOCH = datetime(1970, 1, 1)
_DAY = timedelta(days=1)

# --------------------------------------------------------------------------- the window


@dataclass(frozen=True)
class TimeWindow:
    """A half-open time window ``[start_ms, end_ms)`` in epoch milliseconds (UTC).

    Attributes
    ----------
    start_ms : int
        Inclusive start.
    end_ms : int
        Exclusive end; ``end_ms > start_ms``.
    expression : str
        The matched text of the query, e.g. ``"last Tuesday"``.
    granularity : str
        How the window was built (``"day"``, ``"week"``, ``"month"``,
        ``"season"``, ``"year"``, ``"ago"``, ``"rolling"``, ``"recent"``,
        ``"session"``, ``"before"``, ``"after"``, ``"since"``, ``"range"``,
        ``"shift"``, ``"hull"``); informative only, not compared.
    """

    start_ms: int
    end_ms: int
    expression: str
    granularity: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        for name in ("start_ms", "end_ms"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, numbers.Integral):
                raise ValueError(f"TimeWindow.{name} must be integer epoch milliseconds, got {v!r}")  # noqa: TRY004
            object.__setattr__(self, name, int(v))
        if self.end_ms <= self.start_ms:
            raise ValueError(f"TimeWindow needs start_ms < end_ms, got [{self.start_ms}, {self.end_ms})")

    def where(self) -> dict:
        """The window as a :mod:`gpuir.memory.where` filter: ``{"time": {"gte": START, "lt": END}}`` (ISO 8601)."""
        from ..memory.timeutil import format_time

        return {"time": {"gte": format_time(self.start_ms), "lt": format_time(self.end_ms)}}

    @property
    def start(self) -> datetime:
        """Start as an aware UTC datetime."""
        return _dt(self.start_ms).replace(tzinfo=timezone.utc)

    @property
    def end(self) -> datetime:
        """Exclusive end as an aware UTC datetime."""
        return _dt(self.end_ms).replace(tzinfo=timezone.utc)

    def __contains__(self, t_ms: object) -> bool:
        return isinstance(t_ms, numbers.Real) and self.start_ms <= t_ms < self.end_ms  # type: ignore[operator]


# --------------------------------------------------------------------------- time helpers


def _ms(d: datetime) -> int:
    """Naive-UTC datetime -> epoch ms."""
    return (d - _EPOCH) // timedelta(milliseconds=1)


def _dt(ms: int) -> datetime:
    """Epoch ms -> naive-UTC datetime."""
    return _EPOCH + timedelta(milliseconds=int(ms))


def _floor_day(d: datetime) -> datetime:
    return d.replace(hour=0, minute=0, second=0, microsecond=0)


def _anchor_datetime(anchor: Any) -> tuple[datetime, int]:
    """The anchor as (naive UTC datetime, epoch ms); ValueError for anything else."""
    if isinstance(anchor, datetime):
        if anchor.tzinfo is not None:
            anchor = anchor.astimezone(timezone.utc).replace(tzinfo=None)
        return anchor, _ms(anchor)
    if isinstance(anchor, bool) or not isinstance(anchor, numbers.Real):
        raise ValueError(  # noqa: TRY004 - the contract says ValueError
            f"anchor_ms must be epoch milliseconds (int or float) or a datetime, got "
            f"{type(anchor).__name__} {anchor!r}; convert ISO strings with gpuir.memory's to_epoch_ms first"
        )
    f = float(anchor)
    if not math.isfinite(f):
        raise ValueError(f"anchor_ms must be a finite number of epoch milliseconds, got {anchor!r}")
    ms = int(anchor) if isinstance(anchor, numbers.Integral) else round(f)
    if not MIN_MS <= ms < MAX_MS:
        raise ValueError(f"anchor_ms {anchor!r} is outside years 1..9999 (is it in seconds or microseconds?)")
    return _dt(ms), ms


@functools.lru_cache(maxsize=1)
def _relativedelta() -> Any:
    """dateutil's relativedelta module (light), imported on first use."""
    try:
        from dateutil import relativedelta
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise MissingExtra("routing", "parsing time expressions (python-dateutil)") from e
    return relativedelta


@functools.lru_cache(maxsize=1)
def _dateparser_class() -> Any:
    """dateparser's DateDataParser (heavy: ~0.2 s to import), imported on first use."""
    try:
        from dateparser.date import DateDataParser
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise MissingExtra("routing", "parsing dates in queries (dateparser)") from e
    return DateDataParser


def _rd(**kw: Any) -> Any:
    return _relativedelta().relativedelta(**kw)


_PARSE_LOCK = threading.Lock()


@functools.lru_cache(maxsize=256)
def _parser(anchor: datetime) -> Any:
    """A dateparser DateDataParser anchored at ``anchor`` (cached per anchor)."""
    cls = _dateparser_class()
    return cls(
        languages=["en"],
        settings={
            "RELATIVE_BASE": anchor,
            "PREFER_DATES_FROM": "past",
            "PREFER_DAY_OF_MONTH": "first",
            "RETURN_AS_TIMEZONE_AWARE": False,
            "DATE_ORDER": "MDY",
        },
    )


@functools.lru_cache(maxsize=4096)
def _dateparse(text: str, anchor: datetime) -> datetime | None:
    """dateparser's reading of an absolute date text (a day or a month), or None (cached)."""
    with _PARSE_LOCK:
        data = _parser(anchor).get_date_data(text)
    return None if data is None or data.date_obj is None else data.date_obj.replace(tzinfo=None)


# --------------------------------------------------------------------------- grammar

# Month names: "May" and "March" are verbs too, so only their capitalised forms count;
# abbreviations ("Mar", "Sat") only next to a day number or a year.
_MONTH = (r"(?:(?i:january|february|april|june|july|august|september|october|november|december)"
          r"|May|March|MAY|MARCH)")
_MONTH_ABBR = r"(?:Jan|Feb|Mar|Apr|Jun|Jul|Aug|Sept|Sep|Oct|Nov|Dec)\.?"
_MONTH_D = rf"(?:{_MONTH}|{_MONTH_ABBR})(?![A-Za-z])"
_DAYNUM = r"(?:[12]\d|3[01]|0?[1-9])(?:st|nd|rd|th)?\b"
_YEAR = r"(?:19|20)\d{2}\b"
_WEEKDAY = r"(?i:monday|tuesday|wednesday|thursday|friday|saturday|sunday)"
_WD_ANY = rf"(?:{_WEEKDAY}|(?:Mon|Tues|Tue|Wed|Thurs|Thur|Thu|Fri|Sat|Sun)\.?)"
_SEASON = r"(?i:spring|summer|autumn|winter)"
_UNIT = r"(?i:(?P<unit>day|week|month|year)s?)"
_NUMWORDS = {
    "a": 1, "an": 1, "one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7,
    "eight": 8, "nine": 9, "ten": 10, "eleven": 11, "twelve": 12, "couple": 2, "a couple": 2,
    "a couple of": 2, "couple of": 2, "few": 3, "a few": 3, "several": 4,
}
_QTY = (r"(?P<qty>\d{1,3}|(?i:a\s+couple(?:\s+of)?|couple\s+of|a\s+few|few|several|an?|one|two|three|four|"
        r"five|six|seven|eight|nine|ten|eleven|twelve))")
# Words after which a bare month name or year is a time ("in May", "since 2020").
_PREP = (r"(?i:in|during|since|until|till|before|after|of|from|by|through|throughout|to|and|between|"
         r"around|last|this|next|early|mid|late|over|for|on|as\s+of|the\s+year)")
_MODIFIER = r"(?P<mod>(?i:early|mid|late|the\s+(?:beginning|start|end|middle)\s+of|(?:beginning|start|end|middle)\s+of))"

_I = re.IGNORECASE


def _c(p: str, flags: int = 0) -> re.Pattern:
    return re.compile(p, flags)


# Each pattern: (kind, regex). The expression's span is group "x" when present.
# Listed from most to least specific; a later match overlapping an accepted one is dropped.
_PATTERNS: list[tuple[str, re.Pattern]] = [
    ("session", _c(r"\b(?P<x>since\s+(?:we|I|you\s+and\s+I)\s+(?:last\s+)?(?:talked|spoke|chatted|met|discussed)"
                   r"|since\s+(?:our|my)\s+last\s+(?:chat|conversation|session|talk|call)"
                   r"|since\s+last\s+time"
                   r"|(?:the\s+)?last\s+time\s+(?:we|I|you\s+and\s+I)\s+(?:talked|spoke|chatted|met|discussed)"
                   r"|(?:in|during)\s+our\s+last\s+(?:chat|conversation|session|talk|call)"
                   r"|last\s+time(?=\s*(?:[?.!,;]|$)))", _I)),
    ("iso_day", _c(r"\b(?P<x>(?:19|20)\d{2}[-/](?:0?[1-9]|1[0-2])[-/](?:0?[1-9]|[12]\d|3[01]))\b")),
    ("num_day", _c(r"\b(?P<x>(?:0?[1-9]|1[0-2])/(?:0?[1-9]|[12]\d|3[01])/(?:(?:19|20)\d{2}|\d{2}))\b")),
    ("num_md", _c(r"\b(?i:on|the|before|after|since|until|by)\s+(?P<x>(?:0?[1-9]|1[0-2])/(?:0?[1-9]|[12]\d|3[01]))\b(?!/)")),
    ("day", _c(rf"\b(?P<x>(?:{_WD_ANY},?\s+)?(?:the\s+)?(?P<d>{_DAYNUM}\s+(?:of\s+)?{_MONTH_D}(?:,?\s*(?P<y>{_YEAR}))?))")),
    ("day", _c(rf"\b(?P<x>(?:{_WD_ANY},?\s+)?(?P<d>{_MONTH_D}\s+(?:the\s+)?{_DAYNUM}(?:,?\s*(?P<y>{_YEAR}))?))(?!\s*(?:-|–)?\s*\d)")),
    ("month_year", _c(rf"\b(?P<x>(?:{_MODIFIER}[-\s]?\s*)?(?P<d>{_MONTH_D},?\s+(?P<y>{_YEAR})))")),
    ("season_year", _c(rf"\b(?P<x>(?:{_MODIFIER}[-\s]?\s*)?(?:the\s+)?(?P<season>{_SEASON}|(?i:fall))\s+(?:of\s+)?(?P<y>{_YEAR}))")),
    ("mod_year", _c(rf"\b(?P<x>{_MODIFIER}[-\s]?\s*(?P<y>{_YEAR}))")),
    ("rolling", _c(rf"\b(?P<x>(?:(?:in|over|during|within|for)\s+)?(?P<the>the\s+|this\s+)?(?P<which>past|last)\s+"
                   rf"(?:{_QTY}\s+)?{_UNIT})\b(?!'s)(?!\s+of\b)", _I)),
    ("ago", _c(rf"\b(?P<x>{_QTY}\s+{_UNIT}\s+ago)\b", _I)),
    ("shift_prefix", _c(rf"\b(?P<x>(?:(?:{_QTY}|the|last)\s+{_UNIT}|the\s+(?P<swd>{_WEEKDAY}|weekend))\s+"
                        r"(?P<dir>before|after|prior\s+to|following))\s+", _I)),
    ("part_prefix", _c(r"\b(?P<x>the\s+(?P<pos>first|last|second|third|fourth)\s+(?:(?P<pn>two|three|four|[1-9])\s+)?"
                       r"(?P<punit>week|weekend|day)s?\s+of)\s+", _I)),
    ("calendar", _c(r"\b(?P<x>(?P<which>last|this|next|the\s+previous|the\s+following|this\s+past)\s+"
                    r"(?P<cal>weekend|week|month|year))\b(?!'s)(?!\s+(?:before|after|of)\b)", _I)),
    ("unit_start", _c(r"\b(?P<x>(?:the\s+)?(?P<edge>start|beginning)\s+of\s+(?:the|this)\s+(?P<cal>week|month|year))\b", _I)),
    ("day_word", _c(r"\b(?P<x>(?P<w>the\s+day\s+before\s+yesterday|yesterday|earlier\s+today|today|tonight|"
                    r"this\s+(?:morning|afternoon|evening)|last\s+night))\b", _I)),
    ("weekday", _c(rf"\b(?P<x>(?P<which>(?i:last|this\s+past|past|on|this|next))\s+(?P<wd>{_WEEKDAY}))"
                   r"(?!s\b|'s)(?!\s+(?i:mornings|nights|evenings|afternoons)\b)")),
    ("season", _c(rf"\b(?P<x>(?P<which>(?i:this\s+past|last|this|next|in\s+the|during\s+the|over\s+the|in|during))\s+"
                  rf"(?P<season>{_SEASON}|(?i:fall)))\b(?!\s+(?i:camp|break|semester|term|session|job|internship|"
                  r"vacation|holiday|collection|sale|festival|school|program|class|classes|course)s?\b)")),
    ("month", _c(rf"\b{_PREP}\s+(?P<x>(?:{_MODIFIER}[-\s]?\s*)?(?:the\s+month\s+of\s+)?(?P<d>{_MONTH}))\b(?!'s|\s*\d)")),
    ("month", _c(rf"\b(?P<x>{_MODIFIER}[-\s]?\s*(?P<d>{_MONTH}))\b(?!'s|\s*\d)")),
    ("year", _c(rf"\b{_PREP}\s+(?P<x>(?P<y>{_YEAR}))(?!\s*(?:%|-|–|/))")),
    ("year", _c(rf"\b(?P<x>(?i:the\s+year)\s+(?P<y>{_YEAR}))")),
    ("recent", _c(r"(?<!most\s)(?<!more\s)\b(?P<x>recently|lately|of\s+late|these\s+days)\b", _I)),
    ("other_day", _c(r"\b(?P<x>the\s+other\s+day)\b", _I)),
]

_DIGITS = tuple("0123456789")
_MONTH_HINTS = ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec")
_SEASON_HINTS = ("spring", "summer", "autumn", "fall", "winter")
#: Per kind: lower-case substrings a match needs (all groups, one of each), checked before the
#: regular expression runs; a query lacking them skips the pattern (regex scans cost ~10-90 us each).
_NEEDS: dict[str, tuple[tuple[str, ...], ...]] = {
    "session": (("last", "since"),),
    "iso_day": (_DIGITS,),
    "num_day": (("/",),),
    "num_md": (("/",),),
    "day": (_DIGITS, _MONTH_HINTS),
    "month_year": (_DIGITS, _MONTH_HINTS),
    "season_year": (_DIGITS, _SEASON_HINTS),
    "mod_year": (_DIGITS, ("early", "mid", "late", "beginning", "start", "end")),
    "rolling": (("past", "last"),),
    "ago": (("ago",),),
    "shift_prefix": (("before", "after", "prior", "following"),),
    "part_prefix": (("first", "last", "second", "third", "fourth"),),
    "calendar": (("week", "month", "year"),),
    "unit_start": (("start", "beginning"),),
    "day_word": (("yesterday", "today", "tonight", "morning", "afternoon", "evening", "night"),),
    "weekday": (("day",),),
    "season": (_SEASON_HINTS,),
    "month": (("january", "february", "march", "april", "may", "june", "july", "august", "september",
               "october", "november", "december"),),
    "year": (_DIGITS,),
    "recent": (("recent", "lately", "late", "these days"),),
    "other_day": (("other day",),),
}

_NEEDS_RE = {k: tuple(re.compile("|".join(re.escape(h) for h in grp)) for grp in v) for k, v in _NEEDS.items()}

#: Cheap pre-check: a query matching none of these words never reaches the grammar or dateparser.
_TIMEISH = re.compile(
    r"\d|\b(?:jan|feb|mar|apr|may|jun|jul|aug|sep|oct|nov|dec|mon|tue|wed|thu|fri|sat|sun|yesterday|today|"
    r"tonight|ago|last|past|previous|recent|lately|since|week|month|year|spring|summer|autumn|fall|winter|"
    r"early|mid|late|morning|afternoon|evening|night|other|these|start|beginning)",
    re.IGNORECASE,
)

def may_name_time(query: str) -> bool:
    """Whether ``query`` holds a word a time expression needs (the cheap pre-check of
    :func:`parse_time_window`; False means it certainly returns None)."""
    return bool(_TIMEISH.search(query))


_COMBINE_BEFORE = re.compile(
    r"(?P<op>between|from|before|prior\s+to|after|since|until|till|up\s+to|following)\s+(?:the\s+)?$", _I)
_JOIN_RANGE = re.compile(r"^\s*(?:and|to|until|till|through|-|–)\s*(?:the\s+)?$", _I)
_HAS_YEAR = re.compile(r"(?:19|20)\d{2}")


@dataclass
class _Atom:
    kind: str
    start: int  # span in the query
    end: int
    text: str
    lo: datetime
    hi: datetime  # exclusive; hi == datetime.max stands for "open"
    gran: str
    match: re.Match | None = None
    explicit_year: bool = True


# --------------------------------------------------------------------------- resolution


def _season_bounds(season: str, year: int) -> tuple[datetime, datetime]:
    """Meteorological (northern) seasons; winter Y runs from 1 Dec Y to 1 Mar Y+1."""
    s = season.lower()
    start_month = {"spring": 3, "summer": 6, "fall": 9, "autumn": 9, "winter": 12}[s]
    lo = datetime(year, start_month, 1)
    return lo, lo + _rd(months=3)


def _apply_modifier(mod: str | None, lo: datetime, hi: datetime) -> tuple[datetime, datetime]:
    """early / mid / late (and "the beginning/middle/end of") as thirds of [lo, hi)."""
    if not mod:
        return lo, hi
    m = mod.lower()
    span = hi - lo
    if span <= timedelta(days=31):  # a month: days 1-10, 11-20, 21-end
        cuts = (lo, lo + 10 * _DAY, lo + 20 * _DAY, hi)
    else:  # a year or a season: thirds by month
        months = round(span.days / 30.4)
        step = max(1, months // 3)
        cuts = (lo, lo + _rd(months=step), lo + _rd(months=months - step), hi)
    if "early" in m or "beginning" in m or "start" in m:
        return cuts[0], cuts[1]
    if "mid" in m:
        return cuts[1], cuts[2]
    return cuts[2], cuts[3]  # late, end of


def _qty(m: re.Match) -> int:
    q = " ".join(m.group("qty").lower().split())
    return int(q) if q.isdigit() else _NUMWORDS[q]


def _units(unit: str, n: int) -> Any:
    return _rd(**{f"{unit.lower()}s": n})


def _resolve(kind: str, m: re.Match, anchor: datetime, anchor_ms: int,
             sessions: Sequence[int], year: int | None = None) -> tuple[datetime, datetime, str] | None:
    """(lo, hi, granularity) of one matched expression, or None when it names no usable time.

    ``year`` forces the year of a year-less date (the second date of "between August 11 and
    August 15 2023" lends its year to the first).
    """
    g = m.groupdict()
    today = _floor_day(anchor)
    now_end = anchor + timedelta(milliseconds=1)
    if kind == "session":
        before = [t for t in sessions if t < anchor_ms]
        if not before:
            return None
        return _dt(max(before)), now_end, "session"
    if kind in ("iso_day", "num_day", "num_md", "day"):
        text = g.get("d") or g["x"]
        if year is not None and not _HAS_YEAR.search(text):
            text = f"{text} {year}"
        d = _dateparse(text, anchor)
        if d is None:
            return None
        lo = _floor_day(d)
        return lo, lo + _DAY, "day"
    if kind in ("month_year", "month"):
        text = g["d"]
        if year is not None and not _HAS_YEAR.search(text):
            text = f"{text} {year}"
        d = _dateparse(text, anchor)
        if d is None:
            return None
        lo = datetime(d.year, d.month, 1)
        lo, hi = _apply_modifier(g.get("mod"), lo, lo + _rd(months=1))
        return lo, hi, "month"
    if kind == "season_year":
        lo, hi = _season_bounds(g["season"], int(g["y"]))
        lo, hi = _apply_modifier(g.get("mod"), lo, hi)
        return lo, hi, "season"
    if kind == "mod_year":
        y = int(g["y"])
        lo, hi = _apply_modifier(g.get("mod"), datetime(y, 1, 1), datetime(y + 1, 1, 1))
        return lo, hi, "year"
    if kind == "year":
        y = int(g["y"])
        return datetime(y, 1, 1), datetime(y + 1, 1, 1), "year"
    if kind == "season":
        which = " ".join(g["which"].lower().split())
        season = g["season"]
        cands = [_season_bounds(season, y) for y in range(anchor.year - 2, anchor.year + 2)]
        if which == "next":
            lo, hi = min((c for c in cands if c[0] > anchor), key=lambda c: c[0])
        elif which in ("last", "this past"):
            lo, hi = max((c for c in cands if c[1] <= anchor), key=lambda c: c[0])
        elif which == "this":
            lo, hi = _season_bounds(season, anchor.year - (1 if season.lower() == "winter" and anchor.month <= 2 else 0))
        else:  # in / during / over the: the latest one that has begun
            lo, hi = max((c for c in cands if c[0] <= anchor), key=lambda c: c[0])
        return lo, hi, "season"
    if kind == "rolling":
        if g["which"].lower() == "last" and not g.get("qty") and not g.get("the"):
            return None  # "last week" is the calendar week before this one (kind "calendar")
        n = _qty(m) if g.get("qty") else 1
        return today - _units(g["unit"], n), now_end, "rolling"
    if kind == "ago":
        n = _qty(m)
        unit = g["unit"].lower()
        center = _floor_day(anchor - _units(unit, n))
        hw = AGO_HALF_WIDTH_DAYS[unit] * _DAY
        return center - hw, center + _DAY + hw, "ago"
    if kind in ("calendar", "unit_start"):
        cal = g["cal"].lower()
        which = " ".join((g.get("which") or "this").lower().split())
        step = {"last": -1, "the previous": -1, "this past": -1, "next": 1, "the following": 1}.get(which, 0)
        if cal in ("week", "weekend"):
            monday = today - timedelta(days=today.weekday())
            lo = monday + timedelta(weeks=step)
            if cal == "weekend":
                lo, hi = lo + timedelta(days=5), lo + timedelta(days=7)
            else:
                hi = lo + timedelta(weeks=1)
            gran = "week"
        elif cal == "month":
            lo = datetime(today.year, today.month, 1) + _rd(months=step)
            hi, gran = lo + _rd(months=1), "month"
        else:
            lo = datetime(today.year + step, 1, 1)
            hi, gran = lo + _rd(years=1), "year"
        if which == "last" and cal != "weekend":
            # "last week/month/year" is ambiguous between the previous calendar unit and the
            # past 7 days / month / year: the window covers both readings, up to the anchor
            hi = now_end
        if kind == "unit_start":  # "the start of the year": its first day
            hi, gran = lo + _DAY, "day"
        return lo, hi, gran
    if kind == "day_word":
        w = " ".join(g["w"].lower().split())
        back = 2 if w == "the day before yesterday" else 1 if w in ("yesterday", "last night") else 0
        lo = today - timedelta(days=back)
        return lo, lo + _DAY, "day"
    if kind == "weekday":
        which = " ".join(g["which"].lower().split())
        wd = ["monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday"].index(g["wd"].lower())
        rel = _relativedelta()
        wdobj = (rel.MO, rel.TU, rel.WE, rel.TH, rel.FR, rel.SA, rel.SU)[wd]
        if which == "next":
            lo = today + _rd(days=1, weekday=wdobj(+1))
        elif which == "this":  # the one in the anchor's week (Monday first)
            lo = today - timedelta(days=today.weekday()) + timedelta(days=wd)
        else:  # last / on / past / this past: the latest one strictly before the anchor's day
            lo = today + _rd(days=-1, weekday=wdobj(-1))
        return lo, lo + _DAY, "day"
    if kind == "recent":
        return today - timedelta(days=RECENT_DAYS), now_end, "recent"
    if kind == "other_day":
        return today - timedelta(days=OTHER_DAY_DAYS), now_end, "recent"
    raise AssertionError(kind)  # pragma: no cover


def _part(m: re.Match, lo: datetime, hi: datetime) -> tuple[datetime, datetime]:
    """"the first / second / last (N) week(s) / weekend / day(s) of" the span [lo, hi)."""
    pos = m.group("pos").lower()
    k = {"first": 1, "second": 2, "third": 3, "fourth": 4}.get(pos, 0)
    n = int(m.group("pn")) if (m.group("pn") or "").isdigit() else _NUMWORDS.get((m.group("pn") or "one").lower(), 1)
    unit = m.group("punit").lower()
    sa = _relativedelta().SA
    if unit == "weekend":  # the first Saturday in the span, or the last one that starts in it
        sat = lo + _rd(weekday=sa(+k)) if k else hi - _DAY + _rd(weekday=sa(-1))
        return sat, sat + 2 * _DAY
    step = timedelta(weeks=1) if unit == "week" else _DAY
    if k:
        start = lo + (k - 1) * step if m.group("pn") is None else lo
        return start, min(hi, start + n * step)
    return max(lo, hi - n * step), hi


def _find_atoms(q: str, anchor: datetime, anchor_ms: int, sessions: Sequence[int]) -> tuple[list[_Atom], list[tuple]]:
    """The accepted, resolved expressions of ``q`` in text order, plus the shift prefixes."""
    taken: list[tuple[int, int]] = []
    atoms: list[_Atom] = []
    shifts: list[tuple[int, int, re.Match]] = []
    low = q.lower()
    for kind, pat in _PATTERNS:
        if not all(r.search(low) for r in _NEEDS_RE[kind]):
            continue
        for m in pat.finditer(q):
            s, e = m.span("x")
            if any(s < te and ts < e for ts, te in taken):
                continue
            if kind in ("shift_prefix", "part_prefix"):
                shifts.append((s, e, m))
                continue
            r = _resolve(kind, m, anchor, anchor_ms, sessions)
            if r is None:
                continue
            taken.append((s, e))
            atoms.append(_Atom(kind, s, e, m.group("x"), r[0], r[1], r[2], m,
                               explicit_year=bool(m.groupdict().get("y")) or bool(_HAS_YEAR.search(m.group("x")))))
    atoms.sort(key=lambda a: a.start)
    return atoms, shifts


def _window(lo: datetime, hi: datetime, text: str, gran: str) -> TimeWindow | None:
    s = _ms(lo)
    e = MAX_MS if hi == datetime.max else _ms(hi)
    s, e = max(s, MIN_MS), min(e, MAX_MS)
    return TimeWindow(s, e, " ".join(text.split()), gran) if e > s else None


_ABSOLUTE = ("iso_day", "num_day", "num_md", "day", "month_year", "month", "season_year", "mod_year", "year",
             "calendar", "unit_start", "day_word", "weekday", "season")


def parse_time_window(query: str, anchor_ms: int, session_times_ms: Sequence[int] = ()) -> TimeWindow | None:
    """The window a query's time expression names, anchored at the time the question is asked.

    Parameters
    ----------
    query : str
        The question.
    anchor_ms : int, float or datetime
        When the question is asked: epoch milliseconds (UTC), or a datetime
        (naive = UTC). Relative expressions count back from it; a date without
        a year is the latest such date not after it.
    session_times_ms : sequence of int
        Start times (epoch ms) of the user's past sessions, for "since we last
        talked" / "last time we spoke" (window: from the latest session start
        before the anchor to the anchor). Order does not matter. Without a
        session before the anchor these expressions give no window.

    Returns
    -------
    TimeWindow or None
        ``[start_ms, end_ms)``; None when the query names no time (a "when"
        question asks about a time and names none), or names only the future
        (the window starts after the anchor: "next week", "this weekend" asked
        on a Wednesday; a memory holds nothing there). Several expressions give
        their hull; "recently" next to a date is dropped, and relative
        expressions next to a dated one count back from that date. See
        ``docs/temporal.md`` for the rules.

    Raises
    ------
    ValueError
        ``query`` not a string, ``anchor_ms`` not a number/datetime, a session
        time not a number.
    MissingExtra
        dateparser / python-dateutil missing (``pip install 'gpuir[routing]'``).
    """
    if not isinstance(query, str):
        raise ValueError(f"query must be a str, got {type(query).__name__}")  # noqa: TRY004
    anchor, a_ms = _anchor_datetime(anchor_ms)
    if not _TIMEISH.search(query):
        return None
    sessions: list[int] = []
    for t in session_times_ms:
        if isinstance(t, bool) or not isinstance(t, numbers.Real) or not math.isfinite(float(t)):
            raise ValueError(f"session_times_ms must be epoch milliseconds (numbers), got {t!r}")
        sessions.append(int(t))
    atoms, shifts = _find_atoms(query, anchor, a_ms, sessions)
    if any(a.kind not in ("recent", "other_day") for a in atoms):
        # "recently in May 2022": the date names the time; "recently" is relative to it, not to the anchor
        atoms = [a for a in atoms if a.kind not in ("recent", "other_day")]
    if not atoms:
        return None
    dated = [a for a in atoms if a.kind in ("iso_day", "num_day", "day", "month_year") and a.explicit_year]
    if dated:
        # "last Friday, as mentioned on 23 January, 2022": relative expressions count back from
        # the dated one (the end of its span), not from the anchor; the hull then spans both
        local = dated[0].hi - timedelta(milliseconds=1)
        for a in atoms:
            if a.kind in ("weekday", "calendar", "ago", "day_word", "rolling") and a.match is not None:
                r = _resolve(a.kind, a.match, local, _ms(local), sessions)
                if r is not None:
                    a.lo, a.hi = r[0], r[1]
    now_end = anchor + timedelta(milliseconds=1)

    out: list[tuple[datetime, datetime, int, int, str]] = []  # lo, hi, span start, span end, granularity
    i = 0
    while i < len(atoms):
        a = atoms[i]
        lo, hi, s, e, gran = a.lo, a.hi, a.start, a.end, a.gran
        before = query[:a.start]
        op_m = _COMBINE_BEFORE.search(before) if a.kind in _ABSOLUTE else None
        op = " ".join(op_m.group("op").lower().split()) if op_m else None
        nxt = atoms[i + 1] if i + 1 < len(atoms) else None
        shift = next((sh for sh in shifts if sh[1] <= a.start and not query[sh[1]:a.start].strip(" ,")
                      .removeprefix("the").strip()), None)
        if (op in ("between", "from") and nxt is not None and nxt.kind in _ABSOLUTE
                and _JOIN_RANGE.match(query[a.end:nxt.start])):
            if nxt.explicit_year and not a.explicit_year and a.match is not None:
                r = _resolve(a.kind, a.match, anchor, a_ms, sessions, year=nxt.lo.year)
                if r is not None:
                    lo = r[0]
            if lo >= nxt.hi and not a.explicit_year:
                lo = lo - _rd(years=1)
            lo, hi = min(lo, nxt.lo), max(hi, nxt.hi)
            s, e, gran = op_m.start(), nxt.end, "range"
            i += 1
        elif shift is not None and "pos" in shift[2].groupdict():  # "the first weekend of October 2023"
            if a.kind in ("month", "month_year", "year", "season_year", "season"):
                lo, hi = _part(shift[2], lo, hi)
                s, gran = shift[0], "part"
        elif shift is not None and shift[2].group("swd"):  # "the Sunday / weekend before X"
            sm, rel = shift[2], _relativedelta()
            d = " ".join(sm.group("dir").lower().split())
            swd = sm.group("swd").lower()
            before_x = d in ("before", "prior to")
            if swd == "weekend":
                sat = (_floor_day(lo) + _rd(days=-2, weekday=rel.SA(-1)) if before_x
                       else _floor_day(hi) + _rd(weekday=rel.SA(+1)))
                lo, hi = sat, sat + 2 * _DAY
            else:
                wdobj = getattr(rel, swd[:2].upper())
                day = (_floor_day(lo) + _rd(days=-1, weekday=wdobj(-1)) if before_x
                       else _floor_day(hi) + _rd(weekday=wdobj(+1)))
                lo, hi = day, day + _DAY
            s, gran = shift[0], "shift"
        elif shift is not None:
            sm = shift[2]
            unit = sm.group("unit").lower()
            n = _qty(sm) if sm.group("qty") else 1
            d = " ".join(sm.group("dir").lower().split())
            if d in ("before", "prior to"):
                base = lo
                lo, hi = (base - _units(unit, n), base) if not sm.group("qty") else (base - _units(unit, n), base - _units(unit, n) + _DAY)
            else:
                base = hi
                lo, hi = (base, base + _units(unit, n)) if not sm.group("qty") else (base + _units(unit, n) - _DAY, base + _units(unit, n))
            if sm.group("qty"):  # "3 days before X": that day, widened like "ago"
                hw = AGO_HALF_WIDTH_DAYS[unit] * _DAY
                lo, hi = lo - hw, hi + hw
            s, gran = shift[0], "shift"
        elif op in ("before", "prior to"):
            lo, hi, s, gran = datetime.min, lo, op_m.start(), "before"
        elif op in ("until", "till", "up to"):
            lo, s, gran = datetime.min, op_m.start(), "before"
        elif op in ("after", "following", "since"):
            lo = hi if op != "since" else lo
            hi = now_end if lo < now_end else datetime.max
            s, gran = op_m.start(), "after" if op != "since" else "since"
        out.append((lo, hi, s, e, gran))
        i += 1

    if len(out) == 1:
        lo, hi, s, e, gran = out[0]
    else:
        lo = min(o[0] for o in out)
        hi = max(o[1] for o in out)
        s, e, gran = out[0][2], out[-1][3], "hull"
    if lo != datetime.min and _ms(lo) > a_ms:
        return None  # only the future ("next week", "this weekend" asked on a Wednesday): nothing is stored there
    if lo == datetime.min:
        lo_ms = MIN_MS
        hi_ms = MAX_MS if hi == datetime.max else _ms(hi)
        return TimeWindow(lo_ms, hi_ms, " ".join(query[s:e].split()), gran) if hi_ms > lo_ms else None
    return _window(lo, hi, query[s:e], gran)
