#!/usr/bin/env python
"""Load test of the memory service: many concurrent agents, a kill -9 mid-run, nothing lost.

A real ``gpuir serve`` runs in a subprocess on loopback (127.0.0.1 only).
``--agents`` simulated agents (asyncio coroutines on
:class:`gpuir.service.AsyncMemoryClient`, each with its own HTTP connection, as
separate agent processes would have; or sharing ``--connections N``), one
tenant and one API key each, run ``--steps`` steps each (with an optional think
time before each request, ``--think-ms``): add one record carrying a word unique
to it, then search its tenant for that word and for a word common to all its
records, and check the answer (read-your-writes: the new record is the top hit;
every hit is the agent's own). When ``--kill-at`` (0.4) of all adds are
acknowledged the server is killed with SIGKILL (other requests are in flight
then); the agents' requests fail (they wait and retry: an add that was durable
before the kill answers 409 on retry and counts as acknowledged); the server is
restarted on the same directory (it replays its write-ahead log; its record
count must be at least the acknowledged count), and the agents finish. Then
every acknowledged record -- before and after the kill -- is checked: a search
for its unique word must return it first (a hit is the stored record, so found
means present and searchable).

With ``--shards N`` the server serves a sharded memory (``ShardedMemory.create(route="tenant")``, N
shard actors on a local Ray runtime on loopback, ``--statistics pooled``), and ``--kill shard`` sends the
SIGKILL to one shard actor's process (its pid from ``/healthz``) instead of the server: the server stays
up, Ray restarts the shard, which replays its memory's log, and the requests that meet the dead shard
wait for it (nothing is retried by the client: an answer other than 2xx is an error). The run then
records how long the shard took to answer again (``shard_recovery_s``) and the latencies of the requests
started after the kill apart; every acknowledged record is checked at the end as above.

Recorded: throughput (requests/s over the whole run, outage excluded), p50/p99
latency per operation as the client sees it (requests interrupted by the
crash excluded; they are counted as ``outage_retries``), errors (a non-2xx
reply other than the 409 of a retried durable add, a wrong answer, or a
transport error while the server was up: must be 0), records lost (must be 0),
the CPU seconds per request of the client process and of the server processes,
the server's own mean time per route and its batching figures (from
``/metrics``, before the kill and after the restart; read with an operator key), and the load average.

Why one connection per agent: httpx's connection pool scans its waiting requests
times its connections on every event, so 1,000 agents queued on a shared pool of
100 connections cost the *client* about 30 ms of CPU per request (cProfile) and
the benchmark measured its own client. ``--connections N`` shares N connections
but hands the pool at most N requests at a time (a semaphore), which keeps it cheap.

With ``--page on`` the memory inspector page (``/ui``) is open in headless
Chromium during the run (Playwright driving Debian's ``/usr/bin/chromium``),
signed in with the first agent's key on its memory view with "refresh every
second" on, so it polls ``GET /v1/tenants/{tenant}/overview`` once a second
(re-opened on the new port after the restart); ``--page both`` runs the whole
benchmark ``--repeat`` times without and with the page, alternately, and
writes both series and their ratios (``--out``, default
``bench/results/service_page_MACHINE.json``), among them the server process's CPU
time per agent request (the page's polls' work included): on a machine whose
load moves requests/s by 2x from run to run, the figure that can resolve 5%. The browser runs on the same
machine as the server and the agents, so its own CPU is part of what it costs.

Each run also reports ``phases``: every operation's p50/p99 for the requests started before the kill and
after the restart, the first wave (each agent's first add, all at once, each opening a new tenant) apart
from the adds after it, and the slowest requests with their start. With 200 agents x 30 steps the first
wave is 3.3% of the adds, so it sets the run's add p99; ``--settle-s S`` starts the agents S seconds after
the server (and the page's sign-in), the same with and without the page.

Runs with and without the page differ by more than 5% on a shared machine on their own. ``--page
toggle`` keeps the page open through each of ``--repeat`` runs, switches its polling off and on every
``--toggle-s`` seconds and counts each request under the state at its start (the first wave, the outage
and the ramp-down left out): the same minutes fall on both states, and the results give each
operation's p50/p99 and requests per second polling over not polling, per run and pooled
(``bench/results/service_page_toggle_MACHINE.json``). ``--page-client http`` replaces the browser by a
process that asks the page's route as the page does: the server's share of the page's cost alone.

Usage::

    python bench/bench_service.py --agents 1000 --steps 2 --out bench/results/service_vm_after.json
        # the closed-loop run in docs/service.md (under a minute on 2 cores)
    python bench/bench_service.py --agents 1000 --steps 3 --think-ms 5000 \
        --out bench/results/service_vm_after_think5s.json --plot docs/img/service_latency_think5s.png
    python bench/bench_service.py --agents 50 --steps 3 --no-docs   # a smoke run
    python bench/bench_service.py --agents 200 --steps 6 --page both --repeat 3   # with and without the page
    python bench/bench_service.py --agents 200 --steps 100 --page toggle --repeat 6 --settle-s 3
        # the page's polling switched off and on within each run
    python bench/bench_service.py --agents 200 --steps 4 --shards 2 --kill shard --no-docs
        # a 2-shard memory behind the server; one shard actor SIGKILLed mid-stream

Writes ``--out`` (default ``bench/results/service_<machine>.json``) and ``--plot``
(default ``docs/img/service_latency.png``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import math
import os
import random
import resource
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import httpx
import numpy as np

from gpuir.eval.runner import machine_info
from gpuir.service.client import AsyncMemoryClient, ServiceError
from gpuir.service.keys import KeyStore
from gpuir.service.testing import ServerProcess
from gpuir.storage.dirlock import claim_dir

VOCAB = ["meeting", "garden", "coffee", "project", "budget", "travel", "doctor", "birthday", "concert", "recipe", "invoice", "deadline", "weather", "music", "movie", "train", "hotel", "dinner", "gift", "library"]


class Run:
    def __init__(self, args):
        self.args = args
        self.total_steps = args.agents * args.steps
        self.done_steps = 0
        self.up = asyncio.Event()
        self.up.set()
        self.crashed = False
        self.lat: dict[str, list[float]] = {"add": [], "search": [], "verify": []}
        self.restarted = False  # latencies of requests started after the restart are also kept apart
        self.lat_after: dict[str, list[float]] = {"add": [], "search": [], "verify": []}
        self.samples: list[tuple[float, str, float]] = []  # (start, op, seconds) of every kept latency
        self.finished: list[float] = []  # when each agent made its last step (the load ramps down after the first)
        self.errors: list[str] = []
        self.outage_retries = 0
        self.acked: dict[int, list[tuple[str, str]]] = {}  # agent -> [(id, unique word)]
        self.acked_before_kill: dict[int, int] = {}
        self.requests = 0
        self.timeline: list[tuple[float, int]] = []
        self.gate: asyncio.Semaphore | None = None  # --connections N: at most N requests handed to the pool
        self.rng = random.Random(0)


async def think(run: Run) -> None:
    if run.args.think_ms > 0:
        await asyncio.sleep(run.rng.expovariate(1000.0 / run.args.think_ms))


def word(agent: int, step: int) -> str:
    return f"a{agent}s{step}tok"


async def call(run: Run, op: str, fn, *a, **kw):
    """One request; retried after the deliberate outage; latency kept only for uninterrupted requests."""
    interrupted = False
    while True:
        await run.up.wait()
        t0 = time.perf_counter()
        try:
            if run.gate is None:
                out = await fn(*a, **kw)
            else:
                async with run.gate:
                    out = await fn(*a, **kw)
        except ServiceError as e:
            if op == "add" and e.status == 409 and interrupted:
                return "durable-before-crash"
            run.errors.append(f"{op}: HTTP {e.status}: {e.detail}")
            return None
        except httpx.TransportError as e:
            if run.crashed:
                interrupted = True
                run.outage_retries += 1
                await asyncio.sleep(0.05)
                continue
            run.errors.append(f"{op}: {type(e).__name__}: {e}")
            return None
        run.requests += 1
        if not interrupted:
            dt = time.perf_counter() - t0
            run.lat[op].append(dt)
            run.samples.append((t0, op, dt))
            if run.restarted:
                run.lat_after[op].append(dt)
        return out


async def agent(run: Run, i: int, client: AsyncMemoryClient, bar) -> None:
    run.acked[i] = []
    for step in range(run.args.steps):
        w = word(i, step)
        rec = {"id": f"m{step}", "text": f"agent note {w} about {VOCAB[(i + step) % len(VOCAB)]}",
               "role": "user", "session": f"s{step // 2}", "time": 1_700_000_000_000 + step * 60_000}
        await think(run)
        got = await call(run, "add", client.add, [rec], time_unit="ms")  # times are epoch ms
        if got is None:
            continue
        run.acked[i].append((rec["id"], w))
        await think(run)
        hits = await call(run, "search", client.search, [w, "agent note"], k=10)
        if hits is None:
            continue
        if not hits[0] or hits[0][0]["id"] != rec["id"]:
            run.errors.append(f"agent {i} step {step}: its new record is not the top hit of its word: {hits[0][:1]}")
        if any(h["tenant"] != client.tenant for row in hits for h in row):
            run.errors.append(f"agent {i}: a hit of another tenant")
        if len(hits[1]) != min(10, len(run.acked[i])):
            run.errors.append(f"agent {i} step {step}: {len(hits[1])} hits for the common words, "
                              f"expected {min(10, len(run.acked[i]))}")
        run.done_steps += 1
        bar.update(1)
    run.finished.append(time.perf_counter())


async def verify(run: Run, clients: dict[int, AsyncMemoryClient], sem) -> tuple[int, int]:
    """Acknowledged records not found by their unique word: (all, those acknowledged before the kill); 0 expected.

    One search request per agent with one query per acknowledged record (k=1);
    the top hit must be that record. A search hit is the stored record itself
    (text and fields come from the memory), so found means present.
    """
    lost = lost_before = 0

    async def one(i: int):
        nonlocal lost, lost_before
        recs = run.acked[i]
        if not recs:
            return
        async with sem:
            hits = await call(run, "verify", clients[i].search, [w for _, w in recs], k=1)
        if hits is None:
            lost += len(recs)
            lost_before += run.acked_before_kill.get(i, 0)
            return
        for j, ((rid, w), row) in enumerate(zip(recs, hits)):
            if not row or row[0]["id"] != rid or w not in row[0]["text"]:
                lost += 1
                lost_before += j < run.acked_before_kill.get(i, 0)

    await asyncio.gather(*(one(i) for i in clients))
    return lost, lost_before


class InspectorPage:
    """The memory inspector open in headless Chromium, polling the overview once a second, in its own thread
    (Playwright's sync API); ``open(url)`` (re)opens it on a server, ``close()`` ends it."""

    ARGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
            "--disable-component-update", "--no-first-run", "--disable-sync")

    def __init__(self, key: str, chromium: str = "/usr/bin/chromium", nice: int = 0, profile: str = "memory",
                 toggle_s: float = 0.0):
        import queue
        import threading

        self.key, self.chromium, self.nice, self.profile = key, chromium, nice, profile
        self.toggle_s = toggle_s  # > 0: the polling switched off and on every toggle_s seconds (--page toggle)
        self.flips: list[tuple[float, bool]] = []  # (perf_counter, polling on) at each switch
        self.jobs: queue.Queue = queue.Queue()
        self.polls = {"ok": 0, "failed": 0}
        self.error: str | None = None
        self.cpu0, self.cpu_s = 0.0, 0.0  # the browser's and Playwright driver's CPU while a page is open
        self.opened = threading.Event()
        self.opened_at = 0.0  # perf_counter when the page last finished signing in
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        from playwright.sync_api import sync_playwright

        try:
            with sync_playwright() as p, tempfile.TemporaryDirectory(
                    prefix="gpuir-bench-browser-", dir=browser_profile_parent(self.profile)) as prof:
                # a profile of our own: on "memory" (/dev/shm) the browser's own fdatasyncs (about 2.5 a second
                # into its profile's databases, strace) do not queue beside the server's log fsyncs on one disk,
                # as with a page opened on another machine; "disk": where Playwright puts one by default (/tmp)
                b = p.chromium.launch_persistent_context(prof, executable_path=self.chromium, args=list(self.ARGS),
                                                         headless=True)
                pg = b.pages[0] if b.pages else b.new_page()
                pg.set_default_timeout(120_000)

                def seen(r):
                    if "/overview" in r.url:
                        self.polls["ok" if r.ok else "failed"] += 1

                pg.on("response", seen)
                pg.on("requestfailed", lambda r: "/overview" in r.url and self.polls.__setitem__(
                    "failed", self.polls["failed"] + 1))
                while True:
                    job = self.jobs.get()
                    if job is None:
                        break
                    pg.goto(job + "/ui")
                    pg.fill("#key", self.key)
                    pg.click("#signin-button")
                    pg.wait_for_selector("#app:not([hidden])")
                    pg.click("button[data-tab=memory-tab]")
                    pg.check("#memory-poll")
                    if self.nice:
                        renice_browser(self.nice)
                    self.opened_at = time.perf_counter()
                    self.flips.append((self.opened_at, True))
                    self.opened.set()
                    self.cpu0 = browser_cpu()
                    on, last = True, time.perf_counter()
                    while self.jobs.empty():
                        # the page's own timer polls; this thread only hands Playwright's events over, once a
                        # second (each hand-over takes the GIL from the agents' event loop in this process)
                        pg.wait_for_timeout(250 if self.toggle_s else 1000)
                        if self.toggle_s and time.perf_counter() - last >= self.toggle_s:
                            on = not on
                            (pg.check if on else pg.uncheck)("#memory-poll")
                            last = time.perf_counter()
                            self.flips.append((last, on))
                    self.cpu_s += browser_cpu() - self.cpu0
                b.close()
        except Exception as e:  # noqa: BLE001 - reported in the result, not raised in the benchmark's loop
            self.error = f"{type(e).__name__}: {e}"
            self.opened.set()

    def open(self, url: str, timeout: float = 120.0) -> None:
        self.opened.clear()
        self.jobs.put(url)
        self.opened.wait(timeout)

    def close(self) -> dict[str, Any]:
        self.jobs.put(None)
        self.thread.join(60)
        return {"overview_polls": dict(self.polls), "error": self.error, "browser_cpu_s": self.cpu_s,
                "flips": self.flips}


