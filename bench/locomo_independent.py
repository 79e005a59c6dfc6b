"""LoCoMo Hit@1 of a Retriever configuration, scored without the evaluation harness.

    python bench/locomo_independent.py [--data locomo10.json] [--config CONFIG.json] \
        [--out bench/results/locomo_default_independent.json]

Everything between the data file and the figure is written here, from the file's
own fields, and shares no code with ``gpuir.eval`` (its loader, records, wheres,
question times, metrics and bootstrap): the memory holds one record per turn
(``"<speaker>: <text>"``, session ``<sample_id>:S<n>``, tenant the conversation,
time the session's date as UTC), each question is searched with
``Retriever.search(unit="session", where={"tenant": <conversation>}, at=<the
conversation's last session date>)``, and Hit@1 is whether the top session holds
a turn the question's ``evidence`` names (``D<n>:<t>`` ids of existing turns;
questions without one are not scored). The interval is a cluster bootstrap over
the 10 conversations, written here too. What it checks: the figure that
``gpuir eval locomo --method default`` reports (``tests/test_eval_independent.py``
checks both agree question by question).
"""

from __future__ import annotations

import argparse
import json
import platform
import re
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

DATE_FORMATS = ("%I:%M %p on %d %B, %Y", "%I:%M %p on %d %b, %Y", "%I:%M %p on %B %d, %Y")
TURN_ID = re.compile(r"D(\d+):(\d+)")
CATEGORIES = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop", 5: "adversarial"}


def _date(s: str | None) -> datetime | None:
    if not s:
        return None
    s = " ".join(str(s).split())
    for fmt in DATE_FORMATS:
        try:
            return datetime.strptime(s, fmt).replace(tzinfo=timezone.utc)
        except ValueError:
            pass
    return None


def read_locomo(path: str | Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Turn records and questions straight from ``locomo10.json``.

    Returns
    -------
    records : list of dict (id, text, session, tenant, time), in file order
    questions : list of dict (qid, text, tenant, at: epoch ms, gold: set of session ids, category)
    """
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    records: list[dict[str, Any]] = []
    questions: list[dict[str, Any]] = []
    for conv_obj in data:
        sid, conv = conv_obj["sample_id"], conv_obj["conversation"]
        nums = sorted(int(k.split("_")[1]) for k in conv if re.fullmatch(r"session_\d+", k))
        turns: set[tuple[int, int]] = set()
        dates = []
        for n in nums:
            when = _date(conv.get(f"session_{n}_date_time"))
            if when is not None:
                dates.append(when)
            for t, turn in enumerate(conv[f"session_{n}"] or [], start=1):
                turns.add((n, t))
                text = str(turn.get("text", ""))
                if turn.get("speaker"):
                    text = f"{turn['speaker']}: {text}"
                rec = {"id": f"{sid}:D{n}:{t}", "text": text, "session": f"{sid}:S{n}", "tenant": sid}
                if when is not None:
                    rec["time"] = when
                records.append(rec)
        at = round(max(dates).timestamp() * 1000) if dates else None
        for qi, qa in enumerate(conv_obj["qa"]):
            gold = set()
            for ev in qa.get("evidence") or []:
                for piece in re.split(r"[;,\s]+", str(ev)):
                    m = TURN_ID.fullmatch(piece)
                    if m and (int(m.group(1)), int(m.group(2))) in turns:
                        gold.add(f"{sid}:S{int(m.group(1))}")
            questions.append({"qid": f"{sid}:q{qi}", "text": str(qa.get("question", "")), "tenant": sid, "at": at,
                              "gold": gold, "category": CATEGORIES.get(qa.get("category"), str(qa.get("category")))})
    return records, questions


def top_sessions(records: list[dict[str, Any]], questions: list[dict[str, Any]], config: Any = None,
                 k: int = 5, backend: str = "auto") -> list[list[str]]:
    """Each question's top-``k`` session ids from ``gpuir.Retriever`` (the default configuration unless given)."""
    from gpuir import Memory, Retriever

    m = Memory()
    m.add(records)
    r = Retriever(m, config)
    out: list[list[str]] = []
    for s in range(0, len(questions), 256):
        batch = questions[s: s + 256]
        res = r.search([q["text"] for q in batch], k=k, where=[{"tenant": q["tenant"]} for q in batch],
                       unit="session", backend=backend, at=[q["at"] for q in batch])
        out.extend(res.ids(i) for i in range(len(batch)))
    return out


def hit_at(ranked: list[list[str]], questions: list[dict[str, Any]], cut: int = 1) -> np.ndarray:
    """Per scored question: 1.0 when one of its top ``cut`` sessions holds gold evidence (questions with gold only)."""
    return np.array([float(bool(set(r[:cut]) & q["gold"])) for r, q in zip(ranked, questions) if q["gold"]])


def cluster_interval(values: np.ndarray, groups: list[str], n_boot: int = 2000, seed: int = 0) -> tuple[float, float]:
    """95% percentile interval of the mean, resampling whole conversations."""
    rng = np.random.default_rng(seed)
    names = sorted(set(groups))
    g = np.array([names.index(x) for x in groups])
    sums = np.bincount(g, weights=values, minlength=len(names))
    counts = np.bincount(g, minlength=len(names))
    pick = rng.integers(0, len(names), size=(n_boot, len(names)))
    means = sums[pick].sum(axis=1) / counts[pick].sum(axis=1)
    return float(np.percentile(means, 2.5)), float(np.percentile(means, 97.5))


def main(argv: list[str] | None = None) -> int:
    from gpuir import RetrieverConfig
    from gpuir.datapath import locomo_path

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", default=None, help=f"locomo10.json (default: {locomo_path()})")
    p.add_argument("--config", default=None, help="a RetrieverConfig JSON file (default: default_config())")
    p.add_argument("--backend", default="auto", help="BM25 scoring device (default: auto)")
    p.add_argument("--out", default=None, help="write the figures here as JSON (default: printed only)")
    a = p.parse_args(argv)
    t0 = time.perf_counter()
    records, questions = read_locomo(a.data or locomo_path())
    cfg = RetrieverConfig.load(a.config) if a.config else None
    ranked = top_sessions(records, questions, cfg, k=5, backend=a.backend)
    scored = [q for q in questions if q["gold"]]
    groups = [q["tenant"] for q in scored]
    h1, h5 = hit_at(ranked, questions, 1), hit_at(ranked, questions, 5)
    lo, hi = cluster_interval(h1, groups)
    cats = sorted({q["category"] for q in scored})
    from gpuir.retrieve import default_config

    out = {"what": "LoCoMo session Hit@1 of a Retriever configuration, scored by bench/locomo_independent.py "
                   "(no gpuir.eval code)",
           "data": str(a.data or locomo_path()), "config": (cfg or default_config()).to_config(),
           "n_questions": len(questions), "n_scored": len(scored), "records": len(records),
           "hit@1": float(h1.mean()), "hit@1_ci95": [lo, hi], "hit@5": float(h5.mean()),
           "hit@1_by_category": {c: float(h1[[q["category"] == c for q in scored]].mean()) for c in cats},
           "seconds": time.perf_counter() - t0,
           "machine": {"cpu": platform.processor() or platform.machine(), "python": platform.python_version()}}
    print(f"LoCoMo Hit@1 {out['hit@1']:.4f} [{lo:.3f}, {hi:.3f}] over {len(scored)} scored questions "
          f"(Hit@5 {out['hit@5']:.4f}); {out['seconds']:.0f} s")
    if a.out:
        Path(a.out).write_text(json.dumps(out, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
