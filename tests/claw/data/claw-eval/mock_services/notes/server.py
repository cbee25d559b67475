"""A notes service for the tests: list, read and share notes (fixtures: `NOTES_FIXTURES`, `{"notes": [...]}`).

Audit (`GET /notes/audit`): `calls` (every call the routes answered) and `shared` (each share).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import uvicorn
from fastapi import FastAPI
from pydantic import BaseModel

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _base import add_error_injection, load_fixture, logged

app = FastAPI(title="notes")
add_error_injection(app)
notes: list[dict[str, Any]] = load_fixture("NOTES_FIXTURES", "notes")
calls: list[dict[str, Any]] = []
shared: list[dict[str, Any]] = []


class ListNotes(BaseModel):
    tag: str | None = None


class NoteId(BaseModel):
    note_id: str


class Share(BaseModel):
    note_id: str
    recipients: list[str]


@app.post("/notes/list")
def list_notes(request: ListNotes) -> Any:
    found = [n for n in notes if request.tag is None or request.tag in n.get("tags", [])]
    answer = {"notes": [{"id": n["id"], "title": n["title"], "date": n.get("date")} for n in found]}
    return logged(calls, "/notes/list", request, answer)


@app.post("/notes/get")
def get_note(request: NoteId) -> Any:
    note = next((n for n in notes if n["id"] == request.note_id), None)
    return logged(calls, "/notes/get", request, note or {"error": f"no note {request.note_id}"})


@app.post("/notes/share")
def share_note(request: Share) -> Any:
    if not any(n["id"] == request.note_id for n in notes):
        return logged(calls, "/notes/share", request, {"error": f"no note {request.note_id}"})
    shared.append(request.model_dump())
    return logged(calls, "/notes/share", request, {"status": "shared", "note_id": request.note_id})


@app.get("/notes/audit")
def audit() -> Any:
    return {"calls": calls, "shared": shared}


@app.post("/notes/reset")
def reset() -> Any:
    global notes
    notes = load_fixture("NOTES_FIXTURES", "notes")
    calls.clear()
    shared.clear()
    return {"status": "reset"}


if __name__ == "__main__":
    uvicorn.run(app, host="127.0.0.1", port=int(os.environ.get("PORT", "9105")), log_level="warning")
