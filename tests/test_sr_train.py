"""Super-resolution end to end, as a user runs it: the SR model wrapper, a short training of the pico config
on real photographs (tools/train.py) that beats bicubic upscaling on four photographs it never saw
(tools/test.py), and tools/sr_demo.py on an image of odd size.

Data: Debian's mate-backgrounds and opencv-doc (installed by scripts/setup.sh) and scikit-image's bundled
images, written by nalaformer.datasets.write_photo_datasets.
"""
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import timm
import torch
from PIL import Image

from nalaformer.datasets import write_photo_datasets
from nalaformer.datasets.super_resolution import PHOTOS, TEST_SET
from nalaformer.sr import SRModel
from nalaformer.engine.launch import load_config
from nalaformer.images import calculate_psnr, imresize

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / 'configs' / 'sr' / 'nalasr-pico_1xb32-2k_photos-x2.py'
PICO = dict(embed_dim=16, depths=(1,), num_heads=1, window_size=4)
# The CI run: 400 of the config's 2000 iterations, the lr halved at 50 / 75 / 90% as in the config.
CI_ITERS = 400
REPORT = re.compile(r'^(\S+): PSNR ([\d.]+) dB SSIM ([\d.]+) \(bicubic ([\d.]+) / ([\d.]+)\)$', re.M)


def test_sr_model_loss_and_predictions():
    torch.manual_seed(0)
    model = SRModel(upscale=3, **PICO)
    lr = torch.randint(0, 256, (2, 3, 9, 7), dtype=torch.uint8)
    gt = torch.randint(0, 256, (2, 3, 27, 21), dtype=torch.uint8)
    samples = dict(gt=gt, name=['a', 'b'], set=['Set5', 'Set5'])
    sr = model(lr, mode='tensor')
    assert sr.shape == (2, 3, 27, 21)
    loss = model(lr, samples, mode='loss')['loss']
    assert loss.item() == pytest.approx((sr - gt.float() / 255).abs().mean().item(), rel=1e-5)
    predictions = model(lr, samples, mode='predict')
    assert [p['name'] for p in predictions] == ['a', 'b'] and predictions[0]['set'] == 'Set5'
    assert predictions[0]['pred'].dtype == torch.uint8
    assert torch.equal(predictions[1]['pred'], (sr[1].clamp(0, 1) * 255 + .5).floor().to(torch.uint8))  # as MATLAB
    assert torch.equal(predictions[1]['lr'], lr[1]) and torch.equal(predictions[1]['gt'], gt[1])
    # tiles when configured: the network's own tiled inference
    model.tile, model.tile_overlap = 4, 2
    assert torch.equal(model(lr, mode='tensor'), model.model.forward_tiled(lr.float() / 255, 4, 2))
    with pytest.raises(ValueError, match=r"unknown timm model 'nalasr_huge' \(model.arch\); similar names: \['nalasr_"):
        SRModel(arch='nalasr_huge')


@pytest.fixture(scope='module')
def photos(tmp_path_factory):
    assert PHOTOS.is_dir(), f'{PHOTOS} is missing: run `bash scripts/setup.sh` (as root) or `apt-get install ' \
                            f'mate-backgrounds opencv-doc`'
    root = tmp_path_factory.mktemp('sr-photos')
    write_photo_datasets(root, scales=[2])
    return root


