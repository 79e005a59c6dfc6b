"""The torch-free MiniLM against sentence-transformers on every LoCoMo turn: parity and speed.

For every LoCoMo turn (5,882) and question (1,986):

* cosine between the torch-free embedding (gpuir.dense.minilm, NumPy here) and
  sentence-transformers' (torch, CPU), its minimum over all turns (issue 37 asks >= 0.9999);
* the dense channel's top 10 per question (each question ranks its own conversation's
  turns by inner product, tie rule: higher score, then lower turn number) from either
  encoder's vectors: how many questions get the identical ordered top 10;
* encoding speed in turns/s for both, same machine, same process, alternated
  (torch-free, sentence-transformers, torch-free, ...) ``--repeats`` times, plus the
  latency of one short sentence (the cost of encoding a question).

Writes bench/results/bench_encoder_<host>_<date>.json. The machine is shared: the
JSON records the load average before and after, and the figures are labelled as
measured under that load.

    PYTHONPATH=$PWD python bench/bench_encoder.py [--threads 2] [--repeats 2] [--limit N]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
ap.add_argument("--threads", type=int, default=0, help="BLAS / torch threads (0: library default)")
ap.add_argument("--repeats", type=int, default=2, help="timed encodes of all turns per engine")
ap.add_argument("--batch-size", type=int, default=64)
ap.add_argument("--limit", type=int, default=0, help="only the first N turns (0: all) -- for a smoke run")
ap.add_argument("--out", default=None, help="output JSON (default bench/results/bench_encoder_<host>_<date>.json)")
args = ap.parse_args()
if args.threads:
    for v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[v] = str(args.threads)

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from gpuir.dense.encoder import default_model_path
from gpuir.dense.minilm import MiniLM
from gpuir.eval.datasets import load_locomo


def top10_per_question(ds, vec_docs: np.ndarray, vec_q: np.ndarray) -> list[tuple[str, ...]]:
    pos = {d: i for i, d in enumerate(ds.doc_ids)}
    out = []
    for qi, q in enumerate(ds.queries):
        cand = np.array(sorted(pos[c] for c in q.candidates), dtype=np.int64)
        s = vec_docs[cand] @ vec_q[qi]
        order = np.lexsort((cand, -s))[:10]  # higher score, then lower turn number
        out.append(tuple(ds.doc_ids[cand[j]] for j in order))
    return out


def main() -> None:
    ds = load_locomo(unit="turn")
    turns = list(ds.doc_texts)
    if args.limit:
        keep = set(ds.doc_ids[: args.limit])
        ds.queries = [q for q in ds.queries if q.candidates and set(q.candidates) <= keep]
        turns = turns[: args.limit]
        ds.doc_ids = ds.doc_ids[: args.limit]
    questions = [q.text for q in ds.queries]
    load0 = os.getloadavg()
    path = default_model_path()

    import torch
    from sentence_transformers import SentenceTransformer

    if args.threads:
        torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    ours = MiniLM(path)
    load_ours = time.perf_counter() - t0
    t0 = time.perf_counter()
    st = SentenceTransformer(str(path), device="cpu")
    load_st = time.perf_counter() - t0

    enc = {
        "torch-free (numpy)": lambda xs: ours.encode(xs, batch_size=args.batch_size),
        "sentence-transformers (torch cpu)": lambda xs: st.encode(xs, batch_size=args.batch_size,
                                                                  normalize_embeddings=True, convert_to_numpy=True),
    }
    vecs: dict[str, np.ndarray] = {}
    secs: dict[str, list[float]] = {k: [] for k in enc}
    for _ in range(max(1, args.repeats)):
        for name, f in enc.items():
            t0 = time.perf_counter()
            vecs[name] = f(turns)
            secs[name].append(time.perf_counter() - t0)
    qv = {name: f(questions) for name, f in enc.items()}
    one: dict[str, dict[str, float]] = {}
    sentence = ["where does Alice live?"]
    for name, f in enc.items():
        f(sentence)
        lat = []
        for _ in range(50):
            t0 = time.perf_counter()
            f(sentence)
            lat.append((time.perf_counter() - t0) * 1e3)
        one[name] = {"p50_ms": float(np.percentile(lat, 50)), "p99_ms": float(np.percentile(lat, 99))}

    a, b = vecs["torch-free (numpy)"], vecs["sentence-transformers (torch cpu)"]
    cos = (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
    qa, qb = qv["torch-free (numpy)"], qv["sentence-transformers (torch cpu)"]
    qcos = (qa * qb).sum(1)
    ta = top10_per_question(ds, a, qa)
    tb = top10_per_question(ds, b, qb)
    same = sum(x == y for x, y in zip(ta, tb))
    same_set = sum(set(x) == set(y) for x, y in zip(ta, tb))
    load1 = os.getloadavg()
    res = {
        "what": "torch-free all-MiniLM-L6-v2 (gpuir.dense.minilm, NumPy) vs sentence-transformers on LoCoMo turns",
        "command": "PYTHONPATH=$PWD python " + " ".join(sys.argv),
        "when": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "host": socket.gethostname(), "cpu_count": os.cpu_count(), "platform": platform.platform(),
        "load_avg_before": load0, "load_avg_after": load1,
        "note": ("measured on a 2-core machine shared with other engineers' jobs (load average above): "
                 "absolute figures are noisy; both engines ran alternately in one process"),
        "versions": {"numpy": np.__version__, "torch": torch.__version__,
                     "sentence_transformers": __import__("sentence_transformers").__version__},
        "turns": len(turns), "questions": len(questions), "batch_size": args.batch_size, "threads": args.threads,
        "model_load_s": {"torch-free (numpy)": load_ours, "sentence-transformers (torch cpu)": load_st},
        "encode_all_turns_s": secs,
        "turns_per_s_best": {k: len(turns) / min(v) for k, v in secs.items()},
        "one_sentence_ms": one,
        "parity": {
            "turn_cosine_min": float(cos.min()), "turn_cosine_mean": float(cos.mean()),
            "turns_below_0.9999": int((cos < 0.9999).sum()),
            "question_cosine_min": float(qcos.min()),
            "top10_identical_ordered": same, "top10_identical_as_sets": same_set, "questions_compared": len(ta),
            "max_abs_diff": float(np.abs(a - b).max()),
        },
    }
    out = Path(args.out) if args.out else (
        Path(__file__).resolve().parent / "results"
        / f"bench_encoder_{socket.gethostname()}_{datetime.now(timezone.utc):%Y%m%d_%H%M}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=2) + "\n")
    print(json.dumps({k: res[k] for k in ("turns_per_s_best", "one_sentence_ms", "parity", "load_avg_after")},
                     indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
