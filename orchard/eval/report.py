"""What a run writes in its folder besides its JSON summaries: each attempt's files, and the
Markdown report with PNG plots.

Each attempt's files are in SWE-bench's layout (`logs/<instance_id>/`, `attempt_folder`): the
submission (its kind's `submission_file`: `patch.diff` for SWE, else `submission.txt`),
`test_output.txt` (the grader's whole log, up to `LOG_FILE_LIMIT`; the store keeps only its
tail), `report.json` (its kind's `attempt_report`: for SWE, SWE-bench's per-instance report; for
other kinds, the grade), and `run_instance.log` (the outcome and why).
A run that makes several attempts at a task (harnesses, samples) files each in a folder of its
own below the task's, `<harness>-<sample>`. Every file is written whole or not at all.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from orchard.tasks.base import Grade, TaskBase

OUTCOME_ORDER = ["resolved", "unresolved", "unsafe", "empty_patch", "patch_failed", "timeout", "error"]
LOG_FILE_LIMIT = 64 * 1024 * 1024
"""Bytes of an attempt's log written to its `test_output.txt`; a longer one keeps its head and tail."""
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")


def attempt_folder(instance_id: str, harness: str, sample: int, *, single: bool) -> str:
    """Where an attempt's files are in its run's folder: `logs/<instance_id>` for a run's only
    attempt at a task (SWE-bench's layout), else `logs/<instance_id>/<harness>-<sample>`."""
    task = f"logs/{_name(instance_id)}"
    return task if single else f"{task}/{_name(harness)}-{sample}"


def _name(text: str) -> str:
    """`text` as one safe path part: itself when it is one, else a readable form and a short hash."""
    if _UNSAFE.search(text) is None and text not in ("", ".", ".."):
        return text
    return f"{_UNSAFE.sub('_', text)[-80:]}-{hashlib.sha256(text.encode()).hexdigest()[:8]}"


def write_attempt(folder: Path, task: TaskBase, grade: Grade, submission: str, details: dict[str, Any]) -> None:
    """An attempt's files in `folder` (made if missing): its submission, whole log, report and summary."""
    folder.mkdir(parents=True, exist_ok=True)
    _write(folder / task.submission_file, _bytes(submission))
    report = task.attempt_report(grade, submission, details)
    _write(folder / "test_output.txt", _bounded(_bytes(grade.log)))
    _write(folder / "report.json", (json.dumps(report, indent=2) + "\n").encode())
    lines: list[str] = []
    for key in ("outcome", "error", "solver_error", "episode"):
        value = details.get(key)
        if value and not any(line.endswith(f": {value}") for line in lines):  # the solver's error is often the grade's
            lines.append(f"{key}: {value}")
    lines += [f"suspicious: {reason}" for reason in grade.suspicious]
    lines += [f"warning: {warning}" for warning in grade.checks.get("warnings", [])]
    _write(folder / "run_instance.log", ("\n".join(lines) + "\n").encode())


def _bytes(text: str) -> bytes:
    """UTF-8; a character that has none (a lone surrogate) as `?`."""
    return text.encode(errors="replace")


def _bounded(data: bytes) -> bytes:
    if len(data) <= LOG_FILE_LIMIT:
        return data
    half = LOG_FILE_LIMIT // 2
    return data[:half] + f"\n[orchard: {len(data) - 2 * half} bytes left out]\n".encode() + data[-half:]


