"""Datasets, client partitions and their plots. Plotting imports matplotlib only when called."""

from edgefl.data.datasets import (
    ArrayDataset,
    dataset_shape,
    default_data_dir,
    load_dataset,
    parse_dataset_ref,
    read_idx,
)
from edgefl.data.partition import (
    PartitionScheme,
    carve_public,
    client_users,
    label_count_matrix,
    parse_scheme,
    partition,
    train_val_split,
)
from edgefl.data.plots import plot_image_grid, plot_label_heatmap
from edgefl.data.registry import DATASETS, DatasetInfo, dataset_info

__all__ = [
    "DATASETS",
    "ArrayDataset",
    "DatasetInfo",
    "PartitionScheme",
    "carve_public",
    "client_users",
    "dataset_info",
    "dataset_shape",
    "default_data_dir",
    "label_count_matrix",
    "load_dataset",
    "parse_dataset_ref",
    "parse_scheme",
    "partition",
    "plot_image_grid",
    "plot_label_heatmap",
    "read_idx",
    "train_val_split",
]
