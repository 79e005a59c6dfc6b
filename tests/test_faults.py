"""Fault injection: concurrent writers and readers (threads and processes), kill -9
during saves, a full and a read-only file system.

Each test asserts that nothing is lost -- the index always loads, complete, as
one of the versions that were saved -- and that every answer equals the serial
answer of that version. The file-system tests need to mount a small tmpfs (root
on Linux); where the machine does not allow it they are skipped, not failed.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from _helpers import random_corpus

from gpuir import BM25Index
from gpuir.index import storage

REPO = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tests")])}
QUERIES = ["w1 w2", "w30 w0", "w7 w7 w3", "w55"]

#: The two versions every test writes: (corpus seed, n_docs, method).
VERSIONS = {"A": (1, 400, "lucene"), "B": (2, 300, "atire")}


def build(name: str, scale: int = 1) -> BM25Index:
    seed, n, method = VERSIONS[name]
    return BM25Index.build(random_corpus(n * scale, 80, seed=seed), analyzer="plain", method=method, progress=False)


def answers(idx: BM25Index) -> list:
    r = idx.search(QUERIES, k=5, backend="numpy")
    return [r.ids.tolist(), r.scores.tolist()]


# A worker process: builds its versions, then saves or loads in a loop.
WORKER = r"""
import json, os, sys, time
from test_faults import build, answers
from gpuir import BM25Index
mode, ix, seconds, out = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4]
scale = int(sys.argv[5]) if len(sys.argv) > 5 else 1
if mode == "save":
    versions = [build("A", scale), build("B", scale)]
    open(out, "w").close()  # ready
    i, end = 0, time.monotonic() + seconds
    while time.monotonic() < end:
        versions[i % 2].save(ix, lock_timeout=60)
        i += 1
else:
    seen, failures, loads, end = [], [], 0, time.monotonic() + seconds
    while time.monotonic() < end:
        try:
            got = answers(BM25Index.load(ix))
        except Exception as e:
            failures.append(f"{type(e).__name__}: {e}")
            continue
        loads += 1
        if got not in seen:
            seen.append(got)
    json.dump({"seen": seen, "failures": failures, "loads": loads}, open(out, "w"))
