"""The GUI recipe's costs (not a test): a browser agent's step, a browser sandbox's start, and how
many browsers this machine steps at once, each against a baseline measured in the same run.

    .venv/bin/python bench/gui.py [--quick] [--steps 50] [--cold 5] [--json out.json]

Real Docker, real Chromium (`orchard/browser:bookworm`, built if missing), our shop site
(`examples/gui/tasks.json`, `gui-shop-rain-jacket`: search, product page, two drop-downs, cart,
checkout form, order), sandboxes limited and `blocked` as a task's are.

* **a step**: one turn of the scripted solution through the real harness, what `run_episode`
  does for it after the model's reply: every tool call of the turn (`execute`: the action, the
  harness's own look-ups, `Browser.settle`) and then the observation (`after_actions`: the
  screenshot and the tab line for `computer`, the page outline with element ids for `bid`).
  The solution is played again from the start page until `--steps` turns are timed per harness
  (the way back is not timed). Baselines: the bare CDP costs of one such action in the same
  sandbox, a `Runtime.evaluate("1")` round trip and a `Browser.click` on an empty spot (three
  `Input` events, no settle, no observation), and a bare screenshot. Goal: p50 under 150 ms.
* **cold start to first screenshot**: `Client.create` of the browser image with no init
  (nothing runs in it yet), the site started in it (`GuiTask.serve`), `Browser.launch` (Chromium
  started), the start page opened and settled, a screenshot, each phase timed. Baseline: the
  bare `create` (until the agent answers). Goal: p50 under 1.5 s.
* **second launch to first screenshot**: `Browser.launch` on a sandbox whose Chromium already
  runs (a fresh browser context), the start page, a screenshot. Through a real warm pool too
  when the environment layer has one for browsers (`SandboxSpec.init`, `GuiTask.sandbox_init`):
  `task_sandbox` from a pool of the task's sandboxes (filled first, then not refilling, so no
  refill competes while a run is timed), the site started, `launch`, page, screenshot. Goal:
  under 100 ms.
* **browsers at once**: 1, 2, 4, 6 sandboxes, each a thread playing the solution through the
  `computer` harness at the same time; the step p50 at each count, its ratio to one browser's,
  and the first count where it doubles.

It prints the load average at the start and the end (other jobs may share the machine) and
records the figures as a `bench` run.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from orchard.env import Client
from orchard.env.backends.base import SandboxSpec
from orchard.env.client import Sandbox
from orchard.recipes.gui.browser import Browser
from orchard.recipes.gui.harnesses import BidHarness, BrowserHarness, ComputerHarness
from orchard.recipes.gui.task import GuiTask, session_of
from orchard.store.runs import record_bench
from orchard.tasks.loading import load_tasks

ROOT = Path(__file__).resolve().parents[1]
TASK_ID = "gui-shop-rain-jacket"
COUNTS = (1, 2, 4, 6)


def _ms(values: list[float]) -> dict[str, float]:
    """p50 and p95 in milliseconds of values in seconds."""
    ordered = sorted(values)
    return {
        "p50": statistics.median(ordered) * 1000,
        "p95": ordered[round(0.95 * (len(ordered) - 1))] * 1000,
        "n": len(ordered),
    }


def _load() -> str:
    return " ".join(f"{value:.2f}" for value in os.getloadavg())


def _timed(call) -> tuple[Any, float]:
    began = time.perf_counter()
    result = call()
    return result, time.perf_counter() - began


# --- steps -----------------------------------------------------------------------------------


def play(box: Sandbox, task: GuiTask, harness: BrowserHarness, turns: int, times: dict[str, list[float]]) -> int:
    """Time `turns` turns of the task's solution through `harness` in `box` (whose task has
    started), replaying the solution from the start page as often as needed. Each turn's
    actions and its observation are timed apart (`actions`, `observation`) and together
    (`step`), and by the turn's tools (`turn: click + write`); the model's side (encoding the
    scripted step) is not timed. Returns the turns whose feedback was an error."""
    steps = [step for step in task.script("solution") if step.kind == "call"]
    browser = session_of(box).browser
    harness.opening(box)
    errors, index = 0, 0
    while index < turns:
        for step in steps:
            if index >= turns:
                break
            reply = harness.encode(step, index)
            actions = harness.parse(reply)
            if any(action.is_submit for action in actions):  # the script's target was not found
                errors += 1
                continue
            began = time.perf_counter()
            feedback = [harness.execute(action, box, task.workdir) for action in actions]
            acted = time.perf_counter()
            harness.after_actions(box)
            ended = time.perf_counter()
            errors += any(line.startswith("Error:") for line in feedback)
            times["actions"].append(acted - began)
            times["observation"].append(ended - acted)
            times["step"].append(ended - began)
            times.setdefault("turn: " + " + ".join(action.name for action in actions), []).append(ended - began)
            index += 1
        browser.goto(task.start_url())  # the next round starts at the start page again: not timed
        browser.settle()
    return errors


def bare_costs(box: Sandbox, runs: int) -> dict[str, dict[str, float]]:
    """The floors of a step in the same sandbox: one CDP round trip, a bare click (no settle,
    no observation) on a spot with nothing to click, a bare screenshot."""
    browser = session_of(box).browser
    spot = next(
        (point for point in ((1270.0, 990.0), (5.0, 990.0), (1270.0, 500.0)) if browser.element_at(*point) is None),
        None,
    )
    figures = {}
    for name, call in (
        ("evaluate", lambda: browser.evaluate("1")),
        ("click", (lambda: browser.click(*spot)) if spot else (lambda: browser.hover(5.0, 5.0))),
        ("screenshot", browser.screenshot),
    ):
        for _ in range(5):
            call()
        figures[name if spot or name != "click" else "hover"] = _ms([_timed(call)[1] for _ in range(runs)])
    return figures


# --- starts ----------------------------------------------------------------------------------


def cold_starts(client: Client, image: str, task: GuiTask, runs: int, relaunches: int) -> dict[str, list[float]]:
    """Sandbox created (no init: nothing runs in it yet), site started, Chromium launched, start
    page, first screenshot, `runs` times (each sandbox deleted after); then `relaunches` second
    launches in each (`relaunch: ...`)."""
    times: dict[str, list[float]] = defaultdict(list)
    for _ in range(runs):
        began = time.perf_counter()
        box = client.create(image, **type(task).limits)
        try:
            times["create"].append(time.perf_counter() - began)
            _to_screenshot(box, task, times, began)
            for _ in range(relaunches):
                _to_screenshot(box, task, times, time.perf_counter(), prefix="relaunch: ", serve=False)
        finally:
            box.delete()
    return times


def _to_screenshot(
    box: Sandbox, task: GuiTask, times: dict[str, list[float]], began: float, *, prefix: str = "", serve: bool = True
) -> None:
    """The site started (unless `serve` is False), `Browser.launch`, the start page opened and
    settled, a screenshot: each phase in `times` under `prefix`, and `total` from `began`. The
    browser context is closed after, untimed."""
    if serve:
        times[f"{prefix}serve"].append(_timed(lambda: task.serve(box))[1])
    browser, took = _timed(lambda: Browser.launch(box, viewport=task.viewport))
    with browser:
        times[f"{prefix}launch"].append(took)
        times[f"{prefix}page"].append(_timed(lambda: (browser.goto(task.start_url()), browser.settle()))[1])
        times[f"{prefix}screenshot"].append(_timed(browser.screenshot)[1])
        times[f"{prefix}total"].append(time.perf_counter() - began)


def pool_supported() -> bool:
    """Whether the environment layer can keep sandboxes whose Chromium already runs."""
    return "init" in {f.name for f in dataclasses.fields(SandboxSpec)} and hasattr(GuiTask, "sandbox_init")


def pooled_starts(client: Client, image: str, task: GuiTask, runs: int) -> dict[str, list[float]]:
    """From a warm pool of the task's sandboxes (`sandbox_args`: its limits and its init, which
    starts Chromium), as `orchard eval` keeps one: `task_sandbox`, the site, `launch`, start page,
    screenshot. The pool is filled with `runs` sandboxes first and then stops refilling, so no
    refill competes for the cores while a run is timed (in an eval it would)."""
    from orchard.tasks.base import sandbox_args, task_sandbox

    args = sandbox_args(task)
    client.warm(image, runs, **args)
    pools = client._manager.pools  # type: ignore[union-attr]  # embedded: this process's pools
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if any(spec.init == args.get("init") and ready >= runs for spec, _size, ready in pools.sizes()):
            break
        time.sleep(0.1)
    client.warm(image, 0, **args)  # the ready ones stay until taken
    time.sleep(2.0)  # the last Chromium's start-up work done, as in a pool that has waited a while
    times: dict[str, list[float]] = defaultdict(list)
    for _ in range(runs):
        began = time.perf_counter()
        box = task_sandbox(client, task, image)
        try:
            times["create"].append(time.perf_counter() - began)
            _to_screenshot(box, task, times, began)
        finally:
            box.delete()
    return times


# --- browsers at once ------------------------------------------------------------------------


def at_once(boxes: list[Sandbox], task: GuiTask, turns: int) -> tuple[list[float], int]:
    """All `boxes` playing the solution through `computer` at once, `turns` turns each: every
    turn's step time, and the turns that went wrong."""
    barrier = threading.Barrier(len(boxes))
    results: list[dict[str, list[float]]] = [{"actions": [], "observation": [], "step": []} for _ in boxes]
    errors = [0] * len(boxes)
    failures: list[BaseException] = []

    def work(index: int) -> None:
        try:
            barrier.wait()
            errors[index] = play(boxes[index], task, ComputerHarness(), turns, results[index])
        except BaseException as exc:  # reported after the others finish
            failures.append(exc)

    threads = [threading.Thread(target=work, args=(index,)) for index in range(len(boxes))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if failures:
        raise failures[0]
    return [t for result in results for t in result["step"]], sum(errors)


# --- the run ---------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="a smaller run (about a minute)")
    parser.add_argument("--steps", type=int, default=None, help="turns timed per harness (default 50; quick 15)")
    parser.add_argument("--cold", type=int, default=None, help="cold starts (default 5; quick 2)")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    steps = args.steps or (15 if args.quick else 50)
    cold = args.cold or (2 if args.quick else 5)
    counts = COUNTS[:3] if args.quick else COUNTS
    turns_each = 10 if args.quick else 15
    print(f"load average at start: {_load()}  ({os.cpu_count()} CPUs)", flush=True)
    from orchard.recipes.gui.image import build_image

    image = build_image()
    task = next(t for t in load_tasks(ROOT / "examples/gui/tasks.json") if t.instance_id == TASK_ID)
    figures: dict[str, Any] = {"load_start": os.getloadavg()}
    started = time.perf_counter()
    with Client() as client:
        print(f"cold starts ({cold}) ...", flush=True)
        starts = cold_starts(client, image, task, cold, relaunches=2)
        figures["cold"] = {name: _ms(values) for name, values in starts.items()}
        if pool_supported():
            print(f"warm-pool starts ({cold}) ...", flush=True)
            figures["pool"] = {name: _ms(values) for name, values in pooled_starts(client, image, task, cold).items()}
        print(f"{max(counts)} browser sandboxes for the steps ...", flush=True)
        boxes = [client.create(image, **type(task).limits) for _ in range(max(counts))]
        for box in boxes:
            task.start(box)
        try:
            figures["bare"] = bare_costs(boxes[0], 50)
            for harness in (ComputerHarness(), BidHarness()):
                print(f"steps through {harness.name} ({steps}) ...", flush=True)
                times: dict[str, list[float]] = {"actions": [], "observation": [], "step": []}
                errors = play(boxes[0], task, harness, steps, times)
                figures[harness.name] = {name: _ms(values) for name, values in times.items()} | {"errors": errors}
            figures["at_once"] = {}
            for count in counts:
                print(f"{count} browser(s) at once ...", flush=True)
                times_at, errors = at_once(boxes[:count], task, turns_each)
                figures["at_once"][count] = _ms(times_at) | {"errors": errors}
        finally:
            for box in boxes:
                task.conclude(box, [], [])
    figures["wall_s"] = time.perf_counter() - started
    figures["load_end"] = os.getloadavg()
    report(figures)
    print(f"load average at end: {_load()}; the bench took {figures['wall_s']:.0f} s")
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2))
    summary: dict[str, Any] = {
        key: figures[key] for key in ("cold", "computer", "bid", "bare", "at_once") if key in figures
    }
    print(f"recorded as run {record_bench('gui', vars(args) | {'json': str(args.json)}, summary)}")


