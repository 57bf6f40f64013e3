"""Flink's ``MergingWindowSet``: the in-flight windows of one key for a merging assigner.

Each window the key has open maps to the *state window*: the namespace its contents live
under.  When windows merge, the result takes the state window of one of them, so only the other
namespaces are merged into it (``merge_namespaces``) and a long session is not copied on every
element.  The mapping is keyed state (a list of ``(start, end, state start, state end)``),
written back by :meth:`persist` only when it changed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from statekit.errors import StateError
from statekit.runtime.windows.assigners import MergingWindowAssigner, TimeWindow
from statekit.serde.types import Types
from statekit.state.api import ListState
from statekit.state.descriptors import ListStateDescriptor

#: the state holding each key's merging window set (Flink's name)
MERGING_WINDOW_SET = "merging-window-set"


def merging_set_descriptor() -> ListStateDescriptor:
    return ListStateDescriptor(MERGING_WINDOW_SET, Types.TUPLE([Types.LONG()] * 4))


#: merge(merge_result, merged_windows, state_window_result, merged_state_windows)
MergeFunction = Callable[[TimeWindow, list[TimeWindow], TimeWindow, list[TimeWindow]], None]


class _Collect(MergingWindowAssigner.MergeCallback):
    def __init__(self) -> None:
        self.results: dict[Any, list[Any]] = {}

    def merge(self, to_be_merged: Iterable[Any], merge_result: Any) -> None:
        self.results[merge_result] = sorted(to_be_merged)


class MergingWindowSet:
    """One key's windows and their state windows (read from ``state`` at creation)."""

    def __init__(self, assigner: MergingWindowAssigner, state: ListState) -> None:
        self.assigner = assigner
        self.state = state
        self.mapping: dict[TimeWindow, TimeWindow] = {
            TimeWindow(row[0], row[1]): TimeWindow(row[2], row[3]) for row in state.get() or ()}
        self.initial = dict(self.mapping)

    def persist(self) -> None:
        """Write the mapping back to the key's state if it changed."""
        if self.mapping != self.initial:
            self.state.update([(*w, *s) for w, s in self.mapping.items()])
            self.initial = dict(self.mapping)

    def get_state_window(self, window: TimeWindow) -> TimeWindow | None:
        """The namespace holding ``window``'s contents (None: not in flight)."""
        return self.mapping.get(window)

    def retire_window(self, window: TimeWindow) -> None:
        """Forget ``window`` (purged or cleaned up)."""
        if self.mapping.pop(window, None) is None:
            raise StateError(f"window {window!r} is not in the in-flight window set")

    def add_window(self, new_window: TimeWindow, merge: MergeFunction) -> TimeWindow:
        """Add ``new_window``, merging it with the windows it touches; the window it ends up in.
        ``merge`` is called for each merge with the state windows to fold into the target."""
        collect = _Collect()
        self.assigner.merge_windows([*self.mapping, new_window], collect)
        result_window, merged_new = new_window, False
        for merge_result, merged in collect.results.items():
            if new_window in merged:
                merged.remove(new_window)
                merged_new = True
                result_window = merge_result
            target_state = self.mapping[merged[0]]
            merged_states = [s for s in (self.mapping.pop(w, None) for w in merged)
                             if s is not None]
            self.mapping[merge_result] = target_state
            merged_states.remove(target_state)
            # one existing window merged into itself (not extended) has nothing to merge
            if not (len(merged) == 1 and merged[0] == merge_result):
                merge(merge_result, merged, target_state, merged_states)
        if not collect.results or (result_window == new_window and not merged_new):
            self.mapping[result_window] = result_window
        return result_window
