"""Model and data specs of the command line: what they build, and the one-line errors."""

import numpy as np
import pytest
import torch
from PIL import Image

from hookscope.specs import SpecError, checked_summary, load_data, load_model, parse_input_size


def test_torchvision_name_is_built_with_random_weights_and_says_so(capsys):
    model = load_model("resnet18", num_classes=7)
    assert model.fc.out_features == 7
    assert "pretrained weights cannot be downloaded here" in capsys.readouterr().err


def test_package_module_factory_gets_num_classes():
    model = load_model("hookscope.models:digits_cnn", num_classes=4)
    assert model(torch.zeros(2, 1, 8, 8)).shape == (2, 4)


def test_file_factory(tmp_path):
    (tmp_path / "net.py").write_text("from torch import nn\ndef build():\n    return nn.Linear(3, 2)\n")
    model = load_model(f"{tmp_path / 'net.py'}:build", num_classes=10)
    assert isinstance(model, torch.nn.Linear) and model.out_features == 2


def test_weights_file_is_loaded(tmp_path):
    source = load_model("hookscope.models:mlp")
    torch.save(source.state_dict(), tmp_path / "w.pt")
    model = load_model("hookscope.models:mlp", weights=tmp_path / "w.pt")
    assert torch.equal(model[1].weight, source[1].weight)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("no_such_pkg.models:net", "cannot import module 'no_such_pkg.models'"),
        ("hookscope.models:digits_cnm", "has no callable 'digits_cnm' (closest: digits_cnn)"),
        ("resnet181", "unknown model 'resnet181' (closest torchvision names: resnet18"),
        ("missing/net.py:build", "no file missing/net.py"),
    ],
)
def test_model_spec_errors_name_the_spec_and_the_fix(spec, message):
    with pytest.raises(SpecError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_model(spec)


def test_weights_that_do_not_fit_name_the_keys(tmp_path):
    torch.save({"other.weight": torch.zeros(1)}, tmp_path / "w.pt")
    with pytest.raises(SpecError, match=r"--weights .*w.pt does not fit model 'hookscope.models:mlp'"):
        load_model("hookscope.models:mlp", weights=tmp_path / "w.pt")


def test_digits_data():
    data = load_data("digits", batch_size=32)
    x = next(iter(data.train))[0]
    assert x.shape == (32, 1, 8, 8) and data.num_classes == 10
    assert len(data.train.dataset) + len(data.valid.dataset) == 1797


def _image_folder(root, classes=("cat", "dog"), per_class=5):
    rng = np.random.default_rng(0)
    for name in classes:
        (root / name).mkdir(parents=True)
        for i in range(per_class):
            pixels = rng.integers(0, 255, (20, 30, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(root / name / f"{i}.png")


def test_image_folder_is_split_and_resized(tmp_path):
    _image_folder(tmp_path)
    data = load_data(str(tmp_path), batch_size=4, image_size=16)
    assert data.classes == ["cat", "dog"]
    assert (len(data.train.dataset), len(data.valid.dataset)) == (8, 2)
    assert next(iter(data.train))[0].shape == (4, 3, 16, 16)


def test_image_folder_with_train_and_valid_subfolders(tmp_path):
    _image_folder(tmp_path / "train", per_class=3)
    _image_folder(tmp_path / "valid", per_class=1)
    data = load_data(str(tmp_path), batch_size=2, image_size=8)
    assert (len(data.train.dataset), len(data.valid.dataset)) == (6, 2)


def test_folder_without_classes_is_a_spec_error(tmp_path):
    (tmp_path / "empty_class").mkdir()
    with pytest.raises(SpecError, match=r"no class sub-folders with images; lay the images out as"):
        load_data(str(tmp_path))


def test_pt_and_npz_files_of_tensors(tmp_path):
    x, y = torch.randn(50, 2, 5, 5), torch.arange(50) % 3
    torch.save({"x": x, "y": y}, tmp_path / "d.pt")
    np.savez(tmp_path / "d.npz", x=x.numpy(), y=y.numpy(), x_valid=x[:10].numpy(), y_valid=y[:10].numpy())
    from_pt = load_data(str(tmp_path / "d.pt"), batch_size=10)
    from_npz = load_data(str(tmp_path / "d.npz"), batch_size=10)
    assert (len(from_pt.train.dataset), len(from_pt.valid.dataset), from_pt.num_classes) == (40, 10, 3)
    assert (len(from_npz.train.dataset), len(from_npz.valid.dataset)) == (50, 10)


def test_float_targets_are_refused(tmp_path):
    torch.save({"x": torch.randn(4, 3), "y": torch.randn(4)}, tmp_path / "d.pt")
    with pytest.raises(SpecError, match="y must be a 1-D tensor of integer class labels"):
        load_data(str(tmp_path / "d.pt"))


def test_unknown_data_spec():
    with pytest.raises(SpecError, match=r"--data nowhere: no such folder or \.pt/\.npz file; give 'digits'"):
        load_data("nowhere")


def test_input_size_parsing():
    assert parse_input_size("1,3,224,224") == (1, 3, 224, 224)
    with pytest.raises(SpecError, match="--input-size '1,a'"):
        parse_input_size("1,a")


def test_an_input_that_does_not_fit_names_the_module_and_shape():
    model = load_model("hookscope.models:digits_cnn")
    expected = r"input of shape 1,3,8,8 does not fit .*'features.0.0'.*\[1, 3, 8, 8\].*in_channels=3; FIX$"
    with pytest.raises(SpecError, match=expected):
        checked_summary(model, "hookscope.models:digits_cnn", "FIX", input_size=(1, 3, 8, 8))


def test_valid_classes_get_the_training_index_of_their_name(tmp_path):
    _image_folder(tmp_path / "train", classes=("a", "b", "c"), per_class=2)
    _image_folder(tmp_path / "valid", classes=("a", "c"), per_class=1)
    data = load_data(str(tmp_path), batch_size=2, image_size=8)
    assert data.classes == ["a", "b", "c"]
    assert data.valid.dataset.targets == [0, 2]  # c keeps train's index 2, not valid's own 1


def test_one_class_and_negative_labels_are_refused(tmp_path):
    torch.save({"x": torch.randn(6, 3), "y": torch.zeros(6, dtype=torch.long)}, tmp_path / "one.pt")
    torch.save({"x": torch.randn(6, 3), "y": torch.tensor([0, 1, -1, 0, 1, 0])}, tmp_path / "neg.pt")
    with pytest.raises(SpecError, match=r"one.pt: the training set holds one class only \(0\)"):
        load_data(str(tmp_path / "one.pt"))
    with pytest.raises(SpecError, match=r"neg.pt: y holds the label -1; class labels must be 0, 1"):
        load_data(str(tmp_path / "neg.pt"))


def test_a_model_scoring_fewer_classes_than_the_labels_is_refused():
    with pytest.raises(SpecError, match=r"model 'net' scores 2 classes but the labels of --data go up to 4"):
        checked_summary(torch.nn.Linear(3, 2), "net", "FIX", example=torch.zeros(1, 3), num_classes=5)
    checked_summary(torch.nn.Linear(3, 5), "net", "FIX", example=torch.zeros(1, 3), num_classes=5)


def test_factory_that_raises_names_the_spec_and_its_error(tmp_path):
    (tmp_path / "net.py").write_text("def build():\n    raise ValueError('width must be even')\n")
    spec = f"{tmp_path / 'net.py'}:build"
    with pytest.raises(SpecError, match=r"build\(\) raised ValueError: width must be even; fix the factory"):
        load_model(spec)


def test_detection_model_is_named_as_such_not_unknown():
    with pytest.raises(SpecError, match="'fasterrcnn_resnet50_fpn' is a torchvision detection model, not a"):
        load_model("fasterrcnn_resnet50_fpn")


def test_imagenet_weights_fine_tune_with_a_fresh_head(tmp_path, capsys):
    from torchvision.models import resnet18

    source = resnet18(weights=None)  # the default 1000-class head, like an ImageNet checkpoint
    torch.save(source.state_dict(), tmp_path / "imagenet.pt")
    model = load_model("resnet18", num_classes=2, weights=tmp_path / "imagenet.pt")
    assert torch.equal(model.conv1.weight, source.conv1.weight)
    assert torch.equal(model.layer4[1].bn2.running_var, source.layer4[1].bn2.running_var)
    assert model.fc.weight.shape == (2, 512)
    notes = [line for line in capsys.readouterr().err.splitlines() if "--weights" in line]
    assert len(notes) == 1 and "loaded 120 of 122 tensors; skipped fc.weight, fc.bias" in notes[0]
