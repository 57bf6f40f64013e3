"""Serializers: round trips without pickle, type checks, and pickle only as an explicit opt-in."""

import datetime as dt
import decimal
import pickle
from typing import NamedTuple

import pytest
from hypothesis import given
from hypothesis import strategies as st

from statekit.errors import SerializationError
from statekit.serde.types import GenericSerializer, Types, packb, unpackb

plain = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text() | st.binary(),
    lambda children: st.lists(children, max_size=4) | st.tuples(children, children)
    | st.dictionaries(st.text(max_size=3) | st.integers(), children, max_size=4),
    max_leaves=20,
)


@given(plain)
def test_generic_round_trip(value):
    ser = GenericSerializer()
    assert ser.deserialize(ser.serialize(value)) == value


def test_generic_handles_python_types_without_pickle():
    ser = GenericSerializer()
    for value in [decimal.Decimal("1.25"), dt.datetime(2026, 1, 2, 3, 4, 5), dt.date(2026, 1, 2),
                  dt.time(1, 2), dt.timedelta(days=1, seconds=3), {1, 2}, frozenset({"a"}),
                  (1, (2, "x")), 2**100, -(2**90)]:
        assert ser.deserialize(ser.serialize(value)) == value
    assert ser.check(object()) is not None
    with pytest.raises(SerializationError):
        ser.serialize(object())


def test_pickle_payloads_are_never_loaded_by_default():
    evil = pickle.dumps(print)
    with pytest.raises(SerializationError):
        GenericSerializer().deserialize(evil)


def test_typed_checks():
    assert Types.INT().get_serializer().check(2**31) is not None
    assert Types.INT().get_serializer().check(True) is not None
    assert Types.LONG().get_serializer().check(2**63 - 1) is None
    assert Types.STRING().get_serializer().check(1) is not None
    assert Types.CHAR().get_serializer().check("ab") is not None
    assert Types.LIST(Types.INT()).get_serializer().check([1, "x"]) is not None
    assert Types.MAP(Types.STRING(), Types.LONG()).get_serializer().check({"a": 1}) is None
    row = Types.ROW_NAMED(["a", "b"], [Types.INT(), Types.STRING()]).get_serializer()
    assert row.deserialize(row.serialize({"a": 1, "b": "x"})) == {"a": 1, "b": "x"}
    tup = Types.TUPLE([Types.INT(), Types.SQL_DATE()]).get_serializer()
    assert tup.deserialize(tup.serialize((1, dt.date(2026, 5, 1)))) == (1, dt.date(2026, 5, 1))


def test_pickled_byte_array_is_the_opt_in():
    ser = Types.PICKLED_BYTE_ARRAY().get_serializer()
    assert ser.uses_pickle
    assert ser.deserialize(ser.serialize(complex(1, 2))) == complex(1, 2)


def test_damaged_bytes_raise_a_typed_error():
    with pytest.raises(SerializationError):
        unpackb(packb([1, 2, 3])[:-1])


class Point(NamedTuple):
    a: int
    b: str


@pytest.mark.parametrize("make", [Types.ROW, Types.TUPLE])
def test_row_and_tuple_fields_are_nullable(make):
    ser = make([Types.INT(), Types.STRING()]).get_serializer()
    assert ser.check((None, "x")) is None and ser.check((1, None)) is None
    assert ser.deserialize(ser.serialize((None, None))) == (None, None)
    assert ser.check(("x", None)) is not None  # a present field is still typed


def test_named_row_takes_none_fields_a_namedtuple_and_a_spark_row():
    from pyspark.sql import Row

    ser = Types.ROW_NAMED(["a", "b"], [Types.INT(), Types.STRING()]).get_serializer()
    assert ser.deserialize(ser.serialize({"a": None, "b": "x"})) == {"a": None, "b": "x"}
    assert ser.check(Point(1, "x")) is None
    assert ser.deserialize(ser.serialize(Point(1, None))) == {"a": 1, "b": None}
    assert ser.deserialize(ser.serialize(Row(a=2, b="y"))) == {"a": 2, "b": "y"}
    assert ser.check(Point("no", "x")) is not None
    assert ser.check((1, "x")) is not None  # a plain tuple has no field names
