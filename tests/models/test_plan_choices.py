"""The planner's choice for every shipped profile on MNIST and HAPT, pinned: a change to the
cost model (the upload file's size in the storage budget, a runtime-aware estimate) must not move
a choice silently. A change that should move one edits this table and says why: the training memory
counted step by step (Costs.train_bytes, bench/results/train_memory.md) moved the mcu's and the
wristband's small picks."""

from __future__ import annotations

import pytest

from edgefl.data.registry import DATASETS
from edgefl.models.plan import plan, plan_inference, ratio_text
from edgefl.models.zoo import spec_label
from edgefl.profiles import get_profile

# profile -> dataset -> (auto, classifier, generator, inference): the planner at 98b63c6 (before the
# upload file entered the storage budget and the TFLite Micro estimate) gave exactly these.
CHOICES = {
    "jetson-orin-nano": {
        "hapt": (
            "classifier cnn1d(width=64)",
            "classifier cnn1d(width=64)",
            "generator cvae1d(hidden=256,width=32)",
            "cnn1d(width=64)",
        ),
        "mnist": ("classifier vgg9", "classifier vgg9", "generator cvae-large", "vgg9"),
    },
    "mcu": {
        "hapt": (
            "generator cvae-mlp(hidden=24)",
            "classifier cnn1d(width=4)",
            "generator cvae-mlp(hidden=24)",
            "cnn1d(width=24)",
        ),
        "mnist": (
            "generator cvae-mlp(hidden=8)",
            "classifier mlp(hidden=16)",
            "generator cvae-mlp(hidden=8)",
            "scnn(width=16)",
        ),
    },
    "raspberry-pi-5": {
        "hapt": (
            "classifier cnn1d(width=64)",
            "classifier cnn1d(width=64)",
            "generator cvae1d(hidden=256,width=32)",
            "cnn1d(width=64)",
        ),
        "mnist": ("classifier vgg9", "classifier vgg9", "generator cvae-large", "vgg9"),
    },
    "server-gpu": {
        "hapt": (
            "classifier cnn1d(width=64)",
            "classifier cnn1d(width=64)",
            "generator cvae1d(hidden=256,width=32)",
            "cnn1d(width=64)",
        ),
        "mnist": ("classifier vgg9", "classifier vgg9", "generator cvae-large", "vgg9"),
    },
    "smartphone": {
        "hapt": (
            "classifier cnn1d(width=64)",
            "classifier cnn1d(width=64)",
            "generator cvae1d(hidden=256,width=32)",
            "cnn1d(width=64)",
        ),
        "mnist": ("classifier vgg9", "classifier vgg9", "generator cvae-large", "vgg9"),
    },
    "smartwatch": {
        "hapt": (
            "classifier cnn1d(width=64)",
            "classifier cnn1d(width=64)",
            "generator cvae1d(hidden=256,width=32)",
            "cnn1d(width=64)",
        ),
        "mnist": (
            "generator cvae-large",
            "classifier scnn(width=64)",
            "generator cvae-large",
            "scnn(width=64)",
        ),
    },
    "wristband": {
        "hapt": (
            "generator cvae1d(hidden=48,width=6)",
            "classifier cnn1d(width=8)",
            "generator cvae1d(hidden=48,width=6)",
            "cnn1d(width=48)",
        ),
        "mnist": (
            "generator cvae-mlp(hidden=24)",
            "classifier mlp",
            "generator cvae-mlp(hidden=24)",
            "scnn(width=48)",
        ),
    },
}


def _choices(profile: str, dataset: str) -> tuple[str, ...]:
    p, info = get_profile(profile), DATASETS.get(dataset)
    out = []
    for role in ("auto", "classifier", "generator"):
        chosen = plan(p, info, role=role)
        out.append(f"{chosen.role} {spec_label(chosen.spec)}")
    out.append(spec_label(plan_inference(p, info.input_shape, info.num_classes)))
    return tuple(out)


@pytest.mark.parametrize("profile, dataset", [(p, d) for p in CHOICES for d in CHOICES[p]])
def test_planner_choices_are_pinned(profile, dataset):
    assert _choices(profile, dataset) == CHOICES[profile][dataset]


@pytest.mark.parametrize(
    "need, have, text",
    [
        (1.04, 1, "x1.04"),
        (1.004, 1, "x1.004"),
        (1.0004, 1, "x1.0004"),
        (3.5, 1, "x3.50"),
        (0.5, 1, "x0.50"),
        (1, 1, "x1.00"),
    ],
)
def test_ratio_text_never_shows_a_misfit_as_one(need, have, text):
    assert ratio_text(need, have) == text
