"""The figures of the analysis tools: a grid of panels, bars grouped by a category, saving."""
from pathlib import Path
from typing import Dict, Optional, Sequence, Tuple

__all__ = ['grouped_bars', 'panels', 'save_figure']


def panels(rows: int, cols: int, width: float, height: float, **options):
    """A matplotlib figure (Agg backend) of ``rows`` x ``cols`` panels of ``width`` x ``height`` inches: (figure,
    axes as a 2D array)."""
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    return plt.subplots(rows, cols, figsize=(width * cols, height * rows), squeeze=False, **options)


def grouped_bars(ax, labels: Sequence[str], series: Dict[str, Sequence[Optional[float]]],
                 errors: Optional[Dict[str, Sequence[float]]] = None,
                 hatches: Optional[Dict[str, Sequence[str]]] = None):
    """One group of bars per label, one bar per series (None drawn as 0), ticks under the groups."""
    width = 0.8 / max(1, len(series))
    for i, (name, values) in enumerate(series.items()):
        xs = [j + (i - (len(series) - 1) / 2) * width for j in range(len(labels))]
        ax.bar(xs, [0.0 if v is None else v for v in values], width, label=name, color=f'C{i}',
               yerr=(errors or {}).get(name), hatch=(hatches or {}).get(name), capsize=2)  # hatch: one per bar
    ax.set_xticks(range(len(labels)), labels, fontsize=8)
    ax.legend(fontsize=8)


def save_figure(fig, path: Path, dpi: int = 110, rect: Optional[Tuple[float, float, float, float]] = None):
    """Lay out a matplotlib figure (``tight_layout`` within ``rect``, default all), save it to ``path`` and close it."""
    import matplotlib.pyplot as plt
    fig.tight_layout(rect=rect)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