class OverviewPoller:
    """The page's polls without the page (``--page-client http``): a process of its own asks ``GET
    /v1/tenants/{tenant}/overview`` with the page's key, the next poll a second after the last answer, as
    the page's timer does; the same interface as :class:`InspectorPage`. What the server does for a page,
    without a browser on this machine: the two together tell the server's cost from the browser's."""

    SCRIPT = ("import os, sys, time, httpx\n"
              "url, key = sys.argv[1], sys.argv[2]\n"
              "os.nice(int(sys.argv[3]))\n"
              "toggle = float(sys.argv[4])\n"
              "c = httpx.Client(timeout=120)\n"
              "ok = failed = 0\n"
              "on, last = True, time.perf_counter()\n"
              "print('flip', last, 1, flush=True)\n"
              "while True:\n"
              "    if toggle and time.perf_counter() - last >= toggle:\n"
              "        on, last = not on, time.perf_counter()\n"
              "        print('flip', last, int(on), flush=True)\n"
              "    if not on:\n"
              "        time.sleep(0.05)\n"
              "        continue\n"
              "    try:\n"
              "        r = c.get(url, headers={'Authorization': 'Bearer ' + key})\n"
              "        ok, failed = ok + (r.status_code == 200), failed + (r.status_code != 200)\n"
              "    except httpx.HTTPError:\n"
              "        failed += 1\n"
              "    print('polls', ok, failed, flush=True)\n"
              "    time.sleep(1)\n")

    def __init__(self, key: str, tenant: str, nice: int = 0, toggle_s: float = 0.0):
        self.key, self.tenant, self.nice, self.toggle_s = key, tenant, nice, toggle_s
        self.flips: list[tuple[float, bool]] = []
        self.proc: subprocess.Popen | None = None
        self.polls = {"ok": 0, "failed": 0}
        self.opened_at = 0.0

    def _stop(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            out, _ = self.proc.communicate()
            polls = [0, 0]
            for line in out.splitlines():
                w = line.split()
                if w[:1] == ["flip"]:  # perf_counter is CLOCK_MONOTONIC: one clock for every process
                    self.flips.append((float(w[1]), w[2] == "1"))
                elif w[:1] == ["polls"]:
                    polls = [int(w[1]), int(w[2])]
            self.polls["ok"] += polls[0]
            self.polls["failed"] += polls[1]
            self.proc = None

    def open(self, url: str, timeout: float = 120.0) -> None:
        self._stop()
        self.proc = subprocess.Popen([sys.executable, "-c", self.SCRIPT, f"{url}/v1/tenants/{self.tenant}/overview",
                                      self.key, str(self.nice), str(self.toggle_s)], stdout=subprocess.PIPE,
                                     text=True)
        self.opened_at = time.perf_counter()

    def close(self) -> dict[str, Any]:
        self._stop()
        return {"overview_polls": dict(self.polls), "error": None, "client": "http", "flips": self.flips}


def browser_profile_parent(profile: str) -> str | None:
    """Where the page's browser keeps its profile (``--browser-profile``): ``memory``, a tmpfs (/dev/shm) when
    this machine has one; ``disk``, the temporary directory (None: tempfile's default, as Playwright's)."""
    if profile == "memory" and os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK):
        return "/dev/shm"
    return None


