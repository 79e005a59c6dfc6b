"""What a new user meets in the first hour (issue 22, item 7), beyond the docs' code blocks.

* ``res.hits(i)`` of ``BM25Index.search`` gives the user's ids (``{"id", "score"}`` dicts);
* a sub-command's bad option prints that sub-command's usage, exit 2;
* the library logs through ``gpuir.*`` loggers and adds no handler; the CLI
  shows warnings, ``-v`` INFO, ``-vv`` DEBUG, and leaves nothing behind;
* long operations show progress bars on a terminal only;
* ``gpuir eval locomo`` runs the default configuration; BM25 options given to
  another method are an error;
* MCP tool errors reach the agent with the memory's message.
"""

from __future__ import annotations

import argparse
import ast
import io
import json
import logging
import pkgutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import gpuir
from gpuir.cli import build_parser, main
from gpuir.results import SearchResults

REPO = Path(__file__).resolve().parent.parent


# -- hits carry the user's ids -----------------------------------------------------------------


def test_index_hits_are_user_ids_without_passing_them():
    idx = gpuir.BM25Index.build(["red apple", "green apple", "blue sky"], ids=["a", "b", "c"])
    res = idx.search(["apple", "sky"], k=3)
    assert res.ids[0].tolist()[:2] == [0, 1]  # the arrays stay document numbers
    assert [h["id"] for h in res.hits(0)] == ["a", "b"] and [h["id"] for h in res.hits(1)] == ["c"]
    assert res.ids(0) == ["a", "b"] and res.ids(1) == ["c"]  # ids(i), as on every result of the package
    assert set(res.hits(0)[0]) == {"id", "score"} and isinstance(res.hits(0)[0]["score"], float)
    with pytest.warns(DeprecationWarning):
        assert res.hits(0) == res.hits(0, idx.ids)
    with pytest.warns(DeprecationWarning):
        assert res.hits(0, ["x", "y", "z"])[0]["id"] == "x"  # an explicit mapping still wins
    bare = SearchResults(np.array([[2, -1]]), np.array([[1.5, -np.inf]], dtype=np.float32))
    assert bare.hits(0) == [{"id": 2, "score": 1.5}]  # no ids known: document numbers


# -- usage of the sub-command ------------------------------------------------------------------


def _leaves(parser: argparse.ArgumentParser, argv=()):
    """(argv reaching each leaf sub-command, its parser); positionals before a sub-command get a dummy."""
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        yield argv, parser
        return
    before = [a for a in parser._actions[: parser._actions.index(subs[0])] if not a.option_strings]
    for name, p in subs[0].choices.items():
        yield from _leaves(p, (*argv, *["X"] * len(before), name))


LEAVES = [argv for argv, _ in _leaves(build_parser())]


