"""The plugin protocol over configuration keys: plugins (backends, storages) are
:class:`Configurable` (``from_config`` builds, ``configure`` returns a configured copy) and apply
their own keys with :class:`Setting` rows (:func:`apply_settings`), under one rule: a setting
made in code wins over a flat key.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Self

from statekit.config import BY_KEY, canonical
from statekit.errors import ConfigError


class Configurable:
    """The configuration protocol of every plugin (state backend, checkpoint storage).

    The registry builds a plugin from flat keys with :meth:`from_config`; :meth:`configure`
    returns a copy with the keys applied, never changing the object it is called on, and a
    setting made in code wins over a key (see :class:`Setting`).
    """

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> Self:
        """The plugin built from flat keys: by default the constructor's defaults, then
        :meth:`configure`; a plugin whose constructor needs arguments (a directory, say)
        overrides this to take them from ``config``."""
        return cls().configure(dict(config))

    def configure(self, config: dict[str, Any]) -> Self:
        """A copy with the flat keys this plugin understands applied (override to read some)."""
        return copy.copy(self)


@dataclass(frozen=True)
class Setting:
    """One setting of a plugin (backend or storage) that flat keys may give.

    ``keys`` are tried in order and the first one set applies; ``parse`` defaults to the
    parser of the key's option.  ``given`` names the attribute that is None while the setting
    was not made in code (default: ``attribute`` itself): a setting made in code wins.
    """

    attribute: str
    keys: tuple[str, ...]
    parse: Callable[[str, Any], Any] | None = None
    given: str | None = None

    def value(self, config: Mapping[str, Any]) -> tuple[bool, Any]:
        """``(True, parsed value)`` of the first key set in ``config``, else ``(False, None)``."""
        for key in self.keys:
            if config.get(key) is not None:
                parse = self.parse or BY_KEY[canonical(key)].parse
                return True, parse(key, config[key])
        return False, None


def apply_settings(settings: Iterable[Setting], source: Any, target: Any,
                   config: Mapping[str, Any]) -> None:
    """Set each setting of ``target`` that ``source`` leaves open from ``config``.

    ``target`` is usually a copy of ``source``: ``configure()`` returns a configured copy and
    leaves the object it was called on as it was.
    """
    for setting in settings:
        if getattr(source, setting.given or setting.attribute) is not None:
            continue
        found, value = setting.value(config)
        if found:
            setattr(target, setting.attribute, value)


def refuse_keys_of(config: Mapping[str, Any], prefix: str, owner: str, here: str) -> None:
    """ConfigError for a key under ``prefix`` (the ``owner`` backend's settings) set on the
    ``here`` backend, where it could not take effect: refused, never accepted and ignored."""
    for key, value in config.items():
        if value is not None and canonical(key).startswith(prefix):
            raise ConfigError(key, f"a setting of the {owner} state backend, which cannot take "
                              f"effect on the {here} backend (state.backend.type: {here}); "
                              "leave it out, or choose that backend")
