"""The Claw services' state and rules: mail, calendar, to-dos, contacts, notes and files, as one `World`.

A world is made from a task's fixtures and changed only by calls, `world.call(service, verb, body)
-> (status, answer)`, each appended to its log. It is deterministic: the same fixtures and the same
calls give the same answers, ids and final state, errors injected included (the n-th call of an
endpoint fails or not by rule, never by chance). So the one world serves twice: inside a task's
sandbox, behind a real HTTP server (`orchard/recipes/claw/server.py`), where the agent works it; and on the
host, where the grader replays the calls the sandbox logged into a fresh world and reads the state
that comes out. What the sandbox says the state is never counts, only the calls it was asked.

This file is standard library only and runs on the bundle's interpreter in the sandbox (the image
needs no Python: `orchard.env.bundle.sandbox_python`), whose standard library holds what it
imports (`orchard.env.bundle.SERVER_MODULES`): the host copies it in.

Routes (all under one port): `POST /<service>/<verb>` with the arguments as a JSON body (as
Claw-Eval's services take them), `GET /<service>/state`, `GET /<service>/audit` (its calls and
its action lists), `POST /<service>/reset`. An answer is JSON; a verb's own failure (no such
message) is 404 with `{"error": ...}`, bad arguments 422, an injected error 429 or 500.
"""

from __future__ import annotations

import copy
import re

SERVICES = ("mail", "calendar", "todo", "contacts", "notes", "files")
MAX_RECORDS = 500
"""Records a collection may hold: creating one more is refused (422)."""

_TYPES = {"string": str, "integer": int, "boolean": bool, "array": list, "object": dict}


class CallError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def _field(kind: str, about: str, *, required: bool = False, items: str = "", enum: tuple = ()) -> dict:
    schema: dict = {"type": kind, "description": about}
    if items:
        schema["items"] = {"type": items}
    if enum:
        schema["enum"] = list(enum)
    return {"schema": schema, "required": required}


def _verb(about: str, **fields: dict):
    """Marks a method as a verb of its service; `fields` are its arguments (`_field`)."""

    def mark(method):
        method.verb = {
            "description": about,
            "input_schema": {
                "type": "object",
                "properties": {name: spec["schema"] for name, spec in fields.items()},
                "required": [name for name, spec in fields.items() if spec["required"]],
            },
        }
        return method

    return mark


def _check(body: object, schema: dict) -> dict:
    """The arguments the schema names, type-checked (CallError 422 naming the first wrong one)."""
    if not isinstance(body, dict):
        raise CallError(422, "the arguments must be a JSON object")
    for name in schema["required"]:
        if body.get(name) in (None, ""):
            raise CallError(422, f"missing argument {name!r}")
    clean = {}
    for name, spec in schema["properties"].items():
        if body.get(name) is None:
            continue
        value = body[name]
        wanted = _TYPES[spec["type"]]
        if spec["type"] == "array" and isinstance(value, str):
            value = [value]  # one recipient given as a string: what a person means
        if not isinstance(value, wanted) or (wanted is int and isinstance(value, bool)):
            raise CallError(422, f"argument {name!r} must be {spec['type']}")
        if isinstance(value, list) and not all(isinstance(v, str) for v in value):
            raise CallError(422, f"argument {name!r} must be a list of strings")
        if "enum" in spec and value not in spec["enum"]:
            raise CallError(422, f"argument {name!r} must be one of {', '.join(spec['enum'])}")
        clean[name] = value
    return clean


def _text(value: object) -> str:
    return " ".join(str(v) for v in value) if isinstance(value, list) else str(value or "")


def _matches(record: dict, query: str, fields: tuple) -> bool:
    words = query.lower().split()
    haystack = " ".join(_text(record.get(f)) for f in fields).lower()
    return all(word in haystack for word in words)


