"""What a request body may hold: each field read and checked here, and the `ClientError` (a 4xx
with a JSON body naming the field and the fix) for everything a client can get wrong. A route
never answers a client's mistake with a 500."""

from __future__ import annotations

import json
from typing import Any

from flaxheads.inference import readable_texts

PREDICT_INPUTS = ("a string, a pair of strings [string, string], or a batch of mixed strings and pairs "
                  "[[string], [string, string], ...]")
"""What /predict's `inputs` may be: text-embeddings-inference's words for the same shapes."""


class ClientError(Exception):
    """A request the server cannot answer because of what the client sent: `status` (4xx),
    `message` (the field and the fix) and `error_type` (text-embeddings-inference's kinds:
    "validation", "tokenizer", "overloaded", "not_found", ...)."""

    def __init__(self, status: int, message: str, error_type: str = "validation"):
        super().__init__(message)
        self.status, self.message, self.error_type = status, message, error_type

    def body(self) -> dict[str, str]:
        return {"error": self.message, "error_type": self.error_type}


def parse_body(raw: bytes) -> dict[str, Any]:
    """The JSON object `raw` holds; ClientError 400 for bytes that are no JSON object."""
    try:
        body = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ClientError(400, f"the request body is not valid JSON ({err}): send a JSON object, e.g. "
                               '{"inputs": "a fine film"}, with Content-Type: application/json') from None
    if not isinstance(body, dict):
        raise ClientError(422, f"the request body is a JSON {_json_type(body)}, not an object: send e.g. "
                               '{"inputs": "a fine film"}')
    return body


def check_fields(body: dict[str, Any], known: tuple[str, ...]) -> None:
    """ClientError 422 naming a field the route does not read (a misspelt one would be ignored)."""
    unknown = sorted(set(body) - set(known))
    if unknown:
        raise ClientError(422, f"unknown field(s) {', '.join(map(repr, unknown))}: this route reads "
                               f"{', '.join(map(repr, known))}")


def flag(body: dict[str, Any], name: str, default: bool = False) -> bool:
    value = body.get(name, default)
    if not isinstance(value, bool):
        raise ClientError(422, f"`{name}` must be true or false, not {_shown(value)}")
    return value


def optional_int(body: dict[str, Any], name: str, *, minimum: int, default: int | None = None) -> int | None:
    value = body.get(name, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ClientError(422, f"`{name}` must be an integer of at least {minimum}, not {_shown(value)}")
    return value


def choice(body: dict[str, Any], name: str, choices: tuple[str, ...], default: str) -> str:
    value = body.get(name, default)
    if not isinstance(value, str) or value.lower() not in choices:
        raise ClientError(422, f"`{name}` must be one of {', '.join(map(repr, choices))}, not {_shown(value)}")
    return value.lower()


def text(value: Any, where: str) -> str:
    """`value` when it is a str with words in it (`readable_texts`' rule); ClientError 422 naming
    `where` (the field's JSON path, e.g. `inputs[2][1]`) otherwise."""
    if not isinstance(value, str):
        raise ClientError(422, f"`{where}` must be a string, not {_shown(value)}")
    try:
        readable_texts([value], where)
    except ValueError:
        raise ClientError(422, f"`{where}` is empty or blank ({_shown(value)}): the model would read no word of it; "
                               "send it with words in it, or leave it out") from None
    return value


def texts(value: Any, where: str, max_items: int) -> tuple[list[str], bool]:
    """(texts, whether one str was sent) from a str or a non-empty list of str."""
    if isinstance(value, str):
        return [text(value, where)], True
    items = items_of(value, where, "a string or a list of strings", max_items)
    return [text(item, f"{where}[{i}]") for i, item in enumerate(items)], False


def sequences(value: Any, max_items: int, where: str = "inputs") -> tuple[list[tuple[str, str | None]], bool]:
    """/predict's `inputs` as text-embeddings-inference reads them: (per input its text and second
    text or None, whether one input was sent). A list of one or two strings is one input (a text,
    a pair); a batch is a list of such lists."""
    if isinstance(value, str):
        return [(text(value, where), None)], True
    if isinstance(value, list) and value and all(isinstance(item, str) for item in value):
        if len(value) > 2:
            raise ClientError(422, f"`{where}` is a list of {len(value)} strings; it must be {PREDICT_INPUTS}: "
                                   f"a batch of single texts is [[\"a\"], [\"b\"], ...]")
        return [_sequence(value, where)], True
    items = items_of(value, where, PREDICT_INPUTS, max_items)
    out = []
    for i, item in enumerate(items):
        if not isinstance(item, list) or not 1 <= len(item) <= 2:
            raise ClientError(422, f"`{where}[{i}]` is {_shown(item)}; in a batch each input is [text] or "
                                   f"[text, text_pair] ({PREDICT_INPUTS})")
        out.append(_sequence(item, f"{where}[{i}]"))
    return out, False


def _sequence(item: list, where: str) -> tuple[str, str | None]:
    first = text(item[0], f"{where}[0]")
    return (first, text(item[1], f"{where}[1]")) if len(item) == 2 else (first, None)


def items_of(value: Any, where: str, expected: str, max_items: int) -> list:
    if value is None:
        raise ClientError(422, f"`{where}` is missing: send {expected}")
    if not isinstance(value, list):
        raise ClientError(422, f"`{where}` is {_shown(value)}; it must be {expected}")
    if not value:
        raise ClientError(422, f"`{where}` is an empty list: send at least one input")
    if len(value) > max_items:
        raise ClientError(413, f"`{where}` holds {len(value)} inputs, more than the {max_items} one request may "
                               "hold (--max_client_batch_size): split it into several requests")
    return value


def _json_type(value: Any) -> str:
    return {dict: "object", list: "array", str: "string", bool: "boolean", type(None): "null"}.get(
        type(value), "number")


def _shown(value: Any, limit: int = 60) -> str:
    shown = json.dumps(value, ensure_ascii=False, default=repr)
    shown = shown if len(shown) <= limit else shown[: limit - 3] + "..."
    return f"the {_json_type(value)} {shown}"
