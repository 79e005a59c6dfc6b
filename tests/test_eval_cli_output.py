"""`gpuir eval` as a user meets it: help text, defaults, missing extras, headers, table widths, formats."""

from __future__ import annotations

import argparse
import csv
import io
import json
import sys
from types import SimpleNamespace

import numpy as np
import pytest

from gpuir.eval import cli as ecli
from gpuir.eval.tables import render

MARKUP = (":data:", ":func:", ":class:", ":mod:", ":meth:", "``", "::")


def _cli(argv):
    from gpuir.cli import main

    return main(argv)


def _eval_parsers():
    p = argparse.ArgumentParser(prog="gpuir")
    sub = p.add_subparsers(dest="command")
    pe = ecli.register(sub)
    subs = next(a for a in pe._actions if isinstance(a, argparse._SubParsersAction))
    return pe, subs.choices


def test_every_option_has_help_and_a_visible_default():
    _, subs = _eval_parsers()
    for name, sp in subs.items():
        for a in sp._actions:
            if isinstance(a, argparse._HelpAction):
                continue
            assert a.help and a.help != argparse.SUPPRESS, f"gpuir eval {name} {a.option_strings or a.dest}: no help"
            if a.option_strings and not isinstance(a, (argparse._StoreTrueAction, argparse._StoreFalseAction)):
                assert "default" in a.help.lower() or a.required, \
                    f"gpuir eval {name} {a.option_strings}: default not shown"


def test_help_has_no_markup_and_data_default_is_a_path(capsys):
    from gpuir.datapath import locomo_path

    for argv in (["eval", "--help"], ["eval", "locomo", "--help"], ["eval", "longmemeval", "--help"],
                 ["eval", "compare", "--help"], ["eval", "ablation", "--help"]):
        with pytest.raises(SystemExit) as e:
            _cli(argv)
        assert e.value.code == 0
        out = capsys.readouterr().out
        for m in MARKUP:
            assert m not in out, f"{' '.join(argv)}: markup {m!r} in help"
        if argv[1] == "locomo":
            assert "locomo_path()" not in out and "locomo10.json" in out
            _, subs = _eval_parsers()
            data = next(a for a in subs["locomo"]._actions if a.dest == "data")
            assert str(locomo_path()) in data.help


