"""Every code block of README.md and docs/*.md runs as printed.

The convention (docs/README.md, "Code blocks"), checked here block by block:

* every block is fenced and names its language; an indented block, a fence
  without a language or one with a language not listed here fails;
* ``python``: run as printed in a fresh interpreter, in an empty temporary
  directory, with this checkout's gpuir importable and the evaluation data at
  ``GPUIR_DATA``; it must exit 0;
* ``sh`` / ``bash``: run as printed by ``bash -e`` in an empty temporary
  directory, with ``gpuir`` and ``python`` on ``PATH`` (this checkout's); it
  must exit 0;
* ``bash gpuir-serve`` (the word after the language): the same, against a
  real ``gpuir serve`` of a new memory started for the block on loopback, with
  ``GPUIR_URL`` (the server) and ``GPUIR_KEY`` (a key of tenant ``alice``) in
  its environment -- how the ``curl`` examples of docs/service.md run; the
  server is stopped (SIGTERM) afterwards, and the block is skipped where
  ``curl`` is not installed;
* in both, the ``# -> ...`` comments are the block's standard output, one
  comment per line, in order (``...`` matches anything, runs of whitespace
  compare equal): a shown output is a checked output. A block without such
  comments may print anything;
* ``json``: must parse as JSON;
* ``text``: never run -- synopses with placeholders, commands that need a GPU,
  the network, Docker or a long time (benchmarks, full evaluations), diagrams
  and file layouts.

So no python or shell block can be skipped: the only way not to run a block is
to call it ``text``, in the open. A block that needs an optional extra which is
not installed here is skipped, naming the module (every extra is installed by
``make setup``); so is one that reads evaluation data absent here.
"""

from __future__ import annotations

import doctest
import importlib.util
import io
import json
import os
import re
import signal
import subprocess
import sys
import tokenize
from dataclasses import dataclass
from pathlib import Path

import pytest

from gpuir.cli import EXTRA_OF_MODULE
from gpuir.datapath import data_dir

REPO = Path(__file__).resolve().parent.parent
DOC_FILES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]

RUN = {"python", "sh", "bash"}
#: The fence word that runs a shell block against a ``gpuir serve`` started for it.
SERVE = "gpuir-serve"
#: The tenant whose key a served block gets as ``GPUIR_KEY``.
SERVE_TENANT = "alice"
#: Languages a block may name, and what the test does with it.
LANGUAGES = {"python": "run", "sh": "run", "bash": "run", "json": "parse", "text": "never run"}
TIMEOUT_S = 300
#: A comment that shows output: ``# -> the line printed``.
_SHOWN = re.compile(r"#\s?->(?: (.*))?$")


@dataclass(frozen=True)
class Block:
    path: Path
    line: int  # 1-based line of the opening fence
    lang: str | None  # None: an indented block or a fence without a language
    code: str
    info: tuple[str, ...] = ()  # the fence's words after the language (e.g. "gpuir-serve")

    @property
    def name(self) -> str:
        rel = self.path.relative_to(REPO) if self.path.is_relative_to(REPO) else self.path
        return f"{rel}:{self.line}"


def doc_blocks(paths=DOC_FILES) -> list[Block]:
    """Every code block of ``paths`` as a CommonMark renderer sees it (markdown-it-py)."""
    from markdown_it import MarkdownIt

    md = MarkdownIt("commonmark")
    out = []
    for p in paths:
        for tok in md.parse(p.read_text("utf-8")):
            if tok.type == "fence":
                words = tok.info.split()
                lang = words[0] if words else None
                out.append(Block(p, tok.map[0] + 1, lang, tok.content, tuple(words[1:])))
            elif tok.type == "code_block":
                out.append(Block(p, tok.map[0] + 1, None, tok.content))
    return out


BLOCKS = doc_blocks()


def shown_output(block: Block) -> list[str] | None:
    """The ``# -> ...`` comments of a python or shell block, in order (None: it shows no output)."""
    lines = []
    if block.lang == "python":
        toks = tokenize.generate_tokens(io.StringIO(block.code).readline)
        comments = [t.string for t in toks if t.type == tokenize.COMMENT]
    else:  # a shell comment: '#' at the start of a word
        comments = [m.group(1) for m in re.finditer(r"(?:^|\s)(#.*)$", block.code, re.MULTILINE)]
    for c in comments:
        m = _SHOWN.match(c)
        if m:
            lines.append((m.group(1) or "").rstrip())
    return lines or None


def _shims(tmp: Path) -> Path:
    """``gpuir``, ``python`` and ``python3`` of this checkout and interpreter, for shell blocks."""
    b = tmp / ".bin"
    b.mkdir()
    for name, target in (("gpuir", f'"{sys.executable}" -m gpuir'), ("python", f'"{sys.executable}"'),
                         ("python3", f'"{sys.executable}"')):
        (b / name).write_text(f'#!/bin/sh\nexec {target} "$@"\n')
        (b / name).chmod(0o755)
    return b


