"""The mechanism study's measurements and statistics (``tools/analysis/mechanism_study.py`` drives them).

For a trained NaLaFormer whose stages all use one kernel, :func:`measure_stages` takes, in every stage
with more than one token, the q, k entering the first block's kernel on a fixed set of images and
computes (with :mod:`nalaformer.analysis.entropy`: exact, RoPE off, the kernel's own feature maps):

* ``spearman`` / ``pearson``: correlation between each query's norm |q| and its attention entropy,
  pooled over images, heads and queries (the paper's claim: negative for softmax and NaLa);
* the norm sweep: the same query directions rescaled to fixed norms; ``sweep_change`` is the mean
  entropy at the largest norm minus that at the smallest, ``sweep_max_abs_change`` the largest change
  of any single query's entropy over the sweep (0 up to rounding for a kernel that ignores |q|:
  ``relu`` is positively homogeneous, ``const_power`` uses only q's direction).

:func:`summarise` gives mean and sample standard deviation over seeds; :func:`compare` calls two
cells a tie when their means differ by less than the larger of their standard deviations.
"""
import math
import os
import shutil
import tempfile
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Sequence

import torch
import torch.nn as nn

from .entropy import attention_entropy, capture_qk, norm_sweep, pearson, spearman

__all__ = ['STUDY_KERNELS', 'ABLATION_CHAIN', 'measure_stages', 'summarise', 'compare', 'sweep_norms',
           'write_brightest_of_four']

# The kernels, in the paper's order: softmax, the kernel linear attentions that lose the norm,
# then the ablation ReLU split + constant power -> + cosine inhibit -> + norm-aware power (NaLa).
STUDY_KERNELS = ('softmax', 'relu', 'elu', 'const_power', 'nala_cos', 'nala')
# The paper's ablation (ImageNet top-1): const_power 82.1 < nala_cos 82.5 < nala 82.9.
ABLATION_CHAIN = ('const_power', 'nala_cos', 'nala')


def sweep_norms(low: float = 0.03, high: float = 30.0, steps: int = 13) -> torch.Tensor:
    """Log-spaced query norms of the sweep (the range of ``tools/analysis/attention_entropy.py``)."""
    return torch.logspace(math.log10(low), math.log10(high), steps, dtype=torch.float64)


def _finite_or_none(x: float) -> Optional[float]:
    return x if math.isfinite(x) else None


