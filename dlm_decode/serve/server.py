"""uvicorn's server with a SIGTERM drain: new requests get 503 while the running ones finish, then it stops."""

from __future__ import annotations

import logging
import signal
import threading
import time
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
