"""What ``hs.summary`` returns: a :class:`Summary` of totals and one :class:`SummaryRow` per module call."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from hookscope.hooks.summary.render import human, plain_text, renderable

if TYPE_CHECKING:
    from rich.console import Group

Shape = tuple[int, ...]


@dataclass
class SummaryRow:
    """One module call: where it sits, what went in and out, the parameters it holds and the MACs it did.

    ``params`` counts the parameters of this module and of descendants not listed as rows of their own; a
    module called again (``call`` 1, 2, ...) shows 0 there, so ``sum(row.params) == total_params``.
    ``macs`` counts multiply-accumulates done in this call outside its listed child calls.
    """

    name: str
    type: str
    depth: int
    input_shapes: list[Shape]
    output_shapes: list[Shape] = field(default_factory=list)
    params: int = 0
    trainable_params: int = 0
    macs: int = 0
    call: int = 0
    failed: bool = False


@dataclass
class Summary:
    """Result of ``hs.summary``: one row per module call plus model totals; prints as a table.

    ``failed_module`` is the qualified name of the module whose forward raised ("" for the model's own
    forward), ``None`` when the forward succeeded. ``activation_bytes`` estimates what one forward keeps for
    backward: the bytes of every leaf module's outputs. ``notes`` says what the numbers leave out (modules
    that refuse hooks, parameters still lazy after the forward); they print under the totals.
    """

    model_type: str
    rows: list[SummaryRow]
    total_params: int
    trainable_params: int
    total_macs: int
    param_bytes: int
    buffer_elements: int
    buffer_bytes: int
    input_bytes: int
    activation_bytes: int
    failed_module: str | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def non_trainable_params(self) -> int:
        """Parameters with ``requires_grad=False`` (frozen layers)."""
        return self.total_params - self.trainable_params

    def to_dict(self) -> dict[str, Any]:
        """Plain data (lists, ints, strings) for JSON or a run folder."""
        data = asdict(self)
        data["non_trainable_params"] = self.non_trainable_params
        for row in data["rows"]:
            row["input_shapes"] = [list(s) for s in row["input_shapes"]]
            row["output_shapes"] = [list(s) for s in row["output_shapes"]]
        return data

    def __rich__(self) -> Group:
        return renderable(self)

    def __str__(self) -> str:
        return plain_text(self)

    def __repr__(self) -> str:
        status = f", failed in {self.failed_module!r}" if self.failed_module is not None else ""
        return (
            f"Summary({self.model_type}, {len(self.rows)} rows, {self.total_params:,} params, "
            f"{human(self.total_macs, 'MACs')}{status})"
        )
