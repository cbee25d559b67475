"""The run's Markdown report, with PNG plots, written next to the run's JSON files."""

from __future__ import annotations

from pathlib import Path
from typing import Any

OUTCOME_ORDER = ["resolved", "unresolved", "empty_patch", "patch_failed", "timeout", "error"]


def write_report(folder: Path, summary: dict[str, Any], title: str) -> Path:
    """`report.md` plus `resolve_rate.png` and `outcomes.png` in `folder`; the Markdown's path."""
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
        lines.append(
            f"| {name} | {row['resolved']}/{row['attempts']} | {row['resolve_rate']:.1%} |{score} {flagged(row)} "
            f"| {row['pass_at_k'][k]:.1%} (k={k}) | {row['pass_hat_k'][k]:.1%} | {row['mean_steps']:.1f} "
            f"| {row['mean_tokens']:.0f} | {outcomes} |"
        )
    report = summary["report"]
    lines += [
        "",
        f"SWE-bench report (first harness, sample 0): {report['resolved_instances']} of "
        f"{report['total_instances']} resolved, {report['error_instances']} errors, "
        f"{report['empty_patch_instances']} empty patches (`report.json`).",
        "",
    ]
    flagged_attempts = summary.get("suspicious") or []
    if flagged_attempts:
        lines += ["## Suspicious attempts", ""]
        lines += ["The grader flagged these: their patches reach for the test run. A resolved one counts as resolved"]
        lines += ["above; check it before trusting it.", ""]
        lines += [f"* `{a['id']}` ({a['outcome']}): {'; '.join(a['reasons'])}" for a in flagged_attempts]
        lines.append("")
    lines += [f"![{plot.stem}]({plot.name})" for plot in plots]
    path = folder / "report.md"
    path.write_text("\n".join(lines) + "\n")
    return path


def flagged(row: dict[str, Any]) -> str:
    """A harness row's suspicious attempts: `2 (1 resolved)`, or `0` (`-` for runs made before the count)."""
    if "suspicious" not in row:
        return "-"
    count, resolved = row["suspicious"], row.get("suspicious_resolved", 0)
    return f"{count} ({resolved} resolved)" if count else "0"


def _plots(folder: Path, harnesses: dict[str, Any]) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(harnesses)
    rate_path, outcome_path = folder / "resolve_rate.png", folder / "outcomes.png"
    fig, ax = plt.subplots(figsize=(max(3.0, 1.2 * len(names) + 1), 3))
    ax.bar(names, [harnesses[n]["resolve_rate"] * 100 for n in names], color="#4c8c4a")
    ax.set_ylabel("resolved %")
    ax.set_ylim(0, 100)
    ax.set_title("Resolve rate by harness")
    fig.tight_layout()
    fig.savefig(rate_path, dpi=100)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(max(3.0, 1.2 * len(names) + 2), 3))
    bottom = [0] * len(names)
    for kind in OUTCOME_ORDER:
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
    return [rate_path, outcome_path]
