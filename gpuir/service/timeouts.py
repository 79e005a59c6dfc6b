"""Read timeouts for uvicorn's HTTP/1.1 protocol (h11): slow or silent clients are disconnected.

uvicorn closes a connection that stays idle ``timeout_keep_alive`` seconds
*after a response*, but it has no timer before a connection's first request
and none while a request arrives: a client that opens connections and sends
nothing, or sends its headers a byte at a time, holds them for ever. The
protocol class :func:`timed_h11` returns adds both:

* **head**: from a connection's opening, and from the first byte of each
  later request, the request line and headers must arrive within
  ``header_timeout`` seconds;
* **body**: the body must then arrive within ``body_timeout`` seconds.

A connection past either is closed (the application, if already running,
sees a disconnect). Between requests uvicorn's keep-alive timer applies as
before (``gpuir serve --keep-alive-seconds``).
"""

from __future__ import annotations

import asyncio

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol


def timed_h11(header_timeout: float, body_timeout: float) -> type[H11Protocol]:
    """uvicorn's h11 protocol with the head and body timeouts above (give it as ``uvicorn.Config(http=...)``)."""

    class TimedH11Protocol(H11Protocol):
        _read_timer: asyncio.TimerHandle | None = None
        _read_phase: str | None = None

        def _arm(self, phase: str, seconds: float) -> None:
            self._disarm()
            self._read_phase = phase
            self._read_timer = self.loop.call_later(seconds, self._read_timed_out)

        def _disarm(self) -> None:
            if self._read_timer is not None:
                self._read_timer.cancel()
            self._read_timer, self._read_phase = None, None

        def _read_timed_out(self) -> None:
            self._read_timer = None
            if not self.transport.is_closing():
                self.logger.info("closing a connection: its request %s did not arrive within %s s",
                                 "head" if self._read_phase == "head" else "body",
                                 header_timeout if self._read_phase == "head" else body_timeout)
                self.transport.close()

        def _follow(self) -> None:
            """Arm, switch or stop the timer for the state the peer's side of the connection is in."""
            state = self.conn.their_state
            if state is h11.IDLE:  # waiting for (the rest of) a request head
                if self._read_phase != "head":
                    self._arm("head", header_timeout)
            elif state is h11.SEND_BODY:
                if self._read_phase != "body":
                    self._arm("body", body_timeout)
            else:
                self._disarm()

        def connection_made(self, transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._arm("head", header_timeout)  # a new connection must send a request

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            if not self.transport.is_closing():
                self._follow()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            # idle now: uvicorn's keep-alive timer runs until the next request's first byte
            if self.conn.their_state is h11.IDLE and not self.conn.trailing_data[0]:
                self._disarm()
            elif not self.transport.is_closing():
                self._follow()

        def connection_lost(self, exc) -> None:
            self._disarm()
            super().connection_lost(exc)

    return TimedH11Protocol
