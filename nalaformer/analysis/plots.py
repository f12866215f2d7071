"""The figures of the analysis tools: a grid of panels of the quantities measured, bars grouped by a category, a
title that fits, saving."""
import textwrap
from pathlib import Path
from typing import Callable, Dict, Iterable, List, Optional, Sequence, Tuple, TypeVar

__all__ = ['grouped_bars', 'measured', 'panels', 'save_figure', 'wrapped_title']

Quantity = TypeVar('Quantity')


def measured(quantities: Sequence[Quantity], rows: Iterable[Dict],
             value: Callable[[Quantity, Dict], Optional[float]]) -> List[Quantity]:
    """The quantities that some row has a value of (``value(quantity, row)`` not None), in order: a report without
    one (memory with ``--no-memory``, time with ``--no-time``) gets no empty panel for it."""
    rows = list(rows)
    return [q for q in quantities if any(value(q, row) is not None for row in rows)]


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


def wrapped_title(fig, text: str, fontsize: float = 9):
    """``fig.suptitle(text)`` wrapped to the figure's width (about 12.5 characters an inch at font size 9)."""
    fig.suptitle('\n'.join(textwrap.wrap(text, int(fig.get_figwidth() * 12.5 * 9 / fontsize))), fontsize=fontsize)


def save_figure(fig, path: Path, dpi: int = 110, rect: Optional[Tuple[float, float, float, float]] = None):
    """Lay out a matplotlib figure (``tight_layout`` within ``rect``, default all), save it to ``path`` and close it."""
    import matplotlib.pyplot as plt
    fig.tight_layout(rect=rect)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