def report(figures: dict[str, Any]) -> None:
    """The tables, the ratios to each baseline, the goals."""

    def row(name: str, figure: dict[str, float]) -> None:
        print(f"  {name:<58} {figure['p50']:>9.1f} {figure['p95']:>9.1f} {figure['n']:>4}")

    print(f"\n  {'what':<58} {'p50 ms':>9} {'p95 ms':>9} {'n':>4}")
    for harness in ("computer", "bid"):
        found = figures[harness]
        row(f"{harness}: step (actions + settle + observation)", found["step"])
        row(f"{harness}:   its actions (incl. settle)", found["actions"])
        row(f"{harness}:   its observation", found["observation"])
        for name in sorted(key for key in found if key.startswith("turn: ")):
            row(f"{harness}:   a turn of {name[6:]}", found[name])
    bare = figures["bare"]
    for name, figure in bare.items():
        row(f"baseline: bare {name} (CDP, no settle, no observation)", figure)
    cold = figures["cold"]
    starts = [("cold", "cold", ""), ("second launch", "cold", "relaunch: ")]
    starts += [("warm pool", "pool", "")] if "pool" in figures else []
    for label, key, prefix in starts:
        for name in ("create", "serve", "launch", "page", "screenshot"):
            if f"{prefix}{name}" in figures[key]:
                row(f"{label}: {name}", figures[key][f"{prefix}{name}"])
        row(f"{label}: to first screenshot", figures[key][f"{prefix}total"])
    one = figures["at_once"][1]["p50"]
    print(f"\n  {'browsers at once':<18} {'step p50 ms':>12} {'p95 ms':>9} {'x one':>7} {'errors':>7}")
    doubled = None
    for count, figure in figures["at_once"].items():
        ratio = figure["p50"] / one
        if doubled is None and ratio >= 2:
            doubled = count
        print(f"  {count:<18} {figure['p50']:>12.1f} {figure['p95']:>9.1f} {ratio:>6.2f}x {figure['errors']:>7}")
    counted = max(figures["at_once"])
    print(
        f"  the step p50 doubles at {doubled} browsers"
        if doubled
        else f"  the step p50 did not double up to {counted} browsers"
    )
    print()
    floor = bare.get("click", bare.get("hover"))["p50"]
    for harness in ("computer", "bid"):
        p50 = figures[harness]["step"]["p50"]
        print(
            f"  {harness} step p50 {p50:.1f} ms: goal < 150 ms {'met' if p50 < 150 else 'MISSED'};"
            f" {p50 / floor:.1f}x a bare click, {p50 / bare['evaluate']['p50']:.1f}x a bare evaluate"
        )
    total = cold["total"]["p50"]
    print(
        f"  cold sandbox to first screenshot p50 {total / 1000:.2f} s: goal < 1.5 s {'met' if total < 1500 else 'MISSED'};"
        f" {total / cold['create']['p50']:.1f}x a bare create"
    )
    relaunch = cold["relaunch: total"]["p50"]
    print(
        f"  second launch to first screenshot p50 {relaunch:.1f} ms: goal < 100 ms"
        f" {'met' if relaunch < 100 else 'MISSED'}; {relaunch / cold['launch']['p50']:.2f}x the cold launch alone"
    )
    if "pool" in figures:
        pooled = figures["pool"]["total"]["p50"]
        print(
            f"  warm pool to first screenshot p50 {pooled:.1f} ms: goal < 100 ms {'met' if pooled < 100 else 'MISSED'};"
            f" {pooled / total:.2f}x the cold start, {pooled / figures['pool']['create']['p50']:.0f}x its hand-over"
        )
    else:
        print("  warm pool: not measured (the environment layer has no SandboxSpec.init / GuiTask.sandbox_init yet)")


if __name__ == "__main__":
    main()