def _browser_processes():
    """This process's child processes that are Playwright's driver or the Chromium it started (not the server,
    also a child)."""
    import psutil

    for ch in psutil.Process().children(recursive=True):
        try:
            name = ch.name().lower()
            if "chrom" in name or "node" in name or "playwright" in name:
                yield ch
        except psutil.Error:
            pass


def renice_browser(nice: int) -> None:
    """Lower the browser's and its driver's priority (``--browser-nice``): on a client core they share with the
    agents' load, the load comes first, as with a page opened on another machine."""
    import psutil

    for ch in _browser_processes():
        try:
            ch.nice(nice)
        except psutil.Error:
            pass


def browser_cpu() -> float:
    """CPU seconds (user + system) of this process's child processes now alive: Playwright's driver and the
    Chromium it started (the page's cost to a machine that runs it beside the server)."""
    import psutil

    total = 0.0
    for ch in _browser_processes():
        try:
            t = ch.cpu_times()
            total += t.user + t.system
        except psutil.Error:
            pass
    return total


async def main_async(args, root: Path, keys: list[str], operator: str) -> dict[str, Any]:
    from tqdm.auto import tqdm

    run = Run(args)
    options = ["--batch-window-ms", str(args.batch_window_ms), "--max-batch", str(args.max_batch),
               "--checkpoint-every", str(args.checkpoint_every)]
    if args.shards:
        options += ["--statistics", "pooled"]  # a sharded memory's statistics are global (gpuir.service.sharded)
    launcher = (["taskset", "-c", args.server_cpus, sys.executable, "-m", "gpuir.service"] if args.server_cpus
                else None)  # (the restart after the kill reuses it: the server stays on its cores)
    server = ServerProcess(root, options, launcher=launcher).start(timeout=args.timeout)
    out: dict[str, Any] = {}
    bar = tqdm(total=run.total_steps, unit="step", desc="agents", mininterval=1, disable=True if args.no_progress else None)
    tls = ssl.create_default_context()  # unused on http://, but httpx builds one per client unless given
    if args.connections:
        run.gate = asyncio.Semaphore(args.connections)
        shared = httpx.AsyncClient(timeout=120, verify=tls, limits=httpx.Limits(
            max_connections=args.connections, max_keepalive_connections=args.connections, keepalive_expiry=60.0))
        pools = [shared]
    else:
        pools = [httpx.AsyncClient(timeout=120, verify=tls, limits=httpx.Limits(max_connections=1,
                                                                              keepalive_expiry=60.0))
                 for _ in range(args.agents)]
    cpu = {"client_s": 0.0, "server_s": 0.0}
    marks: dict[str, float] = {}  # perf_counter times of the run's events (the kill, the restart, the page)
    page = None
    if args.page_open:
        toggle = args.toggle_s if args.page == "toggle" else 0.0
        page = (InspectorPage(keys[0], nice=args.browser_nice, profile=args.browser_profile, toggle_s=toggle)
                if args.page_client == "browser" else
                OverviewPoller(keys[0], "agent-0000", nice=args.browser_nice, toggle_s=toggle))
        await asyncio.to_thread(page.open, server.url)
    if args.settle_s > 0:
        await asyncio.sleep(args.settle_s)
    try:
        async with contextlib.AsyncExitStack() as stack:
            for p in pools:
                await stack.enter_async_context(p)
            http = pools[0]
            clients = {i: AsyncMemoryClient(server.url, keys[i], http=pools[i % len(pools)])
                       for i in range(args.agents)}
            load_start = os.getloadavg()
            c0, s0 = process_cpu(), server_cpu(server)
            t_start = time.perf_counter()
            scraped: list[str] = []
            op = {"Authorization": f"Bearer {operator}"}  # /metrics and the counts of /healthz
            scraper = asyncio.create_task(scrape(server.url, tls, scraped, op))
            if args.kill == "shard":  # the shards' pids, asked before the load (/healthz asks every shard)
                shards_before = (await http.get(server.url + "/healthz", headers=op)).json()["shards"]
            tasks = [asyncio.create_task(agent(run, i, clients[i], bar)) for i in range(args.agents)]
            # the crash: once --kill-at of all adds are acknowledged (others are in flight then)
            kill_at = math.ceil(args.kill_at * run.total_steps)
            while sum(map(len, run.acked.values())) < kill_at and not all(t.done() for t in tasks):
                await asyncio.sleep(0.01)
            if args.kill == "shard":
                victim = shards_before[args.kill_shard]
                t_kill = time.perf_counter()
                run.acked_before_kill = {i: len(v) for i, v in run.acked.items()}
                n_before = sum(run.acked_before_kill.values())
                scraper.cancel()
                metrics_before = scraped[-1] if scraped else ""
                os.kill(victim["pid"], signal.SIGKILL)  # the server stays up; Ray restarts the shard
                run.restarted = True  # latencies of requests started from here on are also kept apart
                back = asyncio.create_task(shard_back(server.url, tls, op, args.kill_shard, victim["pid"]))
                await asyncio.gather(*tasks)
                t_up = await back
                t_restart0 = t_verified = t_kill  # no outage of the server: the run's time is all counted
                health = (await http.get(server.url + "/healthz", headers=op)).json()
            else:
                run.crashed = True
                run.up.clear()
                t_kill = time.perf_counter()
                run.acked_before_kill = {i: len(v) for i, v in run.acked.items()}
                n_before = sum(run.acked_before_kill.values())
                scraper.cancel()
                metrics_before = scraped[-1] if scraped else ""
                cpu["server_s"] += server_cpu(server) - s0
                await asyncio.to_thread(server.kill9)
                t_restart0 = time.perf_counter()
                server2 = ServerProcess(root, server.options, log=server.log, launcher=server.launcher)
                await asyncio.to_thread(server2.start, args.timeout)
                t_up = time.perf_counter()
                if server2.port != server.port:  # the clients share one base URL: point them at the new port
                    for c in clients.values():
                        c.base_url = server2.url
                server = server2
                health = (await http.get(server.url + "/healthz", headers=op)).json()
                s0 = server_cpu(server)
                t_verified = time.perf_counter()
                run.restarted = True
                run.up.set()
                # the page signs in again on the new server beside the agents, as a user's tab would: opened
                # before they resumed, its sign-in lengthened the outage that every waiting request's latency holds
                reopen = asyncio.create_task(asyncio.to_thread(page.open, server.url)) if page is not None else None
                await asyncio.gather(*tasks)
                if reopen is not None:
                    await reopen
                    marks["page_reopened"] = page.opened_at
            t_end = time.perf_counter()
            n_requests = run.requests  # the verification below is not part of the measured run
            cpu["client_s"] = process_cpu() - c0
            cpu["server_s"] += server_cpu(server) - s0
            load_end = os.getloadavg()
            bar.close()
            run.crashed = False  # from here on a transport error is an error
            lost_at_end, lost_before_kill = await verify(run, clients, asyncio.Semaphore(args.connections or 100))
            n_acked = sum(map(len, run.acked.values()))
            outage = t_verified - t_kill
            final = (await http.get(server.url + "/healthz", headers=op)).json()
            out = {
                "agents": args.agents, "steps": args.steps, "requests": n_requests,
                "acknowledged_records": n_acked, "acknowledged_before_kill": n_before,
                "wall_s": t_end - t_start, "outage_s": outage,
                "restart_s": t_up - t_restart0, "replayed_operations": health.get("replayed_operations"),
                "records_after_restart": health.get("records"),
                "throughput_rps": n_requests / max(1e-9, (t_end - t_start) - outage),
                "latency_ms": {op: {"p50": float(np.percentile(v, 50) * 1e3), "p99": float(np.percentile(v, 99) * 1e3),
                                    "mean": float(np.mean(v) * 1e3), "n": len(v)}
                               for op, v in run.lat.items() if v and op != "verify"},
                "latency_ms_after_restart": {
                    op: {"p50": float(np.percentile(v, 50) * 1e3), "p99": float(np.percentile(v, 99) * 1e3),
                         "n": len(v)} for op, v in run.lat_after.items() if v and op != "verify"},
                "errors": len(run.errors), "error_examples": run.errors[:5],
                "outage_retries": run.outage_retries,
                "lost_acknowledged_before_kill": lost_before_kill, "lost_at_end": lost_at_end,
                "records_after_restart_ge_acknowledged_before_kill": health.get("records", -1) >= n_before,
                "records_at_end": final.get("records"),
                "records_at_end_ge_acknowledged": final.get("records", -1) >= n_acked,
                "cpu_ms_per_request": {k.replace("_s", ""): v * 1e3 / max(1, n_requests) for k, v in cpu.items()},
                "load_average_1_5_15": {"start": list(load_start), "end": list(load_end)},
                "killed": ({"what": "shard", "shard": args.kill_shard, "pid": victim["pid"],
                            "shard_recovery_s": t_up - t_kill,
                            "shards_before": shards_before, "shards_after": final.get("shards")}
                           if args.kill == "shard" else {"what": "server"}),
                "settings": {"statistics": "pooled (global over the shards)" if args.shards else
                             "tenant (the server's default)",
                             "shards": args.shards or None, "route": "tenant" if args.shards else None,
                             "batch_window_ms": args.batch_window_ms, "max_batch": args.max_batch,
                             "checkpoint_every": args.checkpoint_every,
                             "connections": args.connections or "one per agent", "think_ms": args.think_ms, "settle_s": args.settle_s},
                "server_before_kill": server_figures(metrics_before),
                "server_after_restart": server_figures((await http.get(server.url + "/metrics", headers=op)).text),
            }
            out["_lat"] = run.lat
            marks.update(start=t_start, kill=t_kill, verified=t_verified, end=t_end)
            marks["first_agent_done"] = min(run.finished) if run.finished else t_end
            out["_timeline"] = {"marks": marks, "samples": run.samples, "n_agents": args.agents}
    finally:
        if page is not None:
            out["page"] = await asyncio.to_thread(page.close)
        server.stop()
    return out


