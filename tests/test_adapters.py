"""LangChain, LlamaIndex and MCP adapters, each exercised through the real package (no network)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from _helpers import without_times

from gpuir import Memory
from gpuir.adapters import as_backend, hit_metadata

REPO = Path(__file__).resolve().parent.parent

RECORDS = [
    {"id": "r1", "text": "my dog is called Rex and loves the park", "session": "s1", "role": "user",
     "metadata": {"speaker": "Caroline"}},
    {"id": "r2", "text": "I moved to Berlin last spring", "session": "s1", "role": "user"},
    {"id": "r3", "text": "Rex the dog chewed my shoes", "session": "s2", "role": "user", "importance": 0.9},
    {"id": "r4", "text": "the weather in Berlin was rainy", "session": "s2", "role": "assistant"},
]


@pytest.fixture
def memory():
    m = Memory()
    m.add(RECORDS)
    return m


def _expected(memory, query, k):
    """What the memory itself returns: the adapters must return the same ids, scores and order."""
    return memory.search([query], k=k).hits(0)


class FakeClient:
    """A duck-typed service client (search/add/delete), as gpuir.service.client.MemoryClient behaves."""

    def __init__(self, hits):
        self.hits, self.calls = hits, []

    def search(self, queries, k=10, where=None):
        self.calls.append(("search", list(queries), k, where))
        return [self.hits[:k] for _ in queries]

    def add(self, records):
        self.calls.append(("add", list(records)))
        return len(self.calls[-1][1])

    def delete(self, ids):
        self.calls.append(("delete", list(ids)))
        return 1


def test_as_backend_and_metadata(memory):
    b = as_backend(memory)
    assert [h["id"] for h in b.search(["dog Rex"], k=2)[0]] == [h["id"] for h in _expected(memory, "dog Rex", 2)]
    client = FakeClient([])
    assert as_backend(client) is client
    with pytest.raises(TypeError, match="MemoryClient"):
        as_backend(object())
    md = hit_metadata({"id": "x", "score": 1.5, "text": "t", "session": "s", "metadata": {"speaker": "C", "id": "no"}})
    assert md == {"id": "x", "score": 1.5, "session": "s", "speaker": "C"}


def test_langchain_invoke(memory):
    pytest.importorskip("langchain_core")
    from langchain_core.documents import Document

    from gpuir.adapters.langchain import GpuirRetriever

    r = GpuirRetriever(backend=memory, k=2)
    docs = r.invoke("where is Rex the dog")
    want = _expected(memory, "where is Rex the dog", 2)
    assert all(isinstance(d, Document) for d in docs)
    assert [d.id for d in docs] == [h["id"] for h in want] and len(docs) == 2
    assert docs[0].page_content == next(x["text"] for x in RECORDS if x["id"] == want[0]["id"])
    assert docs[0].metadata["score"] == pytest.approx(want[0]["score"])
    assert docs[0].metadata["session"] == want[0]["session"]
    # a where filter reaches the memory
    docs = GpuirRetriever(backend=memory, k=5, where={"session": "s2"}).invoke("Berlin")
    assert [d.id for d in docs] == ["r4"]
    # a service client is used as is
    client = FakeClient([{"id": "z", "score": 2.0, "text": "zed", "tenant": "acme"}])
    docs = GpuirRetriever(backend=client, k=3, where={"tenant": "acme"}).invoke("q")
    assert client.calls == [("search", ["q"], 3, {"tenant": "acme"})]
    assert docs[0].page_content == "zed" and docs[0].metadata == {"id": "z", "score": 2.0, "tenant": "acme"}


@pytest.mark.slow  # importing llama-index-core takes seconds
def test_llamaindex_retrieve(memory):
    pytest.importorskip("llama_index.core")
    from llama_index.core.schema import NodeWithScore

    from gpuir.adapters.llamaindex import GpuirRetriever

    nodes = GpuirRetriever(memory, k=3).retrieve("Berlin weather")
    want = _expected(memory, "Berlin weather", 3)
    assert all(isinstance(n, NodeWithScore) for n in nodes)
    assert [n.node.node_id for n in nodes] == [h["id"] for h in want]
    assert [n.score for n in nodes] == pytest.approx([h["score"] for h in want])
    assert nodes[0].node.get_content() == next(x["text"] for x in RECORDS if x["id"] == want[0]["id"])
    r1 = next(n for n in GpuirRetriever(memory, k=4).retrieve("dog park") if n.node.node_id == "r1")
    assert r1.node.metadata["speaker"] == "Caroline" and r1.node.metadata["role"] == "user"
    with pytest.raises(ValueError, match="k must be"):
        GpuirRetriever(memory, k=0)


@pytest.mark.slow
def test_llamaindex_adapter_never_reaches_the_network():
    """Importing llama-index-core and retrieving opens no socket and downloads no NLTK data."""
    pytest.importorskip("llama_index.core")
    code = """
