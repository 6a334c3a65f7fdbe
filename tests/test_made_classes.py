"""A value whose class was made while the job ran comes back as an equal value of an equal class.

The result is written by the job's pickler (`result_writing`) and read with
``torch.load`` as the client reads it; the classes here are made inside a
function, as a trace or a helper makes them, so that no module names them.
Before `made_classes`, each of these results was refused ("cannot be
serialized").
"""

from __future__ import annotations

import collections
import dataclasses
import enum
import io
import pickle
import typing

import pytest
import torch

from nnhost.execution.job.result_writing import serialize_result


def _round_trip(value):
    return torch.load(io.BytesIO(serialize_result({"value": value}, False)), weights_only=False)["value"]


def test_a_named_tuple_keeps_its_name_fields_and_defaults():
    Point = collections.namedtuple("Point", ["x", "y"], defaults=[0])
    back = _round_trip([Point(1, 2), Point(3)])
    assert [tuple(point) for point in back] == [(1, 2), (3, 0)]
    kind = type(back[0])
    assert kind is type(back[1]) and kind.__name__ == "Point" and kind._fields == ("x", "y")
    assert kind(5) == (5, 0) and kind.__qualname__ == Point.__qualname__


def test_a_typed_named_tuple_keeps_its_annotations_even_as_text():
    namespace: dict = {}
    exec(
        "from __future__ import annotations\n"
        "import typing\n"
        "class Stat(typing.NamedTuple):\n"
        "    low: float\n"
        "    high: float = 1.0\n",
        namespace,
    )
    Stat = namespace["Stat"]
    assert isinstance(Stat.__annotations__["low"], typing.ForwardRef)  # holds compiled code
    back = _round_trip(Stat(0.5))
    assert back == (0.5, 1.0) and type(back).__name__ == "Stat"
    assert type(back).__annotations__ == Stat.__annotations__


def test_a_made_dataclass_keeps_its_fields_options_and_values():
    Pair = dataclasses.make_dataclass(
        "Pair", [("left", int), ("right", list, dataclasses.field(default_factory=list))], order=True
    )
    back = _round_trip(Pair(1, [torch.ones(2)]))
    assert dataclasses.is_dataclass(back) and type(back).__name__ == "Pair"
    assert [item.name for item in dataclasses.fields(back)] == ["left", "right"]
    assert back.left == 1 and torch.equal(back.right[0], torch.ones(2))
    assert type(back)(0) < type(back)(1)  # order=True came along, and the factory


def _helper_classes():
    class Box:
        kind = "box"

        def area(self):
            return 1

    @dataclasses.dataclass(frozen=True)
    class Node:
        value: int
        next: typing.Optional[Node] = None

    box = Box()
    box.size = 3
    return box, Node(1, Node(2))


def test_classes_made_in_a_helper_keep_their_data_but_not_their_code():
    box, node = _helper_classes()
    back_box, back_node = _round_trip([box, node])
    assert type(back_box).__qualname__ == type(box).__qualname__
    assert vars(back_box) == {"size": 3} and type(back_box).kind == "box"
    assert not hasattr(type(back_box), "area")  # the job's code stays on the server
    assert back_node.value == 1 and back_node.next.value == 2
    assert type(back_node.next) is type(back_node)
    with pytest.raises(dataclasses.FrozenInstanceError):
        back_node.value = 5


def test_an_enum_from_the_functional_api_keeps_its_members():
    Mode = enum.Enum("Mode", "MEAN MAX")
    Level = enum.IntEnum("Level", [("LOW", 1), ("HIGH", 5)])
    mode, modes, level = _round_trip((Mode.MAX, [Mode.MEAN, Mode.MAX], Level.HIGH))
    assert type(mode).__name__ == "Mode" and [m.name for m in type(mode)] == ["MEAN", "MAX"]
    assert mode is modes[1] and mode.value == 2
    assert level == 5 and isinstance(level, int) and level.name == "HIGH"


def test_no_code_of_the_job_travels():
    box, node = _helper_classes()
    Mode = enum.Enum("Mode", "MEAN MAX")
    data = serialize_result({"value": [box, node, Mode.MAX]}, False)
    import pickletools
    import zipfile

    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        pickled = archive.read(next(name for name in archive.namelist() if name.endswith("data.pkl")))
    named = {arg for opcode, arg, _ in pickletools.genops(pickled) if opcode.name in ("STACK_GLOBAL", "GLOBAL")}
    strings = {arg for opcode, arg, _ in pickletools.genops(pickled) if isinstance(arg, str)}
    assert "area" not in strings and "<lambda>" not in strings
    assert not any("_helper_classes" in str(name) for name in named)
    with pytest.raises(Exception):
        pickle.dumps(box.area)  # what a method would need: never written