class Service:
    """One service: named collections of records (dicts with an `id`), loaded from fixtures."""

    name = ""
    collections: tuple = ()
    actions: tuple = ()
    """Its audit's action lists, each a list of what a kind of verb did (`sent_messages`, `deleted`)."""

    def __init__(self, world: World, fixtures: dict) -> None:
        self.world = world
        self.data = {c: copy.deepcopy(list(fixtures.get(c, []))) for c in self.collections}
        self.audit: dict = {"calls": [], **{a: [] for a in self.actions}}

    @classmethod
    def verbs(cls) -> dict:
        """`{verb: function}`: its methods marked with `_verb` (`list_` is `list`)."""
        return {attr.rstrip("_"): fn for attr, fn in vars(cls).items() if hasattr(fn, "verb")}

    def find(self, collection: str, record_id: object) -> dict:
        for record in self.data[collection]:
            if record.get("id") == record_id:
                return record
        raise CallError(404, f"no {collection[:-1] if collection.endswith('s') else collection} with id {record_id!r}")

    def new_id(self, prefix: str) -> str:
        self.world.counter += 1
        return f"{prefix}-{self.world.counter:04d}"

    def act(self, action: str, record: dict) -> dict:
        """`record` in the audit's action list, and in the world's (which no reset clears)."""
        self.audit[action].append(copy.deepcopy(record))
        self.world.actions[self.name][action].append(copy.deepcopy(record))
        return record

    def room(self, collection: str) -> None:
        """CallError 422 when `collection` is full (`MAX_RECORDS`): a world stays small to replay."""
        if len(self.data[collection]) >= MAX_RECORDS:
            raise CallError(422, f"{self.name} holds at most {MAX_RECORDS} {collection}")

    def state(self) -> dict:
        return copy.deepcopy(self.data)


class Mail(Service):
    name = "mail"
    collections = ("messages",)
    actions = ("sent_messages", "deleted", "moved")
    _summary = ("id", "folder", "from", "to", "subject", "date", "read")

    def _list(self, folder: str, query: str, unread: bool, limit: int) -> list:
        found = [
            {k: m.get(k) for k in self._summary}
            for m in self.data["messages"]
            if (not folder or m.get("folder", "inbox") == folder)
            and (not query or _matches(m, query, ("from", "to", "cc", "subject", "body")))
            and (not unread or not m.get("read"))
        ]
        return sorted(found, key=lambda m: str(m.get("date", "")), reverse=True)[:limit]

    @_verb(
        "List messages in a folder, newest first.",
        folder=_field("string", "inbox (default), sent, drafts, archive or trash"),
        unread_only=_field("boolean", "only unread messages"),
        limit=_field("integer", "at most this many (default 50)"),
    )
    def list_(self, body: dict) -> dict:
        return {
            "messages": self._list(
                body.get("folder", "inbox"), "", bool(body.get("unread_only")), body.get("limit", 50)
            )
        }

    @_verb(
        "Search all messages by words in sender, recipients, subject and body.",
        query=_field("string", "words", required=True),
    )
    def search(self, body: dict) -> dict:
        return {"messages": self._list("", body["query"], False, 50)}

    @_verb("Read one message in full (marks it read).", message_id=_field("string", "its id", required=True))
    def get(self, body: dict) -> dict:
        message = self.find("messages", body["message_id"])
        message["read"] = True
        return {"message": copy.deepcopy(message)}

    def _send(self, to: list, cc: list, subject: str, text: str, reply_to: str = "") -> dict:
        if not to:
            raise CallError(422, "a message needs at least one recipient")
        self.room("messages")
        for address in to + cc:
            if not re.fullmatch(r"[^@\s]+@[^@\s]+\.[^@\s]+", address):
                raise CallError(422, f"{address!r} is not an email address")
        message = {
            "id": self.new_id("msg"),
            "folder": "sent",
            "from": self.world.user,
            "to": to,
            "cc": cc,
            "subject": subject,
            "body": text,
            "date": self.world.now,
            "read": True,
        }
        if reply_to:
            message["in_reply_to"] = reply_to
        self.data["messages"].append(message)
        return {"sent": self.act("sent_messages", dict(message))}

    @_verb(
        "Send a new email.",
        to=_field("array", "recipients' addresses", required=True, items="string"),
        cc=_field("array", "copy to", items="string"),
        subject=_field("string", "subject line", required=True),
        body=_field("string", "the text", required=True),
    )
    def send(self, body: dict) -> dict:
        return self._send(body["to"], body.get("cc", []), body["subject"], body["body"])

    @_verb(
        "Reply to a message's sender (reply_all: and to everyone it was sent to).",
        message_id=_field("string", "the message replied to", required=True),
        body=_field("string", "the text", required=True),
        reply_all=_field("boolean", "also to the other recipients"),
    )
    def reply(self, body: dict) -> dict:
        original = self.find("messages", body["message_id"])
        cc = (
            [a for a in original.get("to", []) + original.get("cc", []) if a != self.world.user]
            if body.get("reply_all")
            else []
        )
        subject = str(original.get("subject", ""))
        subject = subject if subject.lower().startswith("re:") else f"Re: {subject}"
        return self._send([original["from"]], cc, subject, body["body"], original["id"])

    @_verb(
        "Forward a message to others.",
        message_id=_field("string", "the message", required=True),
        to=_field("array", "recipients", required=True, items="string"),
        body=_field("string", "a note above it"),
    )
    def forward(self, body: dict) -> dict:
        original = self.find("messages", body["message_id"])
        text = f"{body.get('body', '')}\n\n---------- Forwarded message ----------\n{original.get('body', '')}"
        return self._send(body["to"], [], f"Fwd: {original.get('subject', '')}", text.strip(), original["id"])

    @_verb(
        "Move a message to another folder (archive, trash, inbox).",
        message_id=_field("string", "the message", required=True),
        folder=_field("string", "where to", required=True, enum=("inbox", "archive", "trash")),
    )
    def move(self, body: dict) -> dict:
        message = self.find("messages", body["message_id"])
        message["folder"] = body["folder"]
        self.act("moved", {"id": message["id"], "folder": body["folder"]})
        return {"message": {k: message.get(k) for k in self._summary}}

    @_verb("Delete a message for good.", message_id=_field("string", "the message", required=True))
    def delete(self, body: dict) -> dict:
        message = self.find("messages", body["message_id"])
        self.data["messages"].remove(message)
        return {"deleted": self.act("deleted", message)["id"]}


