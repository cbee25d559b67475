"""What the claw tests share: a real OpenAI-compatible chat server on loopback, for judges and
simulated users played by a model."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest


@pytest.fixture
def chat_server() -> Iterator[Callable[[Callable[[list[dict[str, Any]]], str]], tuple[str, list[dict[str, Any]]]]]:
    """`chat_server(answer)` starts one: `answer(messages)` is each reply's text; returns its base URL
    and the bodies of the requests it gets. Each is stopped, and the claw kinds' model caches
    cleared, when the test ends."""
    from orchard.claw import task as claw_task

    servers: list[ThreadingHTTPServer] = []

    def start(answer: Callable[[list[dict[str, Any]]], str]) -> tuple[str, list[dict[str, Any]]]:
        bodies: list[dict[str, Any]] = []

        class Handler(BaseHTTPRequestHandler):
            def _send(self, data: dict[str, Any]) -> None:
                payload = json.dumps(data).encode()
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("content-length") or 0)))
                bodies.append(body)
                message = {"role": "assistant", "content": answer(body["messages"])}
                self._send({
                    "id": "x", "object": "chat.completion", "created": 0, "model": body["model"],
                    "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
                    "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
                })  # fmt: skip

            def do_GET(self) -> None:
                self._send({"object": "list", "data": [{"id": "judge-model", "object": "model"}]})

            def log_message(self, *args: Any) -> None:
                pass

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_port}/v1", bodies

    claw_task._MODELS.clear()
    yield start
    claw_task._MODELS.clear()
    for server in servers:
        server.shutdown()
        server.server_close()
