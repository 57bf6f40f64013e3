"""Restart strategies (PyFlink's ``RestartStrategies``): whether and when a failed job restarts."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from statekit import config as cfg
from statekit.durations import Time, to_millis
from statekit.values import checked_int

_FIXED_ATTEMPTS = "restart-strategy.fixed-delay.attempts"
_FIXED_DELAY = "restart-strategy.fixed-delay.delay"
_RATE_FAILURES = "restart-strategy.failure-rate.max-failures-per-interval"
_RATE_INTERVAL = "restart-strategy.failure-rate.failure-rate-interval"
_RATE_DELAY = "restart-strategy.failure-rate.delay"


@dataclass(frozen=True)
class RestartStrategyConfiguration:
    """A restart strategy; ``next_delay_ms`` answers whether a failure may restart, and after how long."""

    kind: str
    attempts: int = 0
    delay_ms: int = 0
    failure_rate: int = 0
    failure_interval_ms: int = 0

    def describe(self) -> str:
        if self.kind == "fixed-delay":
            return f"fixed-delay ({self.attempts} attempts, {self.delay_ms} ms)"
        if self.kind == "failure-rate":
            return (f"failure-rate ({self.failure_rate} per {self.failure_interval_ms} ms, "
                    f"{self.delay_ms} ms)")
        return self.kind


class RestartTracker:
    """Counts one job's failures against its strategy."""

    def __init__(self, strategy: RestartStrategyConfiguration) -> None:
        self.strategy = strategy
        self.restarts = 0
        self._failures: deque[float] = deque()

    def next_delay_ms(self) -> int | None:
        """Delay before restarting after a failure now, or None when no restart is allowed."""
        s = self.strategy
        if s.kind == "fixed-delay":
            if self.restarts >= s.attempts:
                return None
        elif s.kind == "failure-rate":
            now = time.monotonic()
            self._failures.append(now)
            while self._failures and now - self._failures[0] > s.failure_interval_ms / 1000:
                self._failures.popleft()
            if len(self._failures) > s.failure_rate:
                return None
        else:
            return None
        self.restarts += 1
        return s.delay_ms


class RestartStrategies:
    """Factory of restart strategy configurations."""

    @staticmethod
    def no_restart() -> RestartStrategyConfiguration:
        return RestartStrategyConfiguration("none")

    @staticmethod
    def fall_back_restart() -> RestartStrategyConfiguration:
        """Use the cluster default (here: the default of the environment's configuration)."""
        return RestartStrategyConfiguration("fallback")

    @staticmethod
    def fixed_delay_restart(restart_attempts: int, delay_between_attempts: int | Time
                            ) -> RestartStrategyConfiguration:
        return RestartStrategyConfiguration(
            "fixed-delay", attempts=checked_int(_FIXED_ATTEMPTS, restart_attempts, 0),
            delay_ms=to_millis(delay_between_attempts, _FIXED_DELAY, minimum=0)
        )

    @staticmethod
    def failure_rate_restart(failure_rate: int, failure_interval: int | Time,
                             delay_interval: int | Time) -> RestartStrategyConfiguration:
        return RestartStrategyConfiguration(
            "failure-rate", failure_rate=checked_int(_RATE_FAILURES, failure_rate, 1),
            failure_interval_ms=to_millis(failure_interval, _RATE_INTERVAL, minimum=1),
            delay_ms=to_millis(delay_interval, _RATE_DELAY, minimum=0),
        )

    @staticmethod
    def from_config(config: Mapping[str, Any]) -> RestartStrategyConfiguration | None:
        """The strategy ``restart-strategy.type`` names (canonical keys), its parameters from
        their keys or defaults; None when no type is set."""
        if config.get("restart-strategy.type") is None:
            return None
        kind = cfg.read(config, "restart-strategy.type").replace("_", "-")
        if kind in ("none", "off", "disable"):
            return RestartStrategies.no_restart()
        if kind in ("fixed-delay", "fixeddelay"):
            return RestartStrategies.fixed_delay_restart(
                cfg.read(config, "restart-strategy.fixed-delay.attempts"),
                cfg.read(config, "restart-strategy.fixed-delay.delay"),
            )
        return RestartStrategies.failure_rate_restart(
            cfg.read(config, "restart-strategy.failure-rate.max-failures-per-interval"),
            cfg.read(config, "restart-strategy.failure-rate.failure-rate-interval"),
            cfg.read(config, "restart-strategy.failure-rate.delay"),
        )
