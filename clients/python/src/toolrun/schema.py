"""Tool definitions from Python functions (seed 004's ``function_to_tool_definition``).

A typed, documented function becomes a tool definition: its name, the docstring's summary
as description, an input JSON Schema from the type hints (defaults make properties
optional; the docstring's Google-style ``Args:`` section describes them), and an output
schema from the return annotation.
"""

from __future__ import annotations

import collections.abc as abc
import enum
import inspect
import json
import re
import sys
import typing
from typing import Any, Callable, Dict, List, Optional, Tuple, Union

#: What a tool name must match (the gateway's and the providers' rule).
TOOL_NAME_PATTERN = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")

_SECTIONS = {
    "args",
    "arguments",
    "parameters",
    "params",
    "returns",
    "return",
    "yields",
    "raises",
    "examples",
    "example",
    "note",
    "notes",
    "attributes",
    "see also",
    "warning",
    "warnings",
}

_SCALARS: Dict[Any, str] = {str: "string", int: "integer", float: "number", bool: "boolean"}

_UNION_TYPES: Tuple[Any, ...] = (Union,)
if sys.version_info >= (3, 10):  # X | Y
    import types as _types

    _UNION_TYPES = (Union, _types.UnionType)


def validate_tool_name(name: str) -> str:
    """Returns ``name`` if it matches ``^[a-zA-Z0-9_-]{1,64}$``; ValueError otherwise."""
    if not isinstance(name, str) or not TOOL_NAME_PATTERN.match(name):
        raise ValueError(
            f"invalid tool name {name!r}: it must match {TOOL_NAME_PATTERN.pattern} "
            "(letters, digits, _ and -; 1 to 64 characters)"
        )
    return name


def parse_docstring(doc: Optional[str]) -> Tuple[str, Dict[str, str], str]:
    """A Google-style docstring's description, ``Args:`` descriptions and ``Returns:`` text.

    The description is the text before the first section, paragraphs joined by a blank
    line and lines within a paragraph by a space.
    """
    text = inspect.cleandoc(doc or "")
    lines = text.splitlines()
    description: List[str] = []
    params: Dict[str, List[str]] = {}
    returns: List[str] = []
    section: Optional[str] = None
    current: Optional[str] = None
    param_indent: Optional[int] = None
    for line in lines:
        stripped = line.strip()
        header = stripped[:-1].lower() if stripped.endswith(":") else None
        if header in _SECTIONS and not line.startswith((" ", "\t")):
            section, current, param_indent = header, None, None
            continue
        if section is None:
            description.append(stripped)
        elif section in ("args", "arguments", "parameters", "params"):
            if not stripped:
                continue
            indent = len(line) - len(line.lstrip())
            m = re.match(r"^\*{0,2}(\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)$", stripped)
            if m and (param_indent is None or indent <= param_indent):
                param_indent = indent
                current = m.group(1)
                params[current] = [m.group(2)] if m.group(2) else []
            elif current is not None:
                params[current].append(stripped)
        elif section in ("returns", "return"):
            if stripped:
                # "int: the sum" -> "the sum" (a leading type is dropped).
                m = re.match(r"^[\w\[\], .|]+:\s+(.*)$", stripped) if not returns else None
                returns.append(m.group(1) if m else stripped)
    paragraphs: List[str] = []
    para: List[str] = []
    for line in description + [""]:
        if line:
            para.append(line)
        elif para:
            paragraphs.append(" ".join(para))
            para = []
    return (
        "\n\n".join(paragraphs),
        {k: " ".join(v).strip() for k, v in params.items()},
        " ".join(returns).strip(),
    )


def type_to_schema(tp: Any) -> Dict[str, Any]:
    """The JSON Schema of a type hint.

    str, int, float, bool, None, list[T] / List[T] / Sequence[T], tuple[T, ...], set[T],
    dict[str, T] / Dict / Mapping, Optional[T] and unions, Literal[...], Enum subclasses,
    Any (an empty schema). TypeError for anything else.
    """
    if tp is Any or tp is inspect.Parameter.empty:
        return {}
    if tp is None or tp is type(None):
        return {"type": "null"}
    if tp in _SCALARS:
        return {"type": _SCALARS[tp]}
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        values = [m.value for m in tp]
        return {**_literal_type(values), "enum": values}
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin is typing.Annotated:  # Annotated[T, "description"]
        schema = type_to_schema(args[0])
        for extra in args[1:]:
            if isinstance(extra, str):
                schema = {**schema, "description": extra}
        return schema
    if origin is typing.Literal:
        values = [v.value if isinstance(v, enum.Enum) else v for v in args]
        return {**_literal_type(values), "enum": values}
    if origin in _UNION_TYPES:
        non_null = [a for a in args if a is not type(None)]
        if Any in non_null:  # Optional[Any] (Python 3.10 adds it for a None default)
            return {}
        nullable = len(non_null) < len(args)
        if len(non_null) == 1:
            inner = type_to_schema(non_null[0])
            if not nullable:
                return inner
            if set(inner) == {"type"} and isinstance(inner["type"], str):
                return {"type": [inner["type"], "null"]}
            return {"anyOf": [inner, {"type": "null"}]}
        schemas = [type_to_schema(a) for a in non_null]
        if nullable:
            schemas.append({"type": "null"})
        return {"anyOf": schemas}
    if tp in (list, tuple, set, frozenset, abc.Sequence) or origin in (
        list,
        set,
        frozenset,
        abc.Sequence,
        abc.Set,
        abc.Iterable,
    ):
        array: Dict[str, Any] = {"type": "array"}
        if args:
            array["items"] = type_to_schema(args[0])
        if origin in (set, frozenset, abc.Set) or tp in (set, frozenset):
            array["uniqueItems"] = True
        return array
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return {"type": "array", "items": type_to_schema(args[0])}
        return {
            "type": "array",
            "prefixItems": [type_to_schema(a) for a in args],
            "minItems": len(args),
            "maxItems": len(args),
        }
    if tp in (dict, abc.Mapping) or origin in (dict, abc.Mapping):
        obj: Dict[str, Any] = {"type": "object"}
        if args:
            if args[0] is not str:
                raise TypeError(f"{tp!r}: JSON object keys are strings; use dict[str, T]")
            value = type_to_schema(args[1])
            if value:
                obj["additionalProperties"] = value
        return obj
    raise TypeError(f"no JSON Schema for the type {tp!r}")


