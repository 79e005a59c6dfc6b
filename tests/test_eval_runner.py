"""Runner and CLI: one batch with per-query filters, reports, run files, method registry."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest

from gpuir.eval import runner
from gpuir.eval.datasets import load_beir
from gpuir.eval.runner import Run, evaluate, register_method


def _cli(argv):
    from gpuir.cli import main

    return main(argv)


def test_locomo_one_batch_filtered(locomo, backend):
    res = evaluate(locomo, backend=backend, n_boot=500)
    assert res.run.ranked.shape == (1986, 100)
    # every retrieved session belongs to the question's own conversation
    for q, row in zip(res.queries, res.run.ranked):
        got = [locomo.doc_ids[d] for d in row if d >= 0]
        assert got and all(d.startswith(q.group + ":") for d in got)
    s = res.summary()
    assert s["overall"]["hit@1"]["n"] == 1982 and s["overall"]["hit@1"]["n_clusters"] == 10
    assert set(s["by_category"]) == {"multi-hop", "temporal", "open-domain", "single-hop", "adversarial"}
    ov = {m: v["mean"] for m, v in s["overall"].items()}
    assert ov["hit@1"] <= ov["hit@3"] <= ov["hit@5"] <= ov["hit@10"]
    assert 0.55 < ov["hit@1"] < 0.8 and ov["hit@10"] > 0.9
    for m, v in s["overall"].items():
        assert v["lo"] <= v["mean"] <= v["hi"], m
    # questions without gold: nan metrics, never scored
    nog = [i for i, q in enumerate(res.queries) if not q.gold]
    assert len(nog) == 4 and np.isnan(res.per_query["hit@1"][nog]).all()


@pytest.mark.gpu
def test_cupy_matches_numpy(locomo, oracle):
    a = evaluate(locomo, backend="numpy", n_boot=100)
    b = evaluate(locomo, backend="cupy", n_boot=100)
    assert b.run.meta["backend"] == "cupy"
    for q, row in zip(b.queries, b.run.ranked):
        assert all(locomo.doc_ids[d].startswith(q.group + ":") for d in row if d >= 0)
    for m in ("hit@5", "ndcg@5"):
        assert abs(np.nanmean(a.per_query[m]) - np.nanmean(b.per_query[m])) < 2e-3


def test_longmemeval_oracle_filtered(oracle):
    res = evaluate(oracle, n_boot=200)
    for q, row in zip(res.queries, res.run.ranked):
        assert {oracle.doc_ids[d] for d in row if d >= 0} <= set(q.candidates)
    s = res.summary()
    assert s["overall"]["recall_any@5"]["n"] == 470
    assert s["apart"]["abstention"]["recall_any@5"]["n"] == 30
    assert s["overall"]["recall_all@10"]["mean"] > 0.95


def test_run_and_qrels_files_agree_with_pytrec_eval(tmp_path, locomo):
    pytrec_eval = pytest.importorskip("pytrec_eval")
    res = evaluate(locomo, n_boot=100)
    res.write_run(tmp_path / "run.trec")
    res.write_qrels(tmp_path / "qrels.txt")
    run: dict = {}
    for line in (tmp_path / "run.trec").read_text().splitlines():
        qid, _, did, rank, _score, _tag = line.split()
        # score by rank: our tie order, which trec_eval's re-sort would not keep
        run.setdefault(qid, {})[did] = 1000.0 - int(rank)
    qrels: dict = {}
    for line in (tmp_path / "qrels.txt").read_text().splitlines():
        qid, _, did, rel = line.split()
        qrels.setdefault(qid, {})[did] = int(rel)
    ev = pytrec_eval.RelevanceEvaluator(qrels, {"success.1,5", "ndcg_cut.5", "recip_rank"})
    out = ev.evaluate(run)
    scored = [q for q in res.queries if q.scored]
    assert set(out) == {q.qid for q in scored}
    pos = {q.qid: i for i, q in enumerate(res.queries)}
    for qid, m in out.items():
        i = pos[qid]
        assert res.per_query["hit@1"][i] == pytest.approx(m["success_1"], abs=1e-6)
        assert res.per_query["ndcg@5"][i] == pytest.approx(m["ndcg_cut_5"], abs=1e-6)
        assert res.per_query["mrr"][i] == pytest.approx(m["recip_rank"], abs=1e-6)


def test_method_registry(locomo):
    calls = {}

    @register_method("reverse-test", help="worst ranking, for the test")
    def _rev(ds, queries, k, *, backend="auto", progress=False, **opts):
        calls["opts"] = opts
        ranked = np.full((len(queries), k), -1, dtype=np.int64)
        filt = ds.candidate_filters(queries)
        for i, f in enumerate(filt):
            row = f[::-1][:k]
            ranked[i, : row.size] = row
        scores = np.where(ranked >= 0, 1.0, -np.inf).astype(np.float32)
        return Run(ranked, scores, {"backend": "none"})

    try:
        res = evaluate(locomo, "reverse-test", k=50, n_boot=100, foo=1)
        assert calls["opts"] == {"foo": 1}
        assert res.summary()["overall"]["hit@1"]["mean"] < 0.2
    finally:
        runner.EVAL_METHODS.pop("reverse-test", None)
    with pytest.raises(ValueError, match="unknown method"):
        evaluate(locomo, "nope")


def test_beir_end_to_end(tmp_path, beir_toy):
    d = beir_toy
    ds = load_beir(d)
    res = evaluate(ds, cutoffs=(1, 3), n_boot=100)
    # q1 -> d1, q2 -> d2 (the other relevant dX is not in the corpus: recall 1/2)
    assert res.per_query["hit@1"][:2].tolist() == [1.0, 1.0]
    assert res.per_query["recall@3"][:2].tolist() == [1.0, 0.5]
    assert np.isnan(res.per_query["hit@1"][2])
    rc = _cli(["eval", "beir", "--data", str(d), "--out", str(tmp_path / "r.json"), "--n-boot", "100"])
    assert rc == 0
    rep = json.loads((tmp_path / "r.json").read_text())
    assert rep["n_scored"] == 2 and rep["dataset"]["name"] == "beir:toy"


def test_cli_locomo_under_a_minute(tmp_path, data_dir, capsys):
    t0 = time.perf_counter()
    rc = _cli(["eval", "locomo", "--data", str(data_dir / "locomo" / "locomo10.json"),
               "--out", str(tmp_path / "rep.json"), "--run", str(tmp_path / "run.trec"), "--no-progress"])
    assert rc == 0
    assert time.perf_counter() - t0 < 60
    out = capsys.readouterr().out
    assert "1982 questions scored of 1986" in out and "single-hop" in out and "hit@1" in out
    rep = json.loads((tmp_path / "rep.json").read_text())
    assert rep["n_scored"] == 1982 and rep["dataset"]["malformed_ids"] == 2
    assert len(rep["per_query"]["qid"]) == 1986 and rep["per_query"]["qid"][0] == "conv-26:q0"
    assert rep["bootstrap"]["clusters"] == "conversation"
    first = (tmp_path / "run.trec").read_text().splitlines()[0].split()
    assert first[0] == "conv-26:q0" and first[2].startswith("conv-26:S") and first[3] == "1"
    # compare the report with itself: no difference
    rc = _cli(["eval", "compare", str(tmp_path / "rep.json"), str(tmp_path / "rep.json"), "--json"])
    assert rc == 0
    cmp = json.loads(capsys.readouterr().out)
    assert cmp["delta"] == 0 and cmp["n_clusters"] == 10


def test_cli_longmemeval_oracle(tmp_path, data_dir, capsys):
    rc = _cli(["eval", "longmemeval", "--method", "bm25", "--split", "oracle", "--n-boot", "200",
               "--data", str(data_dir / "longmemeval" / "longmemeval_oracle.json.gz"),
               "--analyzer", "porter", "--k1", "0.9", "--b", "0.4", "--out", str(tmp_path / "o.json")])
    assert rc == 0
    out = capsys.readouterr().out
    assert "(abstention, apart)" in out and "multi-session" in out
    rep = json.loads((tmp_path / "o.json").read_text())
    assert rep["options"]["analyzer"] == "porter" and rep["run_meta"]["bm25"]["k1"] == 0.9


@pytest.mark.parametrize(
    "argv, msg",
    [
        (["eval", "locomo", "--data", "/no/such/file.json"], "not found"),
        (["eval", "beir"], "needs --data"),
        (["eval", "locomo", "--categories", "9"], "unknown LoCoMo category"),
        (["eval", "compare", "/no/a.json", "/no/b.json"], "report not found"),
    ],
)
def test_cli_bad_input_exits_2(argv, msg, capsys, data_dir):
    assert _cli(argv) == 2
    assert msg in capsys.readouterr().err


def test_cli_bad_arguments_exit_2(capsys):
    with pytest.raises(SystemExit) as e:
        _cli(["eval", "locomo", "-k", "0"])
    assert e.value.code == 2
    with pytest.raises(SystemExit) as e:
        _cli(["eval", "locomo", "--method", "nope"])
    assert e.value.code == 2


def test_cli_bad_json(tmp_path, capsys):
    p = tmp_path / "x.json"
    p.write_text("not json")
    assert _cli(["eval", "locomo", "--data", str(p)]) == 2
    assert "not valid JSON" in capsys.readouterr().err
    assert _cli(["eval", "longmemeval", "--data", str(p)]) == 2


def test_ablation_small(locomo):
    out = runner.ablation(locomo, analyzers=["default", "plain"], k1s=[1.2], bs=[0.4, 0.75], n_boot=100)
    assert len(out["rows"]) == 4
    assert out["loco"]["metric"] == "hit@1" and len(out["loco"]["chosen"]) == 10
    assert 0.5 < out["loco"]["heldout_mean"] < 0.8
