"""statekit.testing: the test harness for keyed functions, a manual clock, the conformance
suites (``statekit.testing.conformance``) and fault injection for tests of one's own."""

from statekit.testing.harness import (
    KeyedOneInputStreamOperatorTestHarness,
    ManualClock,
    OperatorSubtaskState,
)

__all__ = ["KeyedOneInputStreamOperatorTestHarness", "ManualClock", "OperatorSubtaskState"]
