"""Data specs: ``digits``, a folder of images in class sub-folders, or a ``.pt`` / ``.npz`` file of tensors,
turned into training and validation loaders.

Data that cannot train a classifier is refused here, before a model is built or a file written: an empty
training set, a training set of one class, negative labels, validation classes the training set lacks.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, Subset, TensorDataset

from hookscope.data.digits import digits_loaders
from hookscope.data.images import ImageReadError, read_rgb
from hookscope.specs.errors import SpecError

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff")


@dataclass
class Data:
    """Training and validation loaders plus what a model needs to know about them."""

    train: DataLoader
    valid: DataLoader
    num_classes: int
    classes: list[str]


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
    transform = _image_transform(path, image_size)
    train_root = path / "train"
    valid_root = next((path / n for n in ("valid", "val") if (path / n).is_dir()), None)
    if train_root.is_dir() and valid_root is not None:
        train_set = _folder_dataset(train_root, transform)
        valid_set = _folder_dataset(valid_root, transform)
        _map_classes_by_name(valid_set, valid_root, train_set.class_to_idx, train_root)
        return _loaders(path, train_set, valid_set, train_set.classes, batch_size, seed)
    full = _folder_dataset(path, transform)
    train_set, valid_set = _split(full, seed)
    return _loaders(path, train_set, valid_set, full.classes, batch_size, seed)


def _image_transform(path: Path, image_size: int) -> Callable[[Any], torch.Tensor]:
    try:
        from torchvision import transforms
    except ImportError as err:
        raise SpecError(
            f"--data {path}: reading image folders needs torchvision; pip install 'hookscope[vision]'"
        ) from err
    return transforms.Compose(
        [
            transforms.Resize((image_size, image_size)),
            transforms.ToTensor(),
            transforms.Normalize(IMAGENET_MEAN, IMAGENET_STD),
        ]
    )


def _folder_dataset(root: Path, transform: Callable[[Any], torch.Tensor]) -> Any:
    """An ImageFolder over ``root`` (checked first) whose unreadable images name their file when loaded."""
    from torchvision import datasets

    _check_class_folders(root)
    return datasets.ImageFolder(root, transform=transform, loader=_read_image, is_valid_file=_is_image)


def _check_class_folders(root: Path) -> None:
    """A SpecError unless every sub-folder of ``root`` is a class folder holding at least one image."""
    folders = sorted(p for p in root.iterdir() if p.is_dir())
    empty = [p.name for p in folders if not any(_is_image(f) for f in p.iterdir())]
    if len(empty) == len(folders):
        raise SpecError(
            f"--data {root}: no class sub-folders with images; lay the images out as "
            f"{root}/<class name>/<image>.png (one folder per class)"
        )
    if empty:
        raise SpecError(
            f"--data {root}: class folder(s) {', '.join(empty)} hold no images; add images "
            f"({', '.join(IMAGE_EXTENSIONS)}) or remove the folder(s)"
        )


def _is_image(path: str | Path) -> bool:
    return Path(path).suffix.lower() in IMAGE_EXTENSIONS


def _read_image(path: str) -> Any:
    """The loader of image folders: an unreadable file fails naming itself (torchvision's names nothing)."""
    try:
        return read_rgb(path)
    except ImageReadError as err:
        raise ImageReadError(f"--data: {err}; remove or replace that file") from err


def _map_classes_by_name(valid: Any, valid_root: Path, train_idx: dict[str, int], train_root: Path) -> None:
    """Give ``valid``'s samples the training set's index of their class name (ImageFolder numbers each
    folder's classes on its own, so ``valid/{a,c}`` would label ``c`` as train's second class)."""
    unknown = [name for name in valid.classes if name not in train_idx]
    if unknown:
        raise SpecError(
            f"--data {valid_root}: class(es) {', '.join(unknown)} have no folder in {train_root}, so the "
            "model cannot learn them; add them to the training folder or remove them from the validation one"
        )
    to_train = {index: train_idx[name] for name, index in valid.class_to_idx.items()}
    valid.samples = [(file, to_train[target]) for file, target in valid.samples]
    valid.imgs = valid.samples
    valid.targets = [target for _, target in valid.samples]
    valid.class_to_idx = {name: train_idx[name] for name in valid.classes}


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
    return _loaders(path, train_set, valid_set, [str(c) for c in range(num_classes)], batch_size, seed)


def _read_tensors(path: Path) -> dict[str, torch.Tensor]:
    try:
        if path.suffix == ".npz":
            with np.load(path, allow_pickle=False) as npz:
                return {key: torch.from_numpy(npz[key]) for key in npz.files}
        loaded = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:
        raise SpecError(f"--data {path} cannot be read ({type(err).__name__}: {err})") from err
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
    if int(y.min()) < 0:
        raise SpecError(
            f"--data {path}: {yn} holds the label {int(y.min())}; class labels must be 0, 1, ..., "
            "classes - 1 (renumber them)"
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


def _loaders(
    path: Path, train: Dataset, valid: Dataset, classes: list[str], batch_size: int, seed: int
) -> Data:
    _check_trainable(path, train, classes)
    generator = torch.Generator().manual_seed(seed)
    return Data(
        DataLoader(train, batch_size=batch_size, shuffle=True, generator=generator),
        DataLoader(valid, batch_size=batch_size, shuffle=False),
        num_classes=len(classes),
        classes=list(classes),
    )


def _check_trainable(path: Path, train: Dataset, classes: list[str]) -> None:
    """A SpecError for a training set a classifier cannot learn from: no samples, or one class only
    (cross-entropy is 0 from the first step, so it would "train perfectly" and learn nothing)."""
    if len(train) == 0:
        raise SpecError(
            f"--data {path}: the training set is empty (every sample went to validation); add samples, "
            "at least a few per class"
        )
    present = sorted(set(_targets(train).tolist()))
    if len(present) < 2:
        raise SpecError(
            f"--data {path}: the training set holds one class only ({classes[present[0]]}); a classifier "
            "needs at least two: add samples of another class"
        )


def _targets(dataset: Dataset) -> torch.Tensor:
    """The class label of every sample, without loading any input."""
    if isinstance(dataset, Subset):
        return _targets(dataset.dataset)[dataset.indices]
    if isinstance(dataset, TensorDataset):
        return dataset.tensors[1]
    return torch.as_tensor(dataset.targets)
