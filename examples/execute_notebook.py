"""Execute ``examples/quickstart.ipynb`` top to bottom in a fresh Jupyter kernel and store its outputs.

    python examples/execute_notebook.py      # rewrites examples/quickstart.ipynb with fresh outputs

The kernel runs in a temporary folder (the notebook's run folder is written there, not into the
repository) and imports the hookscope this script sees. The stored outputs are what GitHub shows;
``tests/examples/test_notebook.py`` runs the same function on a copy and checks them.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import nbformat
from nbclient import NotebookClient

NOTEBOOK = Path(__file__).resolve().parent / "quickstart.ipynb"
CELL_TIMEOUT_S = 300  # per cell: a loaded CI machine, not the notebook's usual few seconds


def execute(path: Path, cwd: Path) -> nbformat.NotebookNode:
    """The notebook at ``path``, executed in a new kernel whose working folder is ``cwd``; the first
    failing cell raises ``nbclient.exceptions.CellExecutionError`` naming the cell and the error."""
    notebook = nbformat.read(path, as_version=4)
    client = NotebookClient(
        notebook, timeout=CELL_TIMEOUT_S, kernel_name="python3", resources={"metadata": {"path": str(cwd)}}
    )
    client.execute()
    return notebook


def main() -> None:
    with tempfile.TemporaryDirectory() as cwd:
        notebook = execute(NOTEBOOK, Path(cwd))
    nbformat.write(notebook, NOTEBOOK)
    print(f"executed and saved {NOTEBOOK}")


if __name__ == "__main__":
    main()