@pytest.fixture(scope='module')
def trained(photos, tmp_path_factory):
    """tools/train.py on the photographs for CI_ITERS iterations: the checkpoint."""
    work = tmp_path_factory.mktemp('sr-work')
    milestones = [CI_ITERS // 2, CI_ITERS * 3 // 4, CI_ITERS * 9 // 10]
    result = subprocess.run(
        [sys.executable, str(ROOT / 'tools' / 'train.py'), str(CONFIG), '--work-dir', str(work), '--cfg-options',
         f'train_dataloader.dataset.data_root={photos}', f'train_cfg.max_iters={CI_ITERS}',
         f'param_scheduler.0.milestones=[{",".join(map(str, milestones))}]',
         f'default_hooks.checkpoint.interval={CI_ITERS}'],
        capture_output=True, text=True, cwd=ROOT, timeout=1800)
    assert result.returncode == 0, result.stderr[-5000:]
    checkpoint = work / f'iter_{CI_ITERS}.pth'
    assert checkpoint.is_file()
    return checkpoint


@pytest.mark.xdist_group('sr_trained')
@pytest.mark.slow
def test_short_training_beats_bicubic_on_unseen_photographs(photos, trained, tmp_path):
    result = subprocess.run(
        [sys.executable, str(ROOT / 'tools' / 'test.py'), str(CONFIG), str(trained), '--work-dir', str(tmp_path),
         '--cfg-options', f'test_dataloader.dataset.data_root={photos}'],
        capture_output=True, text=True, cwd=ROOT, timeout=1800)
    assert result.returncode == 0, result.stderr[-5000:]
    [(name, psnr, ssim, bicubic_psnr, bicubic_ssim)] = REPORT.findall(result.stdout)
    print(f'after {CI_ITERS} iterations: {name} PSNR {psnr} / SSIM {ssim}, bicubic {bicubic_psnr} / {bicubic_ssim}')
    assert name == TEST_SET
    assert float(psnr) > float(bicubic_psnr)
    # the reported bicubic baseline is that of the images on disk, computed here independently of the metric
    hr_dir, lr_dir = photos / 'benchmark' / TEST_SET / 'HR', photos / 'benchmark' / TEST_SET / 'LR_bicubic' / 'X2'
    baseline = []
    for hr_file in sorted(hr_dir.glob('*.png')):
        lr = np.asarray(Image.open(lr_dir / f'{hr_file.stem}x2.png'))
        hr = np.asarray(Image.open(hr_file))[:lr.shape[0] * 2, :lr.shape[1] * 2]
        baseline.append(calculate_psnr(imresize(lr, 2), hr, crop_border=2))
    assert float(bicubic_psnr) == pytest.approx(np.mean(baseline), abs=0.006)


@pytest.mark.xdist_group('sr_trained')
@pytest.mark.slow
def test_sr_demo_upscales_an_odd_sized_image(trained, tmp_path):
    """Any size, whole or tiled, equal to the trained network's own output; OUT is never replaced without
    --overwrite."""
    image = np.asarray(Image.open('/usr/share/doc/opencv-doc/examples/dnn_superres/butterfly.png').convert('RGB'))
    small = np.ascontiguousarray(image[:53, :75])
    src = tmp_path / 'odd.png'
    Image.fromarray(small).save(src)

    def demo(out, *extra):
        return subprocess.run([sys.executable, str(ROOT / 'tools' / 'sr_demo.py'), str(src), str(out), '--config',
                               str(CONFIG), '--checkpoint', str(trained), *extra],
                              capture_output=True, text=True, cwd=ROOT, timeout=600)

    whole, tiled = tmp_path / 'whole.png', tmp_path / 'tiled.png'
    for out, extra in ((whole, ()), (tiled, ('--tile', '24', '--tile-overlap', '6'))):
        result = demo(out, *extra)
        assert result.returncode == 0, result.stderr[-3000:]
        assert Image.open(out).size == (150, 106)
    cfg = load_config(str(CONFIG))
    # the training run's checkpoint loads into timm as a pretrained file too
    network = timm.create_model('nalasr_light', upscale=2, pretrained=True,
                                pretrained_cfg_overlay=dict(file=str(trained)),
                                **{k: cfg.model[k] for k in ('embed_dim', 'depths', 'num_heads', 'window_size')}).eval()
    lr = torch.from_numpy(small).permute(2, 0, 1)[None].float() / 255
    with torch.no_grad():
        for out, sr in ((whole, network(lr)), (tiled, network.forward_tiled(lr, 24, 6))):
            expected = (sr[0].clamp(0, 1) * 255).round().to(torch.uint8).permute(1, 2, 0).numpy()
            assert np.abs(np.asarray(Image.open(out)).astype(int) - expected).max() <= 1  # float round-off only
    before = whole.read_bytes()
    result = demo(whole)
    assert result.returncode != 0 and 'exists; pass --overwrite' in result.stderr
    assert whole.read_bytes() == before
    assert demo(whole, '--overwrite').returncode == 0
