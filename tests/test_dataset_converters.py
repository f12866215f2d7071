"""tools/dataset_converters/imagenet_val_to_imagefolder.py on a tiny fake ILSVRC2012 validation folder: class folders
from either ground-truth file (the devkit's, with meta.mat or a text mapping; Kaggle's LOC_val_solution.csv), a
result the training tool's dataset check accepts, and nothing destroyed that the converter did not write."""
import hashlib
import os
import runpy
from pathlib import Path

import numpy as np
import pytest
from mmengine.config import Config
from PIL import Image

from nalaformer.engine.launch import check_dataset_files
from nalaformer.errors import run_tool

ROOT = Path(__file__).resolve().parents[1]
CONVERTER = runpy.run_path(str(ROOT / 'tools' / 'dataset_converters' / 'imagenet_val_to_imagefolder.py'))['main']
CONFIG = ROOT / 'configs' / 'nalaformer' / 'nalaformer-xt_8xb128_in1k.py'
# ILSVRC2012_IDs are not in WNID order (id 1 is the kit fox, n02119789), so a mapping by position would show
ID_TO_WNID = {1: 'n02119789', 2: 'n02100735', 3: 'n02110185'}
IDS = [3, 1, 2, 1, 3, 3, 2, 1, 1, 2]  # image i+1's ILSVRC2012_ID


def image_name(i: int) -> str:
    return f'ILSVRC2012_val_{i:08d}'


@pytest.fixture
def val_set(tmp_path):
    """A flat folder of 10 small JPEGs named as ILSVRC2012's, with the devkit's and Kaggle's ground truth."""
    src = tmp_path / 'ILSVRC2012_img_val'
    src.mkdir()
    rng = np.random.default_rng(0)
    for i in range(1, len(IDS) + 1):
        Image.fromarray(rng.integers(0, 255, (12, 16, 3), dtype=np.uint8)).save(src / f'{image_name(i)}.JPEG')
    devkit = tmp_path / 'devkit'
    devkit.mkdir()
    (devkit / 'ILSVRC2012_validation_ground_truth.txt').write_text(''.join(f'{k}\n' for k in IDS))
    (devkit / 'id_to_wnid.txt').write_text(''.join(f'{k} {w}\n' for k, w in ID_TO_WNID.items()))
    loc = tmp_path / 'LOC_val_solution.csv'
    rows = [f'{image_name(i)},{ID_TO_WNID[k]} 1 2 10 11 {ID_TO_WNID[k]} 0 0 5 5 ' for i, k in enumerate(IDS, 1)]
    loc.write_text('ImageId,PredictionString\n' + '\n'.join(reversed(rows)) + '\n')
    return src, devkit, loc


def write_meta_mat(path: Path) -> None:
    """The devkit's meta.mat as scipy reads it: a ``synsets`` struct array (leaves first, then inner nodes)."""
    sio = pytest.importorskip('scipy.io')
    rows = [(k, w, 0) for k, w in ID_TO_WNID.items()] + [(1001, 'n00001740', 3)]
    sio.savemat(str(path), {'synsets': np.array(rows, dtype=[('ILSVRC2012_ID', 'O'), ('WNID', 'O'),
                                                             ('num_children', 'O')])})


def expected_layout(src: Path) -> dict:
    return {f'{ID_TO_WNID[k]}/{image_name(i)}.JPEG': (src / f'{image_name(i)}.JPEG').read_bytes()
            for i, k in enumerate(IDS, 1)}


def layout(out: Path) -> dict:
    return {p.relative_to(out).as_posix(): p.read_bytes() for p in sorted(out.rglob('*.JPEG'))}


def hashes(folder: Path) -> dict:
    return {p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob('*')) if p.is_file()}


def convert(*argv) -> int:
    return run_tool(CONVERTER, [str(a) for a in argv])


