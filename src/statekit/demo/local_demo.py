"""The local keyed-state demo: per-user running aggregates with a crash, a restart, a resume
with more input at another parallelism, and a check of every result against a plain recomputation.

Run with ``python -m statekit.demo.local_demo [--backend hashmap|rocksdb] [--dir DIR]``.
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time
from typing import Any

from statekit import (
    ExternalizedCheckpointCleanup,
    KeyedProcessFunction,
    MapStateDescriptor,
    RestartStrategies,
    StreamExecutionEnvironment,
    Types,
    ValueStateDescriptor,
)
from statekit.demo import at_least, check_flags, check_work_dir, statekit_command
from statekit.errors import StatekitError


class UserTotals(KeyedProcessFunction):
    """Running count and amount per user, amounts per category; crashes once if asked."""

    def __init__(self, crash_at: int | None = None) -> None:
        self.crash_at = crash_at

    def open(self, runtime_context: Any) -> None:
        self.count = runtime_context.get_state(ValueStateDescriptor("count", Types.LONG()))
        self.amount = runtime_context.get_state(ValueStateDescriptor("amount", Types.LONG()))
        self.by_category = runtime_context.get_map_state(
            MapStateDescriptor("by_category", Types.STRING(), Types.LONG()))
        self.attempt = runtime_context.get_attempt_number()

    def process_element(self, value: Any, ctx: KeyedProcessFunction.Context) -> Any:
        seq, user, category, amount = value
        if seq == self.crash_at and self.attempt == 0:
            raise RuntimeError(f"simulated crash at event {seq}")
        count = (self.count.value() or 0) + 1
        total = (self.amount.value() or 0) + amount
        self.count.update(count)
        self.amount.update(total)
        self.by_category.put(category, (self.by_category.get(category) or 0) + amount)
        yield user, count, total


def events(n: int, users: int, seed: int = 7) -> list[tuple[int, str, str, int]]:
    rng = random.Random(seed)
    return [(i, f"user-{rng.randrange(users):04d}", rng.choice("abcde"), rng.randrange(1, 100))
            for i in range(n)]


def run_job(events_: list[Any], backend: str, directory: str, parallelism: int,
            resume_from: str | None, crash_at: int | None) -> Any:
    conf = {
        "state.backend.type": backend,
        "state.checkpoints.dir": directory,
        "execution.checkpointing.interval": "200 ms",
        "execution.checkpointing.externalized-checkpoint-retention": "RETAIN_ON_CANCELLATION",
        "parallelism.default": parallelism,
    }
    if resume_from:
        conf["execution.savepoint.path"] = resume_from
    env = StreamExecutionEnvironment.get_execution_environment(conf)
    env.set_restart_strategy(RestartStrategies.fixed_delay_restart(3, 100))
    env.get_checkpoint_config().enable_externalized_checkpoints(
        ExternalizedCheckpointCleanup.RETAIN_ON_CANCELLATION)
    stream = env.from_collection(events_).key_by(lambda e: e[1]).process(UserTotals(crash_at))
    return stream.execute_and_collect("local keyed-state demo")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--backend", default="hashmap")
    parser.add_argument("--dir", default=None,
                        help="checkpoint directory (default: a new temporary one), kept afterwards")
    parser.add_argument("--events", type=at_least(2), default=200_000)
    parser.add_argument("--users", type=at_least(1), default=5_000)
    args = parser.parse_args(argv)
    check_work_dir(parser, args.dir)
    check_flags(parser, args.backend)  # a typo (flag or STATEKIT_*) fails here, before any work
    directory = args.dir or tempfile.mkdtemp(prefix="statekit-demo-")
    try:
        return run(args, directory)
    except KeyboardInterrupt:  # Ctrl-C: say what is kept instead of a traceback
        print(f"\ninterrupted; the checkpoints are kept: {statekit_command()} checkpoints list "
              f"{directory} (then: rm -rf {directory})", flush=True)
        return 130
    except StatekitError as exc:  # a configuration or state error: one line, the directory named
        print(f"error: {type(exc).__name__}: {exc} (checkpoints kept in {directory})", flush=True)
        return 2


def run(args: argparse.Namespace, directory: str) -> int:
    """The two runs and the check; the exit code (0: every result exact)."""
    all_events = events(args.events, args.users)
    half = len(all_events) // 2

    start = time.perf_counter()
    first = run_job(all_events[:half], args.backend, directory, 4, None, crash_at=half // 2)
    print(f"run 1: {len(first)} outputs from {half} events, parallelism 4, "
          f"{first.restarts} restart(s) after a simulated crash, "
          f"{sum(s.status == 'completed' for s in first.checkpoint_stats)} checkpoints, "
          f"retained {first.latest_checkpoint}")
    second = run_job(all_events, args.backend, directory, 2, first.latest_checkpoint, None)
    elapsed = time.perf_counter() - start
    print(f"run 2: resumed at parallelism 2 from run 1's checkpoint, {len(second)} outputs "
          f"from the {len(all_events) - half} new events")

    expected: dict[str, tuple[int, int]] = {}
    for _, user, _, amount in all_events:
        c, a = expected.get(user, (0, 0))
        expected[user] = (c + 1, a + amount)
    got: dict[str, tuple[int, int]] = {}
    for user, count, total in list(first) + list(second):
        if count > got.get(user, (0, 0))[0]:
            got[user] = (count, total)
    outputs_ok = len(first) + len(second) == len(all_events)
    ok = got == expected and outputs_ok
    top = sorted(expected.items(), key=lambda kv: -kv[1][1])[:3]
    print(f"{len(all_events)} events, {len(expected)} users, {elapsed:.1f} s, "
          f"{len(all_events) / elapsed:,.0f} events/s; top users by amount: {top}")
    print(f"checkpoints kept for you to look at: {statekit_command()} checkpoints list "
          f"{directory} (then: rm -rf {directory})")
    print("RESULT: " + ("OK — state and outputs exactly once across crash, restart, resume and "
                        "rescale" if ok else "MISMATCH"))
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