def _literal_type(values: List[Any]) -> Dict[str, Any]:
    """``{"type": ...}`` when every value has the same JSON type, else ``{}``."""
    kinds = set()
    for v in values:
        if isinstance(v, bool):
            kinds.add("boolean")
        elif isinstance(v, int):
            kinds.add("integer")
        elif isinstance(v, float):
            kinds.add("number")
        elif isinstance(v, str):
            kinds.add("string")
        elif v is None:
            kinds.add("null")
        else:
            kinds.add("?")
    return {"type": kinds.pop()} if len(kinds) == 1 and "?" not in kinds else {}


def _json_default(value: Any) -> Any:
    """A default as JSON (an Enum member as its value); raises TypeError if it has none."""

    if isinstance(value, enum.Enum):
        value = value.value
    if isinstance(value, tuple):
        value = list(value)
    json.dumps(value)
    return value


def function_to_tool_definition(
    fn: Callable[..., Any],
    *,
    name: Optional[str] = None,
    description: Optional[str] = None,
) -> Dict[str, Any]:
    """A tool definition from a typed, documented function.

    Args:
        fn: The function. Every parameter needs a type hint the schema can express
            (see :func:`type_to_schema`); ``*args`` and ``**kwargs`` are refused.
        name: The tool's name (default: the function's ``__name__``); it must match
            ``^[a-zA-Z0-9_-]{1,64}$``.
        description: The tool's description (default: the docstring's text before its
            first section).

    Returns:
        ``{"name", "description", "input_schema"}`` and, when the function has a return
        annotation other than None, ``"output_schema"``. ``input_schema`` is a closed JSON
        Schema object (``additionalProperties: false``) whose parameters without a default
        are ``required``; a default is recorded as the property's ``default``.

    Raises:
        ValueError: The name is invalid.
        TypeError: A parameter's type has no JSON Schema, or a parameter is variadic.
    """
    tool_name = validate_tool_name(name if name is not None else fn.__name__)
    summary, param_docs, returns_doc = parse_docstring(inspect.getdoc(fn))
    try:
        hints = typing.get_type_hints(fn, include_extras=True)
    except Exception as e:  # an unresolvable forward reference
        raise TypeError(f"{tool_name}: cannot resolve the type hints: {e}") from e
    properties: Dict[str, Any] = {}
    required: List[str] = []
    for pname, param in inspect.signature(fn).parameters.items():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise TypeError(f"{tool_name}: variadic parameter {pname!r} has no JSON Schema")
        if pname not in hints:
            raise TypeError(f"{tool_name}: parameter {pname!r} has no type hint")
        try:
            prop = dict(type_to_schema(hints[pname]))
        except TypeError as e:
            raise TypeError(f"{tool_name}: parameter {pname!r}: {e}") from None
        if param_docs.get(pname):
            prop["description"] = param_docs[pname]
        if param.default is inspect.Parameter.empty:
            required.append(pname)
        else:
            try:
                prop["default"] = _json_default(param.default)
            except (TypeError, ValueError):
                pass  # no JSON form: the property is just optional
        properties[pname] = prop
    input_schema: Dict[str, Any] = {
        "type": "object",
        "properties": properties,
        "required": required,
        "additionalProperties": False,
    }
    definition: Dict[str, Any] = {
        "name": tool_name,
        "description": description if description is not None else summary,
        "input_schema": input_schema,
    }
    ret = hints.get("return", inspect.Parameter.empty)
    if ret is not inspect.Parameter.empty and ret is not None and ret is not type(None):
        try:
            output = dict(type_to_schema(ret))
        except TypeError as e:
            raise TypeError(f"{tool_name}: return type: {e}") from None
        if returns_doc:
            output["description"] = returns_doc
        definition["output_schema"] = output
    return definition
