"""function_to_tool_definition: typed, documented functions become tool definitions."""

from __future__ import annotations

import enum
from typing import Any, Dict, List, Literal, Optional, Sequence, Tuple, Union

import jsonschema
import pytest

from toolrun import Client, function_to_tool_definition, type_to_schema, validate_tool_name


def get_weather(city: str, days: int = 3, unit: Literal["c", "f"] = "c") -> Dict[str, float]:
    """Forecast the weather for a city.

    Uses the nearest station.

    Args:
        city: The city's name, e.g. "Lyon".
        days: How many days to forecast
            (1 to 7).
        unit: Celsius or Fahrenheit.

    Returns:
        dict: Temperatures by day.
    """
    return {}


class Color(enum.Enum):
    RED = "red"
    GREEN = "green"


def paint(
    shapes: List[str],
    color: Color,
    opacity: Optional[float] = None,
    tags: Optional[Dict[str, str]] = None,
    dry_run: bool = False,
    weights: Sequence[int] = (1, 2),
    anything: Any = None,
    point: Tuple[int, int] = (0, 0),
    size: Union[int, str] = 1,
) -> None:
    """Paint shapes.

    Args:
        shapes (list[str]): Shape names.
        color (Color): The colour.
        opacity: From 0 to 1.
    """


def test_weather_definition_exactly() -> None:
    d = function_to_tool_definition(get_weather)
    assert d == {
        "name": "get_weather",
        "description": "Forecast the weather for a city.\n\nUses the nearest station.",
        "input_schema": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": 'The city\'s name, e.g. "Lyon".'},
                "days": {
                    "type": "integer",
                    "description": "How many days to forecast (1 to 7).",
                    "default": 3,
                },
                "unit": {
                    "type": "string",
                    "enum": ["c", "f"],
                    "description": "Celsius or Fahrenheit.",
                    "default": "c",
                },
            },
            "required": ["city"],
            "additionalProperties": False,
        },
        "output_schema": {
            "type": "object",
            "additionalProperties": {"type": "number"},
            "description": "Temperatures by day.",
        },
    }


def test_every_supported_type() -> None:
    d = function_to_tool_definition(paint)
    assert d["name"] == "paint"
    assert d["description"] == "Paint shapes."
    assert "output_schema" not in d  # returns None
    s = d["input_schema"]
    assert s["required"] == ["shapes", "color"]
    p = s["properties"]
    assert p["shapes"] == {"type": "array", "items": {"type": "string"}, "description": "Shape names."}
    assert p["color"] == {"type": "string", "enum": ["red", "green"], "description": "The colour."}
    assert p["opacity"] == {"type": ["number", "null"], "description": "From 0 to 1.", "default": None}
    assert p["tags"] == {
        "anyOf": [{"type": "object", "additionalProperties": {"type": "string"}}, {"type": "null"}],
        "default": None,
    }
    assert p["dry_run"] == {"type": "boolean", "default": False}
    assert p["weights"] == {"type": "array", "items": {"type": "integer"}, "default": [1, 2]}
    assert p["anything"] == {"default": None}
    assert p["point"] == {
        "type": "array",
        "prefixItems": [{"type": "integer"}, {"type": "integer"}],
        "minItems": 2,
        "maxItems": 2,
        "default": [0, 0],
    }
    assert p["size"] == {"anyOf": [{"type": "integer"}, {"type": "string"}], "default": 1}


def test_schemas_are_valid_json_schema_and_validate_arguments() -> None:
    for fn in (get_weather, paint):
        d = function_to_tool_definition(fn)
        jsonschema.Draft202012Validator.check_schema(d["input_schema"])
    v = jsonschema.Draft202012Validator(function_to_tool_definition(get_weather)["input_schema"])
    v.validate({"city": "Lyon"})
    v.validate({"city": "Lyon", "days": 5, "unit": "f"})
    for bad in ({}, {"city": 3}, {"city": "Lyon", "unit": "k"}, {"city": "Lyon", "extra": 1}):
        with pytest.raises(jsonschema.ValidationError):
            v.validate(bad)
    v = jsonschema.Draft202012Validator(function_to_tool_definition(paint)["input_schema"])
    v.validate({"shapes": ["circle"], "color": "red", "opacity": None, "point": [1, 2]})
    with pytest.raises(jsonschema.ValidationError):
        v.validate({"shapes": ["circle"], "color": "blue"})
    with pytest.raises(jsonschema.ValidationError):
        v.validate({"shapes": ["circle"], "color": "red", "point": [1, 2, 3]})


