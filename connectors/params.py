"""Parameter types the plug-ins of rule files share (reclaim connectors, notifiers)."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, PlainSerializer

from costline.rules.durations import PositiveDuration, format_duration

EnvName = Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")]
"""The name of an environment variable that holds a secret (never the secret itself)."""

Seconds = Annotated[PositiveDuration, PlainSerializer(format_duration, return_type=str)]
"""A duration parameter: written ``10s``, held as seconds, and passed on as ``10s`` again so
the parameters of a request validate a second time where they are used."""
