"""The figures (biencoder.report.figures): legends inside the image, distinguishable cells."""

import pytest
import yaml

from biencoder.report.figures import figure, plot
from biencoder.report.runs import assign_cells, find_runs
from helpers import write_run


@pytest.mark.slow
def test_a_six_cell_figure_keeps_every_legend_entry_inside(tmp_path):
    """Six cells with long labels (a key that differs, and a model group whose name differs): labels stay short,
    every legend entry lies inside the saved image, and two identical curves stay distinguishable (markers)."""
    from PIL import Image

    for i, variant in enumerate(("ln", "ln_relu", "relu", "plain", "ln", "relu")):
        folder = write_run(tmp_path / f"r{i}", variant, 0, [0.1, 0.2, 0.3], [0.1, 0.2, 0.3])
        config = yaml.safe_load((folder / ".hydra" / "config.yaml").read_text())
        config["trainer"] = {"head_lr": 0.003 if i < 4 else 0.0003}
        config["model"]["name"] = "tiny" if i == 5 else "minilm"
        config["model"]["encoder"] = {"random_init": {"num_hidden_layers": 2} if i == 5 else None}
        (folder / ".hydra" / "config.yaml").write_text(yaml.safe_dump(config))
    runs = find_runs([tmp_path])
    assign_cells(runs)
    labels = sorted(r.cell for r in runs)
    assert "relu model=tiny head_lr=0.0003" in labels and not any("random_init" in label for label in labels)
    fig = figure(runs)
    fig.canvas.draw()
    texts = [t for legend in fig.legends for t in legend.get_texts()]
    assert len(texts) == 6
    width, height = fig.canvas.get_width_height()
    for text in texts:
        box = text.get_window_extent()
        assert box.x0 >= 0 and box.y0 >= 0 and box.x1 <= width and box.y1 <= height, text.get_text()
    markers = {line.get_marker() for line in fig.axes[0].get_lines()}
    assert len(markers) == 6  # identical curves, six different markers
    out = plot(runs, tmp_path / "six.png")
    saved = Image.open(out).size  # the saved image is the checked canvas (at 120 dpi), not cropped
    assert abs(saved[0] - fig.get_figwidth() * 120) <= 1 and abs(saved[1] - fig.get_figheight() * 120) <= 1