"""


def worker(mode: str, ix: Path, seconds: float, out: Path, scale: int = 1) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", WORKER, mode, str(ix), str(seconds), str(out), str(scale)],
                            env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_for(path: Path, proc: subprocess.Popen, timeout: float = 60.0) -> None:
    end = time.monotonic() + timeout
    while not path.exists():
        if proc.poll() is not None:
            raise AssertionError(f"worker died: {proc.communicate()[1]}")
        if time.monotonic() > end:
            raise AssertionError("worker never got ready")
        time.sleep(0.02)


@pytest.fixture(scope="module")
def expected():
    return {name: answers(build(name)) for name in VERSIONS}


# -- threads


def test_concurrent_saves_from_threads_leave_one_complete_index(tmp_path):
    ix = tmp_path / "ix"
    variants = [BM25Index.build(random_corpus(150, 50, seed=s), analyzer="plain", method=m)
                for s, m in zip(range(8), ["lucene", "atire", "bm25+", "bm25l"] * 2)]
    want = [answers(v) for v in variants]
    errors: list[BaseException] = []
    barrier = threading.Barrier(len(variants))

    def save(v):
        try:
            barrier.wait()
            for _ in range(3):
                v.save(ix)
        except BaseException as e:  # noqa: BLE001 - collected and asserted below
            errors.append(e)

    threads = [threading.Thread(target=save, args=(v,)) for v in variants]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert answers(BM25Index.load(ix)) in want
    assert [p.name for p in ix.iterdir() if p.name.startswith(".tmp-")] == []


def test_threads_racing_to_create_one_index_directory_all_succeed(tmp_path):
    """Claiming a new directory races the first writer's files: a late claimant must see the marker."""
    tiny = BM25Index.build(["w1 w2", "w2 w3"], analyzer="plain")
    errors: list[BaseException] = []
    for rnd in range(8):
        ix = tmp_path / f"ix{rnd}"
        barrier = threading.Barrier(6)

        def save(ix=ix, barrier=barrier):
            try:
                barrier.wait()
                tiny.save(ix)
            except BaseException as e:  # noqa: BLE001 - collected and asserted below
                errors.append(e)

        threads = [threading.Thread(target=save) for _ in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert errors == []


def test_loads_racing_saves_from_threads_get_old_or_new_complete(tmp_path, expected):
    ix = tmp_path / "ix"
    a, b = build("A"), build("B")
    a.save(ix)
    stop = threading.Event()
    failures: list[str] = []
    loads = []

    def writer():
        i = 0
        while not stop.is_set():
            (a if i % 2 else b).save(ix)
            i += 1

    def reader(mmap):
        while not stop.is_set():
            try:
                got = answers(BM25Index.load(ix, mmap=mmap))
            except Exception as e:  # noqa: BLE001 - every failure is a broken guarantee
                failures.append(f"{type(e).__name__}: {e}")
                continue
            loads.append(got == expected["A"] or got == expected["B"])

    threads = [threading.Thread(target=writer)] + [threading.Thread(target=reader, args=(m,))
                                                   for m in (True, False, True)]
    for t in threads:
        t.start()
    stop.wait(3.0)
    stop.set()
    for t in threads:
        t.join()
    assert failures == []
    assert len(loads) > 10 and all(loads)


# -- processes


def test_concurrent_cli_writers_never_corrupt(tmp_path, expected):
    corpora = {}
    for name, (seed, n, method) in VERSIONS.items():
        p = tmp_path / f"{name}.jsonl"
        p.write_text("".join(json.dumps({"id": str(i), "text": t}) + "\n"
                             for i, t in enumerate(random_corpus(n, 80, seed=seed))))
        corpora[name] = (p, method)
    for rnd in range(3):
        ix = tmp_path / f"two{rnd}.idx"
        procs = [subprocess.Popen([sys.executable, "-m", "gpuir", "index", str(p), str(ix), "--analyzer", "plain",
                                   "--method", m], env=ENV, stderr=subprocess.PIPE, text=True)
                 for p, m in (corpora["A"], corpora["B"], corpora["A"])]
        for proc in procs:
            _, err = proc.communicate(timeout=120)
            assert proc.returncode == 0, err
        assert answers(BM25Index.load(ix)) in (expected["A"], expected["B"])


@pytest.mark.slow
def test_concurrent_writer_and_reader_processes(tmp_path, expected):
    ix = tmp_path / "ix"
    build("A").save(ix)
    writers = [worker("save", ix, 6.0, tmp_path / f"w{i}") for i in range(2)]
    for i, w in enumerate(writers):
        wait_for(tmp_path / f"w{i}", w)
    readers = [worker("load", ix, 4.0, tmp_path / f"r{i}.json") for i in range(2)]
    for p in writers + readers:
        _, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
    for i in range(2):
        rep = json.loads((tmp_path / f"r{i}.json").read_text())
        assert rep["failures"] == []
        assert rep["loads"] >= 3 and all(s in (expected["A"], expected["B"]) for s in rep["seen"])
    assert answers(BM25Index.load(ix)) in (expected["A"], expected["B"])


@pytest.mark.slow
def test_kill_9_during_saves_leaves_a_complete_index(tmp_path):
    ix = tmp_path / "ix"
    scale = 8  # saves of about a megabyte, so kills land in every phase of a save
    want = [answers(build("A", scale)), answers(build("B", scale))]
    rng = np.random.default_rng(0)
    for rnd in range(5):
        ready = tmp_path / f"ready{rnd}"
        w = worker("save", ix, 60.0, ready, scale)
        wait_for(ready, w)
        if rnd == 0:
            wait_for(ix / "CURRENT", w)
        time.sleep(float(rng.uniform(0.0, 0.4)))
        w.send_signal(signal.SIGKILL)
        w.wait()
        assert answers(BM25Index.load(ix)) in want, f"round {rnd}"
    # the killed writers' lock is gone and their debris is collected by the next save
    build("A").save(ix, lock_timeout=1)
    left = [p.name for p in ix.iterdir() if not p.name.startswith(".gpuir")]
    assert len([n for n in left if n.startswith("v-")]) == 2 and "CURRENT" in left and len(left) == 3, left


# -- full and read-only file systems


@contextlib.contextmanager
def tmpfs(size: str):
    """A fresh tmpfs of ``size`` mounted on a temporary folder; skips where mounting is not allowed."""
    if sys.platform != "linux" or os.geteuid() != 0:
        pytest.skip("mounting a small file system needs root on Linux")
    mnt = Path(tempfile.mkdtemp(prefix="gpuir-tmpfs-"))
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mnt)],
                       capture_output=True, text=True, check=False)
    if r.returncode != 0:
        os.rmdir(mnt)
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True, check=False)
        os.rmdir(mnt)