class Calendar(Service):
    name = "calendar"
    collections = ("events",)
    actions = ("created_events", "updated_events", "deleted")

    @_verb(
        "List events, by start time; optionally of one calendar and within [start, end).",
        calendar=_field("string", "a calendar's name (default: all)"),
        start=_field("string", "ISO date or time, inclusive"),
        end=_field("string", "ISO date or time, exclusive"),
    )
    def list_(self, body: dict) -> dict:
        start, end = body.get("start", ""), body.get("end", "")
        found = [
            e
            for e in self.data["events"]
            if (not body.get("calendar") or e.get("calendar") == body["calendar"])
            and (not start or str(e.get("end", "")) > start)
            and (not end or str(e.get("start", "")) < end)
        ]
        return {"events": sorted(copy.deepcopy(found), key=lambda e: str(e.get("start", "")))}

    @_verb("The calendars there are.")
    def calendars(self, body: dict) -> dict:
        return {"calendars": sorted({str(e.get("calendar", "personal")) for e in self.data["events"]} | {"personal"})}

    @_verb("Read one event.", event_id=_field("string", "its id", required=True))
    def get(self, body: dict) -> dict:
        return {"event": copy.deepcopy(self.find("events", body["event_id"]))}

    @_verb(
        "Create an event.",
        title=_field("string", "what it is", required=True),
        start=_field("string", "ISO start, e.g. 2026-03-04T10:00", required=True),
        end=_field("string", "ISO end", required=True),
        calendar=_field("string", "which calendar (default personal)"),
        attendees=_field("array", "attendees' addresses", items="string"),
        location=_field("string", "where"),
    )
    def create(self, body: dict) -> dict:
        if str(body["end"]) <= str(body["start"]):
            raise CallError(422, "an event must end after it starts")
        self.room("events")
        event = {"id": self.new_id("evt"), "calendar": "personal", "attendees": [], "location": "", **body}
        self.data["events"].append(event)
        return {"event": self.act("created_events", dict(event))}

    @_verb(
        "Change an event's title, time, attendees or location.",
        event_id=_field("string", "the event", required=True),
        title=_field("string", "new title"),
        start=_field("string", "new start"),
        end=_field("string", "new end"),
        attendees=_field("array", "new attendee list", items="string"),
        location=_field("string", "new location"),
    )
    def update(self, body: dict) -> dict:
        event = self.find("events", body["event_id"])
        changes = {k: v for k, v in body.items() if k != "event_id"}
        if str(changes.get("end", event.get("end"))) <= str(changes.get("start", event.get("start"))):
            raise CallError(422, "an event must end after it starts")
        event.update(changes)
        self.act("updated_events", {"id": event["id"], **changes})
        return {"event": copy.deepcopy(event)}

    @_verb("Delete an event.", event_id=_field("string", "the event", required=True))
    def delete(self, body: dict) -> dict:
        event = self.find("events", body["event_id"])
        self.data["events"].remove(event)
        return {"deleted": self.act("deleted", event)["id"]}


