"""The districts' choropleth (emb.plots.district_figure), drawn and read back as pixels: each
district filled in the colour its value maps to, a hole left empty, a district without a value
hatched grey rather than coloured as 0, every district named, a colour bar."""

from __future__ import annotations

import numpy as np
import shapely
from matplotlib import colormaps

from emb.plots import district_figure

SHELL = shapely.Polygon([(0, 0), (10, 0), (10, 10), (0, 10)], [[(3, 3), (7, 3), (7, 7), (3, 7)]])
TWO = shapely.MultiPolygon([shapely.box(12, 0, 20, 4), shapely.box(12, 6, 20, 10)])
NONE = shapely.box(22, 0, 26, 10)


def colour_at(fig, x: float, y: float, r: int = 0) -> np.ndarray:
    """The RGB (0..1) drawn at data point (x, y) of the figure's first axes (the mean over a
    square of 2r + 1 pixels)."""
    fig.canvas.draw()
    image = np.asarray(fig.canvas.buffer_rgba())
    px, py = fig.axes[0].transData.transform((x, y))
    row, col = int(image.shape[0] - py), int(px)
    return image[row - r : row + r + 1, col - r : col + r + 1, :3].mean((0, 1)) / 255.0


def test_districts_filled_by_value_with_holes_and_gaps() -> None:
    fig = district_figure([SHELL, TWO, NONE], ["shell", "two", "none"],
                          [100.0, 300.0, np.nan], "corn, estimated", "hectares")  # fmt: skip
    cmap = colormaps["YlGn"]
    np.testing.assert_allclose(colour_at(fig, 1.5, 1.5), cmap(0.0)[:3], atol=0.02)
    np.testing.assert_allclose(colour_at(fig, 13, 2), cmap(1.0)[:3], atol=0.02)
    np.testing.assert_allclose(colour_at(fig, 13, 8), cmap(1.0)[:3], atol=0.02)  # both parts
    np.testing.assert_allclose(colour_at(fig, 5.5, 4.2), (1, 1, 1), atol=0.02)  # the hole
    np.testing.assert_allclose(colour_at(fig, 16, 5), (1, 1, 1), atol=0.02)  # between parts
    grey = colour_at(fig, 23.5, 2.5, r=6)  # light grey and its hatch's lines
    assert np.ptp(grey) < 0.05 and 0.3 < grey.mean() < 0.95  # grey (or its hatch), not a value
    texts = [t.get_text() for t in fig.axes[0].texts]
    assert texts == ["shell", "two", "none"]
    assert len(fig.axes) == 2 and fig.axes[1].get_ylabel() == "hectares"  # the colour bar
    assert fig.axes[0].get_title() == "corn, estimated"


def test_degrees_are_drawn_at_their_length() -> None:
    fig = district_figure([shapely.box(-93.7, 41.9, -93.5, 42.1)], ["a"], [1.0], "t", "ha",
                          geographic=True)  # fmt: skip
    assert np.isclose(fig.axes[0].get_aspect(), 1 / np.cos(np.radians(42.0)), rtol=1e-3)