@torch.no_grad()
def measure_stages(model: nn.Module, images: torch.Tensor, kernel: str, norms: torch.Tensor,
                   sweep_queries: int = 64, chunk: int = 1024, block: int = 0) -> List[Dict]:
    """Entropy/norm statistics of ``kernel`` on the trained q, k of block ``block`` of every stage.

    Stages with one token (entropy 0 whatever the kernel) are reported with ``tokens`` and no statistics.
    """
    out = []
    for stage in range(len(model.layers)):
        q, k, grid = capture_qk(model, images, stage, block)
        q, k = q.double(), k.double()
        n = q.shape[-2]
        row = dict(stage=stage, grid=list(grid), tokens=n, heads=q.shape[1], head_dim=q.shape[-1], log_n=math.log(n))
        if n < 2:
            out.append(row)
            continue
        q_norm = torch.linalg.vector_norm(q, dim=-1)
        h = attention_entropy(kernel, q, k, chunk)
        finite = h[h.isfinite()]
        stride = max(1, n // sweep_queries)
        sweep = norm_sweep(kernel, q[..., ::stride, :], k, norms, chunk).flatten(1)  # (S, queries)
        mean_sweep = sweep.nanmean(dim=1)
        deviation = (sweep - sweep[:1]).abs()
        deviation = deviation[deviation.isfinite()]
        row.update(
            spearman=_finite_or_none(spearman(q_norm, h)), pearson=_finite_or_none(pearson(q_norm, h)),
            undefined_rows=int((~h.isfinite()).sum()),
            query_norm=dict(min=float(q_norm.min()), median=float(q_norm.median()), max=float(q_norm.max())),
            entropy=dict(min=float(finite.min()), median=float(finite.median()), max=float(finite.max()))
            if finite.numel() else None,
            sweep_mean_entropy=mean_sweep.tolist(),
            sweep_change=float(mean_sweep[-1] - mean_sweep[0]),
            sweep_max_abs_change=float(deviation.max()) if deviation.numel() else None,
        )
        out.append(row)
    return out


def _mean_std(values: Sequence[float]) -> Dict:
    values = [v for v in values if v is not None and math.isfinite(v)]
    if not values:
        return dict(mean=None, std=None, n=0)
    t = torch.tensor(values, dtype=torch.float64)
    std = float(t.std(unbiased=True)) if len(values) > 1 else 0.0
    return dict(mean=float(t.mean()), std=std, n=len(values))


def summarise(runs: Iterable[Dict]) -> Dict:
    """Mean ± sample std over the seeds of one (kernel, conv mixers) cell.

    ``runs``: per-run results with ``top1`` and ``stages`` (as :func:`measure_stages` returns).
    """
    runs = list(runs)
    stages = []
    for i, first in enumerate(runs[0]['stages']):
        row = dict(stage=i, tokens=first['tokens'])
        if 'spearman' in first:
            for key in ('spearman', 'pearson', 'sweep_change', 'sweep_max_abs_change'):
                row[key] = _mean_std([r['stages'][i][key] for r in runs])
            curves = torch.tensor([r['stages'][i]['sweep_mean_entropy'] for r in runs], dtype=torch.float64)
            row['sweep_mean_entropy'] = curves.nanmean(dim=0).tolist()
        stages.append(row)
    return dict(seeds=sorted(r['seed'] for r in runs), top1=_mean_std([r['top1'] for r in runs]),
                seconds=_mean_std([r['seconds'] for r in runs]), stages=stages)


def compare(a: Dict, b: Dict) -> str:
    """a vs b: 'tie' when |mean a - mean b| < max(std a, std b), else '>' or '<'; 'n/a' when either has
    fewer than two seeds (no spread to compare with) or no value."""
    if a.get('mean') is None or b.get('mean') is None or a['n'] < 2 or b['n'] < 2:
        return 'n/a'
    if abs(a['mean'] - b['mean']) < max(a['std'], b['std']):
        return 'tie'
    return '>' if a['mean'] > b['mean'] else '<'


def write_brightest_of_four(out, src: Optional[str] = None, train_per_class: int = 600,
                            val_per_class: Optional[int] = 1000, seed: int = 0,
                            dim: Sequence[float] = (0.3, 0.55)) -> Dict[str, int]:
    """A harder real-pixel task built from Fashion-MNIST: a 2x2 mosaic (32x32) of four items (16x16 each,
    random classes and places); one is shown at full contrast, the other three dimmed to a random
    ``dim`` fraction; the label is the class of the bright one.

    Which item counts depends on a comparison over the whole image, so the model has to select one
    region and ignore the others (a sharp, content-dependent pooling: what attention provides) rather
    than average all the items' features. Training mosaics use the train split, val ones the test
    split. Same ``out/{train,val}/<class>/*.png`` layout as :func:`nalaformer.datasets.write_imagefolder`.
    """
    import numpy as np
    from PIL import Image

    from ..datasets import CLASSES, read_fashion_mnist
    from ..datasets.fashion_mnist import DEFAULT_SRC

    out = Path(out)
    rng = np.random.default_rng(seed)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f'.{out.name}.'))
    written = {}
    try:
        for split, source, per_class in (('train', 'train', train_per_class), ('val', 'test', val_per_class)):
            images, labels = read_fashion_mnist(src or DEFAULT_SRC, source)
            small = np.asarray([np.asarray(Image.fromarray(im).resize((16, 16), Image.BILINEAR)) for im in images],
                               dtype=np.float32)
            per_class = per_class or int(np.bincount(labels).min())
            count = 0
            for c, name in enumerate(CLASSES):
                (tmp / split / name).mkdir(parents=True)
                targets = rng.choice(np.flatnonzero(labels == c), per_class, replace=per_class > (labels == c).sum())
                for j, target in enumerate(targets):
                    items = np.concatenate([[target], rng.integers(0, len(images), 3)])
                    scale = np.concatenate([[1.0], rng.uniform(*dim, 3)])
                    order = rng.permutation(4)
                    canvas = np.zeros((32, 32), dtype=np.float32)
                    for slot, i in enumerate(order):
                        r, col = divmod(slot, 2)
                        canvas[16 * r:16 * r + 16, 16 * col:16 * col + 16] = small[items[i]] * scale[i]
                    Image.fromarray(canvas.round().clip(0, 255).astype(np.uint8)).save(
                        tmp / split / name / f'{j:05d}.png')
                    count += 1
            written[split] = count
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return written
