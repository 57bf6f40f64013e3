"""How the command line shows things: rich tables on a terminal (plain text when piped), JSON
with ``--json``, progress bars on stderr only when it is a terminal, one-line errors."""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import Any


def human_bytes(n: int | None) -> str:
    """``1.5 MiB`` and the like; ``-`` when unknown."""
    if n is None:
        return "-"
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{int(size)} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"


def console(stderr: bool = False) -> Any:
    """A rich console; when not a terminal, wide enough that piped tables are never cut."""
    from rich.console import Console

    out = Console(stderr=stderr, highlight=False, soft_wrap=False)
    if not out.is_terminal:
        out = Console(stderr=stderr, highlight=False, soft_wrap=True, width=1000)
    return out


def emit_json(data: Any) -> None:
    """Machine output: one JSON document on stdout."""
    sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")


def table(title: str | None, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    """A table on stdout (boxes and colour only on a terminal)."""
    from rich import box
    from rich.table import Table

    out = console()
    grid = Table(title=title, box=box.SIMPLE_HEAD if out.is_terminal else box.MARKDOWN,
                 title_justify="left")
    for name in columns:
        numeric = name in ("ID", "BATCH", "SIZE", "FILES", "KEYS", "BYTES", "PARTS", "ROWS")
        grid.add_column(name, justify="right" if numeric else "left", no_wrap=True)
    for row in rows:
        grid.add_row(*("-" if v is None else str(v) for v in row))
    if out.is_terminal:
        out.print(grid)
        return
    with out.capture() as captured:  # piped: no padding lines, no trailing blanks
        out.print(grid)
    text = "\n".join(ln.rstrip() for ln in captured.get().splitlines() if ln.strip())
    sys.stdout.write(text + "\n")


def line(text: str) -> None:
    console().print(text, markup=False)


def error(text: str) -> None:
    """A one-line error on stderr."""
    console(stderr=True).print(f"error: {text}", markup=False, style="red")


@contextlib.contextmanager
def progress(label: str, total: int | None) -> Iterator[Callable[[int], None]]:
    """A progress bar on stderr, advanced by the callable it yields (bytes); silent when stderr
    is not a terminal."""
    err = console(stderr=True)
    if not err.is_terminal:
        yield lambda n: None
        return
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
        TransferSpeedColumn,
    )

    with Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(),
                  TransferSpeedColumn(), TimeRemainingColumn(), console=err,
                  transient=True) as bar:
        task = bar.add_task(label, total=total)
        yield lambda n: bar.advance(task, n)
