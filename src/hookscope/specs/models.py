"""Model specs: a torchvision model name, ``package.module:factory`` or ``path/to/file.py:factory``, built
into a module (optionally starting from a local state_dict), and the check that an input fits it.
"""

from __future__ import annotations

import difflib
import importlib
import importlib.util
import inspect
import sys
from pathlib import Path
from typing import Any

import torch
from torch import nn

from hookscope.specs.errors import SpecError


def load_model(
    spec: str, *, num_classes: int | None = None, weights: str | Path | None = None, quiet: bool = False
) -> nn.Module:
    """Build the model named by ``spec``; ``num_classes`` is passed when the factory accepts it.

    ``quiet`` leaves out the note that a torchvision model starts from random weights (for a caller that
    loads its weights from elsewhere, such as a resumed run's checkpoint)."""
    if ":" in spec:
        model = _from_factory(spec, num_classes)
    else:
        model = _from_torchvision(spec, num_classes, has_weights=quiet or weights is not None)
    if weights is not None:
        _load_weights(model, Path(weights), spec)
    return model


def is_torchvision_name(spec: str) -> bool:
    """True when ``spec`` is a plain model name rather than a ``module:factory`` spec."""
    return ":" not in spec


def _from_factory(spec: str, num_classes: int | None) -> nn.Module:
    target, _, factory_name = spec.rpartition(":")
    module = _import_file(target, spec) if target.endswith(".py") else _import_module(target, spec)
    factory = getattr(module, factory_name, None)
    if not callable(factory):
        public = [n for n in dir(module) if not n.startswith("_") and callable(getattr(module, n))]
        closest = difflib.get_close_matches(factory_name, public, n=3)
        hint = f" (closest: {', '.join(closest)})" if closest else ""
        raise SpecError(f"model spec {spec!r}: {target} has no callable {factory_name!r}{hint}")
    accepts_classes = "num_classes" in inspect.signature(factory).parameters
    try:
        model = factory(num_classes=num_classes) if accepts_classes and num_classes else factory()
    except Exception as err:
        raise SpecError(
            f"model spec {spec!r}: {factory_name}() raised {type(err).__name__}: {err}; fix the factory, "
            "or run it in Python to see where it fails"
        ) from err
    if not isinstance(model, nn.Module):
        raise SpecError(
            f"model spec {spec!r}: {factory_name}() returned {type(model).__name__}, not a torch.nn.Module; "
            "point the spec at a function that builds the model"
        )
    return model


def _import_module(name: str, spec: str) -> object:
    try:
        return importlib.import_module(name)
    except ImportError as err:
        raise SpecError(
            f"model spec {spec!r}: cannot import module {name!r} ({err}); check the spelling, install the "
            "package, or give a file instead: path/to/file.py:factory"
        ) from err


def _import_file(path_text: str, spec: str) -> object:
    path = Path(path_text).expanduser()
    if not path.is_file():
        raise SpecError(f"model spec {spec!r}: no file {path}; give an existing path/to/file.py:factory")
    module_name = f"hookscope_user_{path.stem}"
    loader_spec = importlib.util.spec_from_file_location(module_name, path)
    if loader_spec is None or loader_spec.loader is None:
        raise SpecError(f"model spec {spec!r}: {path} cannot be imported as Python; give a .py file")
    module = importlib.util.module_from_spec(loader_spec)
    sys.modules[module_name] = module
    # run as `python file.py` runs a script: no __pycache__ left beside the user's file
    writes_bytecode, sys.dont_write_bytecode = sys.dont_write_bytecode, True
    try:
        loader_spec.loader.exec_module(module)
    except Exception as err:
        del sys.modules[module_name]
        raise SpecError(
            f"model spec {spec!r}: importing {path} failed ({type(err).__name__}: {err})"
        ) from err
    finally:
        sys.dont_write_bytecode = writes_bytecode
    return module


def _from_torchvision(name: str, num_classes: int | None, *, has_weights: bool) -> nn.Module:
    try:
        from torchvision import models
    except ImportError as err:
        raise SpecError(
            f"model {name!r} looks like a torchvision name but torchvision is not installed; "
            "pip install 'hookscope[vision]', or give package.module:factory"
        ) from err
    available = models.list_models(module=models)
    kind = "" if name in available else _other_torchvision_kind(models, name)
    if kind:
        raise SpecError(
            f"model {name!r} is a torchvision {kind} model, not a classifier; hookscope builds "
            "classification models (hookscope train fits classifiers): give one such as resnet18, or "
            "package.module:factory returning a model that maps images to class scores"
        )
    if name not in available:
        closest = difflib.get_close_matches(name, available, n=3)
        hint = f" (closest torchvision names: {', '.join(closest)})" if closest else ""
        raise SpecError(
            f"unknown model {name!r}{hint}; give a torchvision model name, package.module:factory "
            "or path/to/file.py:factory"
        )
    if not has_weights:
        print(
            f"note: {name} starts from random weights: pretrained weights cannot be downloaded here; "
            "pass a local state_dict with --weights FILE",
            file=sys.stderr,
        )
    kwargs = {"num_classes": num_classes} if num_classes else {}
    return models.get_model(name, weights=None, **kwargs)


