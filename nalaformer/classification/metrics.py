"""Top-k accuracy for mmengine's Evaluator."""
from typing import Sequence

import torch
from mmengine.evaluator import BaseMetric
from mmengine.registry import METRICS


@METRICS.register_module()
class Accuracy(BaseMetric):
    """Top-k accuracy in percent, reported as ``accuracy/top1``, ``accuracy/top5``, ..."""

    default_prefix = 'accuracy'

    def __init__(self, topk: Sequence[int] = (1, 5), **kwargs):
        super().__init__(**kwargs)
        self.topk = tuple(topk)

    def process(self, data_batch, data_samples: Sequence[dict]) -> None:
        logits = torch.stack([s['logits'] for s in data_samples])
        labels = torch.stack([torch.as_tensor(s['label']) for s in data_samples]).to(logits.device)
        k = min(max(self.topk), logits.shape[1])
        hits = (logits.topk(k, dim=1).indices == labels[:, None]).cpu()
        for row in hits:
            self.results.append([bool(row[:t].any()) for t in self.topk])

    def compute_metrics(self, results: list) -> dict:
        hits = torch.tensor(results, dtype=torch.float64)
        return {f'top{t}': 100.0 * hits[:, i].mean().item() for i, t in enumerate(self.topk)}