def test_missing_dense_extra_exits_2_with_the_pip_line(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "tokenizers", None)  # import fails as if not installed
    assert _cli(["eval", "locomo", "--method", "dense", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "pip install 'gpuir[dense]'" in err and "Traceback" not in err
    assert _cli(["eval", "locomo", "--method", "config", "--config", "dense_hybrid", "--no-progress"]) == 2
    assert "pip install 'gpuir[dense]'" in capsys.readouterr().err


def test_missing_routing_extra_and_import_errors_exit_2(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "sklearn", None)
    with pytest.raises(ImportError, match=r"pip install 'gpuir\[routing\]'"):
        ecli._require("routing", "configuration 'router'")
    assert ecli._config_extras({"channels": [{"kind": "temporal"}]}) == []  # dateparser is core (issue 19)
    assert ecli._config_extras({"router": {"classifier": {"classes": ["a"]},
                                           "routes": {"x": {"channels": [{"kind": "late"}]}}},
                                "channels": [{"kind": "bm25"}]}) == ["dense", "routing"]
    assert ecli._config_extras({"router": {"classifier": "regex"}, "type_filter": {"min_results": 5},
                                "channels": [{"kind": "entity"}]}) == []  # rule-based: no extra
    assert ecli._config_extras({"channels": [{"kind": "bm25_session"}]}) == []

    def boom(args):
        raise ModuleNotFoundError("No module named 'dateparser'", name="dateparser")

    assert ecli._run_guarded(boom)(argparse.Namespace()) == 2
    assert "pip install 'gpuir[routing]'" in capsys.readouterr().err


def test_unloadable_config_exits_2(capsys, tmp_path):
    p = tmp_path / "c.json"
    p.write_text(json.dumps({"channels": [{"kind": "bm25"}], "not_a_field": 1}))
    assert _cli(["eval", "locomo", "--method", "config", "--config", str(p), "--no-progress"]) == 2
    assert "not_a_field" in capsys.readouterr().err
    assert _cli(["eval", "locomo", "--method", "config", "--no-progress"]) == 2
    assert "needs --config" in capsys.readouterr().err


def test_render_fits_100_columns_and_formats():
    head = ["subset", "n"] + [f"metric_{i}" for i in range(8)]
    rows = [["overall", "1982"] + ["0.668 [0.638,0.703]"] * 8, ["multi-hop", "282"] + ["-"] * 8]
    txt = render(head, rows, "table")
    assert max(len(x) for x in txt.splitlines()) <= 100
    assert txt.count("overall") >= 2  # split into blocks, key columns repeated
    assert all(f"metric_{i}" in txt for i in range(8))
    md = render(head, rows, "markdown").splitlines()
    assert md[0].startswith("| subset | n |") and len(md) == 4
    parsed = list(csv.reader(io.StringIO(render(head, rows, "csv"))))
    assert parsed[1][2] == "0.668 [0.638,0.703]" and len(parsed) == 3
    assert json.loads(render(head, rows, "json"))[1]["subset"] == "multi-hop"
    with pytest.raises(ValueError, match="format"):
        render(head, rows, "html")


def test_header_names_the_resolved_backend():
    from gpuir.backends import resolve_backend

    ds = SimpleNamespace(name="locomo", unit="session", n_docs=3, queries=[1, 2])
    res = SimpleNamespace(dataset=ds, run=SimpleNamespace(meta={"backend": None}), n_boot=10,
                          mask=lambda which: np.array([True, False]))
    args = argparse.Namespace(backend="auto", method="dense")
    lines = ecli.header_lines(res, args, {"pooling": "max"})
    assert "backend None" not in lines[0] and f"backend {resolve_backend('auto')[0]}" in lines[0]
    assert all(len(x) <= 100 for x in lines)


@pytest.mark.slow
def test_cli_output_formats_on_locomo(capsys, data_dir):
    data = str(data_dir / "locomo" / "locomo10.json")
    assert _cli(["eval", "locomo", "--data", data, "--n-boot", "100", "--no-progress"]) == 0  # the default config
    out = capsys.readouterr().out
    # every line fits 100 columns but the configuration, printed on one line to be copied into a file
    assert max(len(x) for x in out.splitlines() if not x.startswith("retriever configuration: ")) <= 100
    assert "backend None" not in out and "answer_substr@5" in out
    assert _cli(["eval", "locomo", "--data", data, "--n-boot", "100", "--format", "csv", "--no-progress"]) == 0
    rows = list(csv.reader(io.StringIO(capsys.readouterr().out)))
    assert rows[0][:3] == ["subset", "n", "hit@1_mean"] and rows[1][0] == "overall" and rows[1][1] == "1982"
    assert _cli(["eval", "locomo", "--data", data, "--n-boot", "100", "--format", "json", "--no-progress",
                 "--columns", "hit@1,mrr"]) == 0
    js = json.loads(capsys.readouterr().out)
    assert set(js["table"]["overall"]) == {"hit@1", "mrr"} and js["header"][0].startswith("locomo")
    assert _cli(["eval", "locomo", "--data", data, "--n-boot", "100", "--format", "markdown", "--no-progress"]) == 0
    assert capsys.readouterr().out.splitlines()[0].startswith("| subset | n | hit@1")


@pytest.mark.slow
def test_baseline_paired_table(capsys, data_dir, tmp_path):
    data = str(data_dir / "locomo" / "locomo10.json")
    assert _cli(["eval", "locomo", "--data", data, "--n-boot", "100", "--no-progress", "--method", "default",
                 "--baseline", "current_best", "--test", "randomization", "--out", str(tmp_path / "r.json")]) == 0
    out = capsys.readouterr().out
    assert "this - baseline current_best" in out and "d hit@1" in out
    # every line fits 100 columns but the configuration, printed on one line to be copied into a file
    assert max(len(x) for x in out.splitlines() if not x.startswith("retriever configuration: ")) <= 100
    line = next(x for x in out.splitlines() if x.startswith("retriever configuration: "))
    assert json.loads(line.split(": ", 1)[1])["analyzer"] == "en-large"
    rep = json.loads((tmp_path / "r.json").read_text())
    overall = rep["baseline"]["paired"][0]
    assert overall["subset"] == "overall" and overall["hit@1"]["delta"] == 0 and overall["hit@1"]["p"] == 1.0


def test_compare_by_category(tmp_path, capsys):
    def rep(vals):
        return {"per_query": {"qid": ["q1", "q2", "q3", "q4"], "category": ["x", "x", "y", "y"],
                              "group": ["g1", "g2", "g1", "g2"], "scored": [True] * 4, "hit@1": vals}}

    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps(rep([1, 1, 0, 1])))
    b.write_text(json.dumps(rep([0, 0, 0, 1])))
    assert _cli(["eval", "compare", str(a), str(b), "--by-category", "--json", "--n-boot", "200"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["delta"] == 0.5 and r["by_category"]["x"]["delta"] == 1.0 and r["by_category"]["y"]["delta"] == 0.0
    assert _cli(["eval", "compare", str(a), str(b), "--by-category", "--n-boot", "200"]) == 0
    out = capsys.readouterr().out
    assert "category" in out and "+1.000" in out
