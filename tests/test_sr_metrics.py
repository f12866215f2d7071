"""Super-resolution PSNR / SSIM (Y channel, border crop) against computations made independently here, and
MATLAB-style bicubic resizing against hand-computed values, its defining properties and PIL."""
import numpy as np
import pytest
import torch
from PIL import Image

from nalaformer.images import calculate_psnr, calculate_ssim
from nalaformer.sr import SRMetric
from nalaformer.images.resize import cubic, imresize

BUTTERFLY = '/usr/share/doc/opencv-doc/examples/dnn_superres/butterfly.png'


def bt601_y(image: np.ndarray) -> np.ndarray:
    """ITU-R BT.601 luma in studio range [16, 235] of uint8 RGB, written out by hand."""
    r, g, b = (image[..., i].astype(np.float64) / 255 for i in range(3))
    return 16 + 65.481 * r + 128.553 * g + 24.966 * b


def gaussian_ssim(x: np.ndarray, y: np.ndarray) -> float:
    """SSIM by its definition: an 11x11 Gaussian window (sigma 1.5, normalised) at every position where it fits,
    population statistics, C1 = (0.01 * 255)^2, C2 = (0.03 * 255)^2; the mean of the map."""
    g = np.exp(-(np.arange(11) - 5) ** 2 / (2 * 1.5 ** 2))
    window = np.outer(g, g) / np.outer(g, g).sum()
    c1, c2 = (0.01 * 255) ** 2, (0.03 * 255) ** 2
    values = []
    for i in range(x.shape[0] - 10):
        for j in range(x.shape[1] - 10):
            a, b = x[i:i + 11, j:j + 11], y[i:i + 11, j:j + 11]
            mu_a, mu_b = (window * a).sum(), (window * b).sum()
            var_a, var_b = (window * (a - mu_a) ** 2).sum(), (window * (b - mu_b) ** 2).sum()
            cov = (window * (a - mu_a) * (b - mu_b)).sum()
            values.append((2 * mu_a * mu_b + c1) * (2 * cov + c2)
                          / ((mu_a ** 2 + mu_b ** 2 + c1) * (var_a + var_b + c2)))
    return float(np.mean(values))


@pytest.fixture
def pair():
    rng = np.random.default_rng(0)
    reference = rng.integers(0, 256, (23, 26, 3), dtype=np.uint8)
    noisy = np.clip(reference.astype(int) + rng.integers(-25, 26, reference.shape), 0, 255).astype(np.uint8)
    return noisy, reference


@pytest.mark.parametrize('crop', [0, 2, 3])
def test_psnr_matches_definition_on_y(pair, crop):
    image, reference = pair
    sl = (slice(crop, -crop or None),) * 2
    mse = np.mean((bt601_y(image)[sl] - bt601_y(reference)[sl]) ** 2)
    assert calculate_psnr(image, reference, crop) == pytest.approx(10 * np.log10(255 ** 2 / mse), abs=1e-3)


def test_psnr_on_rgb_and_equal_images(pair):
    image, reference = pair
    mse = np.mean((image.astype(float) - reference.astype(float)) ** 2)
    expected = 10 * np.log10(255 ** 2 / mse)
    assert calculate_psnr(image, reference, 0, y_channel=False) == pytest.approx(expected, abs=1e-3)
    assert calculate_psnr(reference, reference, 2) == float('inf')


@pytest.mark.parametrize('crop', [0, 2])
def test_ssim_matches_definition_on_y(pair, crop):
    image, reference = pair
    sl = (slice(crop, -crop or None),) * 2
    expected = gaussian_ssim(bt601_y(reference)[sl], bt601_y(image)[sl])
    assert calculate_ssim(image, reference, crop) == pytest.approx(expected, abs=1e-4)
    assert calculate_ssim(reference, reference, crop) == pytest.approx(1.0, abs=1e-12)


def test_metric_reports_each_set_with_its_bicubic_baseline():
    """Per-set means; the bicubic baseline of a prediction that *is* the bicubic upscaling equals it."""
    rng = np.random.default_rng(1)
    metric = SRMetric()
    metric.dataset_meta = dict(scale=2)
    samples, expected = [], {}
    for set_name, shift in (('SetA', 3), ('SetB', 9)):
        for k in range(2):
            gt = rng.integers(0, 256, (32, 36, 3), dtype=np.uint8)
            lr = imresize(gt, 1 / 2)
            pred = np.clip(gt.astype(int) + shift, 0, 255).astype(np.uint8)
            samples.append(dict(pred=torch.from_numpy(pred).permute(2, 0, 1), gt=torch.from_numpy(gt).permute(2, 0, 1),
                                lr=torch.from_numpy(lr).permute(2, 0, 1), set=set_name, name=str(k)))
            expected.setdefault(set_name, []).append(
                (calculate_psnr(pred, gt, 2), calculate_psnr(imresize(lr, 2), gt, 2), calculate_ssim(pred, gt, 2)))
    metric.process({}, samples)
    metrics = metric.compute_metrics(metric.results)
    for set_name, values in expected.items():
        values = np.array(values)
        assert metrics[f'{set_name}/PSNR'] == pytest.approx(values[:, 0].mean())
        assert metrics[f'{set_name}/bicubic_PSNR'] == pytest.approx(values[:, 1].mean())
        assert metrics[f'{set_name}/SSIM'] == pytest.approx(values[:, 2].mean())
    lines = SRMetric.report_lines(metrics)
    assert lines[0].startswith('SetA: PSNR ') and ' dB SSIM ' in lines[0] and '(bicubic ' in lines[0]
    assert len(lines) == 2 and lines[1].startswith('SetB: ')


