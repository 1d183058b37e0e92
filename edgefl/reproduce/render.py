"""What a reproduced table leaves for people: markdown beside the paper, and a PNG of the same."""

from __future__ import annotations

from pathlib import Path


def ours_text(cell: dict) -> str:
    if cell["mean"] is None:
        return "refused" if cell.get("error") else "-"
    text = f"{cell['mean']:.2f} +- {cell['std']:.2f} (n={cell['n']})"
    scopes = cell.get("scope") or {}
    if not scopes:
        return text
    # Part of the federation only: said first, so the number is not read as the paper's row.
    if len(scopes) == 1 and len(next(iter(scopes.values()))) == cell["n"]:
        return f"{next(iter(scopes))}: {text}"
    seeds = "; ".join(
        f"{s} (seed{'s' * (len(v) > 1)} {', '.join(map(str, v))})" for s, v in scopes.items()
    )
    return f"{seeds}: {text}"


def paper_text(cell: dict) -> str:
    return "-" if cell["paper"] is None else f"{cell['paper']:.2f}"


def gap_text(cell: dict) -> str:
    return "-" if cell["gap"] is None else f"{cell['gap']:+.2f}"


def table_markdown(summary: dict) -> str:
    lines = _heading(summary) + _settings_lines(summary) + _table_lines(summary)
    refused = {
        (r["method"], c["error"])
        for r in summary["rows"]
        for c in r["partitions"].values()
        if c["mean"] is None and c.get("error")
    }
    if refused:
        lines += ["", "Refused:", ""] + [f"- {m}: {e}" for m, e in sorted(refused)]
    if summary["notes"]:
        lines += ["", "Notes:", ""] + [f"- {n}" for n in summary["notes"]]
    lines += ["", "Cells (one `edgefl simulate` run each; its own results.md has the details):", ""]
    for c in summary["cells"]:
        when = "finished earlier" if c["skipped"] else "this run"
        lines.append(
            f"- {c['setting']} {c['partition']} seed {c['seed']}: "
            f"{c['seconds']['total']:.0f} s ({when}), `{c['dir']}`"
        )
    return "\n".join(lines) + "\n"


def partial_text(summary: dict) -> str:
    """Said wherever a table of fewer cells than its job asked for is shown: its means are over
    the seeds that finished, not the table's."""
    return (
        f"**Partial: {len(summary['cells'])} of {summary['cells_planned']} cells finished** "
        "(the run stopped or is still running); the command above finishes it, reusing them."
    )


def _heading(summary: dict) -> list[str]:
    """The title, the command and host that made the table, and its budget."""
    b = summary["budget"]
    lines = [
        f"# {summary['title']}",
        "",
        f"`{summary['command']}`: "
        f"{summary['date_utc']} UTC, {summary['host']['cpu_count']} CPU cores"
        + (f", {summary['host']['cuda']}" if summary["host"]["cuda"] else "")
        + f", torch {summary['host']['torch']}. Paper's numbers: {summary['source']}.",
        "",
        f"Budget **{b['name']}**: {b['description']} ({b['estimate']}).",
    ]
    if not summary.get("complete", True):  # (a table written before 2026-12-04 does not say)
        lines += ["", partial_text(summary)]
    if b["reductions"]:
        lines += ["Differs from the paper:", ""] + [f"- {r}" for r in b["reductions"]]
    return lines


def _settings_lines(summary: dict) -> list[str]:
    """The client settings the cells ran, one line each."""
    fed = summary["federation"]
    lines = [
        "",
        "Client settings"
        + (
            " (each method in its own paper's setting):"
            if fed == "own"
            else f" (every method on the {fed} federation):"
        ),
        "",
    ]
    for s in summary["settings"]:
        models = ", ".join(f"{p} {m}" for p, m in s["models"].items())
        lines.append(f"- **{s['name']}**: {models}. {s['description']}.")
    return lines


def _table_lines(summary: dict) -> list[str]:
    """The table itself: per method, ours | paper | gap for each partition."""
    parts = summary["partitions"]
    head = " | ".join(f"{p} edgefl | paper | gap" for p in parts)
    lines = ["", f"| method | setting | {head} |", "|---|---|" + "---:|---:|---:|" * len(parts)]
    for row in summary["rows"]:
        cells = [
            f"{ours_text(c)} | {paper_text(c)} | {gap_text(c)}"
            for c in (row["partitions"][p] for p in parts)
        ]
        lines.append(f"| {row['method']} | {row['setting']} | " + " | ".join(cells) + " |")
    return lines


def plot_table(summary: dict, path: Path) -> Path:
    """One panel per partition: our mean +- std per method, the paper's number marked on it."""
    from edgefl.plots import save_figure

    return save_figure(table_figure(summary), path)


def table_figure(summary: dict):
    """The Figure `plot_table` saves (tests read its axes)."""
    from edgefl.plots import accuracy_legend, draw_accuracy_bars, new_figure

    parts, rows = summary["partitions"], summary["rows"]
    names = [r["method"] for r in rows]
    fig = new_figure(max(5, 0.8 * len(names)) * len(parts), 3.8)
    axes = fig.subplots(1, len(parts), squeeze=False)[0]
    for ax, p in zip(axes, parts, strict=True):
        cells = [r["partitions"][p] for r in rows]
        draw_accuracy_bars(
            ax,
            names,
            [c["mean"] for c in cells],
            [c["paper"] for c in cells],
            err=[c["std"] for c in cells],
            label="edgefl (mean +- std)",
        )
        for x, c in enumerate(cells):
            if c["mean"] is None and c.get("error"):
                ax.text(x, 1, "refused", rotation=90, ha="center", va="bottom", fontsize=7)
        ax.set_title(p, loc="left")
    accuracy_legend(axes[-1], panels=axes)
    done = ""
    if not summary.get("complete", True):
        done = f"; partial: {len(summary['cells'])} of {summary['cells_planned']} cells"
    fig.suptitle(f"{summary['title']} (budget {summary['budget']['name']}{done})", fontsize=10)
    return fig
