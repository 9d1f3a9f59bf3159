"""What ``apply()`` did: one outcome per adapter, and the support verdict."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from . import matrix
from .record import Side
from .versions import Environment


class State(str, enum.Enum):
    APPLIED = "applied"
    NOT_NEEDED = "not needed"
    UNSUPPORTED = "unsupported"
    SKIPPED = "skipped"
    FAILED = "failed"


@dataclass(frozen=True)
class Outcome:
    adapter: str
    state: State
    reason: str
    side: Side

    def as_dict(self) -> dict[str, str]:
        return {"id": self.adapter, "state": self.state.value, "reason": self.reason,
                "side": self.side.value}


@dataclass(frozen=True)
class Report:
    """What ``apply()`` did, per adapter, and whether the installed pair is supported."""

    environment: Environment
    support: matrix.Support
    outcomes: tuple[Outcome, ...] = field(default_factory=tuple)

    @property
    def ok(self) -> bool:
        return self.support.supported and not any(
            o.state in (State.FAILED, State.UNSUPPORTED) for o in self.outcomes
        )

    @property
    def applied(self) -> tuple[str, ...]:
        return tuple(o.adapter for o in self.outcomes if o.state is State.APPLIED)

    def state_of(self, adapter_id: str) -> State:
        for o in self.outcomes:
            if o.adapter == adapter_id:
                return o.state
        raise KeyError(adapter_id)

    def as_dict(self) -> dict[str, object]:
        return {
            "environment": self.environment.as_dict(),
            "supported": self.support.supported,
            "support": self.support.message,
            "ok": self.ok,
            "adapters": [o.as_dict() for o in self.outcomes],
        }

    def __str__(self) -> str:
        lines = [self.environment.describe(), self.support.message]
        width = max((len(o.adapter) for o in self.outcomes), default=0)
        lines += [f"  {o.adapter:<{width}}  {o.state.value:<11}  {o.reason}" for o in self.outcomes]
        return "\n".join(lines)