def _other_torchvision_kind(models: Any, name: str) -> str:
    """The task of a torchvision model that is not a classifier (``"detection"``...), else ``""``."""
    for kind in ("detection", "segmentation", "video", "optical_flow", "quantization"):
        module = getattr(models, kind, None)
        if module is not None and name in models.list_models(module=module):
            return kind.replace("_", " ")
    return ""


def _load_weights(model: nn.Module, path: Path, spec: str) -> None:
    """Load every tensor of ``path`` whose name and shape match ``model``; the rest (a 1000-class head on
    2-class data) keeps its fresh initialisation, and one note line names it."""
    state = _read_state_dict(path)
    own = model.state_dict()
    fits = {k: v for k, v in state.items() if k in own and tuple(v.shape) == tuple(own[k].shape)}
    if not fits:
        sample = ", ".join(list(state)[:3]) or "nothing"
        raise SpecError(
            f"--weights {path} does not fit model {spec!r}: none of its {len(state)} tensors ({sample}...) "
            f"matches a parameter of the model by name and shape; give a state_dict saved from {spec}"
        )
    model.load_state_dict(fits, strict=False)
    skipped = [k for k in state if k not in fits]
    fresh = [k for k in own if k not in fits]
    if skipped or fresh:
        print(
            f"note: --weights {path}: loaded {len(fits)} of {len(state)} tensors; skipped "
            f"{_names(skipped)} (no parameter of that name and shape); freshly initialised {_names(fresh)}",
            file=sys.stderr,
        )


def _read_state_dict(path: Path) -> dict[str, torch.Tensor]:
    if not path.is_file():
        raise SpecError(f"--weights {path}: no such file; give a state_dict saved with torch.save")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:
        raise SpecError(
            f"--weights {path} cannot be loaded safely ({type(err).__name__}); save it with "
            "torch.save(model.state_dict(), path)"
        ) from err
    # Training checkpoints often wrap the state_dict; timm and Lightning use these two keys.
    for key in ("model", "state_dict"):
        if isinstance(state, dict) and isinstance(state.get(key), dict):
            state = state[key]
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise SpecError(
            f"--weights {path} holds a {type(state).__name__}, not a state_dict; save it with "
            "torch.save(model.state_dict(), path)"
        )
    return state


def _names(keys: list[str], most: int = 4) -> str:
    """``a, b, c and 5 more``; ``none`` for no keys."""
    if not keys:
        return "none"
    more = f" and {len(keys) - most} more" if len(keys) > most else ""
    return ", ".join(keys[:most]) + more


def parse_input_size(text: str) -> tuple[int, ...]:
    """``"1,3,224,224"`` -> ``(1, 3, 224, 224)``; a SpecError for anything that is not positive integers."""
    try:
        size = tuple(int(part) for part in text.replace("x", ",").split(","))
    except ValueError:
        size = ()
    if not size or any(n < 1 for n in size):
        raise SpecError(
            f"--input-size {text!r}: give positive integers separated by commas, e.g. 1,3,224,224"
        )
    return size


def checked_summary(
    model: nn.Module,
    spec: str,
    fix: str,
    *,
    example: torch.Tensor | None = None,
    input_size: tuple = (),
    num_classes: int | None = None,
) -> Any:
    """``hs.summary`` of ``model`` on ``example`` (or zeros of ``input_size``). An input that does not fit
    the model becomes a SpecError naming the module that refused it, the shape it received, and ``fix``;
    so does a model scoring fewer classes than ``num_classes`` (the labels of the data)."""
    from hookscope.hooks.summary import summary

    shape = tuple(example.shape) if example is not None else input_size
    try:
        result = summary(model, example) if example is not None else summary(model, input_size=input_size)
    except Exception as err:
        notes = getattr(err, "__notes__", [])
        where = notes[0].splitlines()[0].removeprefix("hookscope.summary: ") if notes else str(err)
        # ``from err``: --debug must still show the model's own error (e.g. ViT's "Expected 224").
        raise SpecError(
            f"input of shape {','.join(map(str, shape))} does not fit model {spec!r}: {where}; {fix}"
        ) from err
    if num_classes is not None:
        _check_scores(result, spec, num_classes)
    return result


def _check_scores(result: Any, spec: str, num_classes: int) -> None:
    """A SpecError when the model's output (batch, K) scores fewer classes than the data's labels reach."""
    outputs = result.rows[0].output_shapes if result.rows and result.rows[0].name == "" else []
    if len(outputs) != 1 or len(outputs[0]) != 2 or outputs[0][1] >= num_classes:
        return
    scored = outputs[0][1]
    raise SpecError(
        f"model {spec!r} scores {scored} classes but the labels of --data go up to {num_classes - 1}; "
        f"give a model with {num_classes} outputs (a factory taking num_classes gets it), or labels "
        f"0..{scored - 1}"
    )
