"""Published numbers to print beside ours. FedMHO paper, Table 3, MNIST Top-1 (%), 10 clients."""

FEDMHO_TABLE3_MNIST = {
    0.5: {"fedavg": 85.91, "feddf": 88.73, "dense": 90.51, "co-boosting": 91.42,
          "fedcvae-ens": 92.61, "fedmho": 93.45, "fedmho-md": 95.71, "fedmho-sd": 95.67},
    0.3: {"fedavg": 74.57, "feddf": 78.46, "dense": 86.12, "co-boosting": 89.27,
          "fedcvae-ens": 91.37, "fedmho": 92.43, "fedmho-md": 93.98, "fedmho-sd": 94.25},
    0.1: {"fedavg": 49.12, "feddf": 62.58, "dense": 73.76, "co-boosting": 81.30,
          "fedcvae-ens": 89.73, "fedmho": 88.48, "fedmho-md": 91.22, "fedmho-sd": 91.55},
}  # fmt: skip


def paper_reference(dataset: str, partition: str, num_clients: int) -> dict[str, float]:
    """The paper's numbers for this setting, or {} when the setting is not the paper's."""
    if dataset != "mnist" or num_clients != 10 or not partition.startswith("dirichlet:"):
        return {}
    try:
        alpha = float(partition.split(":", 1)[1])
    except ValueError:
        return {}
    return dict(FEDMHO_TABLE3_MNIST.get(alpha, {}))