async def shard_back(url: str, tls, headers: dict[str, str], shard: int, old_pid: int) -> float:
    """When shard ``shard`` answered again after its SIGKILL: ``/healthz`` (which asks every shard) names a
    new pid for it. Polled every 0.1 s on a connection of its own; returns the perf_counter time."""
    async with httpx.AsyncClient(timeout=300, verify=tls) as http:
        while True:
            try:
                shards = (await http.get(url + "/healthz", headers=headers)).json().get("shards", [])
                if shards and shards[shard]["pid"] not in (None, old_pid):
                    return time.perf_counter()
            except (httpx.HTTPError, ValueError, KeyError, IndexError):
                pass
            await asyncio.sleep(0.1)


async def scrape(url: str, tls, out: list[str], headers: dict[str, str]) -> None:
    """Keep the latest /metrics text of the first server (on a connection of its own), every 0.25 s until
    cancelled: the figures before the kill, without a request that would delay the kill."""
    async with httpx.AsyncClient(timeout=30, verify=tls) as http:
        while True:
            try:
                out[:] = [(await http.get(url + "/metrics", headers=headers)).text]
            except httpx.HTTPError:
                pass
            await asyncio.sleep(0.25)


def process_cpu() -> float:
    """CPU seconds (user + system) of this process so far."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def server_cpu(server: ServerProcess) -> float:
    """CPU seconds (user + system) of the server process so far (Linux /proc; 0 elsewhere)."""
    try:
        with open(f"/proc/{server.proc.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, AttributeError):
        return 0.0


def server_figures(text: str) -> dict[str, Any]:
    """The server's own view from its /metrics text: mean time per route, queries per search call, ops per fsync."""
    vals: dict[str, float] = {}
    for ln in text.splitlines():
        if ln.startswith(("gpuir_search_batch_queries_", "gpuir_wal_group_ops_", "gpuir_wal_append_seconds_",
                          "gpuir_request_seconds_sum", "gpuir_request_seconds_count", "gpuir_checkpoints ",
                          "gpuir_records ", "gpuir_gc_pause_seconds_sum", "gpuir_gc_pause_seconds_count")
                       ) and not ln.startswith(("gpuir_request_seconds_bucket",)):
            name, _, v = ln.rpartition(" ")
            if "_bucket" not in name and "_created" not in name:
                vals[name] = float(v)

    def ratio(a: str, b: str, scale: float = 1.0):
        return vals[a] / vals[b] * scale if vals.get(b) else None

    out: dict[str, Any] = {
        "queries_per_search_call": ratio("gpuir_search_batch_queries_sum", "gpuir_search_batch_queries_count"),
        "search_calls": vals.get("gpuir_search_batch_queries_count"),
        "operations_per_fsync": ratio("gpuir_wal_group_ops_sum", "gpuir_wal_group_ops_count"),
        "fsyncs": vals.get("gpuir_wal_group_ops_count"),
        "append_fsync_ms_mean": ratio("gpuir_wal_append_seconds_sum", "gpuir_wal_append_seconds_count", 1e3),
        "checkpoints": vals.get("gpuir_checkpoints"), "records": vals.get("gpuir_records"),
        # the server's collector passes (each holds every request): count and seconds of full (gen 2) ones,
        # seconds of all
        "gc2_passes": vals.get('gpuir_gc_pause_seconds_count{generation="2"}'),
        "gc2_s": vals.get('gpuir_gc_pause_seconds_sum{generation="2"}'),
        "gc_s": sum(v for k, v in vals.items() if k.startswith("gpuir_gc_pause_seconds_sum")),
    }
    for route, short in (("/v1/tenants/{tenant}/records", "add"), ("/v1/tenants/{tenant}/search", "search")):
        lab = f'{{method="POST",route="{route}"}}'
        out[f"{short}_server_ms_mean"] = ratio(f"gpuir_request_seconds_sum{lab}", f"gpuir_request_seconds_count{lab}",
                                               1e3)
    lab = '{method="GET",route="/v1/tenants/{tenant}/overview"}'  # the inspector page's polls (--page)
    if vals.get(f"gpuir_request_seconds_count{lab}"):
        out["overview_requests"] = vals[f"gpuir_request_seconds_count{lab}"]
        out["overview_server_ms_mean"] = ratio(f"gpuir_request_seconds_sum{lab}", f"gpuir_request_seconds_count{lab}",
                                               1e3)
    return out


