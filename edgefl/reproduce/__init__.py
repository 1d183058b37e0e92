"""`edgefl reproduce`: a paper's table at a named budget, each method in its own paper's client
setting, resumable cell by cell, our mean +- std beside the paper's numbers. Sits above
`simulate` (every cell is one simulation) and below the CLI."""

from edgefl.reproduce.run import ReproduceJob, reproduce
from edgefl.reproduce.tables import TABLES, Budget, Setting, Table

__all__ = ["TABLES", "Budget", "ReproduceJob", "Setting", "Table", "reproduce"]
