"""The temporal retriever's time-expression parser (gpuir.retrieve.temporal).

Every expected window below was written by hand from the calendar, not taken
from the code's output. Anchor: Thursday 2023-05-25 13:00 UTC. May 2023 starts on
a Monday, so the anchor's (Monday-first) week is 22-28 May.
"""

from __future__ import annotations

import math
from datetime import datetime, timedelta, timezone

import pytest

pytest.importorskip("dateparser")

from gpuir.retrieve import temporal
from gpuir.retrieve.temporal import MIN_MS, TimeWindow, parse_time_window

ANCHOR = datetime(2023, 5, 25, 13, 0)


def ms(y: int, mo: int, d: int, h: int = 0, mi: int = 0) -> int:
    return int((datetime(y, mo, d, h, mi, tzinfo=timezone.utc).timestamp()) * 1000)


A_MS = ms(2023, 5, 25, 13)
NOW = A_MS + 1  # windows that run "up to now" include the anchor itself

# (query, expected start ms, expected end ms)
TABLE = [
    # weekdays: the latest one strictly before the anchor's day
    ("What did I do last Tuesday?", ms(2023, 5, 23), ms(2023, 5, 24)),
    ("Who did I call on Friday?", ms(2023, 5, 19), ms(2023, 5, 20)),
    ("What did I cook last Thursday?", ms(2023, 5, 18), ms(2023, 5, 19)),
    ("What time did I reach the clinic on Monday?", ms(2023, 5, 22), ms(2023, 5, 23)),
    ("Where did I go this past Sunday?", ms(2023, 5, 21), ms(2023, 5, 22)),
    # day words
    ("What did I eat yesterday?", ms(2023, 5, 24), ms(2023, 5, 25)),
    ("What did I do today?", ms(2023, 5, 25), ms(2023, 5, 26)),
    ("What did I buy the day before yesterday?", ms(2023, 5, 23), ms(2023, 5, 24)),
    ("Which movie did I watch last night?", ms(2023, 5, 24), ms(2023, 5, 25)),
    # calendar units (Monday-first weeks); "last week / month / year" runs from the start of
    # the previous unit up to the anchor (both readings: previous calendar unit, past 7 days / month / year)
    ("How many hours did I jog last week?", ms(2023, 5, 15), NOW),
    ("What meetings do I have this week?", ms(2023, 5, 22), ms(2023, 5, 29)),
    ("What game did I beat last weekend?", ms(2023, 5, 20), ms(2023, 5, 22)),
    ("Which certification did I complete last month?", ms(2023, 4, 1), NOW),
    ("How much have I made from selling eggs this month?", ms(2023, 5, 1), ms(2023, 6, 1)),
    ("Where did I travel last year?", ms(2022, 1, 1), NOW),
    ("How many weddings have I attended this year?", ms(2023, 1, 1), ms(2024, 1, 1)),
    # months: without a year, the latest such month not after the anchor
    ("What did Dave open in May?", ms(2023, 5, 1), ms(2023, 6, 1)),
    ("Where did Joanna travel in June?", ms(2022, 6, 1), ms(2022, 7, 1)),
    ("How many museums did I visit in December?", ms(2022, 12, 1), ms(2023, 1, 1)),
    ("What did Dave open in May 2023?", ms(2023, 5, 1), ms(2023, 6, 1)),
    ("What did Nate share in November 2022?", ms(2022, 11, 1), ms(2022, 12, 1)),
    ("What happened in Aug 2021?", ms(2021, 8, 1), ms(2021, 9, 1)),
    ("How many museums did I visit in the month of February?", ms(2023, 2, 1), ms(2023, 3, 1)),
    # years
    ("What happened to John's job situation in 2022?", ms(2022, 1, 1), ms(2023, 1, 1)),
    ("Which country were they visiting in the year 2019?", ms(2019, 1, 1), ms(2020, 1, 1)),
    ("What have I learned since 2020?", ms(2020, 1, 1), NOW),
    # days
    ("What natural disaster affected John's old area on 7 July, 2022?", ms(2022, 7, 7), ms(2022, 7, 8)),
    ("Which team did John sign with on July 7, 2022?", ms(2022, 7, 7), ms(2022, 7, 8)),
    ("Where was the picture shared by John on December 1,2022 taken?", ms(2022, 12, 1), ms(2022, 12, 2)),
    ("What book did Tim finish reading on the 8th of December 2022?", ms(2022, 12, 8), ms(2022, 12, 9)),
    ("What did we discuss on Mar 3?", ms(2023, 3, 3), ms(2023, 3, 4)),
    ("Who visited on March 15th?", ms(2023, 3, 15), ms(2023, 3, 16)),
    ("What happened on May 26?", ms(2022, 5, 26), ms(2022, 5, 27)),  # a year-less date after the anchor: last year's
    ("What happened on 2023-04-07?", ms(2023, 4, 7), ms(2023, 4, 8)),
    ("What happened on 4/7/2023?", ms(2023, 4, 7), ms(2023, 4, 8)),  # month/day/year
    ("How was the trip on Sat 4 March?", ms(2023, 3, 4), ms(2023, 3, 5)),
    # "N units ago": the day N units back, widened 1 / 4 / 15 / 183 days each side
    ("I mentioned a sports event two weeks ago.", ms(2023, 5, 7), ms(2023, 5, 16)),
    ("What did I buy 3 days ago?", ms(2023, 5, 21), ms(2023, 5, 24)),
    ("Which book did I finish a week ago?", ms(2023, 5, 14), ms(2023, 5, 23)),
    ("What charity event did I join a month ago?", ms(2023, 4, 10), ms(2023, 5, 11)),
    ("Where did I move a year ago?", ms(2021, 11, 23), ms(2022, 11, 25)),
    ("I cooked something for my friend a couple of days ago.", ms(2023, 5, 22), ms(2023, 5, 25)),
    ("What kitchen appliance did I buy 10 days ago?", ms(2023, 5, 14), ms(2023, 5, 17)),
    # rolling windows up to the anchor
    ("How many times did I bake in the past two weeks?", ms(2023, 5, 11), NOW),
    ("Which platform did I gain followers on over the past month?", ms(2023, 4, 25), NOW),
    ("How many MCU films did I watch in the last 3 months?", ms(2023, 2, 25), NOW),
    ("What did I spend on luxury items in the past few months?", ms(2023, 2, 25), NOW),
    ("What have I been reading recently?", ms(2023, 4, 25), NOW),
    ("I've been sneezing quite a bit lately.", ms(2023, 4, 25), NOW),
    ("I met her the other day.", ms(2023, 5, 18), NOW),
    ("What filling did Nate use in the cake he made recently in May 2022?", ms(2022, 5, 1), ms(2022, 6, 1)),
    # a relative expression next to a dated one counts back from that date (23 Jan 2022 is a Sunday)
    ("What did Joanna do last Friday on 23 January, 2022?", ms(2022, 1, 21), ms(2022, 1, 24)),
    ("What did John do last week, as mentioned on November 6, 2022?", ms(2022, 10, 24), ms(2022, 11, 7)),
    # combinators
    ("What happened between March 1 and April 2 2023?", ms(2023, 3, 1), ms(2023, 4, 3)),
    ("Where was John between August 11 and August 15 2022?", ms(2022, 8, 11), ms(2022, 8, 16)),
    ("What did I ride from July to October?", ms(2022, 7, 1), ms(2022, 11, 1)),
    ("What did I buy before 3 March 2023?", MIN_MS, ms(2023, 3, 3)),
    ("What did I buy until June 2022?", MIN_MS, ms(2022, 7, 1)),
    ("What did I buy after May 1, 2023?", ms(2023, 5, 2), NOW),
    ("What changed since last week?", ms(2023, 5, 15), NOW),
    ("What did I spend since the start of the year?", ms(2023, 1, 1), NOW),
    ("What did I do the week before 10 May 2023?", ms(2023, 5, 3), ms(2023, 5, 10)),
    ("What did I do the day after May 5, 2023?", ms(2023, 5, 6), ms(2023, 5, 7)),
    ("Which airline did I fly with the most in March and April?", ms(2023, 3, 1), ms(2023, 5, 1)),
    ("What did Joanna make on the Sunday before October 25, 2022?", ms(2022, 10, 23), ms(2022, 10, 24)),
    ("What did Audrey do over the weekend before 4th October, 2022?", ms(2022, 10, 1), ms(2022, 10, 3)),
    ("What did they do on the Monday before July 24, 2022?", ms(2022, 7, 18), ms(2022, 7, 19)),
    ("What did Jolene finish last week before 23 January, 2023?", ms(2023, 1, 16), ms(2023, 1, 23)),
    ("Where did I eat the Friday after May 5, 2023?", ms(2023, 5, 12), ms(2023, 5, 13)),
    # parts of a month
    ("What did I do the first weekend of October 2022?", ms(2022, 10, 1), ms(2022, 10, 3)),
    ("Where was Dave in the last two weeks of August 2022?", ms(2022, 8, 18), ms(2022, 9, 1)),
    ("What did I start in the second week of March 2023?", ms(2023, 3, 8), ms(2023, 3, 15)),
    # seasons (meteorological, northern) and early / mid / late (thirds)
    ("Where did we go in the summer of 2022?", ms(2022, 6, 1), ms(2022, 9, 1)),
    ("What did I do last summer?", ms(2022, 6, 1), ms(2022, 9, 1)),
    ("What did I plant this spring?", ms(2023, 3, 1), ms(2023, 6, 1)),
    ("Where did I go in early May?", ms(2023, 5, 1), ms(2023, 5, 11)),
    ("Which classes did Evan join in mid-August 2022?", ms(2022, 8, 11), ms(2022, 8, 21)),
    ("What did I build in late 2022?", ms(2022, 9, 1), ms(2023, 1, 1)),
]


