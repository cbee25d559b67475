#!/usr/bin/env python3
"""Generate small SWE tasks, one bug each, split into a training and a held-out set.

    python examples/tasks/generate.py DEST [--train 200] [--held-out 50] [--seed 0] [--force]

Every task is a repository of its own, ``DEST/orchard-gen__<module>-<nnn>``: a one-commit git
repository (author, dates and modes pinned as in make_repos.py, so the hashes depend on the seed
alone) holding one module of three small functions, ``<module>.py``, and its tests,
``tests/test_<module>.py``. One function has one bug of one of ``KINDS`` (off by one, wrong
operator, inverted condition, wrong constant, missing case, wrong variable); the task's issue says
in words what goes wrong and shows a call's result against the expected one; ``patch`` fixes the
line(s), ``test_patch`` adds the test that fails without it. The rows go to ``DEST/train.jsonl``
and ``DEST/held-out.jsonl`` (the fields of tasks.jsonl, plus ``bug_kind``).

The two sets share the bug kinds and the shapes of the functions, nothing else: held-out tasks
take their module names, nouns, function names, parameter names and labels from another
vocabulary (``SPLITS``), and their constants from another range of numbers, so no held-out
repository, file, name or constant occurs in the training set. Every expected value is computed
by running the fixed module, and every test is checked here against the buggy and the fixed one
before it is written. Stdlib only.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import subprocess
import sys
import textwrap
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import make_repos  # noqa: E402

OWNER = "orchard-gen"
VERSION = "1.0"
CREATED_AT = "2026-02-01T00:00:00Z"
KINDS = ("off_by_one", "wrong_operator", "inverted_condition", "wrong_constant", "missing_case", "wrong_variable")
SPLIT_FILES = {"train": "train.jsonl", "held-out": "held-out.jsonl"}


@dataclass(frozen=True)
class Split:
    """One set's vocabulary: domains (module, singular noun, plural noun), the words templates
    name things with, and the range its constants come from."""

    domains: tuple[tuple[str, str, str], ...]
    words: dict[str, str]
    numbers: range


SPLITS = {
    "train": Split(
        domains=(
            ("shipping", "weight", "weights"),
            ("weather", "reading", "readings"),
            ("grades", "score", "scores"),
            ("payroll", "wage", "wages"),
            ("garden", "height", "heights"),
            ("traffic", "speed", "speeds"),
            ("library", "loan", "loans"),
            ("kitchen", "portion", "portions"),
            ("fitness", "pace", "paces"),
            ("bakery", "batch", "batches"),
            ("parking", "stay", "stays"),
            ("cinema", "seat", "seats"),
            ("dairy", "litre", "litres"),
            ("rowing", "stroke", "strokes"),
            ("festival", "visitor", "visitors"),
            ("pottery", "glaze", "glazes"),
        ),
        words={
            "limit": "limit",
            "low": "low",
            "high": "high",
            "n": "n",
            "size": "size",
            "allowance": "allowance",
            "TOP": "HIGH",
            "MID": "LOW",
            "top": "high",
            "mid": "medium",
            "bottom": "low",
            "count_at_least": "count_{items}_at_least",
            "total_first": "total_of_first_{items}",
            "clamp": "clamp_{item}",
            "over_allowance": "{item}_over_allowance",
            "spread": "{item}_spread",
            "band": "{item}_band",
            "mean": "mean_{item}",
            "groups": "{items}_in_groups",
            "first_over": "first_{item}_over",
            "changes": "{item}_changes",
        },
        numbers=range(5, 50),
    ),
    "held-out": Split(
        domains=(
            ("telescope", "magnitude", "magnitudes"),
            ("vineyard", "harvest", "harvests"),
            ("clinic", "dose", "doses"),
            ("airport", "delay", "delays"),
            ("aquarium", "tank", "tanks"),
            ("warehouse", "pallet", "pallets"),
            ("election", "ballot", "ballots"),
            ("brewery", "keg", "kegs"),
        ),
        words={
            "limit": "threshold",
            "low": "floor",
            "high": "ceiling",
            "n": "k",
            "size": "width",
            "allowance": "margin",
            "TOP": "UPPER",
            "MID": "LOWER",
            "top": "strong",
            "mid": "fair",
            "bottom": "weak",
            "count_at_least": "tally_{items}_reaching",
            "total_first": "leading_{items}_sum",
            "clamp": "bounded_{item}",
            "over_allowance": "{item}_excess",
            "spread": "{item}_range_width",
            "band": "classify_{item}",
            "mean": "typical_{item}",
            "groups": "chunk_{items}",
            "first_over": "{item}_position_above",
            "changes": "{item}_deltas",
        },
        numbers=range(55, 100),
    ),
}


@dataclass(frozen=True)
class Mutation:
    """A bug: `old` (in the fixed module, exactly once) becomes `new`. `title` and `symptom` are
    the issue's words for it, `slug` names the test that catches it."""

    kind: str
    old: str
    new: str
    title: str
    symptom: str
    slug: str


