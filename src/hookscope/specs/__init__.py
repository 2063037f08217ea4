"""What the ``hookscope`` command line names, turned into objects: a model spec and a data spec.

A model spec is a torchvision model name (built with ``weights=None``: pretrained weights cannot be
downloaded here, a local state_dict comes in through ``weights=``), ``package.module:factory`` or
``path/to/file.py:factory`` (:mod:`hookscope.specs.models`). A data spec is ``digits`` (scikit-learn's
bundled digits), a folder of images in class sub-folders (ImageFolder layout, optionally split into
``train/`` and ``valid/``), or a ``.pt`` / ``.npz`` file of tensors (:mod:`hookscope.specs.data`). Every
failure is a :class:`SpecError` whose one-line message names the spec and the fix, so the command can print
it without a traceback.
"""

from hookscope.specs.data import IMAGE_EXTENSIONS, IMAGENET_MEAN, IMAGENET_STD, Data, load_data
from hookscope.specs.errors import SpecError
from hookscope.specs.models import checked_summary, is_torchvision_name, load_model, parse_input_size

__all__ = [
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "IMAGE_EXTENSIONS",
    "Data",
    "SpecError",
    "checked_summary",
    "is_torchvision_name",
    "load_data",
    "load_model",
    "parse_input_size",
]