import socket, sys
tries = []
def refuse(self, *a, **kw):
    tries.append(a)
    raise OSError("network disabled by the test")
socket.socket.connect = refuse
socket.socket.connect_ex = refuse
import nltk
nltk.download = lambda *a, **kw: tries.append(("nltk.download", a)) or False
from gpuir import Memory
from gpuir.adapters.llamaindex import GpuirRetriever
m = Memory(); m.add([{"id": "a", "text": "the dog Rex"}, {"id": "b", "text": "Berlin"}])
nodes = GpuirRetriever(m, k=1).retrieve("dog")
print(nodes[0].node.node_id, len(tries))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=REPO, env={**_env(), "PYTHONPATH": str(REPO)})
    assert out.stdout.split() == ["a", "0"], out.stderr[-2000:]


def _env():
    import os

    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


def test_mcp_tools_in_memory(memory):
    pytest.importorskip("mcp")
    import anyio
    from mcp import Client

    from gpuir.adapters.mcp_server import build_server

    async def go():
        async with Client(build_server(memory)) as c:
            names = sorted(t.name for t in (await c.list_tools()).tools)
            assert names == ["browse", "forget", "recall", "remember", "revise"]
            r = await c.call_tool("remember", {"text": "Rex is afraid of thunder", "id": "r5",
                                               "session": "s3", "metadata": {"speaker": "Mel"}})
            assert not r.is_error and r.structured_content == {"added": 1, "id": "r5"}
            r = await c.call_tool("recall", {"query": "thunder", "k": 2})
            hits = r.structured_content["hits"]
            assert [h["id"] for h in hits] == ["r5"] and hits[0]["metadata"] == {"speaker": "Mel"}
            want = _expected(memory, "Rex dog", 3)
            r = await c.call_tool("recall", {"query": "Rex dog", "k": 3})
            assert [h["id"] for h in r.structured_content["hits"]] == [h["id"] for h in want]
            r = await c.call_tool("recall", {"query": "Rex dog", "k": 3, "where": {"session": "s2"}})
            assert [h["id"] for h in r.structured_content["hits"]] == ["r3"]
            r = await c.call_tool("forget", {"ids": ["r5", "nope"]})
            assert r.structured_content == {"deleted": 1}
            r = await c.call_tool("recall", {"query": "thunder", "k": 2})
            assert r.structured_content["hits"] == []
            r = await c.call_tool("remember", {"text": "duplicate id", "id": "r1"})
            assert r.is_error  # an existing id: the memory's error, as a tool error

    anyio.run(go)
    assert memory.get(["r5"], missing_ok=True) == [None]


def test_mcp_revise_and_browse_keep_fields_and_the_tenant():
    pytest.importorskip("mcp")
    import anyio
    from mcp import Client

    from gpuir.adapters.mcp_server import build_server

    m = Memory()
    m.add([{"id": "a1", "text": "Rex likes the park", "tenant": "ann", "session": "s1", "time": "2024-01-01",
            "metadata": {"speaker": "Ann", "mood": "happy"}},
           {"id": "b1", "text": "Bob's note", "tenant": "bob", "time": "2024-02-01"}])

    async def go():
        async with Client(build_server(m, tenant="ann")) as c:
            r = await c.call_tool("revise", {"id": "a1", "text": "Rex loves the park", "metadata": {"mood": None}})
            assert not r.is_error and r.structured_content == {"updated": 1, "id": "a1"}
            r = await c.call_tool("revise", {"id": "b1", "text": "not yours"})
            assert r.is_error, "another tenant's record cannot be revised"
            r = await c.call_tool("remember", {"text": "a later note", "id": "a2", "time": "2024-03-01"})
            r = await c.call_tool("browse", {"limit": 1})
            page = r.structured_content
            assert [x["id"] for x in page["records"]] == ["a2"] and page["cursor"]
            assert page["records"][0]["created_at"] == m.get(["ann/a2"])[0]["created_at"], "with the record's times"
            r = await c.call_tool("recall", {"query": "later note"})
            assert r.structured_content["hits"][0]["updated_at"] == page["records"][0]["updated_at"]
            r = await c.call_tool("browse", {"limit": 5, "where": {"tenant": "bob"}})
            assert r.is_error and "another tenant" in r.content[0].text, "a where naming another tenant is refused"
            r = await c.call_tool("browse", {"limit": 5, "where": {"tenant": "ann"}})
            assert [x["id"] for x in r.structured_content["records"]] == ["a2", "a1"], "its own tenant is fine"
            r = await c.call_tool("browse", {"limit": 5, "cursor": page["cursor"]})
            assert [x["id"] for x in r.structured_content["records"]] == ["a1"]

    anyio.run(go)
    a1 = m.get(["a1"])[0]
    assert without_times(a1) == {"id": "a1", "text": "Rex loves the park", "session": "s1", "tenant": "ann",
                                 "time": "2024-01-01T00:00:00+00:00", "metadata": {"speaker": "Ann"}}
    assert a1["updated_at"] >= a1["created_at"], "the memory's own times: revise moved updated_at"
    assert m.get(["b1"])[0]["text"] == "Bob's note"


