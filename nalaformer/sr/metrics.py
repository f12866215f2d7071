"""PSNR and SSIM per benchmark set as the super-resolution literature reports them
(:mod:`nalaformer.images.quality`), with the bicubic baseline of the same images in the same report: the LR image
upscaled with MATLAB's bicubic (:func:`nalaformer.images.imresize`).
"""
from collections import defaultdict
from typing import Dict, List, Optional, Sequence

import numpy as np
from mmengine.evaluator import BaseMetric
from mmengine.registry import METRICS

from ..images import calculate_psnr, calculate_ssim, imresize

__all__ = ['SRMetric']


@METRICS.register_module()
class SRMetric(BaseMetric):
    """PSNR / SSIM per benchmark set, and those of bicubic upscaling of the same LR images.

    Args:
        scale: the upscaling factor (default: the dataset's ``metainfo['scale']``).
        crop_border: pixels cut from each side (default: the scale).
        y_channel: on the BT.601 Y channel (the literature's convention) or on RGB.
        bicubic: also report the bicubic baseline.

    Reads the model's predictions ``dict(pred, gt, lr: (3, H, W) uint8 tensors, set, name)`` and reports
    ``<set>/PSNR``, ``<set>/SSIM``, ``<set>/bicubic_PSNR``, ``<set>/bicubic_SSIM`` (means over the set's
    images; a sample without ``set`` counts under ``'val'``).
    """

    default_prefix = ''  # keys start with the set's name

    def __init__(self, scale: Optional[int] = None, crop_border: Optional[int] = None, y_channel: bool = True,
                 bicubic: bool = True, **kwargs):
        super().__init__(**kwargs)
        self._scale, self._crop_border = scale, crop_border
        self.y_channel, self.bicubic = y_channel, bicubic

    @property
    def scale(self) -> int:
        scale = self._scale or (self.dataset_meta or {}).get('scale')
        if scale is None:
            raise ValueError("SRMetric needs the scale: give scale=... or a dataset whose metainfo has 'scale'")
        return scale

    @property
    def crop_border(self) -> int:
        return self.scale if self._crop_border is None else self._crop_border

    def _scores(self, image: np.ndarray, gt: np.ndarray, prefix: str = '') -> dict:
        return {f'{prefix}PSNR': calculate_psnr(image, gt, self.crop_border, self.y_channel),
                f'{prefix}SSIM': calculate_ssim(image, gt, self.crop_border, self.y_channel)}

    def process(self, data_batch, data_samples: Sequence[dict]) -> None:
        for sample in data_samples:
            pred, gt = (sample[k].permute(1, 2, 0).cpu().numpy() for k in ('pred', 'gt'))
            result = dict(set=sample.get('set', 'val'), name=sample.get('name'), **self._scores(pred, gt))
            if self.bicubic:
                upscaled = imresize(sample['lr'].permute(1, 2, 0).cpu().numpy(), self.scale)
                result.update(self._scores(upscaled, gt, 'bicubic_'))
            self.results.append(result)

    def compute_metrics(self, results: List[dict]) -> Dict[str, float]:
        by_set = defaultdict(list)
        for result in results:
            by_set[result['set']].append(result)
        metrics = {}
        for name, items in by_set.items():
            for key in [k for k in items[0] if k.endswith(('PSNR', 'SSIM'))]:
                metrics[f'{name}/{key}'] = float(np.mean([item[key] for item in items]))
        return metrics

    @staticmethod
    def report_lines(metrics: Dict[str, float]) -> List[str]:
        """``Set5: PSNR 37.12 dB SSIM 0.9580 (bicubic 33.66 / 0.9299)``, one line per set in ``metrics``."""
        sets = [key[:-len('/PSNR')] for key in metrics if key.endswith('/PSNR')]
        lines = []
        for name in sets:
            line = f'{name}: PSNR {metrics[f"{name}/PSNR"]:.2f} dB SSIM {metrics[f"{name}/SSIM"]:.4f}'
            if f'{name}/bicubic_PSNR' in metrics:
                line += f' (bicubic {metrics[f"{name}/bicubic_PSNR"]:.2f} / {metrics[f"{name}/bicubic_SSIM"]:.4f})'
            lines.append(line)
        return lines
