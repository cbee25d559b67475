"""A to-do service for the tests: list, create, update and delete tasks (fixtures: `TODO_FIXTURES`, `{"tasks": [...]}`).

Audit (`GET /todo/audit`): `calls`, `created_tasks`, `updated_tasks` and `deleted` (the tasks as they were).
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

app = FastAPI(title="todo")
add_error_injection(app)
tasks: list[dict[str, Any]] = load_fixture("TODO_FIXTURES", "tasks")
calls: list[dict[str, Any]] = []
created: list[dict[str, Any]] = []
updated: list[dict[str, Any]] = []
deleted: list[dict[str, Any]] = []


class ListTasks(BaseModel):
    status: str | None = None


class NewTask(BaseModel):
    title: str
    due_date: str | None = None
    notes: str = ""


class Change(BaseModel):
    task_id: str
    title: str | None = None
    status: str | None = None
    due_date: str | None = None


class TaskId(BaseModel):
    task_id: str


@app.post("/todo/tasks")
def list_tasks(request: ListTasks) -> Any:
    found = [t for t in tasks if request.status is None or t.get("status") == request.status]
    return logged(calls, "/todo/tasks", request, {"tasks": found})


@app.post("/todo/tasks/create")
def create_task(request: NewTask) -> Any:
    task = {"id": f"t-{100 + len(created) + 1}", "status": "open", **request.model_dump()}
    tasks.append(task)
    created.append(task)
    return logged(calls, "/todo/tasks/create", request, {"status": "created", "task": task})


@app.post("/todo/tasks/update")
def update_task(request: Change) -> Any:
    task = next((t for t in tasks if t["id"] == request.task_id), None)
    if task is None:
        return logged(calls, "/todo/tasks/update", request, {"error": f"no task {request.task_id}"})
    task.update({k: v for k, v in request.model_dump().items() if v is not None and k != "task_id"})
    updated.append(dict(task))
    return logged(calls, "/todo/tasks/update", request, {"status": "updated", "task": task})


@app.post("/todo/tasks/delete")
def delete_task(request: TaskId) -> Any:
    task = next((t for t in tasks if t["id"] == request.task_id), None)
    if task is None:
        return logged(calls, "/todo/tasks/delete", request, {"error": f"no task {request.task_id}"})
    tasks.remove(task)
    deleted.append({"task_id": task["id"], **task})
    return logged(calls, "/todo/tasks/delete", request, {"status": "deleted", "task_id": task["id"]})


@app.get("/todo/audit")
def audit() -> Any:
    return {"calls": calls, "created_tasks": created, "updated_tasks": updated, "deleted": deleted}


@app.post("/todo/reset")
def reset() -> Any:
    global tasks
    tasks = load_fixture("TODO_FIXTURES", "tasks")
    for log in (calls, created, updated, deleted):
        log.clear()
    return {"status": "reset"}


if __name__ == "__main__":
    uvicorn.run(app, host="127.0.0.1", port=int(os.environ.get("PORT", "9102")), log_level="warning")