@pytest.mark.parametrize(("query", "start", "end"), TABLE, ids=[t[0][:48] for t in TABLE])
def test_expression_table(query, start, end):
    w = parse_time_window(query, A_MS)
    assert w is not None, query
    assert (w.start_ms, w.end_ms) == (start, end), (query, w.start, w.end)
    assert w.expression and w.expression in " ".join(query.split())


def test_table_is_large_enough():
    assert len(TABLE) >= 40


def test_expression_text():
    assert parse_time_window("What did I do last Tuesday?", A_MS).expression == "last Tuesday"
    assert parse_time_window("in the past two weeks, what?", A_MS).expression == "in the past two weeks"
    w = parse_time_window("What happened between March 1 and April 2 2023?", A_MS)
    assert w.expression == "between March 1 and April 2 2023"


# --------------------------------------------------------------------------- negatives

NEGATIVES = [
    "When did Caroline go to the LGBTQ support group?",
    "When did Melanie paint a sunrise?",
    "How many days ago did I buy a smoker?",
    "How many weeks ago did I attend the friends and family sale at Nordstrom?",
    "How many months have passed since I last visited a museum with a friend?",
    "How long have I been working before I started my current job?",
    "What is my favourite colour?",
    "What did Caroline do after the road trip to relax?",
    "Which streaming service did I start using most recently?",
    "Which year did Jolene start practicing yoga?",
    "In which month's game did John achieve a career-high score?",
    "What time do I wake up on Saturday mornings?",
    "How many days had passed between the Sunday mass and the Ash Wednesday service?",
    "What was the increase in followers I experienced in two weeks?",
    "What was my last name before I changed it?",
    "How much faster did I finish the 5K compared to my previous year's time?",
    "It was the last day of school.",
    "What did I do on Sundays?",
    "How many days a week do I attend fitness classes?",
]


