"""A complete response leaves at once under ``sandforge serve``: what the app still does after its last ``send``
in the same step (the gatekeeper's audit write) runs after the client has its answer, not before.

The app below sends a whole response, then blocks its own loop until the client (another thread) says it has
read that response. Without the flush on completion the response would sit in the coalescing buffer until the
app's step ended, so the client would never see it while the app waits: the wait times out and the test fails.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import httpx
import uvicorn

from sandforge.runtime.service.coalesce import CoalescingHttpProtocol
from tests.service.serverproc import free_port

#: the longest the app blocks its loop waiting for the client (a failure, never a passing run, waits this long)
BLOCK_S = 5.0


class _App:
    def __init__(self) -> None:
        self.client_has_it = threading.Event()
        self.seen_while_blocked: list[bool] = []

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        body = b'{"ok": true}'
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": body})
        # same step, no await: as the gatekeeper's audit write after the answer
        self.seen_while_blocked.append(self.client_has_it.wait(BLOCK_S))
        self.client_has_it.clear()


def test_a_complete_response_reaches_the_client_before_the_app_step_ends() -> None:
    app = _App()
    port = free_port()
    config = uvicorn.Config(app, host="127.0.0.1", port=port, http=CoalescingHttpProtocol, log_level="warning",
                            lifespan="off")  # fmt: skip
    server = uvicorn.Server(config)
    thread = threading.Thread(target=lambda: asyncio.run(server.serve()), daemon=True)
    thread.start()
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:
            for _ in range(50):
                if server.started:
                    break
                threading.Event().wait(0.1)
            for _ in range(3):  # kept alive: each answer of the connection leaves at once
                response = client.get("/")
                assert response.json() == {"ok": True}
                app.client_has_it.set()
            connection_close = client.get("/", headers={"connection": "close"})
            assert connection_close.json() == {"ok": True}
            app.client_has_it.set()
    finally:
        server.should_exit = True
        thread.join(30)
    assert app.seen_while_blocked == [True, True, True, True]