def _write(path: Path, data: bytes) -> None:
    """`data` as the file `path`, whole or not at all (a temporary file renamed over it)."""
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(handle, "wb") as out:
            out.write(data)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def write_report(folder: Path, summary: dict[str, Any], title: str) -> Path:
    """`report.md` plus `resolve_rate.png`, `outcomes.png` and `steps_tokens.png` in `folder`; the Markdown's path."""
    harnesses = summary["harnesses"]
    scored = summary.get("metric") == "score"
    plots = _plots(folder, harnesses) if harnesses else []
    lines = [
        f"# {title}",
        "",
        f"| harness | resolved | rate |{' score |' if scored else ''} suspicious | pass@k | pass^k | steps | tokens | outcomes |",
    ]
    lines.append("|---|---|---|" + ("---|" if scored else "") + "---|---|---|---|---|---|")
    for name, row in harnesses.items():
        k = str(len(row["pass_at_k"]))
        outcomes = ", ".join(f"{kind} {count}" for kind, count in row["outcomes"].items())
        score = f" {row['mean_score']:.3f} |" if scored else ""
        passes = f"{row['pass_at_k'][k]:.1%} (k={k}) | {row['pass_hat_k'][k]:.1%}" if k != "0" else "- | -"
        resolved, rate = graded_cells(row)
        lines.append(
            f"| {name} | {resolved} | {rate} |{score} {flagged(row)} | {passes} | {row['mean_steps']:.1f} "
            f"| {row['mean_tokens']:.0f} | {outcomes} |"
        )
    causes = summary.get("machine_errors") or {}
    if causes:
        lines += ["", "**Machine errors** (not verdicts on the model: left out of the rates above):", ""]
        lines += [f"* {count} attempt{'s' if count > 1 else ''}: {cause}" for cause, count in causes.items()]
    report = summary["report"]
    lines += [
        "",
        f"SWE-bench report (first harness, sample 0): {report['resolved_instances']} of "
        f"{report['total_instances']} resolved, {report['error_instances']} errors, "
        f"{report['empty_patch_instances']} empty patches (`report.json`); each attempt's patch, whole "
        "test log and report are in `logs/`.",
        "",
    ]
    errors = sum(row["outcomes"].get("error", 0) for row in harnesses.values())
    if errors:
        why = "the task or the machine failed, not the model"
        again = "the same command tries those the machine failed again, up to twice each"
        lines += [f"{errors} attempts are errors ({why}): {again}.", ""]
    flagged_attempts = summary.get("suspicious") or []
    if flagged_attempts:
        lines += ["## Suspicious attempts", ""]
        lines += ["The grader flagged these: their patches reach for the test run. A resolved one counts as resolved"]
        lines += ["above; check it before trusting it.", ""]
        lines += [f"* `{a['id']}` ({a['outcome']}): {'; '.join(a['reasons'])}" for a in flagged_attempts]
        lines.append("")
    lines += _task_section(summary.get("tasks") or {})
    lines += _effort_section(harnesses)
    lines += _image_section(summary.get("images") or {})
    lines += [f"![{plot.stem}]({plot.name})" for plot in plots]
    path = folder / "report.md"
    path.write_text("\n".join(lines) + "\n")
    return path


def outcome_cell(records: Sequence[Any]) -> str:
    """A task's attempts under one harness in a table's cell: its outcome, or `resolved 2/3` where
    it had several samples; `-` for none."""
    if not records:
        return "-"
    if len(records) == 1:
        return str(records[0].outcome)
    return f"resolved {sum(bool(r.resolved) for r in records)}/{len(records)}"


def _task_section(tasks: dict[str, dict[str, str]]) -> list[str]:
    """The report's per-task table: each task's outcome under each harness."""
    if not tasks:
        return []
    harnesses = sorted({h for row in tasks.values() for h in row})
    lines = ["## Per task", "", f"| task | {' | '.join(harnesses)} |", "|---|" + "---|" * len(harnesses)]
    lines += [f"| {task} | {' | '.join(row.get(h, '-') for h in harnesses)} |" for task, row in sorted(tasks.items())]
    return [*lines, ""]


def _effort_section(harnesses: dict[str, Any]) -> list[str]:
    """How many steps and tokens the graded attempts took, per harness: median, quartiles, range."""
    rows = [(name, row) for name, row in harnesses.items() if row.get("steps")]
    if not rows:
        return []
    lines = ["## Steps and tokens", "", "Graded attempts: median [25th-75th percentile] (least-most).", ""]
    lines += ["| harness | steps | tokens |", "|---|---|---|"]
    for name, row in rows:
        cells = [
            f"{s['median']:.{digits}f} [{s['p25']:.{digits}f}-{s['p75']:.{digits}f}] ({s['min']:.0f}-{s['max']:.0f})"
            for s, digits in ((row["steps"], 1), (row["tokens"], 0))
        ]
        lines.append(f"| {name} | {cells[0]} | {cells[1]} |")
    return [*lines, ""]


def _parts(build: dict[str, float]) -> list[str]:
    """The parts a kind times its image builds by (SWE: base, interpreter, dependencies, repository)."""
    return [part for part in build if part not in ("total", "at")]


def _build_text(build: dict[str, float]) -> str:
    return " / ".join(f"{build[part]:.0f}" for part in _parts(build)) + f" = {build.get('total', 0):.0f} s"


def _image_section(images: dict[str, dict[str, Any]]) -> list[str]:
    """The report's table of the run's task images: the Python asked for and run on, how long
    this run took to have each, and how long each took to build, part by part."""
    described = {i: f for i, f in sorted(images.items()) if f.get("python") or f.get("build")}
    if not described:
        return []
    lines = ["## Task images", ""]
    lines += ["Python: asked for, then run on; build: seconds by part (base / interpreter / dependencies /"]
    lines += ["repository = total) where this machine built the image; this run: seconds to build or find it.", ""]
    lines += ["| task | Python | build | this run |", "|---|---|---|---|"]
    for task, facts in described.items():
        python = facts.get("python") or {}
        asked, ran = python.get("asked") or "-", python.get("ran") or "-"
        mark = " (other)" if python.get("other") else ""
        build = _build_text(facts["build"]) if facts.get("build") else "-"
        lines.append(f"| {task} | {asked} → {ran}{mark} | {build} | {facts.get('seconds', 0):.0f} |")
    others = [task for task, facts in described.items() if (facts.get("python") or {}).get("other")]
    if others:
        why = "their warnings say how that is made up for"
        listed = ", ".join(f"`{task}`" for task in others)
        lines += ["", f"{len(others)} ran on another Python than they ask for ({why}): {listed}."]
    return [*lines, ""]