@dataclass(frozen=True)
class Template:
    """A small function, its module-level constants (`head`), what it should do (`spec`, after
    "should"), the bugs it can carry and a source of calls to test it with (argument texts)."""

    key: str
    head: str
    body: str
    spec: str
    mutations: tuple[Mutation, ...]
    calls: Callable[[random.Random, dict], list[str]]
    constants: Callable[[random.Random, range], dict] = lambda rng, numbers: {}


def _values(rng: random.Random, w: dict, length: int) -> str:
    return "[" + ", ".join(str(rng.randint(0, w["hi"])) for _ in range(length)) + "]"


def _limit_calls(rng: random.Random, w: dict) -> list[str]:
    """Lists of values below, at and above a limit, and the limit."""
    calls = []
    for _ in range(12):
        limit = rng.choice(w["numbers"])
        below, above = rng.randint(0, limit - 1), rng.randint(limit + 1, w["hi"])
        calls += [f"[], {limit}", f"[{below}], {limit}", f"[{limit}, {above}], {limit}", f"[{above}, {below}], {limit}"]
        values = [rng.choice([limit, below, above]) for _ in range(rng.randint(1, 4))]
        calls.append(f"{values}, {limit}")
    return calls


def _total_calls(rng: random.Random, w: dict) -> list[str]:
    calls = ["[], 0", "[], 2"]
    for _ in range(20):
        values = _values(rng, w, rng.randint(1, 5))
        calls += [f"{values}, {rng.randint(1, 3)}", f"{values}, {rng.randint(4, 6)}"]
    return calls


def _clamp_calls(rng: random.Random, w: dict) -> list[str]:
    calls = []
    for _ in range(8):
        low, high = sorted(rng.sample(w["numbers"], 2))
        for value in (low, high, rng.randint(0, low - 1), rng.randint(low, high), rng.randint(high + 1, w["hi"])):
            calls.append(f"{value}, {low}, {high}")
    return calls


def _allowance_calls(rng: random.Random, w: dict) -> list[str]:
    """Values around the default and the wrong one, each with the default, 0 and another allowance."""
    good, bad = w["c_allow"], w["c_bad"]
    values = [good + 3, bad + 3, max(good, bad) + 7, min(good, bad) - 2]
    calls = []
    for value in values + [rng.randint(0, w["hi"]) for _ in range(8)]:
        calls += [str(value), f"{value}, {w['allowance']}=0", f"{value}, {w['allowance']}={rng.choice(w['numbers'])}"]
    return calls


def _list_calls(rng: random.Random, w: dict) -> list[str]:
    return ["[]"] + [_values(rng, w, rng.randint(1, 5)) for _ in range(30)]


def _band_calls(rng: random.Random, w: dict) -> list[str]:
    top, mid, bad = w["c_top"], w["c_mid"], w["c_bad"]
    points = [top, mid, bad, top - 1, mid - 1, bad - 1, 0, w["hi"]]
    return [str(point) for point in points] + [str(rng.randint(0, w["hi"])) for _ in range(20)]


def _groups_calls(rng: random.Random, w: dict) -> list[str]:
    return [f"{_values(rng, w, rng.randint(0, 7))}, {rng.randint(1, 4)}" for _ in range(30)]


def _band_constants(rng: random.Random, numbers: range) -> dict:
    mid, bad, top = sorted(rng.sample(numbers, 3))
    if rng.random() < 0.5:
        mid, bad = bad, mid
    return {"c_top": top, "c_mid": mid, "c_bad": bad, "c_top_minus_1": top - 1}


