"""PSNR and SSIM as the super-resolution literature reports them (BasicSR's calculate_psnr / calculate_ssim).

* Both images uint8 RGB, ``crop_border`` pixels cut from every side (the scale, by convention).
* Y channel of ITU-R BT.601 (studio range 16-235, kept as float): scikit-image's ``rgb2ycbcr``.
* PSNR with peak 255; SSIM with an 11x11 Gaussian window, sigma 1.5, K1 0.01, K2 0.03, population
  statistics, averaged over the window positions that fit inside the image: scikit-image's
  ``structural_similarity(gaussian_weights=True, sigma=1.5, use_sample_covariance=False, data_range=255)``.
"""
import numpy as np

__all__ = ['calculate_psnr', 'calculate_ssim']


def prepare_pair(image: np.ndarray, reference: np.ndarray, crop_border: int, y_channel: bool) -> tuple:
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
    image, reference = prepare_pair(image, reference, crop_border, y_channel)
    if np.array_equal(image, reference):
        return float('inf')
    from skimage.metrics import peak_signal_noise_ratio
    return float(peak_signal_noise_ratio(reference, image, data_range=255))


def calculate_ssim(image: np.ndarray, reference: np.ndarray, crop_border: int, y_channel: bool = True) -> float:
    """SSIM (11x11 Gaussian window, sigma 1.5) of two (H, W, 3) uint8 RGB images; RGB: mean over channels."""
    image, reference = prepare_pair(image, reference, crop_border, y_channel)
    from skimage.metrics import structural_similarity
    return float(structural_similarity(reference, image, gaussian_weights=True, sigma=1.5,
                                       use_sample_covariance=False, data_range=255,
                                       channel_axis=None if y_channel else -1))
