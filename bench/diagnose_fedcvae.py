"""Why the CVAE clients' synthetic data trains a worse global model than their real data
(issue 15, item 1), on one `edgefl simulate` run of FedMHO's federation.

    python bench/diagnose_fedcvae.py --run RUN --partition dirichlet:0.5 --seed 0 --out F

Prints (and writes F.md): the label counts of every client and of the CVAE clients together;
each decoder's label fidelity per class (how often a judge, a `cnn` trained 3 epochs on all of
MNIST's training split, agrees with the label a sample was drawn for, for mean and Bernoulli
pixels); how a `cnn` trained from scratch on 5,000 samples does on the test split with each
synthetic label prior, against the same on the CVAE clients' real digits (the upper bound the
generators could reach); and how often the classifiers' teachers (FedMHO-MD's mean of logits,
fedmho-cw's class-weighted mixture) agree with the decoders' labels.
"""

from __future__ import annotations

import argparse
import datetime as dt
import sys
from pathlib import Path

import numpy as np
import torch

from edgefl.data import load_dataset
from edgefl.data.partition import partition
from edgefl.fusion import fedmho_cw
from edgefl.fusion.base import (
    allocate,
    decode,
    federation_label_counts,
    generate,
    largest_remainder,
    train_student,
)
from edgefl.fusion.teachers import teacher_logits
from edgefl.models.zoo import build_model, make_spec
from edgefl.server.ingest import ingest

CPU = torch.device("cpu")


def fresh_cnn(seed: int):
    torch.manual_seed(seed)
    return build_model(make_spec("cnn", (1, 28, 28), 10))


def accuracy(model, x, y) -> tuple[float, list[int]]:
    model.eval()
    with torch.no_grad():
        p = torch.cat([model(b).argmax(1) for b in x.split(2000)])
    per = [round(100 * float((p[y == c] == c).float().mean())) for c in range(10)]
    return round(100 * float((p == y).float().mean()), 2), per


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run", required=True, help="an `edgefl simulate` run directory")
    ap.add_argument("--partition", required=True, help="the run's --partition")
    ap.add_argument("--seed", type=int, required=True, help="the run's --seed")
    ap.add_argument("--out", required=True, help="report path without suffix")
    args = ap.parse_args()
    torch.set_num_threads(2)
    ups = ingest(str(Path(args.run) / "uploads"), max_upload_bytes=1 << 30).uploads
    dec = [u for u in ups if u.kind == "decoder"]
    cls = [u for u in ups if u.kind == "classifier"]
    held = np.stack([u.label_counts for u in dec]).sum(0)
    fed = federation_label_counts(ups, 10)
    train, test = load_dataset("mnist", "train"), load_dataset("mnist", "test")
    xt, yt = torch.from_numpy(test.x), torch.from_numpy(test.y).long()
    out = [
        f"# FedCVAE diagnosis: {args.run} ({dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M} UTC)",
        "",
        f"Command: `python bench/diagnose_fedcvae.py {' '.join(sys.argv[1:])}`",
        "",
        "## Label counts",
        "",
        "| client | kind | " + " | ".join(map(str, range(10))) + " |",
        "|---|---|" + "---:|" * 10,
    ]
    for u in ups:
        out.append(f"| {u.client_id} | {u.kind} | " + " | ".join(map(str, u.label_counts)) + " |")
    out.append("| CVAE clients | | " + " | ".join(map(str, held)) + " |")
    out.append("| federation | | " + " | ".join(map(str, fed)) + " |")

    judge = fresh_cnn(0)
    train_student(
        judge,
        torch.from_numpy(train.x),
        torch.from_numpy(train.y).long(),
        epochs=3,
        lr=1e-3,
        batch_size=64,
        seed=0,
        device=CPU,
    )
    j_acc, _ = accuracy(judge, xt, yt)
    gen = torch.Generator().manual_seed(0)
    for pixels in ("mean", "bernoulli"):
        out += [
            "",
            f"## Label fidelity, {pixels} pixels (judge: {j_acc}% on the test split)",
            "",
            "Share of 300 samples per class that the judge labels as drawn; - where the "
            "client holds none of the class.",
            "",
            "| decoder | " + " | ".join(map(str, range(10))) + " |",
            "|---|" + "---:|" * 10,
        ]
        for u in dec:
            row = []
            for c in range(10):
                if u.label_counts[c] == 0:
                    row.append("-")
                    continue
                x = decode(u, np.full(300, c), gen, CPU, pixels=pixels)
                with torch.no_grad():
                    row.append(f"{100 * float((judge(x).argmax(1) == c).float().mean()):.0f}")
            out.append(f"| {u.client_id} | " + " | ".join(row) + " |")

    out += [
        "",
        "## A cnn from scratch on 5,000 samples (20 epochs, Adam 1e-3), seed 0",
        "",
        "| training data | top-1 % | per class |",
        "|---|---:|---|",
    ]
    for name, weights in (("decoders", held), ("federation", fed * (held > 0))):
        x, y = generate(dec, allocate(dec, weights, 5000), 0, CPU, pixels="bernoulli")
        m = fresh_cnn(0)
        train_student(m, x, y, epochs=20, lr=1e-3, batch_size=64, seed=0, device=CPU)
        a, per = accuracy(m, xt, yt)
        out.append(f"| synthetic, Bernoulli pixels, class totals by the {name} | {a} | {per} |")
    parts = partition(train.y, 10, args.partition, args.seed, num_classes=10)
    idx = np.concatenate([parts[int(u.client_id.split("-")[-1])] for u in dec])
    rng, y_all = np.random.default_rng(0), train.y[idx]
    per_class = largest_remainder(5000, fed * (held > 0))
    for name, sel in (
        ("decoders", rng.choice(idx, 5000, replace=False)),
        (
            "federation",
            np.concatenate(
                [rng.choice(idx[y_all == c], per_class[c]) for c in range(10) if per_class[c]]
            ),
        ),
    ):
        m = fresh_cnn(0)
        train_student(
            m,
            torch.from_numpy(train.x[sel]),
            torch.from_numpy(train.y[sel]).long(),
            epochs=20,
            lr=1e-3,
            batch_size=64,
            seed=0,
            device=CPU,
        )
        a, per = accuracy(m, xt, yt)
        out.append(f"| the CVAE clients' real digits, class totals by the {name} | {a} | {per} |")

    x, y = generate(dec, allocate(dec, fed * (held > 0), 6000), 0, CPU, pixels="bernoulli")
    logits = torch.stack([teacher_logits(u, x, CPU) for u in cls])
    shares = fedmho_cw.class_shares(cls)
    rows = shares.t()[y]
    teachers = {
        "mean of the classifiers' logits (FedMHO-MD)": logits.mean(0),
        "class-weighted (fedmho-cw --opt teacher=class-weighted)": fedmho_cw.weighted_mixture(
            logits, shares
        ),
        "label-weighted (teacher=label-weighted)": fedmho_cw.weighted_mixture(
            logits, torch.ones_like(shares), rows
        ),
        "both (fedmho-cw's default)": fedmho_cw.weighted_mixture(logits, shares, rows),
    }
    out += ["", "## Teachers on 6,000 synthetic samples: agreement with the decoders' labels", ""]
    out += [
        f"- {name}: {100 * float((t.argmax(1) == y).float().mean()):.1f}%"
        for name, t in teachers.items()
    ]
    Path(args.out + ".md").write_text("\n".join(out) + "\n")
    print("\n".join(out))


if __name__ == "__main__":
    main()