class Todo(Service):
    name = "todo"
    collections = ("tasks",)
    actions = ("created_tasks", "updated_tasks", "deleted")

    @_verb("List to-dos.", status=_field("string", "open, done or all (default open)", enum=("open", "done", "all")))
    def list_(self, body: dict) -> dict:
        status = body.get("status", "open")
        return {
            "tasks": [
                copy.deepcopy(t) for t in self.data["tasks"] if status == "all" or t.get("status", "open") == status
            ]
        }

    @_verb(
        "Add a to-do.",
        title=_field("string", "what to do", required=True),
        due=_field("string", "ISO due date"),
        priority=_field("string", "low, normal or high", enum=("low", "normal", "high")),
        notes=_field("string", "details"),
    )
    def create(self, body: dict) -> dict:
        self.room("tasks")
        task = {"id": self.new_id("task"), "status": "open", "priority": "normal", "due": "", "notes": "", **body}
        self.data["tasks"].append(task)
        return {"task": self.act("created_tasks", dict(task))}

    @_verb(
        "Change a to-do (status done to complete it).",
        task_id=_field("string", "the to-do", required=True),
        title=_field("string", "new title"),
        due=_field("string", "new due date"),
        priority=_field("string", "low, normal or high", enum=("low", "normal", "high")),
        status=_field("string", "open or done", enum=("open", "done")),
        notes=_field("string", "new details"),
    )
    def update(self, body: dict) -> dict:
        task = self.find("tasks", body["task_id"])
        changes = {k: v for k, v in body.items() if k != "task_id"}
        task.update(changes)
        self.act("updated_tasks", {"id": task["id"], **changes})
        return {"task": copy.deepcopy(task)}

    @_verb("Delete a to-do.", task_id=_field("string", "the to-do", required=True))
    def delete(self, body: dict) -> dict:
        task = self.find("tasks", body["task_id"])
        self.data["tasks"].remove(task)
        return {"deleted": self.act("deleted", task)["id"]}