def plot(res: dict[str, Any], lat: dict[str, list[float]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for op, v in lat.items():
        if not v or op == "verify":
            continue
        x = np.sort(np.asarray(v) * 1e3)
        ax.plot(x, np.arange(1, x.size + 1) / x.size, label=f"{op} (p50 {np.percentile(x, 50):.0f} ms, "
                                                             f"p99 {np.percentile(x, 99):.0f} ms)")
    ax.set_xscale("log")
    ax.set_xlabel("latency seen by the client (ms, log scale)")
    ax.set_ylabel("fraction of requests")
    think = f", think {res['settings']['think_ms'] / 1e3:g} s" if res["settings"]["think_ms"] else ""
    ax.set_title(f"gpuir serve: {res['agents']} concurrent agents{think}, {res['throughput_rps']:.0f} req/s, "
                 f"{res['errors']} errors, {res['lost_at_end']} lost after kill -9", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--agents", type=int, default=1000, help="concurrent simulated agents (default: %(default)s)")
    p.add_argument("--steps", type=int, default=5, help="add+search steps per agent (default: %(default)s)")
    p.add_argument("--connections", type=int, default=0, help="HTTP connections shared by the agents; 0: one "
                                                              "per agent (default: %(default)s)")
    p.add_argument("--think-ms", type=float, default=0.0, help="mean think time of an agent before each request "
                                                              "(exponential; 0: none, a closed loop at full "
                                                              "speed) (default: %(default)s)")
    p.add_argument("--batch-window-ms", type=float, default=2.0, help="server option (default: %(default)s)")
    p.add_argument("--max-batch", type=int, default=256, help="server option (default: %(default)s)")
    p.add_argument("--checkpoint-every", type=int, default=None,
                   help="server option (default: three quarters of all adds: the kill finds the log unfolded, "
                        "the restart replays it, a checkpoint follows under load)")
    p.add_argument("--kill-at", type=float, default=0.4, help="send SIGKILL once this fraction of all adds is "
                                                             "acknowledged (default: %(default)s)")
    p.add_argument("--shards", type=int, default=0, help="serve a sharded memory of this many shards (route "
                                                         "tenant, on a local Ray runtime); 0: one memory "
                                                         "(default: %(default)s)")
    p.add_argument("--kill", choices=("server", "shard"), default="server",
                   help="what the SIGKILL hits: the server process, or (with --shards) one shard actor's process "
                        "(default: %(default)s)")
    p.add_argument("--kill-shard", type=int, default=0, help="which shard --kill shard hits (default: %(default)s)")
    p.add_argument("--timeout", type=float, default=300, help="give up after this many seconds (default: %(default)s)")
    p.add_argument("--machine", default="vm", help="name in the result file (default: %(default)s)")
    p.add_argument("--out", type=Path, default=None, help="JSON path (default: bench/results/service_MACHINE.json)")
    p.add_argument("--plot", type=Path, default=REPO / "docs" / "img" / "service_latency.png",
                   help="latency plot path (default: docs/img/service_latency.png)")
    p.add_argument("--no-docs", action="store_true", help="write no JSON and no plot (a smoke run)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--page", choices=("off", "on", "both", "toggle"), default="off",
                   help="the memory inspector page open and polling every second during the run; both: runs "
                        "without and with it, alternately, --repeat times each; toggle: --repeat runs with the page "
                        "open, its polling switched off and on every --toggle-s seconds, each request counted "
                        "under the state at its start (default: %(default)s)")
    p.add_argument("--toggle-s", type=float, default=3.0,
                   help="with --page toggle: seconds of polling, then as many without (default: %(default)s)")
    p.add_argument("--repeat", type=int, default=3, help="runs of each kind with --page both (default: %(default)s)")
    p.add_argument("--server-cpus", default=None, help="pin the server to these CPUs (taskset's list, e.g. 0); "
                                                      "default: where this process runs")
    p.add_argument("--client-cpus", default=None, help="pin this process (the agents' load, and the browser it "
                                                      "starts) to these CPUs (e.g. 1): with --server-cpus, the "
                                                      "page's browser does not take the server's core")
    p.add_argument("--browser-nice", type=int, default=0, help="with --page: run the browser and its driver at "
                                                             "this niceness (e.g. 19), below the agents' load on "
                                                             "the cores they share (default: %(default)s)")
    p.add_argument("--browser-profile", choices=("memory", "disk"), default="memory",
                   help="with --page: the browser's profile on a tmpfs (/dev/shm; memory) or in the temporary "
                        "directory (disk, Playwright's default): a browser on the server's disk adds its "
                        "profile's fdatasyncs beside the server's log fsyncs, which a page opened on another "
                        "machine does not (default: %(default)s)")
    p.add_argument("--page-client", choices=("browser", "http"), default="browser",
                   help="with --page: the page in headless Chromium, or its polls alone from a process of their own "
                        "(http: the server's share of the page's cost, without a browser on this machine; "
                        "default: %(default)s)")
    p.add_argument("--settle-s", type=float, default=0.0,
                   help="seconds between the server's start (and the page's sign-in, with a page) and the agents' "
                        "first requests, the same with and without a page (default: %(default)s)")
    args = p.parse_args(argv)
    if args.client_cpus:
        os.sched_setaffinity(0, {int(c) for part in args.client_cpus.split(",") for c in (
            range(int(part.split("-")[0]), int(part.split("-")[-1]) + 1))})
    if args.page == "both":
        return _page_both(args, argv)
    if args.page == "toggle":
        return _page_toggle(args, argv)
    args.page_open = args.page == "on"
    if args.agents < 1 or args.steps < 2:
        p.error("--agents must be >= 1 and --steps >= 2 (the crash comes mid-run)")
    if args.connections < 0 or not args.think_ms >= 0:
        p.error("--connections and --think-ms must be >= 0")
    if not 0 < args.kill_at < 1:
        p.error("--kill-at must be between 0 and 1")
    if args.shards < 0:
        p.error("--shards must be >= 0")
    if args.kill == "shard" and not 0 <= args.kill_shard < args.shards:
        p.error("--kill shard needs --shards N and 0 <= --kill-shard < N")
    if args.checkpoint_every is None:
        args.checkpoint_every = max(1, args.agents * args.steps * 3 // 4)
    res = _one_run(args)
    lat = res.pop("_lat")
    res["phases"] = phases(res.pop("_timeline"))
    res["machine"] = {"host": socket.gethostname(), **machine_info()}
    res["command"] = "python bench/bench_service.py " + " ".join(argv if argv is not None else sys.argv[1:])
    print(json.dumps({k: v for k, v in res.items() if k != "machine"}, indent=1))
    if not args.no_docs:
        out = args.out or REPO / "bench" / "results" / f"service_{args.machine}.json"
        out.write_text(json.dumps(res, indent=1) + "\n")
        plot(res, lat, args.plot)
        print(f"wrote {out} and {args.plot}", file=sys.stderr)
    ok = (res["errors"] == 0 and res["lost_at_end"] == 0 and res["lost_acknowledged_before_kill"] == 0
          and res["records_after_restart_ge_acknowledged_before_kill"] and res["records_at_end_ge_acknowledged"])
    return 0 if ok else 1


def _one_run(args) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="gpuir-bench-service-") as tmp:
        root = Path(tmp) / "memory"
        if args.shards:
            from gpuir.cluster import ShardedMemory

            # made in a Ray runtime of this process, which close() ends; the server starts its own
            ShardedMemory.create(root, shards=args.shards, route="tenant", device="cpu").close()
        else:
            claim_dir(root, "memory")
        keys = KeyStore(root).add_many([f"agent-{i:04d}" for i in range(args.agents)])
        operator = KeyStore(root).add_operator()
        return asyncio.run(asyncio.wait_for(main_async(args, root, keys, operator), args.timeout))


def first_wave(timeline: dict[str, Any]) -> list[int]:
    """The positions in ``timeline["samples"]`` of the run's first wave: each agent's first add (the first
    ``n_agents`` adds to start; the agents start together)."""
    adds = sorted((t, i) for i, (t, o, _) in enumerate(timeline["samples"]) if o == "add")
    return [i for _, i in adds[:timeline.get("n_agents", 0)]]


def p50_p99(v: list[float]) -> dict[str, Any]:
    """p50 and p99 of latencies ``v`` (seconds) in ms, and their count."""
    return {"p50": float(np.percentile(v, 50) * 1e3), "p99": float(np.percentile(v, 99) * 1e3), "n": len(v)}


def phases(timeline: dict[str, Any], slowest: int = 8) -> dict[str, Any]:
    """Where in the run the latencies fell: p50/p99 of each operation for requests started before the kill
    and after the restart (the server verified up), and the ``slowest`` requests with their start in seconds
    after the restart (negative: before the kill) -- to tell a steady cost from one event's (the restart,
    the page signing in again: ``page_reopened_s``)."""
    m, samples = timeline["marks"], timeline["samples"]
    out: dict[str, Any] = {"kill_s": m["kill"] - m["start"], "outage_s": m["verified"] - m["kill"],
                           "after_restart_s": m["end"] - m["verified"]}
    if "page_reopened" in m:
        out["page_reopened_s"] = m["page_reopened"] - m["verified"]
    for name, keep in (("before_kill", lambda t: t < m["kill"]), ("after_restart", lambda t: t >= m["verified"])):
        for op in ("add", "search"):
            v = [dt for t, o, dt in samples if o == op and keep(t)]
            if v:
                out[f"{op}_{name}_ms"] = p50_p99(v)
    wave = set(first_wave(timeline))
    if wave:
        first = [samples[i][2] for i in wave]
        rest = [dt for i, (_, o, dt) in enumerate(samples) if o == "add" and i not in wave]
        out["add_first_wave_ms"] = {"p50": float(np.percentile(first, 50) * 1e3), "max": max(first) * 1e3,
                                    "n": len(first)}
        if rest:
            out["add_after_first_wave_ms"] = p50_p99(rest)
    worst = sorted((x for x in samples if x[1] != "verify"), key=lambda x: -x[2])[:slowest]
    out["slowest"] = [{"op": o, "ms": dt * 1e3, "start_s_after_restart": t - m["verified"]} for t, o, dt in worst]
    return out


def by_polling(timeline: dict[str, Any], flips: list[tuple[float, bool]]) -> dict[str, Any]:
    """The requests of one ``--page toggle`` run split by whether the page was polling when each started:
    each operation's p50/p99 and the requests started per second of each state, the first wave (each agent's
    first add), the outage and the ramp-down (after the first agent is done) left out. Windows of both
    states alternate every few seconds through the whole run, so a slow drift of the machine (a neighbour's
    load) falls on both alike."""
    m, samples = dict(timeline["marks"]), timeline["samples"]
    m["end"] = m.get("first_agent_done", m["end"])
    flips = sorted(flips)
    times = np.array([t for t, _ in flips])
    states = np.array([on for _, on in flips], bool)
    wave_ids = set(first_wave(timeline))
    t_from = max((samples[i][0] for i in wave_ids), default=m["start"])  # after the first wave has started
    # the seconds spent in each state, between the first wave and the end, the outage left out
    edges = np.concatenate(([t_from], times[(times > t_from) & (times < m["end"])], [m["end"]]))
    secs = {True: 0.0, False: 0.0}
    for a, b in itertools.pairwise(edges):
        for lo, hi in ((a, min(b, m["kill"])), (max(a, m["verified"]), b)):
            if hi > lo:
                j = np.searchsorted(times, lo, side="right") - 1
                secs[bool(states[j]) if j >= 0 else False] += hi - lo
    out: dict[str, Any] = {"seconds": {"polling": secs[True], "not_polling": secs[False]}}
    for op in ("add", "search"):
        v = {True: [], False: []}
        for i, (t, o, dt) in enumerate(samples):
            if o != op or i in wave_ids or t < t_from or t >= m["end"] or m["kill"] <= t < m["verified"]:
                continue
            j = np.searchsorted(times, t, side="right") - 1
            v[bool(states[j]) if j >= 0 else False].append(dt)
        out.setdefault("_lat", {})[op] = v  # for the pooled figures over runs (popped by the caller)
        if v[True] and v[False]:
            out[op] = {name: {"p50_ms": float(np.percentile(x, 50) * 1e3), "p99_ms": float(np.percentile(x, 99) * 1e3),
                              "n": len(x), "per_s": len(x) / max(1e-9, secs[on])}
                       for name, on, x in (("polling", True, v[True]), ("not_polling", False, v[False]))}
            a, b = out[op]["polling"], out[op]["not_polling"]
            out[op]["ratio"] = {k: a[k] / b[k] for k in ("p50_ms", "p99_ms", "per_s")}
    return out


def _page_toggle(args, argv) -> int:
    """``--repeat`` runs with the page open and its polling switched off and on every ``--toggle-s`` s."""
    if args.repeat < 1 or not args.toggle_s > 0:
        raise SystemExit("--repeat must be >= 1 and --toggle-s > 0")
    if args.checkpoint_every is None:
        args.checkpoint_every = max(1, args.agents * args.steps * 3 // 4)
    args.page_open = True
    runs, ok = [], True
    pooled: dict[str, dict[bool, list[float]]] = {op: {True: [], False: []} for op in ("add", "search")}
    seconds = {True: 0.0, False: 0.0}
    for r in range(args.repeat):
        res = _one_run(args)
        res.pop("_lat")
        tl = res.pop("_timeline")
        ok &= res["errors"] == 0 and res["lost_at_end"] == 0
        bp = by_polling(tl, res["page"].pop("flips"))
        for op, v in bp.pop("_lat").items():
            for on in (True, False):
                pooled[op][on] += v[on]
        seconds[True] += bp["seconds"]["polling"]
        seconds[False] += bp["seconds"]["not_polling"]
        row = {"by_polling": bp, "page": res["page"],
               "throughput_rps": res["throughput_rps"], "errors": res["errors"], "lost_at_end": res["lost_at_end"],
               "server_cpu_ms_per_request": res["cpu_ms_per_request"]["server"], "wall_s": res["wall_s"]}
        runs.append(row)
        print(f"run {r + 1}: {json.dumps(row)}", file=sys.stderr)
    med = {op: {k: float(np.median([x["by_polling"][op]["ratio"][k] for x in runs if op in x["by_polling"]]))
                for k in ("p50_ms", "p99_ms", "per_s")} for op in ("add", "search")}
    pool = {op: {k: (np.percentile(v[True], q) / np.percentile(v[False], q)) if k != "per_s" else
                     (len(v[True]) / max(1e-9, seconds[True])) / (len(v[False]) / max(1e-9, seconds[False]))
                 for k, q in (("p50_ms", 50), ("p99_ms", 99), ("per_s", 0))}
            for op, v in pooled.items() if v[True] and v[False]}
    pool = {op: {k: float(x) for k, x in d.items()} for op, d in pool.items()}
    out = {"runs": runs, "median_polling_over_not": med, "pooled_polling_over_not": pool,
           "pooled_n": {op: {"polling": len(v[True]), "not_polling": len(v[False])} for op, v in pooled.items()},
           "pooled_seconds": {"polling": seconds[True], "not_polling": seconds[False]},
           "settings": {**page_settings(args), "toggle_s": args.toggle_s}}
    write_page_result(out, args, argv, "service_page_toggle")
    return 0 if ok else 1


def page_settings(args) -> dict[str, Any]:
    """The settings a page benchmark's results file names (``--page both`` and ``toggle``)."""
    return {"agents": args.agents, "steps": args.steps, "repeat": args.repeat, "server_cpus": args.server_cpus,
            "client_cpus": args.client_cpus, "browser_nice": args.browser_nice,
            "browser_profile": args.browser_profile, "page_client": args.page_client,
            "connections": args.connections or "one per agent", "think_ms": args.think_ms, "settle_s": args.settle_s}


def write_page_result(out: dict[str, Any], args, argv, stem: str) -> None:
    """Name the machine and the command in ``out``, print it (without its runs) and write it to ``--out``
    (default ``bench/results/STEM_MACHINE.json``) unless ``--no-docs``."""
    out["machine"] = {"host": socket.gethostname(), **machine_info()}
    out["command"] = "python bench/bench_service.py " + " ".join(argv if argv is not None else sys.argv[1:])
    print(json.dumps({k: v for k, v in out.items() if k not in ("machine", "runs")}, indent=1))
    if not args.no_docs:
        path = args.out or REPO / "bench" / "results" / f"{stem}_{args.machine}.json"
        path.write_text(json.dumps(out, indent=1) + "\n")
        print(f"wrote {path}", file=sys.stderr)


def _page_both(args, argv) -> int:
    """The benchmark without and with the inspector page, alternately; medians and their ratios."""
    if args.repeat < 1:
        raise SystemExit("--repeat must be >= 1")
    if args.checkpoint_every is None:
        args.checkpoint_every = max(1, args.agents * args.steps * 3 // 4)
    runs: dict[str, list[dict[str, Any]]] = {"without_page": [], "with_page": []}
    ok = True
    for r in range(args.repeat):
        for name, on in (("without_page", False), ("with_page", True)):
            args.page_open = on
            res = _one_run(args)
            res.pop("_lat")
            ph = phases(res.pop("_timeline"))
            ok &= res["errors"] == 0 and res["lost_at_end"] == 0
            row = {"throughput_rps": res["throughput_rps"],
                   "search_p50_ms": res["latency_ms"]["search"]["p50"], "search_p99_ms": res["latency_ms"]["search"]["p99"],
                   "add_p50_ms": res["latency_ms"]["add"]["p50"], "add_p99_ms": res["latency_ms"]["add"]["p99"],
                   "server_cpu_ms_per_request": res["cpu_ms_per_request"]["server"],
                   "client_cpu_ms_per_request": res["cpu_ms_per_request"]["client"],
                   "errors": res["errors"], "lost_at_end": res["lost_at_end"], "wall_s": res["wall_s"],
                   "load_average_1_5_15": res["load_average_1_5_15"],
                   # the server's log: mean append+fsync time and operations per fsync, before the kill and after
                   "fsync_ms_mean": [res[h].get("append_fsync_ms_mean") for h in ("server_before_kill",
                                                                                  "server_after_restart")],
                   "ops_per_fsync": [res[h].get("operations_per_fsync") for h in ("server_before_kill",
                                                                                  "server_after_restart")],
                   "gc2_passes": [res[h].get("gc2_passes") for h in ("server_before_kill", "server_after_restart")],
                   "gc2_s": [res[h].get("gc2_s") for h in ("server_before_kill", "server_after_restart")],
                   "gc_s": [res[h].get("gc_s") for h in ("server_before_kill", "server_after_restart")],
                   "phases": ph,
                   **({"page": res["page"], "overview_server_ms_mean": res["server_after_restart"].get(
                       "overview_server_ms_mean")} if on else {})}
            runs[name].append(row)
            print(f"run {r + 1} {name}: {json.dumps(row)}", file=sys.stderr)
    med = {name: {k: float(np.median([x[k] for x in rows])) for k in
                  ("throughput_rps", "search_p50_ms", "search_p99_ms", "add_p50_ms", "add_p99_ms",
                   "server_cpu_ms_per_request")}
           for name, rows in runs.items()}
    out = {"runs": runs, "median": med,
           "with_over_without": {k: med["with_page"][k] / med["without_page"][k] for k in med["with_page"]},
           "settings": page_settings(args)}
    write_page_result(out, args, argv, "service_page")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