def test_names_are_validated() -> None:
    assert function_to_tool_definition(get_weather, name="weather-v2")["name"] == "weather-v2"
    for bad in ("", "has space", "dots.not.allowed", "x" * 65, "émoji"):
        with pytest.raises(ValueError, match="invalid tool name"):
            function_to_tool_definition(get_weather, name=bad)
    assert validate_tool_name("a" * 64) == "a" * 64


class Custom:
    pass


def test_what_has_no_schema_is_refused() -> None:
    def untyped(x):  # type: ignore[no-untyped-def]
        """No hints."""

    def variadic(*xs: int) -> None:
        """Variadic."""

    def custom(c: Custom) -> None:
        """A class."""

    def int_keys(m: Dict[int, str]) -> None:
        """Keys must be strings in JSON."""

    for fn, what in (
        (untyped, "no type hint"),
        (variadic, "variadic"),
        (custom, "no JSON Schema"),
        (int_keys, "keys are strings"),
    ):
        with pytest.raises(TypeError, match=what):
            function_to_tool_definition(fn)


def test_description_override_and_undocumented_functions() -> None:
    def bare(a: int, b: float = 0.5) -> List[int]:
        return [a]

    d = function_to_tool_definition(bare, description="Adds.")
    assert d["description"] == "Adds."
    assert d["input_schema"]["properties"] == {
        "a": {"type": "integer"},
        "b": {"type": "number", "default": 0.5},
    }
    assert d["output_schema"] == {"type": "array", "items": {"type": "integer"}}
    assert function_to_tool_definition(bare)["description"] == ""


def test_type_to_schema_scalars() -> None:
    assert type_to_schema(str) == {"type": "string"}
    assert type_to_schema(int) == {"type": "integer"}
    assert type_to_schema(float) == {"type": "number"}
    assert type_to_schema(bool) == {"type": "boolean"}
    assert type_to_schema(type(None)) == {"type": "null"}
    assert type_to_schema(list) == {"type": "array"}
    assert type_to_schema(dict) == {"type": "object"}
    assert type_to_schema(Literal[1, 2]) == {"type": "integer", "enum": [1, 2]}


def test_pep604_unions() -> None:
    ns: Dict[str, Any] = {}
    exec("def f(x: int | None = None, y: list[str] | None = None) -> str | int: ...", ns)
    d = function_to_tool_definition(ns["f"])
    assert d["input_schema"]["properties"]["x"] == {"type": ["integer", "null"], "default": None}
    assert d["input_schema"]["properties"]["y"] == {
        "anyOf": [{"type": "array", "items": {"type": "string"}}, {"type": "null"}],
        "default": None,
    }
    assert d["output_schema"] == {"anyOf": [{"type": "string"}, {"type": "integer"}]}


def test_a_definitions_body_runs_in_the_sandbox_with_validated_arguments(client: Client) -> None:
    """Until custom tools exist, the closest real round trip: the definition's schema
    validates the arguments, and the function's source runs in the sandbox with them."""
    import inspect
    import json

    def add(a: int, b: int = 2) -> int:
        """Add two integers.

        Args:
            a: The first.
            b: The second.
        """
        return a + b

    d = function_to_tool_definition(add)
    args = {"a": 40}
    jsonschema.validate(args, d["input_schema"])
    program = (
        inspect.getsource(add).replace("    def add", "def add", 1).replace("\n    ", "\n")
        + "\nimport json, sys\nprint(json.dumps(add(**json.load(sys.stdin))))\n"
    )
    r = client.run_code(program, stdin=json.dumps(args))
    assert r.ok, r
    out = json.loads(r.output["stdout"])
    jsonschema.validate(out, d["output_schema"])
    assert out == 42
