"""Super-resolution data: paired datasets (crops, flips, every benchmark set, errors naming the file), the
bicubic LR converter and the real-photo set writers."""
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from nalaformer.datasets import write_lr_images
from nalaformer.datasets.super_resolution import TEST_SET, unseen_images
from nalaformer.engine.launch import ConfigError, check_dataset_files, load_config
from nalaformer.images import ImageError, imresize
from nalaformer.sr.data import SRBenchmarkDataset, SRDataError, SRPairedDataset

ROOT = Path(__file__).resolve().parents[1]
CONVERTER = ROOT / 'tools' / 'dataset_converters' / 'bicubic_downsample.py'
CONFIG = ROOT / 'configs' / 'sr' / 'nalasr-light_8xb16-500k_div2k-x2.py'


def save(image: np.ndarray, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(image).save(path)
    return path


def gradient_image(h: int, w: int, seed: int = 0) -> np.ndarray:
    """A smooth random-coloured image (where bicubic is meaningful) with some texture."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w] / max(h, w)
    channels = [np.sin(6 * x * rng.uniform(0.5, 2) + 4 * y * rng.uniform(0.5, 2) + rng.uniform(0, 6)) for _ in range(3)]
    image = 127.5 + 100 * np.stack(channels, -1) + rng.normal(0, 6, (h, w, 3))
    return np.clip(image, 0, 255).round().astype(np.uint8)


def div2k(root: Path, scale: int, sizes=((48, 40), (36, 52))) -> Path:
    """root/DIV2K in the training layout, LR written by the project's converter."""
    hr_dir = root / 'DIV2K' / 'DIV2K_train_HR'
    for i, (h, w) in enumerate(sizes):
        save(gradient_image(h, w, i), hr_dir / f'{i:04d}.png')
    write_lr_images(hr_dir, root / 'DIV2K' / 'DIV2K_train_LR_bicubic', [scale])
    return root


def benchmark(root: Path, sets: dict, scale: int) -> Path:
    """root/benchmark/<Set>/{HR, LR_bicubic/X<scale>} for {set name: [(h, w), ...]}."""
    for name, sizes in sets.items():
        for i, (h, w) in enumerate(sizes):
            save(gradient_image(h, w, 10 + i), root / 'benchmark' / name / 'HR' / f'img{i}.png')
        write_lr_images(root / 'benchmark' / name / 'HR', root / 'benchmark' / name / 'LR_bicubic', [scale])
    return root


# --- datasets -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize('scale', [2, 3, 4])
def test_random_crops_are_paired(tmp_path, scale):
    """The LR patch is the HR patch's bicubic shrink (the pair stays aligned through crops, flips and rotations)."""
    dataset = SRPairedDataset(str(div2k(tmp_path, scale, sizes=((72, 84), (96, 60)))), scale, patch_size=12 * scale)
    assert len(dataset) == 2
    np.random.seed(0)
    for _ in range(8):
        item = dataset[np.random.randint(2)]
        lr, hr = item['inputs'], item['data_samples']['gt']
        assert lr.dtype == hr.dtype == torch.uint8
        assert lr.shape == (3, 12, 12) and hr.shape == (3, 12 * scale, 12 * scale)
        shrunk = imresize(hr.permute(1, 2, 0).numpy(), 1 / scale).astype(int)
        inside = (slice(2, -2), slice(2, -2))  # at the patch border the shrink sees mirrored, not real, pixels
        assert np.abs(shrunk[inside] - lr.permute(1, 2, 0).numpy().astype(int)[inside]).mean() < 1.0


def test_flips_and_rotations_cover_the_eight_symmetries(tmp_path):
    root = tmp_path / 'one'
    hr = np.arange(4 * 4 * 3, dtype=np.uint8).reshape(4, 4, 3) * 5
    save(hr, root / 'DIV2K' / 'DIV2K_train_HR' / 'a.png')
    save(imresize(hr, 1 / 2), root / 'DIV2K' / 'DIV2K_train_LR_bicubic' / 'X2' / 'ax2.png')
    dataset = SRPairedDataset(str(root), 2, patch_size=4)
    np.random.seed(0)
    seen = {dataset[0]['data_samples']['gt'].numpy().tobytes() for _ in range(200)}
    symmetries = {np.ascontiguousarray(np.rot90(im, k).transpose(2, 0, 1)).tobytes()
                  for im in (hr, hr[:, ::-1]) for k in range(4)}
    assert seen == symmetries
    plain = SRPairedDataset(str(root), 2, patch_size=4, flip=False, rotate=False)
    assert plain[0]['data_samples']['gt'].numpy().tobytes() == np.ascontiguousarray(hr.transpose(2, 0, 1)).tobytes()


def test_cache_reads_each_pair_once(tmp_path):
    root = div2k(tmp_path, 2)
    cached = SRPairedDataset(str(root), 2, patch_size=None, cache=True)
    first = [cached[i] for i in range(2)]
    for image in (root / 'DIV2K').rglob('*.png'):
        image.unlink()  # from now on only the memory holds the images
    for item, again in zip(first, (cached[i] for i in range(2))):
        assert torch.equal(item['inputs'], again['inputs'])
        assert torch.equal(item['data_samples']['gt'], again['data_samples']['gt'])


def test_benchmark_reads_every_set_and_cuts_hr_to_lr_times_scale(tmp_path):
    """Every set folder present is read under its name; an HR side that is not a multiple of the scale is cut."""
    root = benchmark(tmp_path, {'Set5': [(30, 31)], 'Urban100': [(33, 27), (24, 24)]}, 3)
    dataset = SRBenchmarkDataset(str(root), 3)
    assert dataset.sets == ['Set5', 'Urban100'] and len(dataset) == 3
    item = dataset[0]
    assert item['data_samples']['set'] == 'Set5' and item['data_samples']['name'] == 'img0'
    assert item['inputs'].shape == (3, 10, 10) and item['data_samples']['gt'].shape == (3, 30, 30)
    assert [dataset[i]['data_samples']['set'] for i in range(3)] == ['Set5', 'Urban100', 'Urban100']
    assert len(SRBenchmarkDataset(str(root), 3, sets=['Urban100'])) == 2


def test_manga109_lr_names(tmp_path):
    root = tmp_path
    hr = save(gradient_image(20, 24), root / 'benchmark' / 'Manga109' / 'HR' / 'AisazuNihaIrarenai.png')
    save(imresize(np.asarray(Image.open(hr)), 1 / 2),
         root / 'benchmark' / 'Manga109' / 'LR_bicubic' / 'X2' / 'AisazuNihaIrarenai_LRBI_x2.png')
    assert len(SRBenchmarkDataset(str(root), 2)) == 1


def test_errors_name_the_file(tmp_path):
    root = div2k(tmp_path / 'a', 2)
    hr_dir, lr_dir = root / 'DIV2K' / 'DIV2K_train_HR', root / 'DIV2K' / 'DIV2K_train_LR_bicubic' / 'X2'
    # an LR image of the wrong size (e.g. another scale's)
    save(imresize(np.asarray(Image.open(hr_dir / '0000.png')), 1 / 4), lr_dir / '0000x2.png')
    with pytest.raises(SRDataError, match=r'0000x2\.png is 10x12 but its HR partner .*0000\.png is 40x48: an x2 LR '
                                          r'image must be 20x24'):
        SRPairedDataset(str(root), 2)
    # a missing partner, either way
    (lr_dir / '0000x2.png').unlink()
    with pytest.raises(SRDataError, match=r'0000\.png has no LR partner: expected .*X2/0000x2\.png'):
        SRPairedDataset(str(root), 2)
    save(gradient_image(24, 20), lr_dir / '0000x2.png')
    save(gradient_image(24, 20), lr_dir / '0099x2.png')
    with pytest.raises(SRDataError, match=r'0099x2\.png has no HR partner in .*DIV2K_train_HR'):
        SRPairedDataset(str(root), 2)
    (lr_dir / '0099x2.png').unlink()
    # an unreadable image
    (hr_dir / '0001.png').write_bytes(b'not a png')
    with pytest.raises(ImageError, match=r'cannot read image .*0001\.png'):
        SRPairedDataset(str(root), 2)
    # a folder without images, a missing folder
    for p in hr_dir.iterdir():
        p.unlink()
    with pytest.raises(ImageError, match=r'DIV2K_train_HR holds no images'):
        SRPairedDataset(str(root), 2)
    with pytest.raises(SRDataError, match=r'folder .*nowhere/DIV2K/DIV2K_train_HR does not exist. Expected layout'):
        SRPairedDataset(str(tmp_path / 'nowhere'), 2)
    with pytest.raises(SRDataError, match=r'folder .*nowhere/benchmark does not exist'):
        SRBenchmarkDataset(str(tmp_path / 'nowhere'), 2)
    bench = benchmark(tmp_path / 'b', {'Set5': [(20, 20)]}, 2)
    with pytest.raises(SRDataError, match=r"holds the sets \['Set5'\], not \['Set14'\]"):
        SRBenchmarkDataset(str(bench), 2, sets=['Set14'])


def test_16_bit_images_are_named(tmp_path):
    root = div2k(tmp_path, 2)
    hr = root / 'DIV2K' / 'DIV2K_train_HR' / '0000.png'
    Image.fromarray((np.asarray(Image.open(hr).convert('L')).astype(np.uint16) * 256)).save(hr)
    with pytest.raises(ImageError, match=r'0000\.png is a I;16 image \(16-bit or float\)'):
        SRPairedDataset(str(root), 2)[0]


def test_tools_check_the_sr_data_before_training(tmp_path):
    """tools/train.py and tools/test.py stop with a ConfigError naming the file and the data_root key."""
    root = div2k(tmp_path, 2)
    (root / 'DIV2K' / 'DIV2K_train_LR_bicubic' / 'X2' / '0001x2.png').unlink()
    cfg = load_config(str(CONFIG), {'train_dataloader.dataset.data_root': str(root)})
    with pytest.raises(ConfigError,
                       match=r'0001\.png has no LR partner.*train data; set train_dataloader.dataset.data_root'):
        check_dataset_files(cfg, ('train',))
    cfg = load_config(str(CONFIG), {'test_dataloader.dataset.data_root': str(tmp_path / 'none')})
    with pytest.raises(ConfigError, match=r'none/benchmark does not exist.*test_dataloader.dataset.data_root'):
        check_dataset_files(cfg, ('test',))


# --- converters and writers -------------------------------------------------------------------------------
@pytest.mark.slow
def test_converter_writes_matlab_bicubic_and_never_overwrites(tmp_path):
    hr_dir = tmp_path / 'HR'
    images = {'a': gradient_image(30, 45, 1), 'b': gradient_image(49, 32, 2)}
    for name, image in images.items():
        save(image, hr_dir / f'{name}.png')
    lr_root = tmp_path / 'LR_bicubic'
    run = [sys.executable, str(CONVERTER), str(hr_dir), str(lr_root), '--scales', '2', '3']
    result = subprocess.run(run, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    for name, image in images.items():
        for s in (2, 3):
            lr = np.asarray(Image.open(lr_root / f'X{s}' / f'{name}x{s}.png'))
            h, w = image.shape[0] // s * s, image.shape[1] // s * s
            assert np.array_equal(lr, imresize(image[:h, :w], 1 / s))
    # the written folders read as a dataset
    assert len(SRPairedDataset(str(tmp_path), 3, hr_dir='HR', lr_dir='LR_bicubic/X{scale}', patch_size=None)) == 2
    # existing outputs are refused and left as they were; --overwrite replaces only those files
    mine = save(np.zeros((2, 2, 3), np.uint8), lr_root / 'X2' / 'ax2.png')
    other = lr_root / 'X2' / 'notes.txt'
    other.write_text('keep')
    before = mine.read_bytes()
    result = subprocess.run(run, capture_output=True, text=True)
    assert result.returncode == 2 and 'exist already' in result.stderr and '--overwrite' in result.stderr
    assert mine.read_bytes() == before
    assert subprocess.run(run + ['--overwrite'], capture_output=True).returncode == 0
    assert np.array_equal(np.asarray(Image.open(mine)), imresize(images['a'][:30, :44], 1 / 2))
    assert other.read_text() == 'keep'
    with pytest.raises(ImageError, match='missing does not exist'):
        write_lr_images(tmp_path / 'missing', lr_root)


def test_unseen_images_are_real_photographs():
    images = unseen_images()
    assert set(images) == {'butterfly', 'astronaut', 'coffee', 'chelsea'}
    for image in images.values():
        assert image.dtype == np.uint8 and image.ndim == 3 and min(image.shape[:2]) >= 256
        assert image.std() > 20  # real content, not a blank
    assert TEST_SET == 'Unseen4'
