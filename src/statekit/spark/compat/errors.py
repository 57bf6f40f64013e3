"""Spark's errors for misuse of its state APIs, as statekit's typed errors.

Each class derives from the PySpark error Spark raises (so a user's ``except PySparkValueError``
still catches it) and from :class:`~statekit.errors.StateError` (so statekit's callers can tell
state misuse apart); the message is Spark's own.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache, wraps
from typing import Any, TypeVar

from statekit.errors import StateError, StateTypeError

F = TypeVar("F", bound=Callable[..., Any])


@cache
def typed_class(spark_class: type[BaseException]) -> type[BaseException]:
    """The statekit error class standing for a PySpark error class."""
    base = StateTypeError if issubclass(spark_class, TypeError) else StateError
    return type(f"Statekit{spark_class.__name__}", (spark_class, base),
                {"__module__": __name__, "__doc__": f"Spark's {spark_class.__name__}, typed."})


def typed(exc: BaseException) -> BaseException:
    """``exc`` (a PySpark error) as the statekit error class standing for its class."""
    cls = typed_class(type(exc))
    new = cls.__new__(cls)
    new.__dict__.update(exc.__dict__)
    new.args = exc.args
    new.state_name = None  # type: ignore[attr-defined]
    return new


def spark_errors_typed(method: F) -> F:
    """Re-raise the PySpark errors ``method`` raises as statekit's typed errors (same message)."""
    from pyspark.errors import PySparkException

    @wraps(method)
    def call(*args: Any, **kwargs: Any) -> Any:
        try:
            return method(*args, **kwargs)
        except PySparkException as exc:
            if isinstance(exc, StateError):
                raise
            raise typed(exc) from None

    return call  # type: ignore[return-value]


def spark_error(kind: str, error_class: str, parameters: dict[str, str]) -> BaseException:
    """A typed error of PySpark's ``kind`` (``"ValueError"``, ``"RuntimeError"``, ...)."""
    import pyspark.errors as errors

    spark_class = getattr(errors, f"PySpark{kind}")
    return typed(spark_class(errorClass=error_class, messageParameters=parameters))


def spark_message_error(kind: str, message: str) -> BaseException:
    """A typed error of PySpark's ``kind`` with a plain message (as PySpark's state clients
    raise them)."""
    import pyspark.errors as errors

    return typed(getattr(errors, f"PySpark{kind}")(message))
