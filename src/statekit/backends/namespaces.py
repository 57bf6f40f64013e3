"""Namespaced keyed state and key enumeration of a keyed backend (Flink's
``getPartitionedState(namespace, ...)``, ``getKeys``, ``getKeysAndNamespaces``,
``applyToAllKeys``), shared by every backend through :class:`NamespacedStates`.

A namespaced state is stored as a map state of the current key from namespace to value (see
:mod:`statekit.state.namespaced`), so each backend's map state, snapshots and restores serve it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

from statekit.errors import StateError, StateNameClashError, StateTypeError
from statekit.serde.serializers import MapSerializer, TypeSerializer
from statekit.state.api import MapState, State
from statekit.state.descriptors import StateDescriptor, StateKind, check_state_name
from statekit.state.namespaced import namespaced_view


class NamespacedStates:
    """Registration of namespaced states and enumeration of keys and namespaces (a part of
    :class:`~statekit.backends.base.KeyedStateBackend`, whose attributes it uses)."""

    _namespaced: dict[str, tuple[MapState, State, list[Any]]]
    _states: dict[str, tuple[StateDescriptor, State]]
    current_key: Any

    def get_keys(self, state: str, namespace: Any = None) -> Iterator[Any]:
        """The keys of this partition holding ``state`` (none for a state never written or
        restored) in ``namespace`` (None for state without namespaces, Flink's VoidNamespace).
        On the heap backend, adding or removing a key of a state without namespaces while the
        iteration runs is a :class:`ConcurrentModificationError` (Flink's rule); RocksDB iterates
        a consistent view, as both do for namespaced state (its keys are taken first)."""
        carrier = self._namespaces(state, namespace is not None)
        if carrier is None:
            return self._keys_of(state)
        return iter([key for key in list(self._keys_of(state))
                     if self._with_key(key, lambda: carrier.contains(namespace))])

    def get_keys_and_namespaces(self, state: str) -> Iterator[tuple[Any, Any]]:
        """(key, namespace) of every key and namespace holding ``state``; the namespace is None
        for state without namespaces."""
        carrier = self._namespaces(state, False)
        if carrier is None:
            keys = self._keys_of(state)
            if state not in self._states and any(True for _ in keys):  # restored, unregistered
                raise StateError("register the restored state before enumerating its "
                                 "namespaces (its checkpoint entry is a map either way)", state)
            return ((key, None) for key in keys)
        return iter([(key, ns) for key in list(self._keys_of(state))
                     for ns in self._with_key(key, carrier.keys)])

    def apply_to_all_keys(self, namespace: Any, descriptor: StateDescriptor,
                          function: Callable[[Any, State], None]) -> None:
        """Call ``function(key, state)`` with each key holding the state (in ``namespace``, for
        namespaced state registered with :meth:`get_namespaced_state`) as the current key.
        The keys are taken when the call starts (as Flink's heap backend does), so ``function``
        may change or clear the state; the current key is restored afterwards."""
        keys = list(self.get_keys(descriptor.name, namespace))
        if namespace is None:
            state = self.get_partitioned_state(descriptor)
        else:
            state = self._namespaced[descriptor.name][1]
            state.set_current_namespace(namespace)  # type: ignore[attr-defined]
        for key in keys:
            self._with_key(key, lambda key=key: function(key, state))

    def _with_key(self, key: Any, call: Callable[[], Any]) -> Any:
        """``call()`` with ``key`` as the current key (the previous one restored after)."""
        previous = self.current_key
        self.set_current_key(key)
        try:
            return call()
        finally:
            self.set_current_key(previous)

    def _namespaces(self, state: str, required: bool) -> MapState | None:
        """The carrier of namespaced ``state`` (None for state without namespaces; a StateError
        when ``required`` and the state has none, or a namespaced state is read unregistered)."""
        registered = self._namespaced.get(state)
        if registered is not None:
            return registered[0]
        if required:
            if state in self._states:
                raise StateError("the state has no namespaces (pass namespace=None)", state)
            raise StateError("register the namespaced state with get_namespaced_state before "
                             "enumerating its keys by namespace", state)
        return None

    def _keys_of(self, state: str) -> Iterator[Any]:
        """The keys holding ``state``; each backend enumerates its own storage."""
        raise NotImplementedError(f"{type(self).__name__} cannot enumerate its keys")

    def get_namespaced_state(self, descriptor: StateDescriptor,
                             namespace_serializer: TypeSerializer) -> State:
        """The state for ``descriptor`` in a namespace (Flink's ``getPartitionedState(namespace,
        namespaceSerializer, descriptor)``): call ``set_current_namespace(ns)`` on it, then use it
        as the descriptor's kind; list, reducing and aggregating states also
        ``merge_namespaces(target, sources)``.  Stored as a map state from namespace to value,
        so snapshots, rescaling and the inspection tools show it as one.  TTL is refused."""
        if not isinstance(namespace_serializer, TypeSerializer):  # Flink: a null one is an NPE
            raise StateTypeError(f"a namespaced state needs a namespace serializer (e.g. "
                                 f"Types.STRING().get_serializer()), not {namespace_serializer!r}",
                                 descriptor.name)
        if descriptor.ttl_config is not None:
            raise StateError("TTL is not supported on namespaced state", descriptor.name)
        inner = self.state_meta(descriptor)
        layout = [StateKind.MAP.value, inner.stored_serializer.config(),
                  namespace_serializer.config(), False]
        registered = self._namespaced.get(descriptor.name)
        if registered is not None:
            if registered[2] != layout:
                raise StateNameClashError(f"already registered as a namespaced state of layout "
                                          f"{registered[2]}", descriptor.name)
            return registered[1]
        if descriptor.name in self._states:
            raise StateNameClashError("already registered as a state without namespaces",
                                      descriptor.name)
        check_state_name(descriptor.name)
        self._check_restored_layout(descriptor.name, layout)
        meta = replace(inner, kind=StateKind.MAP.value, layout=layout,
                       stored_serializer=MapSerializer(namespace_serializer, inner.stored_serializer))
        carrier = self._raw_state(meta)
        state = namespaced_view(
            descriptor.kind.value, carrier, descriptor.name, namespace_serializer,  # type: ignore[arg-type]
            reduce=getattr(descriptor, "reduce_function", None),
            agg=getattr(descriptor, "agg_function", None))
        self._namespaced[descriptor.name] = (carrier, state, layout)  # type: ignore[assignment]
        self._states[descriptor.name] = (descriptor, state)
        return state