def _env(tmp: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "GPUIR_BACKEND")}
    env.update(PYTHONPATH=str(REPO), GPUIR_DATA=str(data_dir()), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               PYTHONDONTWRITEBYTECODE="1", MPLBACKEND="Agg")
    env["PATH"] = f"{_shims(tmp)}{os.pathsep}{env.get('PATH', '')}"
    return env


def _skip_if_missing(stderr: str) -> None:
    """Skip (naming it) when the block failed on an optional extra or on evaluation data absent here."""
    if not data_dir().is_dir() and str(data_dir()) in stderr:
        pytest.skip(f"the evaluation data is not at {data_dir()} (GPUIR_DATA)")
    for m in re.finditer(r"No module named '([\w.]+)'|pip install 'gpuir\[(\w+)\]'", stderr):
        mod = (m.group(1) or "").split(".")[0]
        if mod and mod in EXTRA_OF_MODULE and importlib.util.find_spec(mod) is None:
            pytest.skip(f"{mod} is not installed here (pip install 'gpuir[{EXTRA_OF_MODULE[mod]}]')")


def _serve(tmp: Path):
    """A ``gpuir serve`` of a new memory on loopback, started, and a key of :data:`SERVE_TENANT`."""
    import shutil

    if shutil.which("curl") is None:
        pytest.skip("curl is not installed here (the block sends its requests with curl)")
    pytest.importorskip("fastapi", reason="the service extra is not installed (pip install 'gpuir[service]')")
    from gpuir.service.keys import KeyStore
    from gpuir.service.testing import ServerProcess
    from gpuir.storage.dirlock import claim_dir

    root = tmp / "served" / "mem"
    claim_dir(root, "memory")
    key = KeyStore(root).add(SERVE_TENANT)
    return ServerProcess(root).start(), key


def run_block(block: Block, tmp: Path) -> subprocess.CompletedProcess:
    work = tmp / "work"
    work.mkdir()
    env = _env(tmp)
    server = None
    if SERVE in block.info:
        assert block.lang in ("sh", "bash"), f"{block.name}: {SERVE} applies to sh and bash blocks"
        server, key = _serve(tmp)
        env.update(GPUIR_URL=server.url, GPUIR_KEY=key)
    try:
        return _run(block, tmp, work, env)
    finally:
        if server is not None:
            server.stop()