def image_lines(images: dict[str, dict[str, Any]]) -> list[str]:
    """The console's lines on a run's task images: each built in this run, part by part, and
    each that ran on another Python than it asks for."""
    lines = []
    for task, facts in sorted(images.items()):
        build = facts.get("build")
        if build and facts.get("built"):
            parts = ", ".join(f"{part} {build[part]:.0f} s" for part in _parts(build) if build[part] >= 0.5)
            lines.append(f"image of {task}: built in {build['total']:.0f} s ({parts or 'no part took a second'})")
        python = facts.get("python") or {}
        if python.get("other"):
            lines.append(f"{task} asks for Python {python['asked']} and ran on {python['ran']} (see its warnings)")
    return lines


def graded_cells(row: dict[str, Any]) -> list[str]:
    """A harness row's `resolved/graded` and its rate: attempts that a machine error ended are
    not counted (they are shown beside); `-` where none was graded."""
    graded = row.get("graded", row["attempts"])
    return [f"{row['resolved']}/{graded}", f"{row['resolve_rate']:.1%}" if graded else "-"]


def flagged(row: dict[str, Any]) -> str:
    """A harness row's suspicious attempts: `2 (1 resolved)`, or `0` (`-` for runs made before the count)."""
    if "suspicious" not in row:
        return "-"
    count, resolved = row["suspicious"], row.get("suspicious_resolved", 0)
    return f"{count} ({resolved} resolved)" if count else "0"


def rate_chart(
    path: Path, labels: list[str], rates: list[float], title: str, intervals: list[tuple[float, float]] | None = None
) -> None:
    """A bar chart of rates (0..1) as percentages, with their intervals as error bars where given."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(max(3.0, 1.3 * len(labels) + 1), 3.2))
    errors = None
    if intervals is not None:
        errors = [
            [max(0.0, (r - low) * 100) for r, (low, _) in zip(rates, intervals, strict=True)],
            [max(0.0, (high - r) * 100) for r, (_, high) in zip(rates, intervals, strict=True)],
        ]
    ax.bar(labels, [r * 100 for r in rates], yerr=errors, capsize=4, color="#4c8c4a")
    ax.set_ylabel("resolved %" + (" (95% interval)" if intervals is not None else ""))
    ax.set_ylim(0, 100)
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _plots(folder: Path, harnesses: dict[str, Any]) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(harnesses)
    rate_path, outcome_path = folder / "resolve_rate.png", folder / "outcomes.png"
    rate_chart(rate_path, names, [harnesses[n]["resolve_rate"] for n in names], "Resolve rate by harness")

    fig, ax = plt.subplots(figsize=(max(3.0, 1.2 * len(names) + 2), 3))
    bottom = [0] * len(names)
    found = {kind for n in names for kind in harnesses[n]["outcomes"]}
    for kind in [*OUTCOME_ORDER, *sorted(found - set(OUTCOME_ORDER))]:  # a kind's own outcomes too (`failed`)
        counts = [harnesses[n]["outcomes"].get(kind, 0) for n in names]
        if any(counts):
            ax.bar(names, counts, bottom=bottom, label=kind)
            bottom = [b + c for b, c in zip(bottom, counts, strict=True)]
    ax.set_ylabel("attempts")
    ax.set_title("Outcomes by harness")
    ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1, 1))
    fig.tight_layout()
    fig.savefig(outcome_path, dpi=100)
    plt.close(fig)
    drawn = [n for n in names if harnesses[n].get("steps")]
    if not drawn:
        return [rate_path, outcome_path]
    effort_path = folder / "steps_tokens.png"
    fig, axes = plt.subplots(1, 2, figsize=(max(5.0, 1.6 * len(drawn) + 3), 3))
    for ax, key in zip(axes, ("steps", "tokens"), strict=True):
        boxes = [
            {"label": n, "med": s["median"], "q1": s["p25"], "q3": s["p75"], "whislo": s["min"], "whishi": s["max"]}
            for n in drawn
            for s in [harnesses[n][key]]
        ]
        ax.bxp(boxes, showfliers=False)
        ax.set_title(f"{key.capitalize()} per graded attempt")
    fig.tight_layout()
    fig.savefig(effort_path, dpi=100)
    plt.close(fig)
    return [rate_path, outcome_path, effort_path]
