"""Evaluation data as memory records, and `gpuir eval` BM25 through Memory: the shared memory
(tenants as filters, global statistics) reproduces the bm25 method exactly, one memory per tenant
reproduces bm25-private exactly."""

import numpy as np
import pytest

from gpuir import Memory
from gpuir.eval import runner
from gpuir.eval.records import dataset_records, locomo_records, longmemeval_records


def _same_run(ds, method_a, method_b, **opts):
    ra = runner.evaluate(ds, method_a, n_boot=100, **opts)
    rb = runner.evaluate(ds, method_b, n_boot=100, **opts)
    np.testing.assert_array_equal(ra.run.ranked, rb.run.ranked)
    np.testing.assert_array_equal(ra.run.scores, rb.run.scores)
    for metric, v in ra.per_query.items():  # hence every metric, question by question
        np.testing.assert_array_equal(v, rb.per_query[metric])
    return rb


def test_locomo_through_memory_reproduces_bm25(locomo):
    rb = _same_run(locomo, "bm25", "memory")
    assert rb.run.meta["memory"]["tenant_filters"] == len(locomo.queries), "LoCoMo questions filter by tenant"
    _same_run(locomo, "bm25-private", "memory-tenant")
    _same_run(locomo, "bm25", "memory", analyzer="en-large", variant="bm25+", k1=0.9, b=0.4)


def test_longmemeval_through_memory_reproduces_bm25(oracle):
    rb = _same_run(oracle, "bm25", "memory")
    assert rb.run.meta["memory"]["id_filters"] > 0, "shared sessions: some haystacks filter by ids"
    _same_run(oracle, "bm25-private", "memory-tenant")


def test_locomo_records(data_dir, locomo):
    path = data_dir / "locomo" / "locomo10.json"
    turns = locomo_records(path, unit="turn")
    assert len(turns) == 5882 and len({r["tenant"] for r in turns}) == 10
    assert all(r["role"] == "user" and r["metadata"]["speaker"] and "time" in r and r["session"] for r in turns)
    assert all(r["text"].startswith(r["metadata"]["speaker"] + ": ") for r in turns)
    sessions = locomo_records(path, unit="session")
    assert [r["id"] for r in sessions] == locomo.doc_ids and [r["text"] for r in sessions] == locomo.doc_texts
    assert all(len(r["metadata"]["speakers"]) == 2 for r in sessions if r["text"])
    assert dataset_records(locomo)[0]["tenant"] == sessions[0]["tenant"]
    # "what did Caroline say about the support group?" in her conversation
    m = Memory(partition_days=30)
    m.add(turns)
    conv = next(r["tenant"] for r in turns if r["metadata"]["speaker"] == "Caroline")
    res = m.search("support group", k=20, where={"tenant": conv, "metadata.speaker": "Caroline"})
    hits = res.hits(0)
    assert hits and all(h["tenant"] == conv and h["metadata"]["speaker"] == "Caroline" for h in hits)
    assert m.info()["tenants"] == 10


def test_longmemeval_records(oracle, data_dir):
    path = data_dir / "longmemeval" / "longmemeval_oracle.json.gz"
    recs = longmemeval_records(path, split="oracle")
    assert len({r["tenant"] for r in recs}) == len(oracle.queries)
    assert len(recs) == sum(len(q.candidates) for q in oracle.queries)
    assert sum("time" in r for r in recs) > 0.9 * len(recs)
    one = longmemeval_records(path, split="oracle", per_haystack=False)
    assert [r["id"] for r in one] == oracle.doc_ids and not any("tenant" in r for r in one)
    m = Memory(partition_days=None)
    m.add(recs)
    q = oracle.queries[0]
    res = m.search(q.text, k=5, where={"tenant": q.qid})
    assert res.ids(0) and all(i.startswith(q.qid + "/") for i in res.ids(0))


@pytest.mark.parametrize("method", ["memory", "memory-tenant"])
def test_eval_cli_runs_memory_methods(method, data_dir, capsys):
    from gpuir.cli import main

    code = main(["eval", "locomo", "--data", str(data_dir / "locomo" / "locomo10.json"), "--method", method,
                 "--n-boot", "50", "--no-progress"])
    out = capsys.readouterr().out
    assert code == 0 and f"method {method}" in out and "overall" in out
