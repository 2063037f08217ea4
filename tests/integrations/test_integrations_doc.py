"""docs/integrations.md works as written: its Python blocks run in order in one namespace, and each
``print(...)  # text`` prints ``text``."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parents[2] / "docs" / "integrations.md"
BLOCK = re.compile(r"```python\n(.*?)```", re.DOTALL)

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("deterministic")]


def python_blocks(text: str) -> list[str]:
    return BLOCK.findall(text)


def promised_output(block: str) -> list[str]:
    """The comment after each ``print(...)`` line: what the doc says it prints."""
    return [line.partition("# ")[2].strip() for line in block.splitlines() if line.startswith("print(")]


def test_the_doc_has_one_example_per_loop() -> None:
    blocks = python_blocks(DOC.read_text(encoding="utf-8"))
    assert any("hs.watch(" in b for b in blocks)
    for framework in ("lightning", "fastai", "transformers"):
        assert any(f"hookscope.integrations.{framework} import" in b for b in blocks), framework


def test_every_example_runs_and_prints_what_it_says(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WANDB_MODE", "offline")
    printed: list[str] = []
    namespace = {"print": lambda *args: printed.append(" ".join(str(a) for a in args))}
    promised: list[str] = []
    for block in python_blocks(DOC.read_text(encoding="utf-8")):
        exec(compile(block, str(DOC), "exec"), namespace)
        promised += promised_output(block)
    assert printed == promised
    assert "hookscope/findings" in next(tmp_path.glob("runs/lightning_logs/*/metrics.csv")).read_text()