def usage(path: Path) -> int:
    st = os.statvfs(path)
    return (st.f_blocks - st.f_bfree) * st.f_frsize


def test_a_full_file_system_keeps_the_old_index(tmp_path, expected):
    with tmpfs("1m") as mnt:
        ix = mnt / "ix"
        small = build("A")
        small.save(ix)  # one version: a failed save first retires all but the live one
        before, used = sorted(os.listdir(ix)), usage(mnt)
        big = build("B", scale=60)  # about 2 MB: cannot fit
        with pytest.raises(storage.StoreWriteError, match="No space left"):
            big.save(ix)
        assert sorted(os.listdir(ix)) == before and usage(mnt) <= used
        assert answers(BM25Index.load(ix)) == expected["A"]
        # the CLI says the same with exit 2
        corpus = tmp_path / "big.jsonl"
        corpus.write_text("".join(json.dumps({"id": str(i), "text": t}) + "\n"
                                  for i, t in enumerate(random_corpus(20_000, 80, seed=3))))
        r = subprocess.run([sys.executable, "-m", "gpuir", "index", str(corpus), str(ix)], env=ENV,
                           capture_output=True, text=True, check=False)
        assert r.returncode == 2 and "No space left" in r.stderr and "Traceback" not in r.stderr, r.stderr
        assert sorted(os.listdir(ix)) == before
        assert answers(BM25Index.load(ix)) == expected["A"]


def test_a_read_only_file_system_is_exit_2_and_still_searchable(tmp_path, expected):
    with tmpfs("4m") as mnt:
        ix = mnt / "ix"
        build("A").save(ix)
        r = subprocess.run(["mount", "-o", "remount,ro", str(mnt)], capture_output=True, text=True, check=False)
        if r.returncode != 0:
            pytest.skip(f"cannot remount read-only: {r.stderr.strip()}")
        corpus = tmp_path / "c.jsonl"
        corpus.write_text(json.dumps({"id": "x", "text": "w1 w2"}) + "\n")
        for target in (ix, mnt / "new"):
            r = subprocess.run([sys.executable, "-m", "gpuir", "index", str(corpus), str(target)], env=ENV,
                               capture_output=True, text=True, check=False)
            assert r.returncode == 2 and "Read-only file system" in r.stderr, r.stderr
            assert "Traceback" not in r.stderr
        assert answers(BM25Index.load(ix)) == expected["A"]
        r = subprocess.run([sys.executable, "-m", "gpuir", "search", str(ix), "--query", "w1 w2"], env=ENV,
                           capture_output=True, text=True, check=False)
        assert r.returncode == 0 and json.loads(r.stdout)["hits"], r.stderr


def test_a_directory_without_write_permission_is_exit_2(tmp_path, expected):
    prefix: list[str] = []
    if hasattr(os, "geteuid") and os.geteuid() == 0:  # root ignores permissions unless it drops the capability
        if sys.platform != "linux" or shutil.which("setpriv") is None:
            pytest.skip("permissions do not bind root, and setpriv is missing to drop CAP_DAC_OVERRIDE")
        prefix = ["setpriv", "--bounding-set=-dac_override,-dac_read_search"]
    ix = tmp_path / "ix"
    build("A").save(ix)
    corpus = tmp_path / "c.jsonl"
    corpus.write_text(json.dumps({"id": "x", "text": "w1 w2"}) + "\n")
    os.chmod(ix, 0o555)
    try:
        r = subprocess.run([*prefix, sys.executable, "-m", "gpuir", "index", str(corpus), str(ix)], env=ENV,
                           capture_output=True, text=True, check=False)
        if prefix and "setpriv" in r.stderr:
            pytest.skip(f"cannot drop capabilities here: {r.stderr.strip()}")
        assert r.returncode == 2 and "Permission denied" in r.stderr and "Traceback" not in r.stderr, r.stderr
        assert answers(BM25Index.load(ix)) == expected["A"]
        r = subprocess.run([*prefix, sys.executable, "-m", "gpuir", "search", str(ix), "--query", "w1 w2"], env=ENV,
                           capture_output=True, text=True, check=False)
        assert r.returncode == 0 and json.loads(r.stdout)["hits"], r.stderr  # readers need no write access
    finally:
        os.chmod(ix, 0o755)
