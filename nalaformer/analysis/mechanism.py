"""The mechanism studies' measurements on trained q, k and their statistics over seeds (docs/mechanism_study.md).

Per stage (or NaLa-SR group): ``spearman`` / ``pearson`` of |q| and attention entropy, pooled over images, heads and
queries; the norm sweep (``sweep_change``: mean entropy at the largest norm minus the smallest;
``sweep_max_abs_change``: the largest change of one query's entropy). Two cells tie when their means differ by less
than the larger standard deviation.
"""
import math
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

import torch
import torch.nn as nn

from .entropy import attention_entropy, capture_kernel_qk, capture_qk, norm_sweep, pearson, spearman

__all__ = ['STUDY_ATTN_TYPES', 'ABLATION_CHAIN', 'TIE_RULE', 'entropy_and_sweep', 'measure_qk', 'spread',
           'measure_stages', 'measure_global_slots', 'summarise', 'summarise_kernels', 'compare', 'format_mean_std',
           'sweep_norms', 'verdict']

# The kernels, in the paper's order: softmax, the kernel linear attentions that lose the norm,
# then the ablation ReLU split + constant power -> + cosine inhibit -> + norm-aware power (NaLa).
STUDY_ATTN_TYPES = ('softmax', 'relu', 'elu', 'const_power', 'nala_cos', 'nala')
# The paper's ablation (ImageNet top-1): const_power 82.1 < nala_cos 82.5 < nala 82.9.
ABLATION_CHAIN = ('const_power', 'nala_cos', 'nala')
TIE_RULE = 'tie when |mean a - mean b| < max(std a, std b)'


def sweep_norms(low: float = 0.03, high: float = 30.0, steps: int = 13) -> torch.Tensor:
    """Log-spaced query norms of the sweep (the range of ``tools/analysis/attention_entropy.py``)."""
    return torch.logspace(math.log10(low), math.log10(high), steps, dtype=torch.float64)


def _finite_or_none(x: float) -> Optional[float]:
    return x if math.isfinite(x) else None


def spread(values: torch.Tensor) -> Dict[str, float]:
    """The smallest, median and largest of ``values``."""
    return dict(min=float(values.min()), median=float(values.median()), max=float(values.max()))


