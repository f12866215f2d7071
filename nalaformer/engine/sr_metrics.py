"""PSNR and SSIM as the super-resolution literature reports them (BasicSR's calculate_psnr / calculate_ssim),
with the bicubic baseline of the same images in the same report.

* Both images uint8 RGB, ``crop_border`` pixels cut from every side (the scale, by convention).
* Y channel of ITU-R BT.601 (studio range 16-235, kept as float): scikit-image's ``rgb2ycbcr``.
* PSNR with peak 255; SSIM with an 11x11 Gaussian window, sigma 1.5, K1 0.01, K2 0.03, population
  statistics, averaged over the window positions that fit inside the image: scikit-image's
  ``structural_similarity(gaussian_weights=True, sigma=1.5, use_sample_covariance=False, data_range=255)``.
* The bicubic baseline upscales the LR image with MATLAB's bicubic (:func:`nalaformer.imresize.imresize`).
"""
from collections import defaultdict
from typing import Dict, List, Optional, Sequence

import numpy as np
from mmengine.evaluator import BaseMetric
from mmengine.registry import METRICS

from ..imresize import imresize

__all__ = ['calculate_psnr', 'calculate_ssim', 'SRMetric', 'report_lines']


def _prepare(image: np.ndarray, reference: np.ndarray, crop_border: int, y_channel: bool) -> tuple:
    """(H, W, 3) uint8 pair -> cropped float64 arrays, Y (H', W') or RGB (H', W', 3)."""
    if image.shape != reference.shape:
        raise ValueError(f'images differ in shape: {image.shape} vs {reference.shape}')
    if image.dtype != np.uint8 or reference.dtype != np.uint8:
        raise TypeError(f'PSNR/SSIM take uint8 images, got {image.dtype} and {reference.dtype}')
    if crop_border:
        image = image[crop_border:-crop_border, crop_border:-crop_border]
        reference = reference[crop_border:-crop_border, crop_border:-crop_border]
    if y_channel:
        # scikit-image (with SciPy) is imported where a metric is taken: it adds ~1 s to every tool's start-up
        from skimage.color import rgb2ycbcr
        return rgb2ycbcr(image)[..., 0], rgb2ycbcr(reference)[..., 0]
    return image.astype(np.float64), reference.astype(np.float64)


def calculate_psnr(image: np.ndarray, reference: np.ndarray, crop_border: int, y_channel: bool = True) -> float:
    """PSNR in dB (peak 255) of two (H, W, 3) uint8 RGB images; inf when they are equal."""
    image, reference = _prepare(image, reference, crop_border, y_channel)
    if np.array_equal(image, reference):
        return float('inf')
    from skimage.metrics import peak_signal_noise_ratio
    return float(peak_signal_noise_ratio(reference, image, data_range=255))


def calculate_ssim(image: np.ndarray, reference: np.ndarray, crop_border: int, y_channel: bool = True) -> float:
    """SSIM (11x11 Gaussian window, sigma 1.5) of two (H, W, 3) uint8 RGB images; RGB: mean over channels."""
    image, reference = _prepare(image, reference, crop_border, y_channel)
    from skimage.metrics import structural_similarity
    return float(structural_similarity(reference, image, gaussian_weights=True, sigma=1.5,
                                       use_sample_covariance=False, data_range=255,
                                       channel_axis=None if y_channel else -1))


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