@pytest.mark.parametrize("query", NEGATIVES)
def test_no_window(query):
    assert parse_time_window(query, A_MS) is None


FALSE_POSITIVES = [
    "You may want to march on",
    "May I ask you something about my garden?",
    "They will March on the capital",
    "I sat in the sun all afternoon",
    "The mar on the table is from the sun",
    "Sun and sand are what I like",
    "He ran 2022 meters",
    "I have 15 cats and 2 dogs",
    "Can I get a second opinion?",
    "It was the second time I tried",
    "I ran 3 Marathons",
    "We sat down and talked",
    "They will wed in a church",
    "Please mark this as done",
]


@pytest.mark.parametrize("query", FALSE_POSITIVES)
def test_false_positives(query):
    assert parse_time_window(query, A_MS) is None


# --------------------------------------------------------------------------- session log

SESSIONS = [ms(2023, 5, 10, 9), ms(2023, 5, 20, 9), ms(2023, 5, 26, 9)]  # the last one is after the anchor


@pytest.mark.parametrize("query", [
    "What changed since we last talked?",
    "What did I say the last time we spoke?",
    "Can you remind me of the dessert shop you recommended last time?",
    "Anything new since our last conversation?",
    "What did we cover in our last session?",
])
def test_session_log(query):
    w = parse_time_window(query, A_MS, SESSIONS)
    assert (w.start_ms, w.end_ms) == (ms(2023, 5, 20, 9), NOW)
    assert w.granularity == "session"
    # order of the session log does not matter
    assert parse_time_window(query, A_MS, list(reversed(SESSIONS))) == w


def test_session_log_without_sessions():
    assert parse_time_window("What changed since we last talked?", A_MS) is None
    assert parse_time_window("What changed since we last talked?", A_MS, [ms(2023, 6, 1)]) is None


def test_the_last_time_i_did_something_is_not_the_session_log():
    assert parse_time_window("Where did I eat the last time I went to Rome?", A_MS, SESSIONS) is None


# --------------------------------------------------------------------------- anchors


