"""Rule-based checks on what an assistant did: its calls, the services' final state, its answer.

A check is data in the task file, so a task set fetched from elsewhere never picks code to run:

    {"name": "report", "type": "answer", "match": {"all": [{"contains": "3 invoices"}, {"contains": "Acme"}]}}
    {"name": "asked bob", "type": "called", "endpoint": "/mail/send", "where": {"to": "bob@acme.com"}}
    {"name": "todo added", "type": "state", "service": "todo", "collection": "tasks",
     "where": {"title": {"contains": "budget"}, "status": "open"}, "min": 1, "max": 1}

`called` counts the calls of an endpoint whose arguments match `where` (answered 2xx only, unless
`status` is `any`); `state` counts the records of a collection that match `where`; `answer`
matches the agent's final message to the user; `judge` (for what rules cannot decide: is the
summary faithful, the reply polite) asks a model for a score in [0, 1] against its `rubric` (see
`orchard.recipes.claw.task`: the model is `ORCHARD_CLAW_JUDGE`'s, and without one the check is left out of
the grade, which says so). `min` (default 1) and `max` bound the count. A
pattern is a value (equal: strings case- and space-insensitively; against a list, any element)
or one operator: `contains`, `startswith`, `endswith`, `regex` (search, case-insensitive), `in`
(a list of values), `gte`/`lte` (numbers or ISO times), `empty` (true or false), `not`, `all`,
`any` (lists of patterns), `some`/`every` (a pattern each element of a list must match for
some/every element). `where` keys name fields; `a.b` reaches into an object; a field a record
lacks is null.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

OPERATORS = (
    "contains",
    "startswith",
    "endswith",
    "regex",
    "in",
    "gte",
    "lte",
    "empty",
    "not",
    "all",
    "any",
    "some",
    "every",
)


class Check(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = ""
    type: Literal["called", "state", "answer", "judge"]
    weight: float = Field(default=1.0, ge=0)
    endpoint: str = ""
    service: str = ""
    collection: str = ""
    where: dict[str, Any] = Field(default_factory=dict)
    match: Any = None
    rubric: str = ""
    status: Literal["ok", "any"] = "ok"
    min: int = Field(default=1, ge=0)
    max: int | None = Field(default=None, ge=0)

    @field_validator("where")
    @classmethod
    def _patterns(cls, value: dict[str, Any]) -> dict[str, Any]:
        for pattern in value.values():
            validate(pattern)
        return value

    @model_validator(mode="after")
    def _complete(self) -> Check:
        if self.type == "called" and not self.endpoint.startswith("/"):
            raise ValueError("a `called` check needs an `endpoint` such as /mail/send")
        if self.type == "state" and not (self.service and self.collection):
            raise ValueError("a `state` check needs a `service` and a `collection`")
        if self.type == "judge" and not self.rubric.strip():
            raise ValueError("a `judge` check needs a `rubric`: what the judge scores")
        if self.type == "answer":
            if self.match is None:
                raise ValueError("an `answer` check needs a `match` pattern")
            validate(self.match)
        self.name = self.name or f"{self.type} {self.endpoint or self.collection or self.type}"
        return self

    def count(self, calls: list[dict[str, Any]], state: dict[str, Any], answer: str) -> int:
        if self.type == "answer":
            return int(matches(answer, self.match))
        if self.type == "called":
            return sum(
                1
                for call in calls
                if call.get("endpoint") == self.endpoint
                and (self.status == "any" or 200 <= int(call.get("status", 0)) < 300)
                and _where(call.get("request_body"), self.where)
            )
        records = state.get(self.service, {}).get(self.collection, [])
        return sum(1 for record in records if _where(record, self.where))

    def holds(self, calls: list[dict[str, Any]], state: dict[str, Any], answer: str) -> bool:
        found = self.count(calls, state, answer)
        return found >= self.min and (self.max is None or found <= self.max)


def validate(pattern: Any) -> None:
    """ValueError naming what is wrong with a pattern."""
    if isinstance(pattern, dict):
        if len(pattern) != 1 or next(iter(pattern)) not in OPERATORS:
            raise ValueError(f"a pattern object has one operator of {', '.join(OPERATORS)}, not {sorted(pattern)}")
        ((operator, argument),) = pattern.items()
        if operator in ("all", "any", "in") and not isinstance(argument, list):
            raise ValueError(f"`{operator}` takes a list")
        if operator in ("all", "any"):
            for each in argument:
                validate(each)
        elif operator in ("not", "some", "every"):
            validate(argument)
        elif operator == "regex":
            try:
                re.compile(argument)
            except (re.error, TypeError) as exc:
                raise ValueError(f"`regex` {argument!r} does not compile: {exc}") from None


def _field(record: Any, path: str) -> Any:
    for part in path.split("."):
        record = record.get(part) if isinstance(record, dict) else None
    return record


def _where(record: Any, where: dict[str, Any]) -> bool:
    return isinstance(record, dict) and all(matches(_field(record, key), p) for key, p in where.items())


def _norm(value: Any) -> Any:
    return " ".join(value.split()).casefold() if isinstance(value, str) else value


def matches(value: Any, pattern: Any) -> bool:
    """Whether `value` matches `pattern` (see the module's docstring)."""
    if not isinstance(pattern, dict):
        if isinstance(value, list):
            return any(matches(v, pattern) for v in value)
        return _norm(value) == _norm(pattern)
    ((operator, argument),) = pattern.items()
    if operator == "not":
        return not matches(value, argument)
    if operator == "all":
        return all(matches(value, p) for p in argument)
    if operator == "any":
        return any(matches(value, p) for p in argument)
    if operator in ("some", "every"):
        items = value if isinstance(value, list) else [] if value is None else [value]
        test = any if operator == "some" else all
        return test(matches(v, argument) for v in items)
    if operator == "empty":
        return (value in (None, "", [], {})) == bool(argument)
    if isinstance(value, list):
        return any(matches(v, pattern) for v in value)
    if operator == "in":
        return any(_norm(value) == _norm(a) for a in argument)
    if operator in ("gte", "lte"):
        try:
            return value >= argument if operator == "gte" else value <= argument
        except TypeError:
            return False
    if not isinstance(value, str):
        return False
    text, wanted = _norm(value), _norm(str(argument))
    if operator == "contains":
        return wanted in text
    if operator == "startswith":
        return text.startswith(wanted)
    if operator == "endswith":
        return text.endswith(wanted)
    return re.search(str(argument), value, re.IGNORECASE) is not None


def robustness(calls: list[dict[str, Any]]) -> float:
    """Recovery after transient errors (429, 5xx): the share of endpoints that failed so and were
    later answered 2xx; 1.0 when none failed so. An agent's own mistakes (404, 422) are not counted."""
    failed: set[str] = set()
    recovered: set[str] = set()
    for call in calls:
        status, endpoint = int(call.get("status", 0)), str(call.get("endpoint"))
        if status == 429 or status >= 500:
            failed.add(endpoint)
            recovered.discard(endpoint)
        elif 200 <= status < 300 and endpoint in failed:
            recovered.add(endpoint)
    return 1.0 if not failed else len(recovered) / len(failed)