def _allowance_constants(rng: random.Random, numbers: range) -> dict:
    good, bad = rng.sample(numbers, 2)
    return {"c_allow": good, "c_bad": bad}


TEMPLATES = (
    Template(
        key="count_at_least",
        head="",
        body='''
            def {fn}({items}, {limit}):
                """How many of `{items}` are at least `{limit}`."""
                count = 0
                for {item} in {items}:
                    if {item} >= {limit}:
                        count += 1
                return count
        ''',
        spec="count the {items} that are at least `{limit}`",
        mutations=(
            Mutation(
                "off_by_one",
                "{item} >= {limit}",
                "{item} > {limit}",
                "`{fn}()` leaves out {items} equal to `{limit}`",
                "A {item} exactly equal to `{limit}` is not counted.",
                "counts_values_equal_to_the_{limit}",
            ),
            Mutation(
                "inverted_condition",
                "{item} >= {limit}",
                "{item} < {limit}",
                "`{fn}()` counts the wrong {items}",
                "It counts the {items} below `{limit}` instead of those that reach it.",
                "counts_values_that_reach_the_{limit}",
            ),
        ),
        calls=_limit_calls,
    ),
    Template(
        key="total_first",
        head="",
        body='''
            def {fn}({items}, {n}):
                """The sum of the first `{n}` {items} (of all of them when there are fewer)."""
                total = 0
                for index in range(min({n}, len({items}))):
                    total += {items}[index]
                return total
        ''',
        spec="add up the first `{n}` {items}, or all of them when there are fewer than `{n}`",
        mutations=(
            Mutation(
                "off_by_one",
                "range(min({n}, len({items})))",
                "range(min({n}, len({items})) - 1)",
                "`{fn}()` comes out short",
                "The last of the {items} it should add is left out of the sum.",
                "adds_the_last_of_the_first_{n}",
            ),
            Mutation(
                "wrong_operator",
                "total += {items}[index]",
                "total -= {items}[index]",
                "`{fn}()` returns negative totals",
                "The result has the right size but the wrong sign: the {items} are taken away instead of added up.",
                "is_a_sum",
            ),
            Mutation(
                "wrong_variable",
                "total += {items}[index]",
                "total += index",
                "`{fn}()` ignores the {items} themselves",
                "The result does not depend on the {items} at all, only on how many are added: "
                "it adds up their positions (0, 1, 2, ...).",
                "adds_the_values",
            ),
            Mutation(
                "missing_case",
                "range(min({n}, len({items})))",
                "range({n})",
                "`{fn}()` crashes when there are fewer {items} than `{n}`",
                "When there are fewer than `{n}` {items} it raises IndexError instead of adding up all of them.",
                "with_fewer_values_than_{n}",
            ),
        ),
        calls=_total_calls,
    ),
    Template(
        key="clamp",
        head="",
        body='''
            def {fn}({item}, {low}, {high}):
                """`{item}` limited to `{low}`..`{high}` (both ends included)."""
                if {item} < {low}:
                    return {low}
                if {item} > {high}:
                    return {high}
                return {item}
        ''',
        spec="return the {item} unchanged when it lies between `{low}` and `{high}`, else the nearer of the two bounds",
        mutations=(
            Mutation(
                "wrong_variable",
                "        return {high}\n",
                "        return {low}\n",
                "`{fn}()` gets values above `{high}` wrong",
                "A {item} above `{high}` comes back as the wrong bound.",
                "caps_at_{high}",
            ),
            Mutation(
                "inverted_condition",
                "if {item} > {high}:",
                "if {item} < {high}:",
                "`{fn}()` changes {items} that are already in range",
                "A {item} that lies between the bounds is replaced, and one above `{high}` is let through.",
                "keeps_values_in_range",
            ),
            Mutation(
                "missing_case",
                "    if {item} < {low}:\n        return {low}\n",
                "",
                "`{fn}()` lets {items} below `{low}` through",
                "A {item} below `{low}` is returned unchanged instead of being raised to `{low}`.",
                "raises_values_to_{low}",
            ),
        ),
        calls=_clamp_calls,
    ),
    Template(
        key="over_allowance",
        head="{ITEM}_{ALLOWANCE} = {c_allow}",
        body='''
            def {fn}({item}, {allowance}={ITEM}_{ALLOWANCE}):
                """How far `{item}` goes over `{allowance}` ({c_allow} unless given); 0 when it does not."""
                return max({item} - {allowance}, 0)
        ''',
        spec="say how far a {item} goes over `{allowance}` ({c_allow} unless given), and 0 when it does not",
        mutations=(
            Mutation(
                "wrong_operator",
                "{item} - {allowance}",
                "{item} + {allowance}",
                "`{fn}()` returns too much",
                "The result is larger than the {item} itself: the `{allowance}` is added instead of taken off.",
                "takes_off_the_{allowance}",
            ),
            Mutation(
                "wrong_constant",
                "{ITEM}_{ALLOWANCE} = {c_allow}",
                "{ITEM}_{ALLOWANCE} = {c_bad}",
                "`{fn}()` uses the wrong default `{allowance}`",
                "Without an explicit `{allowance}` the result is off: the default is not the documented {c_allow}. "
                "Passing `{allowance}={c_allow}` gives the right answer.",
                "default_{allowance}",
            ),
            Mutation(
                "wrong_variable",
                "max({item} - {allowance}, 0)",
                "max({item} - {ITEM}_{ALLOWANCE}, 0)",
                "`{fn}()` ignores its `{allowance}` argument",
                "Passing `{allowance}=` changes nothing: the default of {c_allow} is always used.",
                "uses_the_given_{allowance}",
            ),
        ),
        calls=_allowance_calls,
        constants=_allowance_constants,
    ),
    Template(
        key="spread",
        head="",
        body='''
            def {fn}({items}):
                """The largest of `{items}` less the smallest; 0 for no {items}."""
                if not {items}:
                    return 0
                return max({items}) - min({items})
        ''',
        spec="return the largest of the {items} less the smallest, and 0 when there are none",
        mutations=(
            Mutation(
                "wrong_operator",
                "max({items}) - min({items})",
                "max({items}) + min({items})",
                "`{fn}()` is too large",
                "The result is larger than the largest {item}, where it should be the distance between "
                "the largest and the smallest.",
                "is_a_difference",
            ),
            Mutation(
                "missing_case",
                "    if not {items}:\n        return 0\n    return max(",
                "    return max(",
                "`{fn}()` crashes on an empty list",
                "With no {items} it raises ValueError instead of returning 0.",
                "of_no_values",
            ),
        ),
        calls=_list_calls,
    ),
    Template(
        key="band",
        head="{ITEM}_{TOP} = {c_top}\n{ITEM}_{MID} = {c_mid}",
        body='''
            def {fn}({item}):
                """'{top}' from {c_top} up, '{mid}' from {c_mid} to {c_top_minus_1}, '{bottom}' below {c_mid}."""
                if {item} >= {ITEM}_{TOP}:
                    return "{top}"
                if {item} >= {ITEM}_{MID}:
                    return "{mid}"
                return "{bottom}"
        ''',
        spec="rate a {item} '{top}' from {c_top} up, '{mid}' from {c_mid} to {c_top_minus_1} "
        "and '{bottom}' below {c_mid}",
        mutations=(
            Mutation(
                "missing_case",
                '    if {item} >= {ITEM}_{MID}:\n        return "{mid}"\n',
                "",
                "`{fn}()` never says '{mid}'",
                "{Items} from {c_mid} to {c_top_minus_1} are rated '{bottom}'; '{mid}' never comes back.",
                "rates_the_middle_{mid}",
            ),
            Mutation(
                "off_by_one",
                "{item} >= {ITEM}_{TOP}",
                "{item} > {ITEM}_{TOP}",
                "`{fn}()` is wrong at exactly {c_top}",
                "A {item} of exactly {c_top} is not rated '{top}'.",
                "rates_{c_top}_{top}",
            ),
            Mutation(
                "wrong_constant",
                "{ITEM}_{MID} = {c_mid}",
                "{ITEM}_{MID} = {c_bad}",
                "`{fn}()` puts the '{mid}'/'{bottom}' boundary in the wrong place",
                "The boundary between '{mid}' and '{bottom}' is not at {c_mid}, as documented.",
                "boundary_at_{c_mid}",
            ),
            Mutation(
                "wrong_variable",
                "{item} >= {ITEM}_{MID}",
                "{item} >= {ITEM}_{TOP}",
                "`{fn}()` rates middle {items} '{bottom}'",
                "{Items} from {c_mid} to {c_top_minus_1} come back '{bottom}' instead of '{mid}'.",
                "rates_from_{c_mid}_{mid}",
            ),
        ),
        calls=_band_calls,
        constants=_band_constants,
    ),
    Template(
        key="mean",
        head="",
        body='''
            def {fn}({items}):
                """The mean of `{items}`, rounded down; 0 for no {items}."""
                if not {items}:
                    return 0
                return sum({items}) // len({items})
        ''',
        spec="return the mean of the {items} rounded down, and 0 when there are none",
        mutations=(
            Mutation(
                "missing_case",
                "    if not {items}:\n        return 0\n    return sum(",
                "    return sum(",
                "`{fn}()` crashes on an empty list",
                "With no {items} it raises ZeroDivisionError instead of returning 0.",
                "of_no_values",
            ),
            Mutation(
                "wrong_operator",
                "sum({items}) // len({items})",
                "sum({items}) * len({items})",
                "`{fn}()` is far too large",
                "The result is larger than any of the {items}, which a mean can never be.",
                "is_an_average",
            ),
        ),
        calls=_list_calls,
    ),
    Template(
        key="groups",
        head="",
        body='''
            def {fn}({items}, {size}):
                """`{items}` cut into consecutive groups of `{size}` (the last one may be shorter)."""
                groups = []
                for start in range(0, len({items}), {size}):
                    groups.append({items}[start:start + {size}])
                return groups
        ''',
        spec="cut the {items} into consecutive groups of `{size}`, the last one possibly shorter",
        mutations=(
            Mutation(
                "off_by_one",
                "{items}[start:start + {size}]",
                "{items}[start:start + {size} - 1]",
                "`{fn}()` loses {items}",
                "Every group is one {item} short, and those {items} are missing from the result.",
                "keeps_every_value",
            ),
            Mutation(
                "off_by_one",
                "range(0, len({items}), {size})",
                "range(0, len({items}) - 1, {size})",
                "`{fn}()` sometimes drops the last {item}",
                "When the last group would hold a single {item}, that group is missing.",
                "keeps_a_last_single_value",
            ),
        ),
        calls=_groups_calls,
    ),
    Template(
        key="first_over",
        head="",
        body='''
            def {fn}({items}, {limit}):
                """The position of the first of `{items}` above `{limit}`; -1 when none is."""
                for position, {item} in enumerate({items}):
                    if {item} > {limit}:
                        return position
                return -1
        ''',
        spec="return the position of the first {item} above `{limit}`, and -1 when there is none",
        mutations=(
            Mutation(
                "wrong_variable",
                "return position",
                "return {item}",
                "`{fn}()` does not return a position",
                "It returns the {item} it found instead of where it is in the list.",
                "returns_the_position",
            ),
            Mutation(
                "inverted_condition",
                "{item} > {limit}",
                "{item} <= {limit}",
                "`{fn}()` finds the wrong {item}",
                "It finds the first {item} that is not above `{limit}`.",
                "finds_a_value_above_the_{limit}",
            ),
            Mutation(
                "wrong_constant",
                "return -1",
                "return 0",
                "`{fn}()` cannot say that nothing was found",
                "When no {item} is above `{limit}` it returns 0, a real position, instead of -1.",
                "when_none_is_above_the_{limit}",
            ),
            Mutation(
                "off_by_one",
                "{item} > {limit}",
                "{item} >= {limit}",
                "`{fn}()` stops at a {item} equal to `{limit}`",
                "A {item} equal to `{limit}` is taken as above it.",
                "skips_values_equal_to_the_{limit}",
            ),
        ),
        calls=_limit_calls,
    ),
    Template(
        key="changes",
        head="",
        body='''
            def {fn}({items}):
                """The change from each of `{items}` to the next (one fewer than there are)."""
                return [{items}[i + 1] - {items}[i] for i in range(len({items}) - 1)]
        ''',
        spec="list the change from each {item} to the next, one fewer than there are {items}",
        mutations=(
            Mutation(
                "wrong_operator",
                "{items}[i + 1] - {items}[i]",
                "{items}[i + 1] + {items}[i]",
                "`{fn}()` gives sums, not changes",
                "Each entry is the two neighbouring {items} added together, not the change between them.",
                "are_differences",
            ),
            Mutation(
                "off_by_one",
                "range(len({items}) - 1)",
                "range(1, len({items}) - 1)",
                "`{fn}()` misses the first change",
                "The change from the first {item} to the second is missing from the list.",
                "include_the_first",
            ),
        ),
        calls=_list_calls,
    ),
)


