"""Execute ``examples/quickstart.ipynb`` top to bottom in a fresh Jupyter kernel and store its outputs.

    python examples/execute_notebook.py      # rewrites examples/quickstart.ipynb with fresh outputs

The kernel runs in a temporary folder (the notebook's run folder is written there, not into the
repository) and imports the hookscope this script imports. The stored outputs are what GitHub shows;
``tests/examples/test_notebook.py`` runs the same function on a copy and checks them.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import nbformat
from nbclient import NotebookClient

import hookscope

NOTEBOOK = Path(__file__).resolve().parent / "quickstart.ipynb"
CELL_TIMEOUT_S = 300  # per cell: a loaded CI machine, not the notebook's usual few seconds


def execute(path: Path, cwd: Path) -> nbformat.NotebookNode:
    """The notebook at ``path``, executed in a new kernel whose working folder is ``cwd``; the first
    failing cell raises ``nbclient.exceptions.CellExecutionError`` naming the cell and the error.

    The kernel imports the hookscope this script imports (its folder goes first on ``PYTHONPATH``: a
    relative entry would not resolve from ``cwd``) and is told the notebook's name as Jupyter Server
    tells it (``JPY_SESSION_NAME``), so that the run folder records ``notebook quickstart.ipynb``."""
    notebook = nbformat.read(path, as_version=4)
    client = NotebookClient(
        notebook, timeout=CELL_TIMEOUT_S, kernel_name="python3", resources={"metadata": {"path": str(cwd)}}
    )
    source = str(Path(hookscope.__file__).resolve().parents[1])
    python_path = os.pathsep.join(p for p in (source, os.environ.get("PYTHONPATH")) if p)
    client.execute(env={**os.environ, "PYTHONPATH": python_path, "JPY_SESSION_NAME": path.name})
    return notebook


def main() -> None:
    with tempfile.TemporaryDirectory() as cwd:
        notebook = execute(NOTEBOOK, Path(cwd))
    nbformat.write(notebook, NOTEBOOK)
    print(f"executed and saved {NOTEBOOK}")


if __name__ == "__main__":
    main()
