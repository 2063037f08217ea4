"""examples/pruning.py runs end to end: every importance, compaction that keeps the accuracy, the figures."""

import importlib.util
from pathlib import Path

import pytest
import torch

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "pruning.py"


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_pruning_example_writes_its_tables_and_figures(tmp_path) -> None:
    spec = importlib.util.spec_from_file_location("example_pruning", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as docs/pruning.md measured it; spinning threads crawl on a loaded machine
    try:
        results = module.main(tmp_path)  # raises if compacting changed an accuracy
    finally:
        torch.set_num_threads(threads)

    dense, channel_rows, weight_rows = results["digits_cnn"]
    assert dense["accuracy"] > 0.9
    assert [(r["how"], r["amount"]) for r in channel_rows] == [
        (how, amount) for amount in ("50%", "80%") for how in ("l1", "random", "activation", "taylor")
    ]
    for rows, dense_macs in (
        (channel_rows, dense["macs"]),
        (results["resnet18"][1], results["resnet18"][0]["macs"]),
    ):
        half, most = rows[0]["macs"], rows[-1]["macs"]
        assert most < half < dense_macs
    assert all(r["sparsity"] == pytest.approx(float(r["amount"][:-1]) / 100, abs=0.01) for r in weight_rows)
    assert {p.name for p in tmp_path.iterdir()} == {"results.md", "ablation_layers.png", "ablation_units.png"}
    assert "| taylor | 80% |" in (tmp_path / "results.md").read_text()
