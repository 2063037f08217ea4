"""What the ``hookscope`` command line names, turned into objects: a model spec and a data spec.

A model spec is a torchvision model name (built with ``weights=None``: pretrained weights cannot be
downloaded here, a local state_dict comes in through ``weights=``), ``package.module:factory`` or
``path/to/file.py:factory``. A data spec is ``digits`` (scikit-learn's bundled digits), a folder of images in
class sub-folders (ImageFolder layout, optionally split into ``train/`` and ``valid/``), or a ``.pt`` /
``.npz`` file of tensors. Every failure is a :class:`SpecError` whose one-line message names the spec and
the fix, so the command can print it without a traceback.
"""

from __future__ import annotations

import difflib
import importlib
import importlib.util
import inspect
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, Subset, TensorDataset

from hookscope.data.digits import digits_loaders

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff")


class SpecError(Exception):
    """A model, data or input spec given on the command line cannot be used (a usage error)."""


@dataclass
class Data:
    """Training and validation loaders plus what a model needs to know about them."""

    train: DataLoader
    valid: DataLoader
    num_classes: int
    classes: list[str]


def load_model(spec: str, *, num_classes: int | None = None, weights: str | Path | None = None) -> nn.Module:
    """Build the model named by ``spec``; ``num_classes`` is passed when the factory accepts it."""
    if ":" in spec:
        model = _from_factory(spec, num_classes)
    else:
        model = _from_torchvision(spec, num_classes, has_weights=weights is not None)
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
    model = factory(num_classes=num_classes) if accepts_classes and num_classes else factory()
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
        ) from None


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
    try:
        loader_spec.loader.exec_module(module)
    except Exception as err:
        del sys.modules[module_name]
        raise SpecError(
            f"model spec {spec!r}: importing {path} failed ({type(err).__name__}: {err})"
        ) from None
    return module


def _from_torchvision(name: str, num_classes: int | None, *, has_weights: bool) -> nn.Module:
    try:
        from torchvision import models
    except ImportError:
        raise SpecError(
            f"model {name!r} looks like a torchvision name but torchvision is not installed; "
            "pip install 'hookscope[vision]', or give package.module:factory"
        ) from None
    available = models.list_models(module=models)
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


def _load_weights(model: nn.Module, path: Path, spec: str) -> None:
    if not path.is_file():
        raise SpecError(f"--weights {path}: no such file; give a state_dict saved with torch.save")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:
        raise SpecError(
            f"--weights {path} cannot be loaded safely ({type(err).__name__}); save it with "
            "torch.save(model.state_dict(), path)"
        ) from None
    if isinstance(state, dict) and isinstance(state.get("model"), dict):
        state = state["model"]
    try:
        model.load_state_dict(state)
    except (RuntimeError, TypeError, AttributeError) as err:
        first = str(err).strip().splitlines()
        detail = " ".join(line.strip() for line in first[:3])[:300]
        raise SpecError(f"--weights {path} does not fit model {spec!r}: {detail}") from None


def load_data(spec: str, *, batch_size: int = 64, seed: int = 0, image_size: int = 64) -> Data:
    """Loaders for ``spec``: ``digits``, an image folder, or a ``.pt`` / ``.npz`` file of tensors."""
    if batch_size < 1:
        raise SpecError(f"--batch-size {batch_size} must be a positive number of samples, e.g. 64")
    if spec == "digits":
        train, valid = digits_loaders(batch_size=batch_size, seed=seed)
        return Data(train, valid, num_classes=10, classes=[str(d) for d in range(10)])
    path = Path(spec).expanduser()
    if path.is_dir():
        return _image_folder(path, batch_size, seed, image_size)
    if path.suffix in (".pt", ".npz") and path.is_file():
        return _tensor_file(path, batch_size, seed)
    raise SpecError(
        f"--data {spec}: no such folder or .pt/.npz file; give 'digits', a folder of images in class "
        "sub-folders (data/<class>/<image>.png), or a .pt/.npz file with x and y"
    )


def _image_folder(path: Path, batch_size: int, seed: int, image_size: int) -> Data:
    try:
        from torchvision import datasets, transforms
    except ImportError:
        raise SpecError(
            f"--data {path}: reading image folders needs torchvision; pip install 'hookscope[vision]'"
        ) from None
    transform = transforms.Compose(
        [
            transforms.Resize((image_size, image_size)),
            transforms.ToTensor(),
            transforms.Normalize(IMAGENET_MEAN, IMAGENET_STD),
        ]
    )
    split = [path / "train", next((path / n for n in ("valid", "val") if (path / n).is_dir()), None)]
    if split[0].is_dir() and split[1] is not None:
        train_set = datasets.ImageFolder(_class_root(split[0]), transform=transform)
        valid_set = datasets.ImageFolder(_class_root(split[1]), transform=transform)
        return _loaders(train_set, valid_set, train_set.classes, batch_size, seed)
    full = datasets.ImageFolder(_class_root(path), transform=transform)
    train_set, valid_set = _split(full, seed)
    return _loaders(train_set, valid_set, full.classes, batch_size, seed)


