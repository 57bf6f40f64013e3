"""The timer service: PyFlink's ``TimerService`` over the backend's timer queues, and time.

:class:`InternalTimerService` (Flink's ``InternalTimerServiceImpl``) keeps one partition's
current watermark and processing-time clock, registers the current key's timers in the backend's
two timer queues (event time, processing time) and hands out due timers in timestamp order.
Finding out that nothing is due is one comparison with a cached earliest timestamp, so an
engine may ask after every element.  Engines that cannot deliver a domain refuse its
registration with a :class:`~statekit.errors.StateError` naming the setting to change.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from enum import Enum
from typing import Any

from statekit.backends.base import KeyedStateBackend
from statekit.backends.timers import (
    EVENT_TIMERS,
    MAX_TIMESTAMP,
    MIN_TIMESTAMP,
    PROCESSING_TIMERS,
    TimerQueue,
    check_timestamp,
)
from statekit.errors import StateError

#: the watermark before any event (Flink's ``Long.MIN_VALUE``) and at the end of input
MIN_WATERMARK = MIN_TIMESTAMP
MAX_WATERMARK = MAX_TIMESTAMP


class TimeDomain(Enum):
    """Which clock a timer runs on (PyFlink's ``TimeDomain``)."""

    EVENT_TIME = 0
    PROCESSING_TIME = 1


def wall_clock_ms() -> int:
    """Processing time: the machine's clock in epoch milliseconds."""
    return time.time_ns() // 1_000_000


#: ``refusal(domain)``: why this engine cannot deliver timers of ``domain`` (None: it can)
Refusal = Callable[[TimeDomain], str | None]


class InternalTimerService:
    """One partition's timers and time: registration for the current key, due timers by time."""

    def __init__(self, backend: KeyedStateBackend, clock: Callable[[], int] = wall_clock_ms,
                 refusal: Refusal | None = None) -> None:
        self.backend = backend
        self.clock = clock
        self.refusal = refusal
        self.watermark = MIN_WATERMARK
        # the queues exist once a timer was registered or restored (a job without timers
        # snapshots none); empty stand-ins until then
        self.event: TimerQueue = backend.timer_queue(EVENT_TIMERS, create=False) or _EMPTY
        self.processing: TimerQueue = (backend.timer_queue(PROCESSING_TIMERS, create=False)
                                       or _EMPTY)
        # lower bounds of the earliest timestamps: the cheap test that nothing is due
        self.next_event = self._head(self.event)
        self.next_processing = self._head(self.processing)

    @staticmethod
    def _head(queue: TimerQueue) -> int:
        head = queue.peek()
        return MAX_TIMESTAMP if head is None else head

    def queue(self, domain: TimeDomain, create: bool = False) -> TimerQueue:
        """The queue of ``domain`` (created in the backend when ``create``; one the backend
        created meanwhile, e.g. for a replayed change, is taken up too)."""
        event = domain is TimeDomain.EVENT_TIME
        queue = self.event if event else self.processing
        if queue is _EMPTY:
            found = self.backend.timer_queue(EVENT_TIMERS if event else PROCESSING_TIMERS, create)
            if found is None:
                return queue
            queue = found
            if event:
                self.event = queue
                self.next_event = self._head(queue)
            else:
                self.processing = queue
                self.next_processing = self._head(queue)
        return queue

    # --- time ---------------------------------------------------------------------------------------

    def current_processing_time(self) -> int:
        return int(self.clock())

    def current_watermark(self) -> int:
        return self.watermark

    # --- the current key's timers ---------------------------------------------------------------

    def _check(self, domain: TimeDomain, timestamp: Any) -> int:
        if self.refusal is not None:
            why = self.refusal(domain)
            if why is not None:
                raise StateError(why)
        return check_timestamp(timestamp)

    def register(self, domain: TimeDomain, timestamp: Any) -> None:
        """Register a timer of the current key (a second registration is the same timer)."""
        timestamp = self._check(domain, timestamp)
        key = self.backend.get_current_key()
        if not self.queue(domain, create=True).add(key, timestamp):
            return
        if domain is TimeDomain.EVENT_TIME:
            self.next_event = min(self.next_event, timestamp)
        else:
            self.next_processing = min(self.next_processing, timestamp)

    def delete(self, domain: TimeDomain, timestamp: Any) -> None:
        """Delete a timer of the current key (nothing happens when there is none)."""
        self.queue(domain).remove(self.backend.get_current_key(), self._check(domain, timestamp))

    def timers_of_current_key(self, domain: TimeDomain) -> list[int]:
        return self.queue(domain).timers_of(self.backend.get_current_key())

    # --- due timers ---------------------------------------------------------------------------------

    # ``next_event`` / ``next_processing`` are lower bounds of the queues' earliest timestamps
    # (registration lowers them, a removal leaves them): when one is past the limit, nothing
    # of that domain is due and the queue is not asked

    def _due_head(self, domain: TimeDomain, limit: int) -> int | None:
        """The earliest timestamp of ``domain`` if it is due at ``limit`` (refreshing the bound)."""
        event = domain is TimeDomain.EVENT_TIME
        if (self.next_event if event else self.next_processing) > limit:
            return None
        head = (self.event if event else self.processing).peek()
        bound = MAX_TIMESTAMP if head is None else head
        if event:
            self.next_event = bound
        else:
            self.next_processing = bound
        return head if head is not None and head <= limit else None

    def poll_event(self) -> tuple[Any, int] | None:
        """The next event-time timer due at the current watermark (removed), or None."""
        if self._due_head(TimeDomain.EVENT_TIME, self.watermark) is None:
            return None
        return self.event.poll(self.watermark)

    def poll_processing(self, now: int) -> tuple[Any, int] | None:
        """The next processing-time timer due at ``now`` (removed), or None."""
        if self._due_head(TimeDomain.PROCESSING_TIME, now) is None:
            return None
        return self.processing.poll(now)

    def poll(self, now: int) -> tuple[Any, int, TimeDomain] | None:
        """The earliest timer due in either domain (event time first on equal timestamps), removed;
        ``now`` is the processing time, the watermark the current one."""
        event = self._due_head(TimeDomain.EVENT_TIME, self.watermark)
        proc = self._due_head(TimeDomain.PROCESSING_TIME, now)
        if event is not None and (proc is None or event <= proc):
            timer = self.event.poll(self.watermark)
            return None if timer is None else (*timer, TimeDomain.EVENT_TIME)
        if proc is not None:
            timer = self.processing.poll(now)
            return None if timer is None else (*timer, TimeDomain.PROCESSING_TIME)
        return None

    def count(self) -> tuple[int, int]:
        """``(event-time timers, processing-time timers)`` registered in this partition."""
        return len(self.event), len(self.processing)


class _NoTimers(TimerQueue):
    """The queue of a domain nothing registered or restored a timer in (yet)."""

    def add(self, key: Any, timestamp: int) -> bool:  # pragma: no cover - never called
        raise StateError("no timer queue")

    def remove(self, key: Any, timestamp: int) -> bool:
        return False

    def peek(self) -> int | None:
        return None

    def poll(self, limit: int) -> tuple[Any, int] | None:
        return None

    def timers_of(self, key: Any) -> list[int]:
        return []

    def __len__(self) -> int:
        return 0


_EMPTY = _NoTimers("none")


class TimerService:
    """What a function sees of timers and time (PyFlink's ``TimerService``), for the current key."""

    __slots__ = ("_internal",)

    def __init__(self, internal: InternalTimerService) -> None:
        self._internal = internal

    def current_processing_time(self) -> int:
        """The current processing time in epoch milliseconds (on Spark: the micro-batch's)."""
        return self._internal.current_processing_time()

    def current_watermark(self) -> int:
        """The current event-time watermark in milliseconds."""
        return self._internal.current_watermark()

    def register_processing_time_timer(self, timestamp: int) -> None:
        """Call ``on_timer`` for the current key once processing time reaches ``timestamp``."""
        self._internal.register(TimeDomain.PROCESSING_TIME, timestamp)

    def register_event_time_timer(self, timestamp: int) -> None:
        """Call ``on_timer`` for the current key once the watermark reaches ``timestamp``."""
        self._internal.register(TimeDomain.EVENT_TIME, timestamp)

    def delete_processing_time_timer(self, timestamp: int) -> None:
        self._internal.delete(TimeDomain.PROCESSING_TIME, timestamp)

    def delete_event_time_timer(self, timestamp: int) -> None:
        self._internal.delete(TimeDomain.EVENT_TIME, timestamp)
