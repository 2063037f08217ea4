"""Private torch APIs are used in hookscope/compat.py only, so a torch upgrade breaks one file, not twenty.

Every other ``.py`` under ``src/hookscope`` is scanned (code and strings; comments and docstrings are
skipped) for the private names below. A hit fails the test naming ``file:line``: wrap the API in
``compat.py`` with the torch versions it was checked on, and call the wrapper.
"""

import ast
import io
import re
import tokenize
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "hookscope"

PRIVATE = re.compile(
    r"\btorch(\.\w+)*\._(?!_)\w"  # torch._foreach_norm, torch._dynamo, torch.utils._pytree, ...data._utils...
    r"|\baten\._\w"  # private aten ops (aten._scaled_dot_product_flash_attention_for_cpu)
    r"|\._version\b"  # Tensor._version
    r"|hooks_dict_ref|_compiled_call_impl|_foreach|_orig_mod|_overloadpacket|_python_dispatch|_pytree"
)


def _private_uses(path: Path) -> list[tuple[int, str]]:
    """(line, code) of each line that names a private torch API. Comments and docstrings are prose, not
    uses, and are skipped; other strings count (``sys.modules.get("torch._dynamo...")`` is a use)."""
    source = path.read_text(encoding="utf-8")
    prose: set[int] = set()
    for node in ast.walk(ast.parse(source)):
        if (
            isinstance(node, ast.Expr)
            and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, str)
        ):
            prose.update(range(node.lineno, (node.end_lineno or node.lineno) + 1))
    comments = {
        token.start[0]: token.start[1]
        for token in tokenize.generate_tokens(io.StringIO(source).readline)
        if token.type == tokenize.COMMENT
    }
    found = []
    for number, line in enumerate(source.splitlines(), start=1):
        code = line[: comments.get(number, len(line))]
        if number not in prose and PRIVATE.search(code):
            found.append((number, code.strip()))
    return found


def test_private_torch_apis_are_used_only_in_compat():
    hits = []
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE).as_posix()
        if relative == "compat.py":
            continue
        hits += [f"src/hookscope/{relative}:{line}: {text}" for line, text in _private_uses(path)]
    assert not hits, "private torch APIs outside hookscope/compat.py (wrap them there):\n" + "\n".join(hits)


def test_the_scan_finds_what_it_must(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text(
        "import torch\n"
        "# torch._dynamo in a comment is fine\n"
        "norms = torch._foreach_norm(grads)\n"
        "from torch.utils._python_dispatch import TorchDispatchMode\n"
        "v = t._version\n"
        'm = sys.modules.get("torch._dynamo.eval_frame")\n'
        'getattr(module, "_compiled_call_impl", None)\n'
        "ok = torch.linalg.vector_norm(x)  # torch._foreach_norm would be faster\n"
        "print(torch.__version__, aten.mm)\n"
        'def f():\n    """Reads ``tensor._version`` through compat."""\n',
        encoding="utf-8",
    )
    assert [line for line, _ in _private_uses(sample)] == [3, 4, 5, 6, 7]