class Contacts(Service):
    name = "contacts"
    collections = ("contacts",)
    actions = ("created", "updated", "merged", "deleted")
    _fields = ("name", "email", "phone", "company", "notes")

    @_verb("List every contact.")
    def list_(self, body: dict) -> dict:
        return {"contacts": copy.deepcopy(self.data["contacts"])}

    @_verb("Find contacts by words in name, email, phone or company.", query=_field("string", "words", required=True))
    def search(self, body: dict) -> dict:
        return {
            "contacts": [copy.deepcopy(c) for c in self.data["contacts"] if _matches(c, body["query"], self._fields)]
        }

    @_verb("Read one contact.", contact_id=_field("string", "its id", required=True))
    def get(self, body: dict) -> dict:
        return {"contact": copy.deepcopy(self.find("contacts", body["contact_id"]))}

    @_verb(
        "Add a contact.",
        name=_field("string", "full name", required=True),
        email=_field("string", "address"),
        phone=_field("string", "number"),
        company=_field("string", "employer"),
        notes=_field("string", "anything else"),
    )
    def create(self, body: dict) -> dict:
        self.room("contacts")
        contact = {"id": self.new_id("c"), **{f: "" for f in self._fields}, **body}
        self.data["contacts"].append(contact)
        return {"contact": self.act("created", dict(contact))}

    @_verb(
        "Change a contact's fields.",
        contact_id=_field("string", "the contact", required=True),
        name=_field("string", "new name"),
        email=_field("string", "new address"),
        phone=_field("string", "new number"),
        company=_field("string", "new employer"),
        notes=_field("string", "new notes"),
    )
    def update(self, body: dict) -> dict:
        contact = self.find("contacts", body["contact_id"])
        changes = {k: v for k, v in body.items() if k != "contact_id"}
        contact.update(changes)
        self.act("updated", {"id": contact["id"], **changes})
        return {"contact": copy.deepcopy(contact)}

    @_verb(
        "Merge a duplicate into a contact: fields the kept one lacks are taken from the duplicate, which is removed.",
        keep_id=_field("string", "the contact kept", required=True),
        duplicate_id=_field("string", "the contact merged into it and removed", required=True),
    )
    def merge(self, body: dict) -> dict:
        keep, duplicate = self.find("contacts", body["keep_id"]), self.find("contacts", body["duplicate_id"])
        if keep is duplicate:
            raise CallError(422, "a contact cannot be merged into itself")
        for name in self._fields:
            if not keep.get(name) and duplicate.get(name):
                keep[name] = duplicate[name]
        self.data["contacts"].remove(duplicate)
        self.act("merged", {"kept": keep["id"], "removed": duplicate["id"]})
        return {"contact": copy.deepcopy(keep)}

    @_verb("Delete a contact.", contact_id=_field("string", "the contact", required=True))
    def delete(self, body: dict) -> dict:
        contact = self.find("contacts", body["contact_id"])
        self.data["contacts"].remove(contact)
        return {"deleted": self.act("deleted", contact)["id"]}


class Notes(Service):
    name = "notes"
    collections = ("notes",)
    actions = ("created", "updated", "shared", "deleted")

    @_verb(
        "List notes (title, tags, date), optionally only those with words in title or text.",
        query=_field("string", "words"),
    )
    def list_(self, body: dict) -> dict:
        query = body.get("query", "")
        return {
            "notes": [
                {k: n.get(k) for k in ("id", "title", "tags", "date")}
                for n in self.data["notes"]
                if not query or _matches(n, query, ("title", "body", "tags"))
            ]
        }

    @_verb("Read one note.", note_id=_field("string", "its id", required=True))
    def get(self, body: dict) -> dict:
        return {"note": copy.deepcopy(self.find("notes", body["note_id"]))}

    @_verb(
        "Write a new note.",
        title=_field("string", "its title", required=True),
        body=_field("string", "its text", required=True),
        tags=_field("array", "tags", items="string"),
    )
    def create(self, body: dict) -> dict:
        self.room("notes")
        note = {"id": self.new_id("note"), "tags": [], "date": self.world.now, "shared_with": [], **body}
        self.data["notes"].append(note)
        return {"note": self.act("created", dict(note))}

    @_verb(
        "Change a note's title, text or tags.",
        note_id=_field("string", "the note", required=True),
        title=_field("string", "new title"),
        body=_field("string", "new text (replaces it)"),
        tags=_field("array", "new tags", items="string"),
    )
    def update(self, body: dict) -> dict:
        note = self.find("notes", body["note_id"])
        changes = {k: v for k, v in body.items() if k != "note_id"}
        note.update(changes)
        self.act("updated", {"id": note["id"], **changes})
        return {"note": copy.deepcopy(note)}

    @_verb(
        "Share a note with people (they get a copy by mail).",
        note_id=_field("string", "the note", required=True),
        to=_field("array", "their addresses", required=True, items="string"),
    )
    def share(self, body: dict) -> dict:
        note = self.find("notes", body["note_id"])
        note.setdefault("shared_with", []).extend(a for a in body["to"] if a not in note["shared_with"])
        self.act("shared", {"id": note["id"], "to": body["to"]})
        return {"note": copy.deepcopy(note)}

    @_verb("Delete a note.", note_id=_field("string", "the note", required=True))
    def delete(self, body: dict) -> dict:
        note = self.find("notes", body["note_id"])
        self.data["notes"].remove(note)
        return {"deleted": self.act("deleted", note)["id"]}


