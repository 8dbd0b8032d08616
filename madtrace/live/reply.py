# SPDX-License-Identifier: GPL-2.0-or-later
"""The answer to one REPL command, as the tracer gives it and the control
socket carries it (a module of its own: clients load nothing else)."""

from __future__ import annotations

from typing import Any
from dataclasses import asdict, dataclass


@dataclass
class Reply:
    ok: bool
    text: str = ""
    data: object = None
    error: str = ""
    code: int = 0
    ended: bool = False      # the session is over

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "Reply":
        fields: dict[str, Any] = {k: d.get(k, getattr(cls, k, None)) for k in cls.__dataclass_fields__}
        return cls(**fields)