def one_line_error(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith('error: '), err
    return err[0]


def check_as_training_does(data_root: Path, classes: int) -> None:
    """The dataset check tools/train.py and tools/test.py run: the ImageNet config's val split at ``data_root``."""
    cfg = Config.fromfile(str(CONFIG))
    cfg.merge_from_dict({'val_dataloader.dataset.data_root': str(data_root), 'model.num_classes': classes,
                         'train_dataloader.dataset.data_root': str(data_root)})
    check_dataset_files(cfg, ('val',))


@pytest.mark.parametrize('ground_truth', ['devkit-mat', 'devkit-text', 'kaggle'])
def test_sorts_val_images_into_wnid_folders(val_set, tmp_path, capsys, ground_truth):
    src, devkit, loc = val_set
    if ground_truth == 'kaggle':
        files = ['--ground-truth', loc]
    else:
        meta = devkit / ('meta.mat' if ground_truth == 'devkit-mat' else 'id_to_wnid.txt')
        if ground_truth == 'devkit-mat':
            write_meta_mat(meta)
        files = ['--ground-truth', devkit / 'ILSVRC2012_validation_ground_truth.txt', '--meta', meta]
    out = tmp_path / 'imagenet' / 'val'
    before = hashes(src)
    assert convert(src, out, *files) == 0
    assert layout(out) == expected_layout(src)
    assert sorted(p.name for p in out.iterdir() if p.is_dir()) == sorted(ID_TO_WNID.values())
    assert hashes(src) == before
    assert 'wrote 10 images in 3 class folders' in capsys.readouterr().out
    for wnid in ID_TO_WNID.values():  # the training split's class folders beside it (compared with val's)
        (tmp_path / 'imagenet' / 'train' / wnid).mkdir(parents=True)
    check_as_training_does(tmp_path / 'imagenet', len(ID_TO_WNID))


@pytest.mark.parametrize('mode', ['hardlink', 'symlink'])
def test_links_instead_of_copies(val_set, tmp_path, mode):
    src, _, loc = val_set
    out = tmp_path / 'val'
    assert convert(src, out, '--ground-truth', loc, '--mode', mode) == 0
    assert layout(out) == expected_layout(src)
    placed = out / ID_TO_WNID[IDS[0]] / f'{image_name(1)}.JPEG'
    original = src / f'{image_name(1)}.JPEG'
    if mode == 'hardlink':
        assert placed.stat().st_ino == original.stat().st_ino and not placed.is_symlink()
    else:
        assert placed.is_symlink() and Path(os.readlink(placed)) == original.resolve()


def test_rewrites_its_own_output_and_refuses_a_foreign_folder(val_set, tmp_path, capsys):
    src, _, loc = val_set
    out = tmp_path / 'val'
    assert convert(src, out, '--ground-truth', loc) == 0
    assert convert(src, out, '--ground-truth', loc, '--mode', 'symlink') == 0  # its own output: replaced
    assert all(p.is_symlink() for p in out.rglob('*.JPEG'))
    capsys.readouterr()

    foreign = tmp_path / 'holds_files'
    (foreign / 'n02119789').mkdir(parents=True)
    (foreign / 'n02119789' / 'mine.JPEG').write_bytes(b'not the converter\'s')
    (foreign / 'notes.txt').write_text('keep me')
    before = hashes(foreign)
    assert convert(src, foreign, '--ground-truth', loc) == 2
    message = one_line_error(capsys)
    assert str(foreign) in message and '--overwrite' in message
    assert hashes(foreign) == before

    # the converter's own output, changed by hand, is foreign too
    (out / 'n02119789' / 'added.JPEG').write_bytes(b'x')
    before = hashes(out)
    assert convert(src, out, '--ground-truth', loc) == 2
    one_line_error(capsys)
    assert hashes(out) == before

    assert convert(src, foreign, '--ground-truth', loc, '--overwrite') == 0
    assert layout(foreign) == expected_layout(src)


def test_refuses_source_as_output_even_with_overwrite(val_set, capsys):
    src, _, loc = val_set
    before = hashes(src)
    for out in (src, src / 'sorted', src.parent):
        assert convert(src, out, '--ground-truth', loc, '--overwrite') == 2
        assert 'overlap' in one_line_error(capsys)
    assert hashes(src) == before


def test_names_a_listed_image_that_is_missing(val_set, tmp_path, capsys):
    src, devkit, loc = val_set
    (src / f'{image_name(7)}.JPEG').unlink()
    out = tmp_path / 'val'
    assert convert(src, out, '--ground-truth', loc) == 2
    assert image_name(7) in one_line_error(capsys)
    assert not out.exists() and not list(tmp_path.glob('.val*'))


@pytest.mark.parametrize('case, expected', [
    ('no-meta', '--meta'),
    ('meta-with-kaggle', 'leave out --meta'),
    ('bad-id', 'line 2'),
    ('bad-wnid', 'WordNet id'),
    ('missing-file', 'does not exist'),
])
def test_bad_ground_truth_is_one_line(val_set, tmp_path, capsys, case, expected):
    src, devkit, loc = val_set
    txt, mapping = devkit / 'ILSVRC2012_validation_ground_truth.txt', devkit / 'id_to_wnid.txt'
    args = {'no-meta': ['--ground-truth', txt],
            'meta-with-kaggle': ['--ground-truth', loc, '--meta', mapping],
            'bad-id': ['--ground-truth', txt, '--meta', mapping],
            'bad-wnid': ['--ground-truth', loc],
            'missing-file': ['--ground-truth', tmp_path / 'nowhere.txt', '--meta', mapping]}[case]
    if case == 'bad-id':
        txt.write_text('1\n1001\n2\n')
    if case == 'bad-wnid':
        loc.write_text('ImageId,PredictionString\nILSVRC2012_val_00000001,kit_fox 1 2 3 4\n')
    assert convert(src, tmp_path / 'val', *args) == 2
    assert expected in one_line_error(capsys)
    assert not (tmp_path / 'val').exists()


def test_unlisted_images_are_reported(val_set, tmp_path, capsys):
    src, _, loc = val_set
    Image.new('RGB', (8, 8)).save(src / 'ILSVRC2012_val_00050001.JPEG')
    assert convert(src, tmp_path / 'val', '--ground-truth', loc) == 0
    out = capsys.readouterr().out
    assert 'note: 1 images' in out and 'ILSVRC2012_val_00050001' in out
    assert len(layout(tmp_path / 'val')) == len(IDS)
