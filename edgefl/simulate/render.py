"""What a simulation leaves for people: the results table (markdown), the accuracy bars, the
label heat map and the decoders' samples."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from edgefl.fusion import METHODS
from edgefl.progress import one_line, printable


def upload_bytes(method: str, client: str, models: dict, predictions: dict, out: Path) -> int:
    consumes = METHODS.get(method).consumes
    if "predictions" in consumes:
        return predictions.get(client, 0)
    if "prototypes" in consumes:
        path = out / "uploads-prototypes" / f"{client}.onnx"
        return path.stat().st_size if path.exists() else 0
    return models.get(client, 0)


def accuracy_text(row: dict) -> str:
    if row["accuracy"] is None:
        # One cell of a markdown table: the reason's lines joined, a "|" in it escaped.
        return "refused: " + one_line(row["error"]).replace("|", "\\|")
    text = f"{100 * row['accuracy']:.2f}"
    if row.get("scope"):  # the global model stands for part of the federation only
        text += f" ({row['scope']})"
    if row.get("standalone_accuracy") is not None:  # FedGH: local test splits, vs alone
        text += f" (local; standalone {100 * row['standalone_accuracy']:.2f})"
    return text


def val_acc_text(client: dict, unit: str = "") -> str:
    """A client's validation accuracy as the run reports it; for an attacker, its upload's on
    the true labels beside what its header claims (what its poisoned training measured)."""
    claimed = client["training"].get("val_accuracy")
    real = client.get("upload_val_accuracy")
    if real is not None:
        return f"{100 * real:.1f}{unit}" + (
            "" if claimed is None else f" (claims {100 * claimed:.1f}{unit})"
        )
    if claimed is None:
        return "-"
    return f"{100 * claimed:.1f}{unit}" + (" (claimed)" if client.get("attack") else "")


def seconds_text(s: float) -> str:
    """A stage's duration in a run's summary: tenths under 10 s (a small run's stages take
    fractions of a second, which whole seconds would show as 0 s)."""
    return f"{s:.1f} s" if s < 10 else f"{s:.0f} s"


def reused_text(seconds: dict) -> str:
    """On a resumed run: which stages' seconds are the recorded ones, and this run's own."""
    reused = seconds.get("reused")
    if not reused:
        return ""
    return (
        f" ({' and '.join(reused)} as recorded by the run that did the work: this rerun "
        f"reused its outputs, in {seconds_text(seconds.get('this_run', 0))})"
    )


def classes_markdown(rows: list[dict]) -> list[str]:
    """--for: each method's model per device class, with its accuracy beside the global one."""
    out = []
    for r in rows:
        classes = r.get("for_classes") or {}
        if "refused" in classes:
            out.append(f"| {r['method']} | - | refused: {printable(classes['refused'])} | - | - |")
            continue
        for name, c in classes.items():
            acc = f"{100 * c['accuracy']:.2f}" if c.get("accuracy") is not None else "-"
            out.append(
                f"| {r['method']} | {printable(name)} | {printable(c['model'])} | "
                f"{c['costs']['macs']:,} | {acc} |"
            )
    if not out:
        return []
    return [
        "",
        "A model for each device class (`--for`):",
        "",
        "| method | device class | model | MACs | accuracy (%) |",
        "|---|---|---|---:|---:|",
        *out,
    ]


def _privacy_lines(job: dict) -> list[str]:
    """What the clients released, said where the accuracies are read (a DP run's results.md
    read like a plain one's)."""
    dp, counts = job.get("dp"), job.get("label_counts") or "exact"
    if dp is None and counts == "exact":
        return []
    trained = f"DP-SGD at `--dp {_md(str(dp))}`" if dp is not None else "without DP"
    return [f"Clients trained {trained}; label counts {_md(str(counts))}.", ""]


def results_markdown(results: dict) -> str:
    j = results["job"]
    lines = [
        f"# edgefl simulate: {j['dataset']}, {j['clients']} clients, {j['partition']}, "
        f"mix {j['mix']}, seed {j['seed']}" + (" (paper models)" if j["paper_models"] else ""),
        "",
        f"Run {results['date_utc']} UTC; clients {seconds_text(results['seconds']['clients'])}, "
        f"fusion {seconds_text(results['seconds']['fusion'])}{reused_text(results['seconds'])}.",
        "",
        *_privacy_lines(j),
        "| method | accuracy (%) | paper (%) | fuse time (s) | upload bytes |",
        "|---|---:|---:|---:|---:|",
    ]
    for r in results["results"]:
        acc = accuracy_text(r)
        paper = f"{r['paper']:.2f}" if r.get("paper") is not None else "-"
        lines.append(
            f"| {r['method']} | {acc} | {paper} | {r['fuse_seconds']:.1f} | {r['upload_bytes']:,} |"
        )
    lines += classes_markdown(results["results"])
    verdicts = [
        (r["method"], what, x)
        for r in results["results"]
        for what, key in (("screened out", "screened"), ("robust", "robust_notes"))
        for x in r.get(key, [])
    ]
    if verdicts:
        lines += ["", "Robust screen (`--robust screen`):", ""]
        lines += [f"- {m}: {what} {_md(x)}" for m, what, x in verdicts]
    lines += [
        "",
        "| client | profile | role | model | val acc | upload bytes |",
        "|---|---|---|---|---:|---:|",
    ]
    for c in results["clients"]:
        who = c["client_id"] + (f" (user {c['user']})" if c.get("user") is not None else "")
        who += f" ({c['attack']} attacker)" if c.get("attack") else ""
        lines.append(
            f"| {who} | {c['profile']} | {c['role']} | {c['model']} | "
            f"{val_acc_text(c)} | {c['upload_bytes']:,} |"
        )
    return "\n".join(lines) + "\n"


def _md(text: str) -> str:
    """Text quoted from an upload, as markdown that shows it and renders nothing of it."""
    text = printable(text)
    return "".join("\\" + ch if ch in "\\`*_[]<>#|!~" else ch for ch in text)


def _stated_counts(clients: list[dict]) -> tuple[np.ndarray | None, str]:
    """(clients x classes label counts as the uploads state them, a note on those withheld by
    --label-counts absent: shown as zeros); None when no client states any."""
    stated = [c.get("label_counts") for c in clients]
    width = max((len(s) for s in stated if s), default=0)
    if not width:
        return None, ""
    note = "; withheld counts shown as 0" if not all(stated) else ""
    return np.array([s or [0] * width for s in stated]), note


def pictures(job, results: dict, out: Path) -> list[str]:
    """Draw the run's pictures; -> every file written (so the run can name them)."""
    from edgefl.client.sample import sample_grid
    from edgefl.data.plots import plot_label_heatmap
    from edgefl.plots import plot_accuracy_bars

    written = []
    rows = [r for r in results["results"] if r["accuracy"] is not None]
    if rows:
        plot_accuracy_bars(
            [r["method"] for r in rows],
            [r["accuracy"] for r in rows],
            out / "accuracy.png",
            title=f"{job.dataset} {job.partition}",
            reference=results["paper_reference"] or None,
        )
        written.append(str(out / "accuracy.png"))
    counts, withheld = _stated_counts(results["clients"])
    if counts is not None:
        plot_label_heatmap(
            counts,
            out / "label_distribution.png",
            title=f"{job.dataset} {job.partition}: labels per client{withheld}",
        )
        written.append(str(out / "label_distribution.png"))
    for c in results["clients"]:
        if c["role"] == "generator":
            grid = out / f"samples_{c['client_id']}.png"
            sample_grid(c["path"], per_class=8, out=str(grid))
            written.append(str(grid))
    return written
