"""uvicorn's server with a SIGTERM drain (new requests get 503 while the running ones finish, then it stops), and
``serve_in_thread``, an app on a free loopback port for tests and benchmarks."""

from __future__ import annotations

import logging
import signal
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import uvicorn

log = logging.getLogger("dlm_decode.serve")


class DrainingServer(uvicorn.Server):
    """On the first SIGTERM the app's state turns "draining" (``/health`` and new requests: 503), and the server stops
    once no request is in flight (exit 0). Ctrl-C, or a second SIGTERM, is uvicorn's own shutdown."""

    def handle_exit(self, sig: int, frame: Any) -> None:
        state = self.config.app.state.serve
        if sig != signal.SIGTERM or state.status == "draining":
            return super().handle_exit(sig, frame)
        state.status = "draining"
        log.info("SIGTERM: draining %d request(s) in flight", state.active)
        threading.Thread(target=self._drain, args=(state,), name="dlm-drain", daemon=True).start()

    def _drain(self, state: Any) -> None:
        while state.active > 0:
            time.sleep(0.05)
        log.info("drained: stopping")
        self.should_exit = True


@contextmanager
def serve_in_thread(app: Any, host: str = "127.0.0.1", log_level: str = "warning") -> Iterator[str]:
    """Run ``app`` on a free port of ``host`` in a thread (tests, benchmarks); yields its base URL, and stops it."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    sock.bind((host, 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level=log_level))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="dlm-serve", daemon=True)
    thread.start()
    try:
        while not server.started:
            if not thread.is_alive():
                raise RuntimeError("the server thread ended before it started")
            time.sleep(0.02)
        yield f"http://{host}:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(30)
        sock.close()
