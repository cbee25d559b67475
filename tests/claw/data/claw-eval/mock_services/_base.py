"""What the test mock services share: fixtures read from the JSON file an environment variable
names, and error injection in front of every tool route.

Errors are injected into POSTs only, never into the audit, reset, health and docs routes, nor into
a request marked `X-Health-Check: 1`:

* `ERROR_RATE` (0 to 1, default 0): the chance a call is answered 429 (`Retry-After: 2`), 500, or
  only after a 2 s delay (weights 0.35, 0.35, 0.30); `ERROR_SEED` seeds the draws.
* `ERROR_PLAN`: `PATH:N:STATUS` entries, comma-separated: the N-th call of PATH is answered STATUS
  (429 or 500), every time the same, for tests of recovery.

An injected error never reaches the route, so the service's audit does not record it.

`STARTUP_CPU` (seconds, default 0): CPU time a service spends before it listens, as a heavier
service's imports do; a test of starting many services on a loaded machine sets it.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

EXEMPT = ("/audit", "/reset", "/health", "/docs", "/openapi.json")

while time.process_time() < float(os.environ.get("STARTUP_CPU", "0")):
    pass


def load_fixture(variable: str, key: str) -> list[dict[str, Any]]:
    """The list under `key` of the JSON file `$variable` names (a path from the root); [] without one."""
    path = os.environ.get(variable)
    if not path:
        return []
    return list(json.loads(Path(path).read_text(encoding="utf-8")).get(key, []))


def logged(calls: list[dict[str, Any]], endpoint: str, request: Any, response: Any) -> Any:
    """Record one call in the audit log and return its response."""
    body = request.model_dump() if hasattr(request, "model_dump") else request
    calls.append(
        {
            "endpoint": endpoint,
            "request_body": body,
            "response_body": response,
            "timestamp": datetime.now(UTC).isoformat(),
        }
    )
    return response


def _plan(text: str) -> dict[tuple[str, int], int]:
    plan = {}
    for entry in filter(None, (part.strip() for part in text.split(","))):
        path, number, status = entry.rsplit(":", 2)
        plan[(path, int(number))] = int(status)
    return plan


def add_error_injection(app: FastAPI) -> None:
    """Put the error injection the module describes in front of `app`'s routes."""
    plan = _plan(os.environ.get("ERROR_PLAN", ""))
    draws = random.Random(os.environ.get("ERROR_SEED"))
    counts: dict[str, int] = {}

    @app.middleware("http")
    async def inject(request: Request, call_next: Any) -> Any:
        path = request.url.path
        if request.method != "POST" or path.endswith(EXEMPT) or request.headers.get("X-Health-Check") == "1":
            return await call_next(request)
        counts[path] = counts.get(path, 0) + 1
        status = plan.get((path, counts[path]))
        if status is None and draws.random() < float(os.environ.get("ERROR_RATE", "0")):
            status = draws.choices([429, 500, 0], weights=[0.35, 0.35, 0.30])[0]
            if status == 0:
                await asyncio.sleep(2)
                return await call_next(request)
        if status == 429:
            body = {
                "error": "rate_limit_exceeded",
                "message": "Too many requests; retry shortly.",
                "retry_after_seconds": 2,
            }
            return JSONResponse(body, status_code=429, headers={"Retry-After": "2"})
        if status is not None:
            return JSONResponse(
                {"error": "internal_server_error", "message": "The service failed."}, status_code=status
            )
        return await call_next(request)
