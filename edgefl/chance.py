"""Saying so when a model is at or near chance, with the likely cause: a table that prints 10.00%
for a 10-class task and nothing else leaves a user to guess whether the method or the setup failed.
"""

from __future__ import annotations

import math

NEAR = 1.5  # "near chance": below 1.5 x the accuracy of guessing one class


def near_chance(accuracy: float | None, num_classes: int) -> bool:
    return (
        accuracy is not None
        and num_classes > 1
        and math.isfinite(accuracy)
        and accuracy < NEAR / num_classes
    )


def _level(accuracy: float, num_classes: int) -> str:
    return f"{100 * accuracy:.2f}% is at or near chance ({100 / num_classes:.0f}% for {num_classes} classes)"


def global_warning(
    method: str, accuracy: float, num_classes: int, classifier_val: list[float]
) -> str:
    """A fused model near chance: weak classifiers in, or a fusion that did not learn."""
    weak = [a for a in classifier_val if math.isfinite(a)]
    if weak and max(weak) < 0.6:
        cause = (
            f"the classifiers it used are weak themselves ({100 * min(weak):.1f}-"
            f"{100 * max(weak):.1f}% on their own validation data): train them longer "
            "(client train --epochs, simulate --classifier-epochs) or on more data"
        )
    else:
        cause = (
            f"{method} itself did not learn from these uploads: see its loss history in the "
            "report and try more global epochs or another method"
        )
    return f"{method}: {_level(accuracy, num_classes)}; likely cause: {cause}"


def client_warning(
    client: str, accuracy: float, num_classes: int, samples: int, dp: dict | None = None
) -> str:
    """A client classifier near chance on its own validation data; `dp`: the DP-SGD plan it
    trained with (its noise, not its epochs, is then the first suspect)."""
    cause = (
        "too few epochs for this model and learning rate, or too little data "
        f"({samples:,} training samples): try more --epochs, a smaller model, or more data"
    )
    if dp:
        cause = (
            f"DP-SGD's noise at epsilon {dp['epsilon']:g} (noise multiplier "
            f"{dp['noise_multiplier']:.3g} on {samples:,} training samples): try a larger "
            "--dp epsilon or a larger --dp batch, or more data"
        )
    return f"{client}: validation {_level(accuracy, num_classes)}; likely cause: {cause}"


def classifier_warnings(clients: list[dict]) -> list[str]:
    """A warning for every classifier client near chance on its own validation data, from its
    summary (`ClientResult.as_dict()`, or a resumed upload's: role, client_id, training,
    label_counts)."""
    out = []
    for c in clients:
        acc, counts = c["training"].get("val_accuracy"), c.get("label_counts")
        # Without counts (--label-counts absent): the classes the summary states. The samples
        # are those it trained on (the counts hold the validation ones too, and may be noised).
        classes = len(counts) if counts else c.get("num_classes")
        samples = c["training"].get("samples") or (sum(counts) if counts else 0)
        if c["role"] == "classifier" and classes and near_chance(acc, classes):
            dp = (c.get("privacy") or {}).get("dp_sgd")
            out.append(client_warning(c["client_id"], acc, classes, samples, dp))
    return out