@dataclass
class Task:
    """One generated task: its files and its row."""

    split: str
    index: int
    module: str
    kind: str
    files: dict[str, str]
    fixed_module: str
    full_tests: str
    fail_to_pass: list[str]
    pass_to_pass: list[str]
    problem_statement: str

    @property
    def name(self) -> str:
        return f"{self.module}-{self.index:03d}"

    @property
    def repo(self) -> str:
        return f"{OWNER}/{self.name}"

    @property
    def instance_id(self) -> str:
        return f"{OWNER}__{self.name}"


def _outcome(namespace: dict, call: str) -> tuple[str, object]:
    try:
        return "value", eval(call, dict(namespace))
    except Exception as exc:  # the bug's symptom may be any exception
        return "raises", type(exc).__name__


def _load(source: str) -> dict:
    namespace: dict = {}
    exec(compile(source, "<generated>", "exec"), namespace)
    return namespace


def _fill(text: str, w: dict) -> str:
    return text.format(**w)


def _pick(rng: random.Random, calls: list[str], count: int, namespace: dict) -> list[str]:
    """Up to `count` of `calls` with different results in `namespace`, from the shorter half
    (they make readable tests and issues)."""
    unique = sorted(set(calls), key=lambda call: (len(call), call))
    shorter = unique[: max(len(unique) // 2, count * 3)]
    rng.shuffle(shorter)
    picked: dict[str, str] = {}
    for call in shorter:
        picked.setdefault(repr(_outcome(namespace, call)), call)
    return sorted(list(picked.values())[:count], key=lambda call: (len(call), call))


def make_task(split: str, index: int, seed: int) -> Task:
    """The `index`-th task of `split` for `seed` (independent of how many tasks are made)."""
    vocabulary = SPLITS[split]
    rng = random.Random(f"{OWNER}:{seed}:{split}:{index}")
    kind = KINDS[index % len(KINDS)]
    module, item, items = rng.choice(vocabulary.domains)
    candidates = [(t, m) for t in TEMPLATES for m in t.mutations if m.kind == kind]
    template, mutation = rng.choice(candidates)
    others = rng.sample([t for t in TEMPLATES if t is not template], 2)
    chosen = [template, *others]
    rng.shuffle(chosen)

    base: dict = dict(vocabulary.words)
    base.update(item=item, items=items, ITEM=item.upper(), Items=items.capitalize(), module=module)
    base["ALLOWANCE"] = base["allowance"].upper()
    base.update(hi=vocabulary.numbers.stop + 10, numbers=list(vocabulary.numbers))
    words = {}
    for each in chosen:
        w = dict(base, **each.constants(rng, vocabulary.numbers))
        w["fn"] = w[each.key].format(**w)
        words[each.key] = w

    heads = [_fill(t.head, words[t.key]) for t in chosen if t.head]
    bodies = [_fill(textwrap.dedent(t.body).strip("\n"), words[t.key]) for t in chosen]
    docstring = f'"""{module.capitalize()}: small helpers for {items}."""'
    fixed = "\n\n".join([docstring, *(["\n".join(heads)] if heads else [])]) + "\n\n\n" + "\n\n\n".join(bodies) + "\n"
    w = words[template.key]
    old, new = _fill(mutation.old, w), _fill(mutation.new, w)
    if fixed.count(old) != 1:
        raise AssertionError(f"{template.key}/{mutation.kind}: {old!r} occurs {fixed.count(old)} times")
    buggy = fixed.replace(old, new)
    good_ns, bad_ns = _load(fixed), _load(buggy)

    tests, pass_to_pass = [], []
    test_file = f"tests/test_{module}.py"
    for each in sorted(chosen, key=lambda t: words[t.key]["fn"]):
        fn = words[each.key]["fn"]
        calls = [f"{fn}({args})" for args in each.calls(rng, words[each.key])]
        if each is template:
            calls = [c for c in calls if _outcome(good_ns, c) == _outcome(bad_ns, c)]
        picked = _pick(rng, calls, 2, good_ns)
        if not picked:
            raise AssertionError(f"{template.key}/{mutation.kind}: no call the bug leaves alone")
        tests.append(_test(f"test_{fn}", picked, good_ns))
        pass_to_pass.append(f"{test_file}::test_{fn}")

    fn = w["fn"]
    calls = [f"{fn}({args})" for args in template.calls(rng, w)]
    showing = [c for c in calls if _outcome(good_ns, c) != _outcome(bad_ns, c)]
    picked = _pick(rng, showing, 2, good_ns)
    if not picked:
        raise AssertionError(f"{template.key}/{mutation.kind}: no call shows the bug")
    failing = f"test_{fn}_{_fill(mutation.slug, w)}"
    names = ", ".join(sorted(words[t.key]["fn"] for t in chosen))
    added = _test(failing, picked, good_ns)
    for source, namespace, passes in ((tests, good_ns, True), (tests, bad_ns, True), ([added], good_ns, True)):
        _check_tests(source, namespace, passes)
    _check_tests([added], bad_ns, False)
    base_tests = f"from {module} import {names}\n\n\n" + "\n\n\n".join(tests) + "\n"

    files = {
        "pyproject.toml": '[tool.pytest.ini_options]\ntestpaths = ["tests"]\n',
        "conftest.py": "# Makes the project root importable when the tests are run with plain `pytest`.\n",
        f"{module}.py": buggy,
        test_file: base_tests,
    }
    return Task(
        split=split,
        index=index,
        module=module,
        kind=kind,
        files=files,
        fixed_module=fixed,
        full_tests=base_tests + "\n\n" + added + "\n",
        fail_to_pass=[f"{test_file}::{failing}"],
        pass_to_pass=pass_to_pass,
        problem_statement=_issue(rng, module, template, mutation, w, picked, good_ns, bad_ns),
    )


def _test(name: str, calls: list[str], namespace: dict) -> str:
    lines = [f"def {name}():"]
    for call in calls:
        kind, value = _outcome(namespace, call)
        if kind != "value":
            raise AssertionError(f"the fixed code raises {value} for {call}")
        lines.append(f"    assert {call} == {value!r}")
    return "\n".join(lines)


def _check_tests(tests: list[str], namespace: dict, passes: bool) -> None:
    """Run each test function against `namespace` (a module's): each must pass, or each fail."""
    for test in tests:
        scope = dict(namespace)
        exec(compile(test, "<tests>", "exec"), scope)
        name = test.split("(", 1)[0].removeprefix("def ")
        try:
            scope[name]()
            passed = True
        except Exception:  # a failing assertion or the bug's exception
            passed = False
        if passed != passes:
            raise AssertionError(f"{name} {'fails' if passes else 'passes'} where it should not")


OPENERS = (
    "`{fn}()` in `{module}.py` should {spec}. {symptom}",
    "According to its docstring, `{fn}()` should {spec}. {symptom}",
    "We rely on `{fn}()` (in `{module}.py`) to {spec}. {symptom}",
)


def _issue(
    rng: random.Random,
    module: str,
    template: Template,
    mutation: Mutation,
    w: dict,
    calls: list[str],
    good: dict,
    bad: dict,
) -> str:
    fn = w["fn"]
    words = dict(w, spec=_fill(template.spec, w), symptom=_fill(mutation.symptom, w))
    lines = []
    for call in calls:
        kind, got = _outcome(bad, call)
        shown = f"raises {got}" if kind == "raises" else f"-> {got!r}"
        lines.append(f"{call}   # {shown}, expected {_outcome(good, call)[1]!r}")
    return (
        f"{_fill(mutation.title, w)}\n\n{rng.choice(OPENERS).format(**words)}\n\n"
        f"```python\nfrom {module} import {fn}\n\n" + "\n".join(lines) + "\n```\n"
    )


def _diff(repo: Path, relative: str) -> str:
    """`git diff` of one file, as git prints it (make_repos.git strips the output, and with it
    the last context line when that is an empty line)."""
    command = ["git", *make_repos.GIT_CONFIG, "diff", "--no-color", "--no-ext-diff", "--", relative]
    result = subprocess.run(command, cwd=repo, env=make_repos.git_env(), capture_output=True, text=True, check=False)
    if result.returncode != 0 or not result.stdout:
        raise RuntimeError(f"git diff {relative} failed in {repo}:\n{result.stderr}")
    return result.stdout


def write_repo(task: Task, dest: Path) -> dict:
    """Make the task's repository under `dest`; returns its row."""
    target = dest / f"{OWNER}__{task.name}"
    target.mkdir(parents=True)
    for relative, text in task.files.items():
        path = target / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    commit = make_repos.commit_tree(target, f"{task.name} {VERSION}")
    module_file, test_file = f"{task.module}.py", f"tests/test_{task.module}.py"
    diffs = {}
    for relative, text in ((module_file, task.fixed_module), (test_file, task.full_tests)):
        (target / relative).write_text(text, encoding="utf-8")
        diffs[relative] = _diff(target, relative)
        make_repos.git(["checkout", "-q", "--", relative], target)
    return {
        "instance_id": task.instance_id,
        "repo": task.repo,
        "base_commit": commit,
        "problem_statement": task.problem_statement,
        "patch": diffs[module_file],
        "test_patch": diffs[test_file],
        "FAIL_TO_PASS": task.fail_to_pass,
        "PASS_TO_PASS": task.pass_to_pass,
        "version": VERSION,
        "environment_setup_commit": commit,
        "hints_text": "",
        "created_at": CREATED_AT,
        "workdir": f"/workspace/{task.name}",
        "difficulty": "easy",
        "bug_kind": task.kind,
    }


def generate(dest: Path, counts: dict[str, int], seed: int, force: bool = False) -> dict[str, list[dict]]:
    """Write every split's repositories and rows under `dest`; returns {split: rows}."""
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    ours = [p for p in dest.iterdir() if p.name.startswith(f"{OWNER}__") or p.name in SPLIT_FILES.values()]
    if ours and not force:
        raise FileExistsError(f"{dest} already holds generated tasks (use --force to replace them)")
    for path in ours:
        shutil.rmtree(path) if path.is_dir() else path.unlink()
    rows: dict[str, list[dict]] = {}
    for split, count in counts.items():
        rows[split] = [write_repo(make_task(split, index, seed), dest) for index in range(count)]
    for key in ("instance_id", "repo"):
        seen = Counter(row[key] for split_rows in rows.values() for row in split_rows)
        if max(seen.values(), default=1) > 1:
            raise AssertionError(f"a {key} occurs twice")
    for split, split_rows in rows.items():
        text = "".join(json.dumps(row) + "\n" for row in split_rows)
        (dest / SPLIT_FILES[split]).write_text(text, encoding="utf-8")
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dest", type=Path, help="folder for the repositories and the two JSONL files")
    parser.add_argument("--train", type=int, default=200, metavar="N", help="training tasks (default 200)")
    parser.add_argument("--held-out", type=int, default=50, metavar="N", help="held-out tasks (default 50)")
    parser.add_argument("--seed", type=int, default=0, help="the seed (default 0)")
    parser.add_argument("--force", action="store_true", help="replace tasks generated there before")
    args = parser.parse_args(argv)
    if args.train < 0 or args.held_out < 0:
        parser.error("--train and --held-out take a count of 0 or more")
    try:
        rows = generate(args.dest, {"train": args.train, "held-out": args.held_out}, args.seed, args.force)
    except (FileExistsError, RuntimeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    for split, split_rows in rows.items():
        kinds = Counter(row["bug_kind"] for row in split_rows)
        listed = ", ".join(f"{kind} {kinds[kind]}" for kind in KINDS if kinds[kind])
        print(f"{args.dest / SPLIT_FILES[split]}: {len(split_rows)} tasks ({listed or 'none'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