class Files(Service):
    """A small file store: records `{"id": path, "content": text}`."""

    name = "files"
    collections = ("files",)
    actions = ("written", "deleted")
    limit = 256 * 1024

    @_verb("List files, optionally under a folder.", prefix=_field("string", "a folder, e.g. reports/"))
    def list_(self, body: dict) -> dict:
        prefix = body.get("prefix", "")
        return {
            "files": [
                {"path": f["id"], "size": len(f.get("content", ""))}
                for f in sorted(self.data["files"], key=lambda f: f["id"])
                if f["id"].startswith(prefix)
            ]
        }

    @_verb("Read a file.", path=_field("string", "its path", required=True))
    def read(self, body: dict) -> dict:
        path = body["path"].strip("/")
        return {"path": path, "content": self.find("files", path).get("content", "")}

    @_verb(
        "Write a file (replacing it if it exists).",
        path=_field("string", "its path, e.g. reports/week.md", required=True),
        content=_field("string", "the text", required=True),
    )
    def write(self, body: dict) -> dict:
        path, content = body["path"].strip("/"), body["content"]
        if not path or ".." in path.split("/"):
            raise CallError(422, f"{body['path']!r} is not a file path")
        if len(content) > self.limit:
            raise CallError(422, f"a file holds at most {self.limit} characters")
        if not any(f["id"] == path for f in self.data["files"]):
            self.room("files")
        self.data["files"] = [f for f in self.data["files"] if f["id"] != path] + [{"id": path, "content": content}]
        self.act("written", {"path": path, "size": len(content)})
        return {"path": path, "size": len(content)}

    @_verb("Delete a file.", path=_field("string", "its path", required=True))
    def delete(self, body: dict) -> dict:
        found = self.find("files", body["path"].strip("/"))
        self.data["files"].remove(found)
        return {"deleted": self.act("deleted", {"path": found["id"]})["path"]}


KINDS = {cls.name: cls for cls in (Mail, Calendar, Todo, Contacts, Notes, Files)}


def tools(services: dict) -> list:
    """Every verb of `services` (names) as a tool: `{"name": "mail_send", "description", "input_schema",
    "endpoint": "/mail/send"}`."""
    found = []
    for name in services:
        for verb, method in sorted(KINDS[name].verbs().items()):
            found.append({"name": f"{name}_{verb}", **copy.deepcopy(method.verb), "endpoint": f"/{name}/{verb}"})
    return found