def test_local_backend_update_list_count(tmp_path, memory):
    memory.save(tmp_path / "m")
    b = as_backend(memory)
    assert b.update([{"id": "r1", "metadata": {"mood": "calm"}}]) == 1
    assert Memory.open(tmp_path / "m", writer=False).get(["r1"])[0]["metadata"] == {"speaker": "Caroline",
                                                                                   "mood": "calm"}
    page = b.list(where={"session": "s2"}, limit=1)
    assert [r["id"] for r in page.records] == ["r3"] and page.cursor is not None
    assert b.count({"session": "s2"}) == 2
    memory.close()


@pytest.mark.slow
def test_mcp_server_module_over_stdio(tmp_path):
    """``python -m gpuir.adapters.mcp_server MEMORY_DIR`` over stdio: what it remembers is saved to the directory."""
    pytest.importorskip("mcp")
    import anyio
    from mcp import Client, StdioServerParameters

    params = StdioServerParameters(command=sys.executable, args=["-m", "gpuir.adapters.mcp_server", str(tmp_path / "mem")],
                                   env={"PYTHONPATH": str(REPO), "GPUIR_BACKEND": "numpy"}, cwd=str(REPO))

    async def go():
        with anyio.fail_after(60):
            async with Client(params) as c:
                r = await c.call_tool("remember", {"text": "the cat is named Tom", "id": "c1"})
                assert r.structured_content == {"added": 1, "id": "c1"}
                r = await c.call_tool("recall", {"query": "cat name", "k": 1})
                assert [h["id"] for h in r.structured_content["hits"]] == ["c1"]

    anyio.run(go)
    m = Memory.open(tmp_path / "mem", writer=False)
    assert [r["text"] for r in m.get(["c1"])] == ["the cat is named Tom"]
    m.close()


def test_missing_extra_names_the_install_line(monkeypatch):
    import builtins

    from gpuir import adapters

    real = builtins.__import__

    def no_langchain(name, *a, **kw):
        if name.startswith("langchain_core"):
            raise ImportError("No module named 'langchain_core'")
        return real(name, *a, **kw)

    monkeypatch.setattr(builtins, "__import__", no_langchain)
    monkeypatch.delitem(sys.modules, "langchain_core", raising=False)
    with pytest.raises(ImportError, match=r"pip install 'gpuir\[langchain\]'"):
        adapters.require("langchain_core", "langchain")


def test_mcp_cli_bad_directory_exits_2(tmp_path, capsys):
    pytest.importorskip("mcp")
    from gpuir.adapters.mcp_server import main

    f = tmp_path / "not-a-dir"
    f.write_text("x")
    assert main([str(f)]) == 2
    assert "gpuir mcp server" in capsys.readouterr().err


def test_retriever_backend_sees_growth(memory):
    """A gpuir.Retriever as the backend: its hits, and records added through the adapter are found."""
    pytest.importorskip("langchain_core")
    from gpuir import Retriever
    from gpuir.adapters.langchain import GpuirRetriever

    ret = Retriever(memory)
    lc = GpuirRetriever(backend=ret, k=3)
    want = ret.search(["Rex dog"], k=3).hits(0)
    assert [d.id for d in lc.invoke("Rex dog")] == [h["id"] for h in want]
    assert lc.backend.add([{"id": "r9", "text": "a parrot named Polly", "session": "s9"}]) == 1
    assert [d.id for d in lc.invoke("parrot Polly")] == ["r9"]
    assert lc.backend.delete(["r9", "missing"]) == 1
    assert lc.invoke("parrot Polly") == []


def test_local_backend_saves_changes_to_its_directory(tmp_path, memory):
    memory.save(tmp_path / "m")
    b = as_backend(memory)
    b.add([{"id": "n1", "text": "saved before the call returns"}])
    memory.close()
    again = Memory.open(tmp_path / "m", writer=False)
    assert [r["id"] for r in again.get(["n1"])] == ["n1"]
    again.close()