@torch.no_grad()
def entropy_and_sweep(q: torch.Tensor, k: torch.Tensor, attn_type: str, norms: torch.Tensor, sweep_queries: int,
                      chunk: int = 1024) -> Tuple[torch.Tensor, torch.Tensor]:
    """Each query's attention entropy under ``attn_type`` (B, heads, N), and the norm sweep (S, queries) of about
    ``sweep_queries`` query directions per head (every ``N // sweep_queries``-th query)."""
    stride = max(1, q.shape[-2] // sweep_queries)
    sweep = norm_sweep(attn_type, q[..., ::stride, :], k, norms, chunk).flatten(1)
    return attention_entropy(attn_type, q, k, chunk), sweep


@torch.no_grad()
def measure_qk(q: torch.Tensor, k: torch.Tensor, attn_type: str, norms: torch.Tensor, sweep_queries: int = 64,
               chunk: int = 1024) -> Dict:
    """Norm/entropy statistics of ``attn_type`` on trained q, k (B, heads, N, d), N > 1 (see the module doc)."""
    q, k = q.double(), k.double()
    q_norm = torch.linalg.vector_norm(q, dim=-1)
    h, sweep = entropy_and_sweep(q, k, attn_type, norms, sweep_queries, chunk)
    finite = h[h.isfinite()]
    mean_sweep = sweep.nanmean(dim=1)
    deviation = (sweep - sweep[:1]).abs()
    deviation = deviation[deviation.isfinite()]
    return dict(
        spearman=_finite_or_none(spearman(q_norm, h)), pearson=_finite_or_none(pearson(q_norm, h)),
        undefined_rows=int((~h.isfinite()).sum()), query_norm=spread(q_norm),
        entropy=spread(finite) if finite.numel() else None, sweep_mean_entropy=mean_sweep.tolist(),
        sweep_change=float(mean_sweep[-1] - mean_sweep[0]),
        sweep_max_abs_change=float(deviation.max()) if deviation.numel() else None,
    )


def _measured_row(q: torch.Tensor, k: torch.Tensor, attn_type: str, norms: torch.Tensor, sweep_queries: int,
                  chunk: int, **fields) -> Dict:
    """``fields``, the shape of q (B, heads, N, d), and with N > 1 :func:`measure_qk` (one token: entropy 0
    whatever the kernel, so no statistics)."""
    n = q.shape[-2]
    row = dict(**fields, tokens=n, heads=q.shape[1], head_dim=q.shape[-1], log_n=math.log(n))
    return {**row, **measure_qk(q, k, attn_type, norms, sweep_queries, chunk)} if n > 1 else row


@torch.no_grad()
def measure_stages(model: nn.Module, images: torch.Tensor, attn_type: str, norms: torch.Tensor,
                   sweep_queries: int = 64, chunk: int = 1024, block: int = 0) -> List[Dict]:
    """:func:`measure_qk` of ``attn_type`` on the trained q, k of block ``block`` of every stage (one row each;
    a one-token stage has ``tokens`` and no statistics)."""
    out = []
    for stage in range(len(model.layers)):
        q, k, grid = capture_qk(model, images, stage, block)
        out.append(_measured_row(q, k, attn_type, norms, sweep_queries, chunk, stage=stage, grid=list(grid)))
    return out


@torch.no_grad()
def measure_global_slots(model: nn.Module, images: torch.Tensor, attn_type: str, norms: torch.Tensor,
                         sweep_queries: int = 64, chunk: int = 1024) -> List[Dict]:
    """:func:`measure_qk` of the global attention in the first layer of every residual group of a NaLa-SR
    network (``nalaformer.models.nala_sr``) on LR images (B, 3, h, w) in [0, 1]: one row per group (``stage``
    = the group's index), over all tokens of the (window-padded) image."""
    out = []
    for group, module in enumerate(model.groups):
        slot = module.layers[0].global_attn
        if slot is None:
            raise ValueError(f'group {group} of the network has no global attention (attn_types "none")')
        q, k = capture_kernel_qk(model, slot.attn.kernel, images)
        out.append(_measured_row(q, k, attn_type, norms, sweep_queries, chunk, stage=group))
    return out


def _mean_std(values: Sequence[float]) -> Dict:
    values = [v for v in values if v is not None and math.isfinite(v)]
    if not values:
        return dict(mean=None, std=None, n=0)
    t = torch.tensor(values, dtype=torch.float64)
    std = float(t.std(unbiased=True)) if len(values) > 1 else 0.0
    return dict(mean=float(t.mean()), std=std, n=len(values))


def summarise(runs: Iterable[Dict], metrics: Sequence[str] = ('top1',)) -> Dict:
    """Mean ± sample std over the seeds of one cell (e.g. one kernel and conv-mixer setting).

    ``runs``: per-run results with ``seed``, ``seconds``, each of ``metrics`` and ``stages`` (rows as
    :func:`measure_stages` returns: ``tokens`` and, where measured, the statistics).
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
    return dict(seeds=sorted(r['seed'] for r in runs), seconds=_mean_std([r['seconds'] for r in runs]),
                stages=stages, **{metric: _mean_std([r[metric] for r in runs]) for metric in metrics})


def summarise_kernels(runs: Sequence[Dict], attn_types: Sequence[str], metrics: Sequence[str], **match) -> Dict:
    """{attn_type: :func:`summarise` of its runs} over the runs whose fields equal ``match`` (kernels without runs
    left out)."""
    chosen = {a: [r for r in runs if r['kernel'] == a and all(r[k] == v for k, v in match.items())]
              for a in attn_types}
    return {a: summarise(rows, metrics) for a, rows in chosen.items() if rows}


def compare(a: Dict, b: Dict) -> str:
    """a vs b: 'tie' when |mean a - mean b| < max(std a, std b), else '>' or '<'; 'n/a' when either has
    fewer than two seeds (no spread to compare with) or no value."""
    if a.get('mean') is None or b.get('mean') is None or a['n'] < 2 or b['n'] < 2:
        return 'n/a'
    if abs(a['mean'] - b['mean']) < max(a['std'], b['std']):
        return 'tie'
    return '>' if a['mean'] > b['mean'] else '<'


def verdict(a: str, b: str, stat_a: Dict, stat_b: Dict, **fields) -> Dict:
    """``fields``, then a vs b: the difference of their means, the larger standard deviation, :func:`compare`."""
    return dict(**fields, a=a, b=b, diff=stat_a['mean'] - stat_b['mean'], spread=max(stat_a['std'], stat_b['std']),
                verdict=compare(stat_a, stat_b))


def format_mean_std(stat: Optional[Dict], digits: int = 2, signed: bool = False) -> str:
    """A statistic of :func:`summarise` as 'mean ± std' ('mean (1 seed)' for one seed, '–' for no value)."""
    if not stat or stat.get('mean') is None:
        return '–'
    mean = f"{stat['mean']:{'+' if signed else ''}.{digits}f}"
    return f'{mean} (1 seed)' if stat['n'] < 2 else f"{mean} ± {stat['std']:.{digits}f}"