class World:
    """All of a task's services, its errors to inject, and the log of every call.

    `setup`: `{"now": ISO time, "user": the user's address, "services": {name: fixtures},
    "errors": {"fail": [{"endpoint": "/mail/send", "calls": [1, 2], "status": 429}], "rate": 0.3,
    "seed": 7, "delay": 0.2}}`. `fail` fails the listed calls (1 = the first) of an endpoint;
    `rate` fails that share of every endpoint's calls, chosen by a hash of the seed, the endpoint
    and the call's number, as 429, 500 or a delay (slowed by `delay` seconds, then answered)."""

    def __init__(self, setup: dict, *, answers: bool = True) -> None:
        self.setup = copy.deepcopy(setup)
        self.answers = answers
        """Keep each call's answer in the log and the audits (the server's); a replay needs none."""
        self.now = str(setup.get("now", "2026-03-02T09:00"))
        self.user = str(setup.get("user", "me@example.com"))
        self.counter = 0
        self.errors = dict(setup.get("errors") or {})
        self.counts: dict = {}
        self.log: list = []
        names = list(self.setup.get("services", {}))
        self.actions: dict = {name: {action: [] for action in KINDS[name].actions} for name in names}
        """Every service's action lists, never reset: what the agent did, whatever it reset after."""
        self.services = {name: self._fresh(name) for name in names}
        self.routes = {f"/{n}/{v}": (s, fn) for n, s in self.services.items() for v, fn in s.verbs().items()}

    def _fresh(self, name: str) -> Service:
        return KINDS[name](self, self.setup["services"][name] or {})

    def injected(self, endpoint: str) -> tuple:
        """(status, delay) of the error this call of `endpoint` is given: (0, 0) for none."""
        number = self.counts[endpoint] = self.counts.get(endpoint, 0) + 1
        for rule in self.errors.get("fail", []):
            if rule.get("endpoint") == endpoint and number in rule.get("calls", [1]):
                return int(rule.get("status", 500)), 0.0
        rate = float(self.errors.get("rate", 0))
        if rate > 0:
            import hashlib  # here: its import is a tenth of the server's start

            digest = hashlib.sha256(f"{self.errors.get('seed', 0)}:{endpoint}:{number}".encode()).digest()
            if int.from_bytes(digest[:4], "big") / 2**32 < rate:
                pick = digest[4] % 20  # 35 % rate limited, 35 % server errors, 30 % slow
                return (
                    (429, 0.0) if pick < 7 else (500, 0.0) if pick < 14 else (0, float(self.errors.get("delay", 0.2)))
                )
        return 0, 0.0

    def call(self, endpoint: str, body: object) -> tuple:
        """(status, answer, delay) of one call, logged. `delay` is for the server to wait before
        answering (an injected slow answer); the world has already changed."""
        name, _, verb = endpoint.strip("/").partition("/")
        if verb == "reset" and name in self.services:  # the service as its fixtures made it; logged, replayed
            self.services[name] = self._fresh(name)
            self.routes.update({f"/{name}/{v}": (self.services[name], fn) for v, fn in KINDS[name].verbs().items()})
            self.log.append({"endpoint": endpoint, "request_body": {}, "status": 200})
            return 200, {"status": "reset"}, 0.0
        route = self.routes.get(endpoint)
        if route is None:
            return 404, {"error": f"no endpoint {endpoint}"}, 0.0
        service, method = route
        status, delay = self.injected(endpoint)
        entry = {"endpoint": endpoint, "request_body": copy.deepcopy(body)}
        if status == 429:
            answer: dict = {
                "error": "rate_limit_exceeded",
                "message": "Too many requests; retry later.",
                "retry_after_seconds": 1,
            }
        elif status:
            answer = {"error": "internal_server_error", "message": "The service failed; try again."}
        else:
            try:
                answer, status = method(service, _check(body, method.verb["input_schema"])), 200
            except CallError as exc:
                answer, status = {"error": str(exc)}, exc.status
        entry["status"] = status
        if self.answers:
            entry["response_body"] = answer
            service.audit["calls"].append(entry)
        self.log.append(entry)
        return status, copy.deepcopy(answer) if self.answers else answer, delay

    def state(self) -> dict:
        return {name: service.state() for name, service in self.services.items()}

    def checked(self) -> dict:
        """What checks read: each service's collections and its action lists (never reset)."""
        return {name: {**service.data, **self.actions[name]} for name, service in self.services.items()}

    def audit(self, name: str) -> dict:
        return copy.deepcopy(self.services[name].audit)


def replay(setup: dict, calls: list) -> World:
    """A fresh world from `setup` after `calls` (`[{"endpoint", "request_body"}]`, as a log holds
    them), keeping no answers (it is for grading: its log has each call's status, its state and
    action lists what the calls did)."""
    world = World(setup, answers=False)
    for entry in calls:
        world.call(str(entry.get("endpoint", "")), entry.get("request_body"))
    return world