def test_anchor_types_agree():
    aware = datetime(2023, 5, 25, 15, 0, tzinfo=timezone(timedelta(hours=2)))  # 13:00 UTC
    ws = [parse_time_window("last Tuesday", a) for a in (A_MS, float(A_MS), ANCHOR, aware)]
    assert all(w == ws[0] for w in ws)
    assert (ws[0].start_ms, ws[0].end_ms) == (ms(2023, 5, 23), ms(2023, 5, 24))


def test_anchor_moves_year_less_dates():
    # asked on 2023-03-10: "in May" is May 2022, "on Tuesday" is 7 March
    a = ms(2023, 3, 10, 13)
    w = parse_time_window("What did Dave open in May?", a)
    assert (w.start_ms, w.end_ms) == (ms(2022, 5, 1), ms(2022, 6, 1))
    w = parse_time_window("What did I do on Tuesday?", a)
    assert (w.start_ms, w.end_ms) == (ms(2023, 3, 7), ms(2023, 3, 8))


@pytest.mark.parametrize("bad", ["2023-05-25", None, True, math.nan, math.inf, [A_MS], b"1"])
def test_bad_anchor(bad):
    with pytest.raises(ValueError, match="anchor_ms"):
        parse_time_window("last Tuesday", bad)


def test_bad_anchor_even_without_time_words():
    with pytest.raises(ValueError, match="anchor_ms"):
        parse_time_window("What is my favourite colour?", "now")


def test_bad_query_and_sessions():
    with pytest.raises(ValueError, match="query must be a str"):
        parse_time_window(None, A_MS)
    with pytest.raises(ValueError, match="session_times_ms"):
        parse_time_window("since we last talked", A_MS, ["2023-05-01"])


# --------------------------------------------------------------------------- the window


def test_where_and_containment():
    w = parse_time_window("What did I eat yesterday?", A_MS)
    assert w.where() == {"time": {"gte": "2023-05-24T00:00:00+00:00", "lt": "2023-05-25T00:00:00+00:00"}}
    assert ms(2023, 5, 24, 23, 59) in w
    assert ms(2023, 5, 25) not in w
    assert w.start == datetime(2023, 5, 24, tzinfo=timezone.utc)


def test_window_validation():
    with pytest.raises(ValueError, match="start_ms < end_ms"):
        TimeWindow(5, 5, "x")
    with pytest.raises(ValueError, match="integer epoch"):
        TimeWindow(1.5, 5, "x")
    assert TimeWindow(1, 2, "x") == TimeWindow(1, 2, "x", "day")  # granularity is informative only


@pytest.mark.parametrize("query", [
    "What is planned for next Monday?",
    "I'm planning my meal prep next week",
    "Any plans this weekend?",  # asked on a Thursday
    "What natural disaster hit on 7 July, 2023?",
    "What is planned after June 1, 2023?",
    "What family event is Evan planning for next summer?",
])
def test_only_the_future_gives_no_window(query):
    assert parse_time_window(query, A_MS) is None


def test_today_and_this_week_keep_their_past_part():
    assert parse_time_window("What shall I watch tonight?", A_MS).start_ms == ms(2023, 5, 25)
    assert parse_time_window("What meetings do I have this week?", A_MS).end_ms == ms(2023, 5, 29)


def test_no_dateparser_call_without_a_date_text(monkeypatch):
    """Queries without time words, and relative ones, never reach dateparser."""
    def boom(*a, **k):
        raise AssertionError("dateparser was called")

    monkeypatch.setattr(temporal, "_dateparse", boom)
    assert parse_time_window("What is Caroline's identity?", A_MS) is None
    assert parse_time_window("What did I do last Tuesday?", A_MS) is not None
    assert parse_time_window("two weeks ago", A_MS) is not None
    with pytest.raises(AssertionError, match="dateparser was called"):
        parse_time_window("on 7 July, 2023", A_MS)


def test_missing_dateparser_names_the_extra(monkeypatch):
    """Without dateparser: queries that need no date text still work; the others name the extra."""
    import sys

    for f in (temporal._dateparser_class, temporal._parser, temporal._dateparse):
        f.cache_clear()
    monkeypatch.setitem(sys.modules, "dateparser", None)
    monkeypatch.setitem(sys.modules, "dateparser.date", None)
    try:
        assert parse_time_window("What is my favourite colour?", A_MS) is None
        assert parse_time_window("What did I do last Tuesday?", A_MS) is not None
        with pytest.raises(ImportError, match=r"pip install 'gpuir\[routing\]'"):
            parse_time_window("What happened on 7 July, 2022?", A_MS)
    finally:
        for f in (temporal._dateparser_class, temporal._parser, temporal._dateparse):
            f.cache_clear()

