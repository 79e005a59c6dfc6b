"""Request bodies of the service: strict JSON, checked on input, answered 422 with the field named.

FastAPI would parse a body with :func:`json.loads` before any dependency runs
(so before the API key is checked), accept ``NaN``, ``Infinity``, integers of
any length and ``1e400`` (infinity), and coerce ``true`` to ``1.0`` for a number
field. :func:`parse_body` instead runs inside the route, after authentication,
and accepts only:

* ``Content-Type: application/json`` (or ``application/*+json``; a missing
  header is taken as JSON) and a body of valid UTF-8 JSON;
* numbers JSON allows: no ``NaN``/``Infinity``, floats that stay finite,
  integers of at most 64 bits (``-2**63`` to ``2**63 - 1``);
* nesting at most :data:`MAX_BODY_DEPTH` levels (the body object is level 1),
  checked before the model sees the body;
* valid Unicode text everywhere (no lone surrogate such as ``"\\ud800"`` in a
  string or a key);
* then the route's Pydantic model in strict mode (no ``true`` for a number,
  no ``"10"`` for an integer).

Every refusal is a :class:`BodyError` holding FastAPI-shaped ``detail`` items
(``loc`` starting with ``"body"``, ``msg``, ``type``) and never echoing the bad
value back.
"""

from __future__ import annotations

import json
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from .validate import INT_MAX, INT_MIN

#: Deepest nesting of a request body (the body object is level 1; record metadata has its own,
#: lower limit of :data:`gpuir.service.validate.MAX_DEPTH` levels).
MAX_BODY_DEPTH = 40

M = TypeVar("M", bound=BaseModel)


class BodyError(ValueError):
    """A body the service refuses (HTTP 422); ``detail`` is the list of FastAPI-style error items."""

    def __init__(self, detail: list[dict[str, Any]]):
        super().__init__("; ".join(f"{'.'.join(map(str, d['loc']))}: {d['msg']}" for d in detail))
        self.detail = detail


def _error(loc: list[Any], msg: str, kind: str = "value_error") -> BodyError:
    return BodyError([{"loc": ["body", *loc], "msg": msg, "type": kind}])


class _Bad:
    """A number the service refuses, kept in place while parsing so that :func:`check` names where it is."""

    __slots__ = ("msg",)

    def __init__(self, msg: str):
        self.msg = msg


def _constant(name: str) -> Any:
    return _Bad(f"is {name}, which is not a JSON number: numbers must be finite")


def _int(text: str) -> Any:
    if len(text) > 20:  # more digits than any 64-bit integer: do not even convert it
        return _Bad(f"is an integer of {len(text.lstrip('-'))} digits: integers must fit in 64 bits "
                    f"({INT_MIN} to {INT_MAX}); send a string for larger numbers")
    v = int(text)
    if not INT_MIN <= v <= INT_MAX:
        return _Bad(f"is an integer beyond 64 bits ({INT_MIN} to {INT_MAX}); send a string for larger numbers")
    return v


def _float(text: str) -> Any:
    v = float(text)
    if v in (float("inf"), float("-inf")):
        return _Bad("is a number beyond the range of a double: numbers must be finite")
    return v


def _is_json(content_type: str | None) -> bool:
    if not content_type:
        return True
    mt = content_type.split(";", 1)[0].strip().lower()
    return mt == "application/json" or (mt.startswith("application/") and mt.endswith("+json"))


def loads(raw: bytes) -> Any:
    """The JSON value of a body under the rules of the module docstring (raises :class:`BodyError`)."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise _error([], f"the body is not UTF-8 (byte {e.start}): send JSON as UTF-8 text") from None
    text = text.removeprefix("\ufeff")
    try:
        value = json.loads(text, parse_constant=_constant, parse_int=_int, parse_float=_float)
    except RecursionError:
        raise _error([], f"the body is nested too deeply (at most {MAX_BODY_DEPTH} levels)") from None
    except json.JSONDecodeError as e:
        raise _error([], f"the body is not valid JSON ({e.msg} at line {e.lineno}, column {e.colno}); send a "
                         "JSON object with the header 'Content-Type: application/json'", "json_invalid") from None
    check(value)
    return value


def _text_ok(s: str) -> bool:
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def check(value: Any) -> None:
    """Depth and text of a parsed body, iteratively (no recursion): raises :class:`BodyError` naming the place."""
    stack: list[tuple[Any, list[Any], int]] = [(value, [], 1)]
    while stack:
        v, loc, depth = stack.pop()
        if isinstance(v, _Bad):
            raise _error(loc, v.msg)
        if isinstance(v, str):
            if not _text_ok(v):
                raise _error(loc, "holds a lone surrogate (e.g. \\ud800), which is not valid Unicode text: "
                                  "send valid UTF-8")
        elif isinstance(v, (dict, list)):
            if depth > MAX_BODY_DEPTH:
                raise _error(loc, f"nested more than {MAX_BODY_DEPTH} levels deep: flatten it")
            if isinstance(v, dict):
                for k, x in v.items():
                    if not _text_ok(k):
                        raise _error(loc, "a key holds a lone surrogate (e.g. \\ud800), which is not valid "
                                          "Unicode text: send valid UTF-8")
                    stack.append((x, [*loc, k], depth + 1))
            else:
                stack.extend((x, [*loc, i], depth + 1) for i, x in enumerate(v))


def validate(model: type[M], value: Any) -> M:
    """``model`` (strict) from a parsed body; a :class:`BodyError` names each bad field, without its value."""
    try:
        return model.model_validate(value, strict=True)
    except ValidationError as e:
        raise BodyError([{"loc": ["body", *e_["loc"]], "msg": str(e_["msg"]), "type": str(e_["type"])}
                         for e_ in e.errors(include_url=False, include_input=False)]) from None


def parse_body(raw: bytes, content_type: str | None, model: type[M]) -> M:
    """A request's body as ``model``: content type, strict JSON, depth, text, then the model."""
    if not _is_json(content_type):
        raise _error([], f"Content-Type is {content_type.split(';', 1)[0].strip()!r}: send a JSON body with the "
                         "header 'Content-Type: application/json' (curl: -H 'Content-Type: application/json')",
                     "content_type")
    if not raw.strip():
        raise _error([], "the body is empty: send a JSON object (with 'Content-Type: application/json')", "missing")
    return validate(model, loads(raw))
