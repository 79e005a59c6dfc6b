"""A real ``gpuir serve`` in a subprocess on loopback, for the tests and the load benchmark."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    """``python -m gpuir.service serve MEMORY_DIR --port P [options]`` with start, kill -9 and stop.

    Parameters
    ----------
    memory_dir : the directory served
    options : extra command-line options (e.g. ``["--checkpoint-every", "50"]``)
    log : file receiving the server's output (default: ``<memory_dir>.server.log``)
    launcher : list of str, optional
        What runs instead of ``python -m gpuir.service`` (e.g. ``[sys.executable,
        "tests/_fault_server.py"]``: the same command line with faults injected).
    env : dict, optional
        Environment variables added for the server.
    """

    def __init__(self, memory_dir: str | os.PathLike, options: list[str] | None = None,
                 log: str | os.PathLike | None = None, launcher: list[str] | None = None,
                 env: dict[str, str] | None = None):
        self.memory_dir = Path(memory_dir)
        self.options = list(options or [])
        self.launcher = list(launcher) if launcher else [sys.executable, "-m", "gpuir.service"]
        self.env = dict(env or {})
        self.log = Path(log) if log else self.memory_dir.with_name(self.memory_dir.name + ".server.log")
        self.port = 0
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 120.0) -> ServerProcess:
        self.port = free_port()
        env = {**os.environ, **self.env}
        root = str(Path(__file__).resolve().parents[2])
        env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        with open(self.log, "ab") as logf:
            self.proc = subprocess.Popen(
                [*self.launcher, "serve", str(self.memory_dir), "--port", str(self.port), *self.options],
                stdout=logf, stderr=subprocess.STDOUT, env=env)
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the server exited with {self.proc.returncode}: {self.output()[-2000:]}")
            try:
                if httpx.get(self.url + "/healthz", timeout=1.0).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        self.kill9()
        raise RuntimeError(f"the server did not answer within {timeout} s: {self.output()[-2000:]}")

    def output(self) -> str:
        try:
            return self.log.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def kill9(self) -> None:
        """SIGKILL: no shutdown, no checkpoint, no flush."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(30)

    def stop(self, timeout: float = 30.0) -> int:
        """SIGTERM (a graceful shutdown with a checkpoint); returns the exit status (0 after a graceful stop)."""
        if self.proc is None:
            return 0
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill9()
        return self.proc.returncode

    def __enter__(self) -> ServerProcess:  # noqa: PYI034
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