def _class_root(path: Path) -> Path:
    """``path`` when it has at least one class sub-folder holding an image; else a SpecError."""
    for sub in sorted(p for p in path.iterdir() if p.is_dir()):
        if any(f.suffix.lower() in IMAGE_EXTENSIONS for f in sub.iterdir()):
            return path
    raise SpecError(
        f"--data {path}: no class sub-folders with images; lay the images out as "
        f"{path}/<class name>/<image>.png (one folder per class)"
    )


def _tensor_file(path: Path, batch_size: int, seed: int) -> Data:
    arrays = _read_tensors(path)
    missing = [key for key in ("x", "y") if key not in arrays]
    if missing:
        raise SpecError(
            f"--data {path}: missing {', '.join(missing)}; save a dict with x (inputs) and y (integer "
            "class labels), optionally x_valid and y_valid"
        )
    x, y = _checked_pair(path, arrays["x"], arrays["y"], "x", "y")
    if "x_valid" in arrays and "y_valid" in arrays:
        xv, yv = _checked_pair(path, arrays["x_valid"], arrays["y_valid"], "x_valid", "y_valid")
        train_set, valid_set = TensorDataset(x, y), TensorDataset(xv, yv)
        num_classes = int(max(y.max(), yv.max())) + 1
    else:
        train_set, valid_set = _split(TensorDataset(x, y), seed)
        num_classes = int(y.max()) + 1
    return _loaders(train_set, valid_set, [str(c) for c in range(num_classes)], batch_size, seed)


def _read_tensors(path: Path) -> dict[str, torch.Tensor]:
    try:
        if path.suffix == ".npz":
            with np.load(path, allow_pickle=False) as npz:
                return {key: torch.from_numpy(npz[key]) for key in npz.files}
        loaded = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:
        raise SpecError(f"--data {path} cannot be read ({type(err).__name__}: {err})") from None
    if isinstance(loaded, tuple | list) and len(loaded) == 2:
        return {"x": loaded[0], "y": loaded[1]}
    if isinstance(loaded, dict):
        return {key: torch.as_tensor(value) for key, value in loaded.items()}
    raise SpecError(
        f"--data {path} holds a {type(loaded).__name__}; save a dict with x and y tensors (or a pair (x, y))"
    )


def _checked_pair(path: Path, x: torch.Tensor, y: torch.Tensor, xn: str, yn: str) -> tuple[torch.Tensor, ...]:
    if y.ndim != 1 or y.dtype.is_floating_point or y.dtype == torch.bool:
        raise SpecError(
            f"--data {path}: {yn} must be a 1-D tensor of integer class labels, got {tuple(y.shape)} "
            f"{y.dtype}; hookscope train fits classifiers"
        )
    if len(x) != len(y) or len(x) < 2:
        raise SpecError(
            f"--data {path}: {xn} has {len(x)} rows and {yn} has {len(y)}; they must match (>= 2)"
        )
    x = x.float()
    if x.ndim == 3:
        x = x.unsqueeze(1)
    return x, y.long()


def _split(dataset: Dataset, seed: int, valid_pct: float = 0.2) -> tuple[Subset, Subset]:
    n = len(dataset)
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed)).tolist()
    n_valid = max(1, round(n * valid_pct))
    return Subset(dataset, order[n_valid:]), Subset(dataset, order[:n_valid])


def _loaders(train: Dataset, valid: Dataset, classes: list[str], batch_size: int, seed: int) -> Data:
    generator = torch.Generator().manual_seed(seed)
    return Data(
        DataLoader(train, batch_size=batch_size, shuffle=True, generator=generator),
        DataLoader(valid, batch_size=batch_size, shuffle=False),
        num_classes=len(classes),
        classes=list(classes),
    )


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
    model: nn.Module, spec: str, fix: str, *, example: torch.Tensor | None = None, input_size: tuple = ()
) -> Any:
    """``hs.summary`` of ``model`` on ``example`` (or zeros of ``input_size``). An input that does not fit
    the model becomes a SpecError naming the module that refused it, the shape it received, and ``fix``."""
    from hookscope.hooks.summary import summary

    shape = tuple(example.shape) if example is not None else input_size
    try:
        if example is not None:
            return summary(model, example)
        return summary(model, input_size=input_size)
    except Exception as err:
        notes = getattr(err, "__notes__", [])
        where = notes[0].splitlines()[0].removeprefix("hookscope.summary: ") if notes else str(err)
        raise SpecError(
            f"input of shape {','.join(map(str, shape))} does not fit model {spec!r}: {where}; {fix}"
        ) from None
