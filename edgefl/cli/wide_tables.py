"""Tables that read at any width: a name a user must type is never cut, and at a narrow terminal
the least needed columns are left out (and named) instead of every cell being cut to "fed...";
a table whose every column matters (a matrix of counts) is wrapped into blocks of columns
instead (`blocks`), and a number is never cut at any width.
"""

from __future__ import annotations

from dataclasses import dataclass

from rich import box
from rich.console import Console
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

WRAP_WIDTH = 16


@dataclass(frozen=True)
class Col:
    name: str
    right: bool = True
    # Left out first at a narrow width: higher goes first; 0 = always shown.
    drop: int = 0
    wrap: bool = False  # prose (reasons): wraps within WRAP_WIDTH rather than widen the table
    key: bool = False  # blocks(): repeated in every block of columns (the row's name)


def _width(cell: str) -> int:
    return Text.from_markup(cell).cell_len


def _natural(cols: list[Col], rows: list[list[str]]) -> list[int]:
    """Each column's width unwrapped: its widest cell or header word."""
    return [
        max([max(len(w) for w in c.name.split()), *(_width(r[i]) for r in rows)])
        for i, c in enumerate(cols)
    ]


def fitted(
    cols: list[Col],
    rows: list[list[str]],
    width: int,
    *,
    title: str | None = None,
    caption: str | None = None,
) -> Table:
    """A table of `rows` (rich markup allowed; escape data) that fits `width` columns: cells
    never get cut (only `wrap` columns wrap); first the borders go, then columns by `drop`
    until the rest fits, and the caption says which were left out."""
    natural = _natural(cols, rows)
    natural = [min(n, WRAP_WIDTH) if c.wrap else n for n, c in zip(natural, cols, strict=True)]
    measure = Console(width=10_000, emoji=False)  # unclamped: the width the table needs at least

    def build(keep: list[int], heavy: bool, note: str | None) -> Table:
        # Light: SIMPLE_HEAD's column divider is one blank, so no padding is needed beside it.
        table = Table(
            title=title,
            caption=note,
            box=box.HEAVY_HEAD if heavy else box.SIMPLE_HEAD,
            padding=(0, 1) if heavy else (0, 0),
            show_edge=heavy,
        )
        for i in keep:
            c = cols[i]
            table.add_column(
                c.name,
                justify="right" if c.right else "left",
                no_wrap=not c.wrap,
                min_width=natural[i],
                overflow="fold",
            )
        for r in rows:
            table.add_row(*(r[i] for i in keep))
        return table

    def needs(table: Table) -> int:
        return Measurement.get(measure, measure.options, table).minimum

    keep = list(range(len(cols)))
    heavy = needs(build(keep, True, None)) <= width
    by_drop = sorted((i for i, c in enumerate(cols) if c.drop), key=lambda i: -cols[i].drop)
    left_out = []
    while not heavy and by_drop and needs(build(keep, False, None)) > width:
        i = by_drop.pop(0)
        keep.remove(i)
        left_out.append(cols[i].name)
    notes = [caption] if caption else []
    if left_out:
        notes.append(f"left out at {width} columns: {', '.join(left_out)} (--json has all)")
    return build(keep, heavy, "; ".join(notes) or None)


@dataclass(frozen=True)
class _Grid:
    """The rows of `blocks` and each column's natural width, to build its tables from."""

    cols: list[Col]
    rows: list[list[str]]
    natural: list[int]

    def table(
        self,
        keep: list[int],
        heavy: bool,
        fold: bool = False,
        head: str | None = None,
        note: str | None = None,
    ) -> Table:
        table = Table(
            title=head,
            caption=note,
            box=box.HEAVY_HEAD if heavy else box.SIMPLE_HEAD,
            padding=(0, 1) if heavy else (0, 0),
            show_edge=heavy,
        )
        for i in keep:
            c = self.cols[i]
            # Each column exactly as wide as its widest cell or header word (rich would
            # otherwise share the width out by its own rule and cut cells): a header wraps at
            # its blanks; only a fold (a cell wider than the whole width) splits a number.
            table.add_column(
                c.name,
                justify="right" if c.right else "left",
                overflow="fold",
                width=None if fold else self.natural[i],
            )
        for r in self.rows:
            table.add_row(*(r[i] for i in keep))
        return table

    def needs(self, keep: list[int], heavy: bool) -> int:
        # Counted, not measured: rich's minimum leaves out part of min_width (2 columns short
        # on a 5-column table), and a table that is really wider gets its cells cut.
        inner = sum(self.natural[i] for i in keep)
        return inner + 3 * len(keep) + 1 if heavy else inner + max(0, len(keep) - 1)

    def parts(self, keys: list[int], width: int) -> list[list[int]]:
        """The non-key columns in consecutive blocks, each fitting `width` beside the keys."""
        parts: list[list[int]] = []
        for i in (i for i in range(len(self.cols)) if not self.cols[i].key):
            if parts and self.needs(keys + parts[-1] + [i], False) <= width:
                parts[-1].append(i)
            else:
                parts.append([i])
        return parts or [[]]


def _block_head(title: str | None, names: list[str], first: bool) -> str | None:
    span = names[0] if len(names) == 1 else f"{names[0]} to {names[-1]}"
    return title if first else f"continued: {span}" if names else None


def _block_note(caption: str | None, count: int, width: int) -> str | None:
    """The last block's caption: the table's own, and that the columns were wrapped."""
    note = [caption] if caption else []
    if count > 1:
        note.append(f"columns wrapped into {count} blocks to fit {width} columns")
    return "; ".join(note) or None


def blocks(
    cols: list[Col],
    rows: list[list[str]],
    width: int,
    *,
    title: str | None = None,
    caption: str | None = None,
) -> list[Table]:
    """`rows` as one table if it fits `width`, else as several, each fitting `width`: the
    columns wrapped into consecutive blocks, the `key` columns (the row's name) repeated in
    each, as a wide data frame is printed. No cell is ever cut: only a column wider than the
    whole width (beside the keys) is folded onto several lines, digit by digit if it must."""
    grid = _Grid(cols, rows, _natural(cols, rows))
    every = list(range(len(cols)))
    if grid.needs(every, True) <= width:
        return [grid.table(every, True, head=title, note=caption)]
    keys = [i for i in every if cols[i].key]
    parts = grid.parts(keys, width)
    tables = []
    for n, part in enumerate(parts):
        keep = sorted(keys + part)  # the columns' own order, keys where they stood
        last = n == len(parts) - 1
        tables.append(
            grid.table(
                keep,
                False,
                fold=grid.needs(keep, False) > width,
                head=_block_head(title, [cols[i].name for i in part], n == 0),
                note=_block_note(caption, len(parts), width) if last else None,
            )
        )
    return tables
