"""BM25 analyzer x k1 x b ablation on LoCoMo and LongMemEval-S, with a plot.

    python bench/eval_ablation.py                       # both data sets
    python bench/eval_ablation.py --datasets locomo     # LoCoMo only (seconds)

Writes bench/results/eval_ablation_<dataset>.json and docs/img/eval_ablation.png
(from whatever result files exist). Each JSON row holds every metric with its
95% cluster-bootstrap interval; LoCoMo adds leave-one-conversation-out selection.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gpuir.eval.datasets import load_locomo, load_longmemeval
from gpuir.eval.runner import ABLATION_ANALYZERS, ablation, save_json

RESULTS = ROOT / "bench" / "results"
IMG = ROOT / "docs" / "img" / "eval_ablation.png"
PANELS = {"locomo": ("LoCoMo sessions", ["hit@1", "hit@5", "mrr"]),
          "longmemeval": ("LongMemEval-S sessions (user turns)", ["recall_all@5", "recall_any@5", "ndcg@5"])}


def run(name: str, backend: str) -> None:
    t0 = time.perf_counter()
    ds = load_locomo() if name == "locomo" else load_longmemeval(split="s")
    from gpuir.progress import show_progress

    out = ablation(ds, backend=backend, n_boot=2000, progress=show_progress())
    out["seconds"] = time.perf_counter() - t0
    save_json(out, RESULTS / f"eval_ablation_{name}.json")
    print(f"{name}: {len(out['rows'])} settings in {out['seconds']:.0f}s", file=sys.stderr)


def plot() -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    avail = [n for n in PANELS if (RESULTS / f"eval_ablation_{n}.json").exists()]
    if not avail:
        return
    fig, axes = plt.subplots(len(avail), 1, figsize=(12, 4.2 * len(avail)), squeeze=False)
    for ax, name in zip(axes[:, 0], avail):
        res = json.loads((RESULTS / f"eval_ablation_{name}.json").read_text())
        title, metrics = PANELS[name]
        rows = res["rows"]
        labels = [f"{r['analyzer']}\nk1={r['k1']:g} b={r['b']:g}" for r in rows]
        x = range(len(rows))
        width = 0.8 / len(metrics)
        for j, m in enumerate(metrics):
            means = [r["overall"][m]["mean"] for r in rows]
            err = [[r["overall"][m]["mean"] - r["overall"][m]["lo"] for r in rows],
                   [r["overall"][m]["hi"] - r["overall"][m]["mean"] for r in rows]]
            ax.bar([i + (j - (len(metrics) - 1) / 2) * width for i in x], means, width, yerr=err,
                   capsize=1.5, label=m, error_kw={"elinewidth": 0.6})
        lo = min(r["overall"][m]["lo"] for r in rows for m in metrics)
        ax.set_ylim(max(0.0, lo - 0.05), 1.0)
        ax.set_xticks(list(x))
        ax.set_xticklabels(labels, rotation=90, fontsize=6)
        ax.set_title(f"BM25 ablation: {title} (95% cluster-bootstrap intervals)")
        ax.legend(ncol=len(metrics), fontsize=8, loc="lower right")
        ax.grid(axis="y", alpha=0.3)
        if "loco" in res:
            lo_ = res["loco"]
            ax.axhline(lo_["heldout_mean"], color="k", ls="--", lw=0.8)
            ax.text(0, lo_["heldout_mean"] + 0.003,
                    f"leave-one-conversation-out {lo_['metric']} = {lo_['heldout_mean']:.3f}", fontsize=7)
    fig.tight_layout()
    IMG.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(IMG, dpi=130)
    print(f"plot -> {IMG}", file=sys.stderr)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--datasets", default="locomo,longmemeval")
    p.add_argument("--backend", default="auto")
    p.add_argument("--plot-only", action="store_true")
    a = p.parse_args()
    if not a.plot_only:
        for name in a.datasets.split(","):
            run(name, a.backend)
    plot()
    print("analyzers:", ", ".join(f"{k} ({v})" for k, v in ABLATION_ANALYZERS.items()), file=sys.stderr)


if __name__ == "__main__":
    main()
