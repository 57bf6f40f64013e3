"""How the command line shows things: rich tables on a terminal (plain text when piped), JSON
with ``--json``, progress bars on stderr only when it is a terminal, one-line errors.

Everything shown comes from data someone else wrote (state and directory names, paths, error
messages quoting them), so nothing is ever interpreted: rich markup and emoji codes are off, and
control characters (terminal escapes, carriage returns, bidirectional overrides) are shown as
escapes (``\x1b``), never sent to the terminal.
"""

from __future__ import annotations

import contextlib
import json
import re
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


#: C0 and C1 control characters, DEL, and the Unicode controls that reorder or hide text
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u061c\u200b-\u200f\u2028-\u202e\u2060-\u2069\ufeff]")


def safe(text: Any) -> str:
    """``text`` with every control character shown as an escape (``\x1b``, ``\u202e``)."""
    return _CONTROL.sub(lambda m: (f"\\x{ord(m[0]):02x}" if ord(m[0]) < 0x100
                                   else f"\\u{ord(m[0]):04x}"), str(text))


def console(stderr: bool = False) -> Any:
    """A rich console that interprets nothing (no markup, emoji codes or highlighting); when
    not a terminal, wide enough that piped tables are never cut."""
    from rich.console import Console

    plain = {"highlight": False, "markup": False, "emoji": False}
    out = Console(stderr=stderr, soft_wrap=False, **plain)
    if not out.is_terminal:
        out = Console(stderr=stderr, soft_wrap=True, width=1000, **plain)
    return out


def emit_json(data: Any) -> None:
    """Machine output: one JSON document on stdout."""
    sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")


def table(title: str | None, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    """A table on stdout (boxes and colour only on a terminal)."""
    from rich import box
    from rich.table import Table
    from rich.text import Text

    out = console()
    grid = Table(title=None if title is None else Text(safe(title)),
                 box=box.SIMPLE_HEAD if out.is_terminal else box.MARKDOWN, title_justify="left")
    for name in columns:
        numeric = name in ("ID", "BATCH", "SIZE", "FILES", "KEYS", "BYTES", "PARTS", "ROWS")
        grid.add_column(name, justify="right" if numeric else "left", no_wrap=True)
    for row in rows:  # Text cells: a name like "[link=...]" is shown, never interpreted
        grid.add_row(*(Text("-" if v is None else safe(v)) for v in row))
    if out.is_terminal:
        out.print(grid)
        return
    with out.capture() as captured:  # piped: no padding lines, no trailing blanks
        out.print(grid)
    text = "\n".join(ln.rstrip() for ln in captured.get().splitlines() if ln.strip())
    sys.stdout.write(text + "\n")


def line(text: str) -> None:
    """One line on stdout, shown as it is (escaped, never interpreted)."""
    console().print(safe(text), markup=False, emoji=False)


def error(text: str) -> None:
    """A one-line error on stderr."""
    console(stderr=True).print(f"error: {safe(text)}", markup=False, emoji=False, style="red")


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

    with Progress(TextColumn("{task.description}", markup=False), BarColumn(), DownloadColumn(),
                  TransferSpeedColumn(), TimeRemainingColumn(), console=err,
                  transient=True) as bar:
        task = bar.add_task(safe(label), total=total)
        yield lambda n: bar.advance(task, n)
