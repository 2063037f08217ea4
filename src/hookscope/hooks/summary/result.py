"""What ``hs.summary`` returns: a :class:`Summary` of totals and one :class:`SummaryRow` per module call."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from hookscope.hooks.summary.render import Table, format_shapes, html, human, plain_text, renderable

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

    def cells(self) -> tuple[str, str, str, str, str]:
        """The row as the table shows it: the name indented by depth, shapes, parameters and MACs."""
        label = self.name or "(model)"
        layer = f"{'  ' * self.depth}{label} ({self.type})"
        if self.call:
            layer += f" · call {self.call + 1}"
        output = "✗ failed" if self.failed else format_shapes(self.output_shapes) or "--"
        params = "(reused)" if self.call else f"{self.params:,}" if self.params else "--"
        macs = human(self.macs) if self.macs else "--"
        return layer, format_shapes(self.input_shapes) or "--", output, params, macs


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

    def table(self) -> Table:
        """What the printed and the HTML table show: title, one row per call, then the totals."""
        partial = " (partial: the forward failed)" if self.failed_module is not None else ""
        failed = frozenset(i for i, row in enumerate(self.rows) if row.failed)
        rows = [row.cells() for row in self.rows]
        return Table(f"{self.model_type} summary{partial}", rows, failed, self._totals())

    def _totals(self) -> list[str]:
        lines = [
            f"Total params: {self.total_params:,}",
            f"Trainable params: {self.trainable_params:,}",
            f"Non-trainable params: {self.non_trainable_params:,}",
            f"Total MACs: {human(self.total_macs)}",
            f"Params size: {human(self.param_bytes, 'B')}",
            f"Buffers: {self.buffer_elements:,} elements, {human(self.buffer_bytes, 'B')}",
            f"Input size: {human(self.input_bytes, 'B')}",
            f"Forward activations (estimate): {human(self.activation_bytes, 'B')}",
        ]
        if self.failed_module is not None:
            where = repr(self.failed_module) if self.failed_module else "the model's own forward"
            lines.append(f"Forward failed in: {where}")
        lines.extend(f"Note: {note}" for note in self.notes)
        return lines

    def __rich__(self) -> Group:
        return renderable(self.table())

    def __str__(self) -> str:
        return plain_text(self.table())

    def _repr_html_(self) -> str:
        """The table in a notebook: escaped HTML, failed rows in red, the totals under it."""
        return html(self.table())

    def __repr__(self) -> str:
        status = f", failed in {self.failed_module!r}" if self.failed_module is not None else ""
        return (
            f"Summary({self.model_type}, {len(self.rows)} rows, {self.total_params:,} params, "
            f"{human(self.total_macs, 'MACs')}{status})"
        )