@pytest.mark.parametrize("argv", LEAVES, ids=[" ".join(p) for p in LEAVES])
def test_bad_option_prints_the_subcommands_usage(argv, capsys):
    prog = dict(_leaves(build_parser()))[argv].prog
    with pytest.raises(SystemExit) as e:
        main([*argv, "--no-such-option"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"usage: {prog} "), err
    assert f"{prog}: error: " in err


def test_unknown_option_of_memory_search_names_it(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        main(["memory", "search", str(tmp_path), "--query", "x", "--k", "3"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: gpuir memory search ") and "unrecognized arguments: --k 3" in err


def test_unknown_top_level_option_keeps_the_top_level_usage(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--no-such-option", "info"])
    assert e.value.code == 2
    assert capsys.readouterr().err.startswith("usage: gpuir [-h]")


# -- logging -----------------------------------------------------------------------------------


def _library_modules():
    skip = ("gpuir.cli", "gpuir.__main__", "gpuir.service.__main__", "gpuir.demo")
    for m in pkgutil.walk_packages(gpuir.__path__, "gpuir."):
        if not m.name.startswith(skip):
            yield m.name


def test_every_logger_is_under_gpuir():
    """Each ``logging.getLogger(...)`` in gpuir/ names ``__name__`` or a literal ``gpuir.*`` logger."""
    bad = []
    for path in sorted((REPO / "gpuir").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text("utf-8"))):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "getLogger":
                arg = node.args[0] if node.args else None
                ok = (isinstance(arg, ast.Name) and arg.id == "__name__") or (
                    isinstance(arg, ast.Constant) and isinstance(arg.value, str)
                    and (arg.value == "gpuir" or arg.value.startswith("gpuir.")))
                if not ok and not (isinstance(arg, ast.Name) and arg.id == "LOGGER"):
                    bad.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert not bad, f"loggers outside 'gpuir': {bad}"


def test_importing_the_library_adds_no_handler():
    code = (
        "import importlib, logging, pkgutil, sys, gpuir\n"
        "for m in pkgutil.walk_packages(gpuir.__path__, 'gpuir.'):\n"
        "    if m.name.startswith(('gpuir.cli', 'gpuir.__main__', 'gpuir.service.__main__')):\n"
        "        continue\n"
        "    try:\n"
        "        importlib.import_module(m.name)\n"
        "    except ImportError:\n"
        "        pass\n"
        "loggers = [n for n in logging.root.manager.loggerDict if n == 'gpuir' or n.startswith('gpuir.')]\n"
        "with_handlers = [n for n in loggers if logging.getLogger(n).handlers]\n"
        "print(len(loggers), with_handlers, logging.getLogger('gpuir').level, logging.root.handlers)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=300,
                       env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1"}, check=False)
    assert r.returncode == 0, r.stderr[-3000:]
    n, rest = r.stdout.split(" ", 1)
    assert int(n) >= 5 and rest.strip() == "[] 0 []", r.stdout


def test_library_shows_warnings_only_by_default():
    code = ("import logging, gpuir\n"
            "logging.getLogger('gpuir.memory').info('an info line')\n"
            "logging.getLogger('gpuir.memory').warning('a warning line')\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120,
                       env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"}, check=False)
    assert r.returncode == 0 and "a warning line" in r.stderr and "an info line" not in r.stderr, r.stderr


@pytest.fixture
def corpus(tmp_path):
    p = tmp_path / "corpus.jsonl"
    p.write_text("".join(json.dumps({"id": f"d{i}", "text": f"document {i} about apples"}) + "\n" for i in range(5)))
    return p


def test_cli_is_quiet_without_v_and_says_what_it_does_with_it(tmp_path, corpus, capsys):
    assert main(["index", str(corpus), str(tmp_path / "i0")]) == 0
    err = capsys.readouterr().err
    assert "INFO" not in err and err.startswith("indexed 5 documents")
    assert main(["-v", "index", str(corpus), str(tmp_path / "i1")]) == 0
    err = capsys.readouterr().err
    assert "gpuir index: INFO: gpuir.engine: built an index of 5 documents" in err
    assert "DEBUG" not in err
    # -v after the sub-command too; -vv adds DEBUG
    assert main(["search", str(tmp_path / "i1"), "--query", "apples", "-vv"]) == 0
    err = capsys.readouterr().err
    assert "INFO: gpuir.engine: loaded the index" in err and "DEBUG: gpuir.engine: searched 1 queries" in err
    # nothing is left behind for the next caller
    lg = logging.getLogger("gpuir")
    assert lg.handlers == [] and lg.level == logging.NOTSET


def test_cli_warnings_reach_stderr_without_v(capsys):
    from gpuir.cli_common import cli_logging

    with cli_logging(0, prog="gpuir x"):
        logging.getLogger("gpuir.memory").info("hidden")
        logging.getLogger("gpuir.memory").warning("careful")
    err = capsys.readouterr().err
    assert err == "gpuir x: WARNING: careful\n"


# -- progress bars -----------------------------------------------------------------------------


class _Tty(io.StringIO):
    def isatty(self):
        return True


def test_progress_bar_on_a_terminal_only(monkeypatch):
    from gpuir.progress import progress_bar

    for stream, shown in ((_Tty(), True), (io.StringIO(), False)):
        monkeypatch.setattr(sys, "stderr", stream)
        assert list(progress_bar(range(3), desc="work", unit="step")) == [0, 1, 2]
        assert ("work: 100%" in stream.getvalue()) is shown, stream.getvalue()
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    list(progress_bar(range(3), desc="forced", enabled=True))
    assert "forced: 100%" in sys.stderr.getvalue()


def _records(path: Path, n: int) -> Path:
    path.write_text("".join(json.dumps({"id": f"r{i}", "text": f"record {i} about topic {i % 7}"}) + "\n"
                            for i in range(n)))
    return path


def test_memory_add_shows_a_bar_on_a_terminal_only(tmp_path, capsys, monkeypatch):
    import gpuir.cli.memory as mcli

    monkeypatch.setattr(mcli, "BATCH", 100)
    recs = _records(tmp_path / "r.jsonl", 250)
    assert main(["memory", "add", str(tmp_path / "m1"), str(recs)]) == 0
    err = capsys.readouterr().err
    assert "%|" not in err and "\r" not in err and "added 250 records" in err
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)  # as on a terminal
    assert main(["memory", "add", str(tmp_path / "m2"), str(recs)]) == 0
    err = capsys.readouterr().err
    assert "add: 100%" in err and "250/250" in err


def test_count_lines_counts_a_last_line_without_newline(tmp_path):
    from gpuir.cli.memory import _count_lines

    for text, n in (("", 0), ("a\n", 1), ("a\nb", 2), ("a\nb\n", 2)):
        (tmp_path / "f").write_text(text)
        assert _count_lines(tmp_path / "f") == n


def test_fusion_eval_shows_its_progress(locomo, capsys):
    from gpuir.eval.retriever_methods import retriever_run
    from gpuir.retrieve import default_config

    groups = sorted({q.group for q in locomo.queries})[:2]
    queries = [q for g in groups for q in [q for q in locomo.queries if q.group == g][:20]]
    retriever_run(locomo, queries, 5, default_config(), alpha="loco", grid="alpha", progress=True)
    assert "fusion settings: 100%" in capsys.readouterr().err
    retriever_run(locomo, queries, 5, default_config(), alpha="loco", grid="alpha", progress=False)
    assert "fusion settings" not in capsys.readouterr().err


# -- gpuir eval's default method ------------------------------------------------------------------


def test_eval_defaults_to_the_default_configuration():
    from gpuir.eval.cli import default_method

    assert default_method("locomo") == "default" and default_method("longmemeval") == "default"
    assert default_method("beir") == "bm25"  # documents, not sessions of turns


def test_bm25_options_without_bm25_are_an_error(capsys):
    assert main(["eval", "locomo", "--k1", "0.9", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "--k1" in err and "add --method bm25" in err and "Traceback" not in err
    assert main(["eval", "locomo", "--method", "fusion", "--analyzer", "porter", "--no-progress"]) == 2
    assert "--analyzer" in capsys.readouterr().err


@pytest.mark.slow
def test_eval_locomo_runs_the_default_configuration(data_dir, capsys):
    data = str(data_dir / "locomo" / "locomo10.json")
    assert main(["eval", "locomo", "--data", data, "--n-boot", "50", "--no-progress", "--format", "json"]) == 0
    plain = json.loads(capsys.readouterr().out)
    assert "method default" in plain["header"][0]
    assert main(["eval", "locomo", "--data", data, "--n-boot", "50", "--no-progress", "--format", "json",
                 "--method", "default"]) == 0
    assert json.loads(capsys.readouterr().out)["table"] == plain["table"]


# -- MCP tool errors ---------------------------------------------------------------------------------


def test_mcp_tool_errors_carry_the_message(caplog):
    pytest.importorskip("mcp")
    import anyio
    from mcp import Client

    from gpuir.adapters.mcp_server import build_server

    mem = gpuir.Memory()
    mem.add([{"id": "r1", "text": "the dog is called Rex"}])

    class Broken:  # a backend with a bug: its message must not reach the agent
        def search(self, queries, k=10, where=None):
            raise RuntimeError("secret internal state")

        add = delete = search

    async def go():
        async with Client(build_server(mem)) as c:
            r = await c.call_tool("remember", {"text": "again", "id": "r1"})
            assert r.is_error and "already exists" in r.content[0].text and "'r1'" in r.content[0].text
            r = await c.call_tool("recall", {"query": "dog", "where": {"colour": "red"}})
            assert r.is_error and "unknown field 'colour'" in r.content[0].text
            r = await c.call_tool("recall", {"query": "dog", "k": 0})
            assert r.is_error and "k must be" in r.content[0].text
            r = await c.call_tool("recall", {"query": "dog"})
            assert not r.is_error and [h["id"] for h in r.structured_content["hits"]] == ["r1"]
        async with Client(build_server(Broken())) as c:
            r = await c.call_tool("recall", {"query": "dog"})
            assert r.is_error and "secret" not in r.content[0].text

    with caplog.at_level(logging.INFO):
        anyio.run(go)
    refused = [r for r in caplog.records if "already exists" in r.getMessage() or "colour" in r.getMessage()]
    assert refused and not any(r.exc_info for r in refused)  # logged without a traceback