# --- MATLAB-style bicubic ----------------------------------------------------------------------------------
def test_cubic_kernel_values():
    """Keys' kernel, a = -0.5: 1 at 0, 0 at the other integers, 0.5625 at 1/2, -0.0625 at 3/2."""
    x = np.array([0, 0.5, 1, 1.5, 2, 2.5, -0.5, -1.5])
    assert np.allclose(cubic(x), [1, 0.5625, 0, -0.0625, 0, 0, 0.5625, -0.0625])


def test_imresize_hand_computed_downscale():
    """x1/2 of a 1 x 8 row: output pixel 1 samples at input position u = 1.5 (1-based) with the kernel stretched to
    width 8: weights h(d) = cubic(d / 2) / 2 at distances d = 1.5 - j for pixels j = -2..5; pixels 0, -1, -2
    before the first mirror to 1, 2, 3."""
    row = np.array([[10., 20, 40, 80, 160, 80, 40, 20]])
    distances = 1.5 - np.arange(-2, 6)
    weights = cubic(distances / 2) / 2
    weights /= weights.sum()
    mirrored = np.array([40, 20, 10, 10, 20, 40, 80, 160])  # pixels -2, -1, 0, 1, ..., 5
    expected_first = (weights * mirrored).sum()
    out = imresize(np.repeat(row, 4, axis=0), 0.5)
    assert out.shape == (2, 4)
    assert out[0, 0] == pytest.approx(expected_first, abs=1e-9)


def test_imresize_properties():
    # a constant stays constant, at any scale, up or down
    flat = np.full((17, 23, 3), 77, np.uint8)
    for scale in (1 / 2, 1 / 3, 1 / 4, 2, 3):
        out = imresize(flat, scale)
        assert out.shape == (int(np.ceil(17 * scale - 1e-9)), int(np.ceil(23 * scale - 1e-9)), 3)
        assert (out == 77).all()
    # a ramp is reproduced exactly away from the border: x1/2 samples at 2x - 0.5 (1-based) = value 2x - 1.5 (0-based)
    ramp = np.tile(np.arange(32, dtype=np.float64), (8, 1))
    assert np.allclose(imresize(ramp, 0.5)[:, 3:-3], (2 * np.arange(1, 17) - 1.5)[3:-3])
    # mirror symmetry: flipping commutes with resizing when the size is a multiple of the scale
    rng = np.random.default_rng(0)
    image = rng.random((24, 30))
    assert np.allclose(imresize(image[:, ::-1], 1 / 3), imresize(image, 1 / 3)[:, ::-1])


@pytest.mark.parametrize('scale', [2, 3, 4])
def test_imresize_matches_pil_inside_the_image(scale):
    """PIL's BICUBIC uses the same kernel, antialiasing and pixel centres and rounds to uint8 after each pass,
    horizontal first: inside the image (where PIL's truncated border kernel plays no part) the width-first
    order of ours gives PIL's pixels exactly. MATLAB's own order is height first (ours by default)."""
    image = np.asarray(Image.open(BUTTERFLY).convert('RGB'))
    h, w = (np.array(image.shape[:2]) // scale) * scale
    hr = image[:h, :w]
    ours = imresize(hr.transpose(1, 0, 2), 1 / scale).transpose(1, 0, 2)
    pil = np.asarray(Image.fromarray(hr).resize((w // scale, h // scale), Image.BICUBIC))
    inside = (slice(3, -3), slice(3, -3))
    assert np.array_equal(ours[inside], pil[inside])
    # in MATLAB's order, uint8 rounding between the passes moves pixels by at most 2 levels
    assert np.abs(imresize(hr, 1 / scale).astype(int) - pil.astype(int))[inside].max() <= 2


def test_imresize_rejects_bad_input():
    with pytest.raises(ValueError, match='scale must be positive'):
        imresize(np.zeros((4, 4)), 0)
    with pytest.raises(TypeError, match='uint8 or float'):
        imresize(np.zeros((4, 4), np.int32), 0.5)