def _run(block: Block, tmp: Path, work: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    if block.lang == "python":
        src = tmp / "block.py"
        src.write_text(block.code, "utf-8")
        cmd = [sys.executable, str(src)]
    else:
        src = tmp / "block.sh"
        src.write_text(block.code, "utf-8")
        cmd = ["bash", "-e", "-o", "pipefail", str(src)]
    # its own session, so that whatever it leaves running (a server started with '&') is stopped with it;
    # output to files, not pipes, which such a process would hold open
    with open(tmp / "stdout", "w+") as out, open(tmp / "stderr", "w+") as err:
        proc = subprocess.Popen(cmd, cwd=work, env=env, stdout=out, stderr=err, stdin=subprocess.DEVNULL,
                                start_new_session=True)
        try:
            proc.wait(timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            _kill_group(proc.pid)
            proc.wait()
            pytest.fail(f"{block.name} ran over {TIMEOUT_S} s (a block that runs this long is a text block)\n"
                        f"{(tmp / 'stderr').read_text(errors='replace')[-3000:]}")
        finally:
            _kill_group(proc.pid)
    read = lambda name: (tmp / name).read_text("utf-8", errors="replace")
    return subprocess.CompletedProcess(cmd, proc.returncode, read("stdout"), read("stderr"))


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _ids(blocks):
    return [f"{b.name}[{b.lang}]" for b in blocks]


@pytest.mark.parametrize("block", BLOCKS, ids=_ids(BLOCKS))
def test_block_names_a_known_language(block):
    assert block.lang in LANGUAGES, (
        f"{block.name}: every code block is fenced and names its language, one of {', '.join(LANGUAGES)} "
        f"(text for what must not run in tests; docs/README.md), got "
        f"{'an indented block' if block.lang is None and not block.code.startswith('```') else repr(block.lang)}")


JSON_BLOCKS = [b for b in BLOCKS if b.lang == "json"]


@pytest.mark.parametrize("block", JSON_BLOCKS, ids=_ids(JSON_BLOCKS))
def test_json_block_parses(block):
    try:
        json.loads(block.code)
    except json.JSONDecodeError as e:
        pytest.fail(f"{block.name}: a json block must be valid JSON ({e}); a fragment is a text block")


RUN_BLOCKS = [b for b in BLOCKS if b.lang in RUN]


@pytest.mark.parametrize("block", RUN_BLOCKS, ids=_ids(RUN_BLOCKS))
def test_block_runs_as_printed(block, tmp_path):
    r = run_block(block, tmp_path)
    if r.returncode != 0:
        _skip_if_missing(r.stderr)
    assert r.returncode == 0, (f"{block.name} ({block.lang}) exited {r.returncode}\n--- block ---\n{block.code}"
                               f"--- stdout ---\n{r.stdout[-3000:]}\n--- stderr ---\n{r.stderr[-6000:]}")
    want = shown_output(block)
    if want is not None:
        checker = doctest.OutputChecker()
        flags = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE
        wanted = "\n".join(want) + "\n"
        assert checker.check_output(wanted, r.stdout, flags), (
            f"{block.name}: the output shown in its '# ->' comments is not what it prints\n"
            + checker.output_difference(doctest.Example("", wanted), r.stdout, flags))


# -- the harness itself can fail -----------------------------------------------------------------


def _fake(tmp_path, text):
    p = tmp_path / "x.md"
    p.write_text(text)
    return doc_blocks([p])


def test_harness_finds_every_kind_of_block(tmp_path, monkeypatch):
    monkeypatch.setattr(sys.modules[__name__], "REPO", tmp_path)
    blocks = _fake(tmp_path, "a\n\n```python\nx = 1\n```\n\n    indented\n\n```\nbare\n```\n\n"
                             "* item\n\n  ```sh\n  echo hi\n  ```\n\n```bash gpuir-serve\ncurl x\n```\n")
    assert [(b.line, b.lang) for b in blocks] == [(3, "python"), (7, None), (9, None), (15, "sh"), (19, "bash")]
    assert blocks[3].code == "echo hi\n"
    assert [b.info for b in blocks] == [(), (), (), (), ("gpuir-serve",)]


@pytest.mark.parametrize("code, ok", [
    ('curl -s "$GPUIR_URL/healthz"; echo  # -> {"status":"ok"}\n', True),
    ('curl -s -H "Authorization: Bearer $GPUIR_KEY" "$GPUIR_URL/v1/tenants/alice/count"; echo  # -> {"count":0}\n',
     True),
    ('curl -s -H "Authorization: Bearer $GPUIR_KEY" "$GPUIR_URL/v1/tenants/alice/count"; echo  # -> {"count":1}\n',
     False),
    ('curl -sf -H "Authorization: Bearer $GPUIR_KEY" "$GPUIR_URL/v1/tenants/bob/count"\n', False),
])
def test_harness_serves_gpuir_serve_blocks(tmp_path, monkeypatch, code, ok):
    """A ``bash gpuir-serve`` block reaches a real server with a key of tenant alice (and only alice's)."""
    monkeypatch.setattr(sys.modules[__name__], "REPO", tmp_path)
    (block,) = _fake(tmp_path, f"```bash gpuir-serve\n{code}```\n")
    monkeypatch.setattr(sys.modules[__name__], "REPO", REPO)
    run = tmp_path / "run"
    run.mkdir()
    if ok:
        test_block_runs_as_printed(block, run)
    else:
        with pytest.raises(AssertionError):
            test_block_runs_as_printed(block, run)


def test_shown_output_reads_arrow_comments_only(tmp_path, monkeypatch):
    monkeypatch.setattr(sys.modules[__name__], "REPO", tmp_path)
    py, sh = _fake(tmp_path, "```python\ns = '# -> not a comment'\nprint(s)  # -> # -> not...\n# plain\n"
                             "print()  # ->\n```\n\n```sh\necho 'a#b'  # -> a#b\n```\n")
    assert shown_output(py) == ["# -> not...", ""]
    assert shown_output(sh) == ["a#b"]


@pytest.mark.parametrize("code, ok", [("print(2 + 2)  # -> 4\n", True), ("print(2 + 2)  # -> 5\n", False),
                                      ("print([1.25, 'x'])  # -> [1.2..., 'x']\n", True),
                                      ("print(1); print(2)  # -> 1\n", False),
                                      ("raise SystemExit(3)\n", False)])
def test_harness_checks_exit_status_and_shown_output(tmp_path, monkeypatch, code, ok):
    monkeypatch.setattr(sys.modules[__name__], "REPO", tmp_path)
    (block,) = _fake(tmp_path, f"```python\n{code}```\n")
    monkeypatch.setattr(sys.modules[__name__], "REPO", REPO)
    run = tmp_path / "run"
    run.mkdir()
    if ok:
        test_block_runs_as_printed(block, run)
    else:
        with pytest.raises(AssertionError):
            test_block_runs_as_printed(block, run)


# -- the index of docs/ ----------------------------------------------------------------------------


def test_docs_index_lists_every_page():
    index = (REPO / "docs" / "README.md").read_text("utf-8")
    linked = set(re.findall(r"\]\(([\w.-]+\.md)\)", index))
    pages = {p.name for p in (REPO / "docs").glob("*.md")} - {"README.md"}
    assert not pages - linked, f"docs/README.md does not list {sorted(pages - linked)}"
    assert not linked - pages, f"docs/README.md links missing pages {sorted(linked - pages)}"


def test_readme_documentation_section_points_to_the_index():
    text = (REPO / "README.md").read_text("utf-8")
    section = text[text.index("## Documentation"):]
    assert "docs/README.md" in section.split("\n## ")[0]
