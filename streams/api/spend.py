"""``GET /api/v1/spend``'s query parameters: exactly the keyword-only arguments of
``costline.streams.cli.spend_cmd.spend_answer``, by name.

``costline spend`` and the API build their answer with that one function, and the API reads its
parameters from the function's signature: an option added there (with a default) is a query
parameter the same day, parsed the same way, and listed in the OpenAPI document. A
``Sequence[str]`` argument takes the parameter repeated (``where=env=prod&where=team=a``), a
``bool`` one ``true``/``false``, any other one value, as the command line takes it.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any, Literal

from costline.streams.api.http import Query
from costline.streams.cli import spend_cmd

Form = Literal["one", "many", "flag"]


@dataclass(frozen=True)
class Parameter:
    name: str
    form: Form
    default: Any


def parameters() -> list[Parameter]:
    """The query parameters, in the signature's order."""
    found = []
    for name, param in inspect.signature(spend_cmd.spend_answer).parameters.items():
        if param.kind is inspect.Parameter.KEYWORD_ONLY:
            found.append(Parameter(name, _form(str(param.annotation)), param.default))
    return found


def _form(annotation: str) -> Form:
    """From the annotation as written (the module postpones annotations)."""
    if annotation == "bool":
        return "flag"
    if annotation.startswith(("Sequence[", "list[", "tuple[")):
        return "many"
    return "one"


def options(query_of: Any) -> dict[str, Any]:
    """The keyword arguments of ``spend_answer`` a request's query string asks for (a
    ``Query`` built with ``known()``)."""
    query: Query = query_of
    out: dict[str, Any] = {}
    for parameter in parameters():
        if parameter.form == "many":
            out[parameter.name] = query.many(parameter.name)
        elif parameter.form == "flag":
            out[parameter.name] = query.flag(parameter.name)
        else:
            value = query.one(parameter.name)
            if value is not None:
                out[parameter.name] = value
    return out


def known() -> list[str]:
    return [parameter.name for parameter in parameters()]
