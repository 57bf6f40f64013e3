"""Read every state of a checkpoint through the inspection path with little address space left:
``python -m tests.inspection.limited_reader PATH HEADROOM_MIB`` sets RLIMIT_AS to what the
process maps after its imports plus ``HEADROOM_MIB``, then counts each state's keys (a child of
:mod:`tests.inspection.test_hostile_tools`, so that an abort is seen as one)."""

from __future__ import annotations

import json
import resource
import sys

import pandas  # noqa: F401 (mapped before the limit, as in a notebook)
import pyarrow  # noqa: F401

from statekit.inspection import open_checkpoint


def mapped() -> int:
    """Bytes of address space the process maps now."""
    with open("/proc/self/status") as fh:
        fields = dict(line.split(":", 1) for line in fh)
    return int(fields["VmSize"].split()[0]) * 1024


def main() -> None:
    path, headroom = sys.argv[1], int(sys.argv[2])
    view = open_checkpoint(path)
    limit = mapped() + headroom * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    print(json.dumps({state.name: state.count() for state in view.states()}))


if __name__ == "__main__":
    main()
