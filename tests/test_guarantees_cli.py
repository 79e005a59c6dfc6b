"""Guarantees of the command line (docs/guarantees.md, "Input and output").

A user's mistake is exit status 2 with a message that says what to fix (never a
traceback); output is strict JSON or well-formed TREC; nothing of the user's is
deleted.
"""

from __future__ import annotations

import contextlib
import errno
import io
import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from gpuir.cli import main

REPO = Path(__file__).resolve().parents[1]


def run(*args, cwd=None):
    """``gpuir ARGS`` in this process (fast): returncode, stdout and stderr, as a subprocess gives them."""
    out, err = io.StringIO(), io.StringIO()
    old = os.getcwd()
    try:
        if cwd is not None:
            os.chdir(cwd)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                rc = main([str(a) for a in args])
            except SystemExit as e:  # argparse
                rc = e.code
    finally:
        os.chdir(old)
    return SimpleNamespace(returncode=rc, stdout=out.getvalue(), stderr=err.getvalue())


def run_process(*args, cwd=None):
    """``python -m gpuir ARGS`` in a fresh process."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "gpuir", *map(str, args)], capture_output=True, text=True,
                          cwd=cwd, env=env, check=False)


def no_traceback(r):
    return "Traceback" not in r.stderr and "internal error" not in r.stderr


def strict_json(line: str):
    def bad(c):
        raise AssertionError(f"non-standard JSON constant {c}")

    return json.loads(line, parse_constant=bad)


@pytest.fixture
def corpus(tmp_path):
    p = tmp_path / "c.jsonl"
    rows = [{"id": "d1", "text": "alice flies to paris"}, {"id": "d2", "text": "bob fixes the login bug"},
            {"id": "d3", "text": "alice and bob in paris"}]
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return p


# -- exit status


def test_exit_status_is_0_on_success_2_on_a_users_mistake_and_1_on_an_internal_error(corpus, tmp_path, monkeypatch):
    """docs/guarantees.md, "Exit status": 0 success; 2 a user's mistake or a file-system error, with a
    message and no traceback; 1 an internal error (with its traceback, for a bug report)."""
    ix = tmp_path / "ix"
    assert run("index", corpus, ix).returncode == 0
    r = run("search", ix, "--query", "paris", "--format", "jsonl")
    assert r.returncode == 0 and "d1" in r.stdout
    mistakes = {
        "an unknown option": ("search", ix, "--k", "3"),
        "a missing file": ("index", tmp_path / "missing.jsonl", tmp_path / "ix2"),
        "a bad parameter": ("search", ix, "--query", "paris", "--k1", "nan"),
        "a path below a regular file": ("index", corpus, corpus / "below"),
        "not an index": ("search", tmp_path, "--query", "paris"),
    }
    for what, args in mistakes.items():
        r = run(*args)
        assert r.returncode == 2 and no_traceback(r) and r.stderr.strip(), (what, r.returncode, r.stderr)
    import gpuir.engine

    def boom(*a, **k):
        raise RuntimeError("kaboom")

    monkeypatch.setattr(gpuir.engine.BM25Index, "search", boom)
    r = run("search", ix, "--query", "paris")
    assert r.returncode == 1 and "internal error: RuntimeError: kaboom" in r.stderr and "Traceback" in r.stderr
    monkeypatch.undo()
    # and through the process's own exit status
    assert [run_process(*a).returncode for a in (("search", ix, "--query", "paris"), mistakes["an unknown option"])
            ] == [0, 2]


# -- ownership


def test_index_refuses_a_folder_of_user_files_and_keeps_them(corpus, tmp_path):
    ud = tmp_path / "ud"
    (ud / "v-notes").mkdir(parents=True)
    (ud / "v-notes" / "thesis.tex").write_text("years of work")
    r = run("index", corpus, ud)
    assert r.returncode == 2 and no_traceback(r), r.stderr
    assert "not created by gpuir" in r.stderr
    assert (ud / "v-notes" / "thesis.tex").read_text() == "years of work"


def test_index_into_an_empty_path_is_exit_2_and_touches_nothing(corpus, tmp_path):
    work = tmp_path / "cwd"
    (work / "v-old").mkdir(parents=True)
    (work / "v-old" / "keep.txt").write_text("keep")
    r = run_process("index", corpus, "", cwd=work)
    assert r.returncode == 2 and no_traceback(r) and "empty" in r.stderr, r.stderr
    assert sorted(os.listdir(work)) == ["v-old"] and (work / "v-old" / "keep.txt").exists()


def test_index_below_a_regular_file_is_exit_2(corpus, tmp_path):
    (tmp_path / "f").write_text("x")
    for target in (tmp_path / "f" / "sub", tmp_path / "f"):
        r = run("index", corpus, target)
        assert r.returncode == 2 and no_traceback(r) and "not a directory" in r.stderr, r.stderr
    r = run("search", tmp_path / "f" / "sub", "--query", "x")
    assert r.returncode == 2 and no_traceback(r), r.stderr


@pytest.mark.parametrize("code", [errno.EACCES, errno.ENOSPC, errno.EROFS])
def test_file_system_errors_while_saving_are_exit_2(corpus, tmp_path, monkeypatch, capsys, code):
    from gpuir.index import storage

    assert main(["index", str(corpus), str(tmp_path / "ix")]) == 0

    def fail(path, data):
        raise OSError(code, os.strerror(code), str(path))

    monkeypatch.setattr(storage, "_write_file", fail)
    assert main(["index", str(corpus), str(tmp_path / "ix"), "--k1", "2"]) == 2
    err = capsys.readouterr().err
    assert os.strerror(code) in err and "Traceback" not in err
    monkeypatch.undo()
    assert main(["search", str(tmp_path / "ix"), "--query", "paris"]) == 0


def test_a_manifest_of_the_wrong_shape_is_exit_2(corpus, tmp_path):
    ix = tmp_path / "ix"
    assert run("index", corpus, ix).returncode == 0
    m = ix / (ix / "CURRENT").read_text().strip() / "manifest.json"
    m.write_text("[1, 2]")
    r = run("search", ix, "--query", "paris")
    assert r.returncode == 2 and no_traceback(r) and "manifest.json" in r.stderr, r.stderr


# -- finite scores, strict JSON


@pytest.mark.parametrize("opts", [["--k1", "1e-320"], ["--method", "atire", "--k1", "1e39"],
                                  ["--method", "bm25+", "--delta", "1e39"], ["--k1", "nan"], ["--b", "inf"]])
def test_parameters_that_would_give_nan_are_refused(corpus, tmp_path, opts):
    r = run("index", corpus, tmp_path / "ix", *opts)
    assert r.returncode == 2 and no_traceback(r), r.stderr
    assert not (tmp_path / "ix" / "CURRENT").exists()


@pytest.mark.parametrize("method", ["lucene", "robertson", "atire", "bm25l", "bm25+"])
def test_search_output_is_strict_json(corpus, tmp_path, method, capsys):
    ix = tmp_path / "ix"
    assert main(["index", str(corpus), str(ix), "--method", method, "--k1", "1e-6", "--b", "1"]) == 0
    capsys.readouterr()
    assert main(["search", str(ix), "--query", "alice paris bob", "-k", "3"]) == 0
    row = strict_json(capsys.readouterr().out)
    assert len(row["hits"]) == 3


# -- output that cannot be forged


@pytest.fixture
def nasty_index(tmp_path):
    p = tmp_path / "n.jsonl"
    rows = [{"id": "d1\nq2 Q0 evil 1 99.0 gpuir", "text": "paris"}, {"id": "d 2", "text": "paris"},
            {"id": "ok", "text": "paris london"}, {"id": "tab\there", "text": "london"}]
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert run("index", p, tmp_path / "ix").returncode == 0
    return tmp_path / "ix"


def test_trec_output_refuses_ids_that_would_forge_lines(nasty_index, tmp_path):
    r = run_process("search", nasty_index, "--query", "paris", "--format", "trec")
    assert r.returncode == 2 and no_traceback(r) and "TREC" in r.stderr, r.stderr
    assert "evil" not in r.stdout
    for line in r.stdout.splitlines():  # whatever was written before the refusal is well formed
        assert len(line.split()) == 6


@pytest.mark.parametrize("qid", ["q 1", "q\n1", "q\t1", "", "q\x001", "q\u20281"])
def test_trec_output_refuses_query_ids_with_whitespace_or_control_characters(nasty_index, tmp_path, qid):
    q = tmp_path / "q.jsonl"
    q.write_text(json.dumps({"id": qid, "text": "london"}) + "\n")
    r = run("search", nasty_index, "--queries", q, "--format", "trec")
    assert r.returncode == 2 and no_traceback(r) and "query id" in r.stderr, r.stderr
    assert r.stdout == ""


def test_trec_output_of_safe_ids_is_six_fields_a_line(nasty_index):
    r = run("search", nasty_index, "--query", "london paris", "--format", "trec", "-k", "1")
    assert r.returncode == 0, r.stderr
    (line,) = r.stdout.splitlines()
    fields = line.split(" ")
    assert fields[:4] == ["0", "Q0", "ok", "1"] and fields[5] == "gpuir" and len(fields) == 6
    assert float(fields[4]) > 0


def test_jsonl_output_carries_any_id_as_valid_json(nasty_index):
    r = run("search", nasty_index, "--query", "paris london", "-k", "10")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert len(lines) == 1
    ids = {h["id"] for h in strict_json(lines[0])["hits"]}
    assert ids == {"d1\nq2 Q0 evil 1 99.0 gpuir", "d 2", "ok", "tab\there"}


# -- no traceback for a user's mistake


def test_a_huge_k_is_clamped(corpus, tmp_path):
    assert run("index", corpus, tmp_path / "ix").returncode == 0
    r = run("search", tmp_path / "ix", "--query", "paris", "-k", str(10**12))
    assert r.returncode == 0, r.stderr
    assert len(strict_json(r.stdout)["hits"]) == 2


def test_deeply_nested_json_is_exit_2_naming_the_line(tmp_path):
    p = tmp_path / "deep.jsonl"
    p.write_text('{"id": "a", "text": "x"}\n' + '{"id": "b", "text": ' + "[" * 200_000 + "]" * 200_000 + "}\n")
    r = run("index", p, tmp_path / "ix")
    assert r.returncode == 2 and no_traceback(r) and "line 2" in r.stderr, r.stderr


@pytest.mark.parametrize("bad_line", [3, 40])
def test_invalid_utf8_names_the_physical_line(tmp_path, bad_line):
    p = tmp_path / "u.jsonl"
    lines = [json.dumps({"id": str(i), "text": "word " * 50}).encode() for i in range(60)]
    lines[1] = b'{"id": "cr",\r "text": "carriage return inside"}'  # one physical line
    lines[bad_line - 1] = b'{"id": "bad", "text": "\xff\xfe"}'
    p.write_bytes(b"\n".join(lines) + b"\n")
    r = run("index", p, tmp_path / "ix")
    assert r.returncode == 2 and no_traceback(r), r.stderr
    assert f"line {bad_line}:" in r.stderr and "UTF-8" in r.stderr


def test_json_errors_count_physical_lines(tmp_path):
    p = tmp_path / "cr.jsonl"
    p.write_bytes(b'{"id": "a", "text": "x"}\n{"id": "b",\r "text": "y"}\n{"id": "c" "text": 1}\n')
    r = run("index", p, tmp_path / "ix")
    assert r.returncode == 2 and "line 3:" in r.stderr, r.stderr


def test_a_utf8_bom_is_accepted(tmp_path):
    p = tmp_path / "bom.jsonl"
    p.write_bytes(b"\xef\xbb\xbf" + json.dumps({"id": "a", "text": "hello"}).encode() + b"\n")
    r = run("index", p, tmp_path / "ix")
    assert r.returncode == 0, r.stderr


LOCOMO_BROKEN = [
    [{"sample_id": "c", "conversation": {"session_1": "not a list"}, "qa": []}],
    [{"sample_id": "c", "conversation": {"session_1": ["turn as a string"]}, "qa": []}],
    [{"sample_id": "c", "conversation": {"session_1": [{"dia_id": "D1:1", "text": "hi"}]}, "qa": "nope"}],
    [{"sample_id": "c", "conversation": {"session_1": [{"dia_id": "D1:1", "text": "hi"}]}, "qa": [5]}],
    [{"sample_id": "c", "conversation": {"session_1": [{"text": "hi"}]},
      "qa": [{"question": "q", "evidence": 7, "category": 1}]}],
    [{"sample_id": "c", "conversation": [], "qa": []}],
]


LME_BROKEN = [
    [{"question_id": "q", "question": "x", "haystack_session_ids": ["s"], "haystack_sessions": [["turn"]],
      "answer_session_ids": ["s"]}],
    [{"question_id": "q", "question": "x", "haystack_session_ids": ["s"], "haystack_sessions": ["abc"],
      "answer_session_ids": ["s"]}],
    [{"question_id": "q", "question": "x", "haystack_session_ids": "s", "haystack_sessions": [[]],
      "answer_session_ids": ["s"]}],
    [{"question_id": "q", "question": "x", "haystack_session_ids": ["s"], "haystack_sessions": [[]],
      "answer_session_ids": 3}],
]


@pytest.mark.parametrize("dataset, data", [("locomo", d) for d in LOCOMO_BROKEN]
                         + [("longmemeval", d) for d in LME_BROKEN])
def test_malformed_datasets_are_exit_2(tmp_path, dataset, data):
    p = tmp_path / f"bad_{dataset}.json"
    p.write_text(json.dumps(data))
    r = run("eval", dataset, "--data", p, "--n-boot", "10")
    assert r.returncode == 2 and no_traceback(r), r.stderr
    assert p.name in r.stderr


def test_deeply_nested_dataset_is_exit_2(tmp_path):
    p = tmp_path / "deep.json"
    p.write_text("[" * 200_000 + "]" * 200_000)
    r = run("eval", "locomo", "--data", p, "--n-boot", "10")
    assert r.returncode == 2 and no_traceback(r), r.stderr


def test_eval_output_below_a_file_is_exit_2(tmp_path, beir_toy):
    (tmp_path / "f").write_text("x")
    r = run("eval", "beir", "--data", beir_toy, "--n-boot", "10", "--out", tmp_path / "f" / "r.json")
    assert r.returncode == 2 and no_traceback(r), r.stderr


def test_eval_trec_run_refuses_ids_that_would_forge_lines(tmp_path, beir_toy):
    corpus = beir_toy / "corpus.jsonl"
    corpus.write_text(corpus.read_text().replace('"d1"', '"d1\\nq2 Q0 evil 1 9 x"'))
    qrels = beir_toy / "qrels" / "test.tsv"
    qrels.write_text(qrels.read_text().replace("q1\td1", "q1\td1\\nq2 Q0 evil 1 9 x"))
    r = run("eval", "beir", "--data", beir_toy, "--n-boot", "10", "--run", tmp_path / "run.trec")
    assert r.returncode == 2 and no_traceback(r) and "TREC" in r.stderr, r.stderr
    assert not (tmp_path / "run.trec").exists()


@pytest.mark.parametrize("target", ["corpus.jsonl", "qrels/test.tsv"])
def test_invalid_utf8_in_beir_names_the_file_and_line(beir_toy, target):
    p = beir_toy / target
    lines = p.read_bytes().split(b"\n")
    lines[2] = lines[2].replace(b"d", b"\xff", 1)
    p.write_bytes(b"\n".join(lines))
    r = run("eval", "beir", "--data", beir_toy, "--n-boot", "10")
    assert r.returncode == 2 and no_traceback(r), r.stderr
    assert f"{target.split('/')[-1]}:3:" in r.stderr and "UTF-8" in r.stderr
