"""Bad inputs to the tools, as a careless user gives them: each is refused before any work with one line
``error: ...`` naming the file or key and the fix, exit code 2, and every file that existed before is
byte-identical afterwards (nothing is created either).

The tools run in-process (their ``main`` under :func:`nalaformer.errors.run_tool`, as their ``__main__``
does; stderr captured at the file-descriptor level, so steps the quick start runs as subprocesses count);
``test_tools_exit_2_with_one_line_in_a_subprocess`` checks the same through real processes. The table of
cases, docs/bad_inputs.md, is written by ``test_the_table_of_bad_inputs_is_written`` from the messages
these runs printed.
"""
import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, List, Tuple

import numpy as np
import pytest
import torch
from PIL import Image

import nalaformer  # noqa: F401  (registers the models)
from nalaformer.checkpoint import Checkpoint, model_definition, model_definitions, save_state_dict
from nalaformer.classification import TimmClassifier
from nalaformer.errors import USER_ERROR_EXIT, run_tool

from tool_runs import run_script, write_imagefolder, write_tiny_ade, write_tiny_coco

pytestmark = pytest.mark.xdist_group('bad_inputs')  # one worker under pytest -n: the tests share the user's files; the last one writes the table of what the others printed

ROOT = Path(__file__).resolve().parents[1]
CONFIG = str(ROOT / 'configs' / 'nalaformer' / 'nalaformer-t_8xb128_in1k.py')
SEG_CONFIG = str(ROOT / 'configs' / 'ade20k' / 'upernet_nalaformer-t_8xb2-160k_ade20k-512x512.py')
DET_CONFIG = str(ROOT / 'configs' / 'coco' / 'mask-rcnn_nalaformer-t_fpn_1x_coco.py')
SR_CONFIG = str(ROOT / 'configs' / 'sr' / 'nalasr-pico_1xb32-2k_photos-x2.py')
SR_X2_CONFIG = str(ROOT / 'configs' / 'sr' / 'nalasr-light_8xb16-500k_div2k-x2.py')
PICO_CONFIG = str(ROOT / 'configs' / 'nalaformer' / 'nalaformer-pico_1xb64-10e_fashion-mnist-32px.py')
TABLE = ROOT / 'docs' / 'bad_inputs.md'
CLASSES = ('class0', 'class1', 'class2')
TINY = dict(num_classes=3, embed_dims=[16, 32, 48, 64], depths=[1, 1, 1, 1], num_heads=[1, 2, 3, 4],
            head_hidden_size=32)
TINY_OPTIONS = ['model.num_classes=3', 'model.embed_dims=[16,32,48,64]', 'model.depths=[1,1,1,1]',
                'model.num_heads=[1,2,3,4]', 'model.head_hidden_size=32',
                'train_dataloader.batch_size=2']  # the tiny datasets hold fewer images than one shipped batch


def load_tool(path: str):
    """tools/<path>.py as a module (tools are scripts, not a package)."""
    spec = importlib.util.spec_from_file_location(f'tool_{Path(path).stem}', ROOT / 'tools' / f'{path}.py')
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


TOOL_PATHS = {'train.py': 'train', 'test.py': 'test', 'convert_checkpoint.py': 'convert_checkpoint',
              'export_onnx.py': 'deployment/export_onnx',
              'fashion_mnist_to_imagefolder.py': 'dataset_converters/fashion_mnist_to_imagefolder',
              'quick_start.py': 'quick_start', 'seg_demo.py': 'seg_demo', 'det_demo.py': 'det_demo',
              'sr_demo.py': 'sr_demo'}


class Tools(dict):
    """The tools, each imported when first used (the demos import mmseg / mmdet)."""

    def __missing__(self, name):
        self[name] = load_tool(TOOL_PATHS[name])
        return self[name]


@pytest.fixture(scope='module')
def tools():
    return Tools()


def snapshot(root: Path) -> Dict[str, str]:
    """Every file (its SHA-256) and folder under ``root``."""
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else 'folder'
            for p in sorted(root.rglob('*'))}


def write_images(folder: Path, n: int, start: int = 0, suffix: str = '.png') -> None:
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(start)
    for i in range(start, start + n):
        Image.fromarray(rng.integers(0, 255, (8, 8, 3), dtype=np.uint8)).save(folder / f'{i}{suffix}')


def image_folder(root: Path, classes=CLASSES, train: int = 3, val: int = 2) -> Path:
    for split, n in (('train', train), ('val', val)):
        for c in classes:
            write_images(root / split / c, n)
    return root


def runner_checkpoint(path: Path, training_state: bool = True, **model_kwargs) -> Path:
    """A checkpoint as tools/train.py writes it (mmengine's layout, recorded definitions and classes)."""
    model_kwargs = {**TINY, 'attn_types': ('nala', 'nala', 'softmax', 'softmax'), **model_kwargs}
    model = TimmClassifier('nalaformer_t', **model_kwargs)
    content = {'state_dict': model.state_dict(),
               'meta': {'epoch': 1, 'iter': 2, 'dataset_meta': {'classes': CLASSES},
                        'model_definitions': model_definitions(model)}}
    if training_state:
        content.update(optimizer={'state': {}, 'param_groups': []}, message_hub={'log_scalars': {}})
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(content, path)
    return path


@pytest.fixture(scope='module')
def world(tmp_path_factory, tools) -> Path:
    """Files a user has: a dataset, a training run's work dir, weights, a timm folder, their own folder, a few
    things that are not checkpoints, and datasets with the layout mistakes the tools must catch."""
    w = tmp_path_factory.mktemp('world')
    image_folder(w / 'data')
    for run in ('run', 'other_run'):
        runner_checkpoint(w / run / 'epoch_1.pth')
        runner_checkpoint(w / run / 'best_accuracy_top1_epoch_1.pth', training_state=False)
        (w / run / 'last_checkpoint').write_text(str(w / run / 'epoch_1.pth'))
        (w / run / '20260101_000000').mkdir()
        (w / run / '20260101_000000' / '20260101_000000.log').write_text('epoch 1 ...\n')
    runner_checkpoint(w / 'wide_run' / 'epoch_1.pth', embed_dims=[32, 32, 48, 64])  # another model's run
    (w / 'wide_run' / 'my_wide_config.py').write_text(f'_base_ = [{CONFIG!r}]\n')
    runner_checkpoint(w / 'relu_run' / 'epoch_1.pth', attn_types='relu')  # the same weights, other attention
    model = TimmClassifier('nalaformer_t', **TINY).model
    torch.save(model.state_dict(), w / 'state_dict.pth')  # a bare state dict
    save_state_dict(model.state_dict(), w / 'weights.safetensors', model_definition(model))
    assert tools['convert_checkpoint.py'].main([str(w / 'weights.safetensors'), str(w / 'timm_folder')]) == 0
    (w / 'mine').mkdir()  # a folder of the user's own
    (w / 'mine' / 'notes.txt').write_text('my notes\n')
    write_images(w / 'mine', 1)
    write_images(w, 1)
    (w / '0.png').rename(w / 'photo.png')
    (w / 'notes.txt').write_text('not a checkpoint\n')
    (w / 'notes').write_text('a file without a suffix\n')
    (w / 'random.pth').write_bytes(np.random.default_rng(0).bytes(4096))
    (w / 'empty.pth').write_bytes(b'')
    with zipfile.ZipFile(w / 'archive.pth', 'w') as archive:
        archive.writestr('photos/a.txt', 'not tensors')
    (w / 'metrics.json').write_text('{"accuracy/top1": 61.9}\n')
    (w / 'model.onnx').write_bytes(b'an earlier export')
    write_bad_configs(w)
    # datasets with one mistake each
    image_folder(w / 'empty_class')
    for image in (w / 'empty_class' / 'val' / 'class1').iterdir():
        image.unlink()
    image_folder(w / 'missing_class')
    shutil.rmtree(w / 'missing_class' / 'val' / 'class1')
    write_images(w / 'loose' / 'train', 6)
    for c in CLASSES:
        write_images(w / 'loose' / 'val' / c, 2)
    image_folder(w / 'beside')
    write_images(w / 'beside' / 'train', 2, start=100)
    image_folder(w / 'nested')
    write_images(w / 'nested' / 'train' / 'class0' / 'close-ups', 2, start=100)
    image_folder(w / 'four_classes', classes=(*CLASSES, 'class3'))
    image_folder(w / 'webp', train=0, val=0)
    for split in ('train', 'val'):
        for c in CLASSES:
            write_images(w / 'webp' / split / c, 2, suffix='.webp')
    return w


def data_options(root: Path, splits=('train', 'val', 'test')) -> List[str]:
    return [f'{s}_dataloader.dataset.data_root={root}' for s in splits]


@dataclass
class Case:
    tool: str
    what: str  # the bad input, as the table says it
    argv: Callable[[Path], List[str]]
    says: Callable[[Path], Tuple[str, ...]]  # what the message must contain: the file or key, and the fix


def train_argv(*args, data='data'):
    return lambda w: [CONFIG, '--work-dir', str(w / 'new_run'), *[a(w) if callable(a) else a for a in args],
                      '--cfg-options', *data_options(w / data), *TINY_OPTIONS]


def train_options(*options, data='data'):
    return lambda w: [CONFIG, '--work-dir', str(w / 'new_run'), '--cfg-options', *data_options(w / data),
                      *TINY_OPTIONS, *options]


def eval_argv(checkpoint, *args, data='data'):
    return lambda w: [CONFIG, str(w / checkpoint), '--work-dir', str(w / 'test_logs'), *[
        a(w) if callable(a) else a for a in args], '--cfg-options', *data_options(w / data), *TINY_OPTIONS]


CASES = {
    # --- destinations: nothing the tool did not write is deleted or overwritten
    'convert-into-work-dir': Case(
        'convert_checkpoint.py', 'a work dir (holding the source) as the timm-folder destination: `RUN/epoch_1.pth RUN --ema`',
        lambda w: [str(w / 'run' / 'epoch_1.pth'), str(w / 'run'), '--ema'],
        lambda w: (f'{w / "run"} holds the source', 'give a new folder name')),
    'convert-into-own-folder': Case(
        'convert_checkpoint.py', 'a folder of the user\'s files as the timm-folder destination',
        lambda w: [str(w / 'weights.safetensors'), str(w / 'mine')],
        lambda w: (f'{w / "mine"} holds other files', 'notes.txt', '--overwrite')),
    'convert-src-is-dst': Case(
        'convert_checkpoint.py', 'SRC == DST', lambda w: [str(w / 'run' / 'epoch_1.pth'), str(w / 'run' / 'epoch_1.pth')],
        lambda w: (f'{w / "run" / "epoch_1.pth"} is the source checkpoint itself', 'another path')),
    'convert-onto-file': Case(
        'convert_checkpoint.py', 'an existing file it did not write as the destination',
        lambda w: [str(w / 'run' / 'epoch_1.pth'), str(w / 'state_dict.pth')],
        lambda w: (f'{w / "state_dict.pth"} exists and is not a file tools/convert_checkpoint.py wrote',
                   '--overwrite')),
    'convert-onto-run-checkpoint': Case(
        'convert_checkpoint.py', 'a run\'s checkpoint as the destination',
        lambda w: [str(w / 'weights.safetensors'), str(w / 'other_run' / 'epoch_1.pth')],
        lambda w: (f'{w / "other_run" / "epoch_1.pth"} exists', '--overwrite')),
    'convert-folder-onto-file': Case(
        'convert_checkpoint.py', 'a file where the timm folder (no suffix) would go',
        lambda w: [str(w / 'run' / 'epoch_1.pth'), str(w / 'notes')],
        lambda w: (f'{w / "notes"} is a file', 'folder name')),
    'converter-into-own-folder': Case(
        'fashion_mnist_to_imagefolder.py', 'a folder of the user\'s files as OUT_DIR',
        lambda w: [str(w / 'mine'), '--train-per-class', '1', '--val-per-class', '1'],
        lambda w: (f'{w / "mine"} holds other files', '--overwrite')),
    'converter-into-dataset': Case(
        'fashion_mnist_to_imagefolder.py', 'a dataset the converter did not write as OUT_DIR',
        lambda w: [str(w / 'data'), '--train-per-class', '1', '--val-per-class', '1'],
        lambda w: (f'{w / "data"} holds other files (train, val)', 'nalaformer_dataset.json', '--overwrite')),
    'test-json-exists': Case(
        'test.py', '`--out-json` an existing file', eval_argv('run/epoch_1.pth', '--out-json', lambda w: str(w / 'metrics.json')),
        lambda w: (f'--out-json {w / "metrics.json"} exists', '--overwrite')),
    'test-json-folder': Case(
        'test.py', '`--out-json` a folder', eval_argv('run/epoch_1.pth', '--out-json', lambda w: str(w / 'mine')),
        lambda w: (f'--out-json {w / "mine"} is a folder', 'metrics.json')),
    'test-json-below-file': Case(
        'test.py', '`--out-json` below a file', eval_argv('run/epoch_1.pth', '--out-json', lambda w: str(w / 'notes' / 'm.json')),
        lambda w: (f'{w / "notes"} is a file, not a folder',)),
    'test-show-dir-classification': Case(
        'test.py', '`--show-dir` with a classification config', eval_argv('run/epoch_1.pth', '--show-dir', lambda w: str(w / 'vis')),
        lambda w: ('--show-dir', 'draws no predictions')),
    'export-out-folder': Case(
        'export_onnx.py', '`--out` an existing folder', lambda w: ['nalaformer_xt', '--out', str(w / 'mine')],
        lambda w: (f'--out {w / "mine"} is a folder', 'model.onnx')),
    'export-out-exists': Case(
        'export_onnx.py', '`--out` an existing file', lambda w: ['nalaformer_xt', '--out', str(w / 'model.onnx')],
        lambda w: (f'--out {w / "model.onnx"} exists', '--overwrite')),
    'train-run-dir': Case(
        'train.py', '`--work-dir` of an earlier run, without `--resume`',
        lambda w: [CONFIG, '--work-dir', str(w / 'run'), '--cfg-options', *data_options(w / 'data'), *TINY_OPTIONS],
        lambda w: (f'--work-dir {w / "run"} holds checkpoints of an earlier run', 'epoch_1.pth', '--resume',
                   'new --work-dir', '--overwrite')),
    'train-resume-other-run': Case(
        'train.py', '`--resume` another run\'s checkpoint into a run\'s work dir',
        lambda w: [CONFIG, '--work-dir', str(w / 'run'), '--resume', str(w / 'other_run' / 'epoch_1.pth'),
                   '--cfg-options', *data_options(w / 'data'), *TINY_OPTIONS],
        lambda w: (f'--work-dir {w / "run"} holds checkpoints of another run', 'new --work-dir', '--overwrite')),
    'train-work-dir-file': Case(
        'train.py', '`--work-dir` a file',
        lambda w: [CONFIG, '--work-dir', str(w / 'notes'), '--cfg-options', *data_options(w / 'data'), *TINY_OPTIONS],
        lambda w: (f'--work-dir {w / "notes"} is a file',)),
    'quick-start-work-dir-in-data': Case(
        'quick_start.py', '`--work-dir` inside `--data`',
        lambda w: ['--work-dir', str(w / 'data' / 'run'), '--data', str(w / 'data')],
        lambda w: (f'--work-dir {w / "data" / "run"} and --data {w / "data"} overlap',)),
    'test-json-is-checkpoint': Case(
        'test.py', '`--out-json` the checkpoint itself, with `--overwrite`',
        eval_argv('run/epoch_1.pth', '--overwrite', '--out-json', lambda w: str(w / 'run' / 'epoch_1.pth')),
        lambda w: (f'--out-json {w / "run" / "epoch_1.pth"} is also an input of this command',)),
    'export-out-is-checkpoint': Case(
        'export_onnx.py', '`--out` the checkpoint itself, with `--overwrite`',
        lambda w: ['nalaformer_t', '--checkpoint', str(w / 'state_dict.pth'), '--out', str(w / 'state_dict.pth'),
                   '--overwrite'],
        lambda w: (f'--out {w / "state_dict.pth"} is also an input of this command',)),
    'quick-start-foreign-work-dir': Case(
        'quick_start.py', '`--work-dir` of something else',
        lambda w: ['--work-dir', str(w / 'run'), '--data', str(w / 'fm')],
        lambda w: (f'--work-dir {w / "run"} holds other files', 'no quick start run', 'new or empty --work-dir')),
    'quick-start-foreign-data': Case(
        'quick_start.py', '`--data` a dataset it did not write',
        lambda w: ['--work-dir', str(w / 'qs'), '--data', str(w / 'data')],
        lambda w: (f'{w / "data"} holds other files (train, val)', '--overwrite')),
    'seg-demo-out-is-image': Case(
        'seg_demo.py', '`--out` the input image, with `--overwrite`',
        lambda w: [str(w / 'photo.png'), SEG_CONFIG, str(w / 'run' / 'epoch_1.pth'), '--out', str(w / 'photo.png'),
                   '--overwrite'],
        lambda w: (f'--out {w / "photo.png"} is also an input of this command',)),
    'det-demo-out-exists': Case(
        'det_demo.py', '`--out` an existing file',
        lambda w: [str(w / 'photo.png'), DET_CONFIG, str(w / 'run' / 'epoch_1.pth'), '--out', str(w / 'mine' / '0.png')],
        lambda w: (f'--out {w / "mine" / "0.png"} exists', '--overwrite')),
    'test-show-dir-foreign': Case(
        'test.py', '`--show-dir` a folder of the user\'s files (segmentation)',
        lambda w: [SEG_CONFIG, str(w / 'run' / 'epoch_1.pth'), '--work-dir', str(w / 'test_logs'), '--show-dir',
                   str(w / 'mine')],
        lambda w: (f'--show-dir {w / "mine"} holds other files', '--overwrite')),
    # --- datasets
    'data-empty-class': Case(
        'train.py', 'a class folder without images in one split', train_options(data='empty_class'),
        lambda w: (f'class folder {w / "empty_class" / "val" / "class1"} has no images', 'remove it from every split')),
    'data-missing-class': Case(
        'test.py', 'a class folder missing from the test split (the checkpoint records 3 classes)',
        eval_argv('run/epoch_1.pth', data='missing_class'),
        lambda w: (f'{w / "missing_class" / "val"} has other classes', 'it lacks class1', 'class map')),
    'data-loose-images': Case(
        'train.py', 'images directly in `train/`, no class folders', train_options(data='loose'),
        lambda w: (f'{w / "loose" / "train"} holds 6 images directly', 'no class folders', '<class name>/<image>')),
    'data-images-beside-classes': Case(
        'train.py', 'images beside the class folders', train_options(data='beside'),
        lambda w: (f'{w / "beside" / "train"} holds 2 images directly', 'outside its class folders')),
    'data-nested': Case(
        'train.py', 'images in a sub-folder of a class folder', train_options(data='nested'),
        lambda w: (f'{w / "nested" / "train"} has images in sub-folders', 'class0/close-ups', 'Move their images up')),
    'data-more-classes': Case(
        'train.py', 'more class folders than `num_classes`', train_options(data='four_classes'),
        lambda w: (f'{w / "four_classes" / "train"} has 4 classes but the model has num_classes=3',
                   'model.num_classes=4')),
    'data-no-readable-images': Case(
        'train.py', 'only files of other extensions (.webp)', train_options(data='webp'),
        lambda w: (f'no images under {w / "webp" / "train"}', 'extensions read: .png, .jpg, .jpeg', 'not read')),
    'data-class-map-misses-folder': Case(
        'train.py', 'a class map (`classes`) that does not name a class folder',
        train_options('train_dataloader.dataset.classes=[class0,class1]'),
        lambda w: (f'{w / "data" / "train"} has class folders that the dataset\'s classes do not name: class2',)),
    # --- checkpoints
    'ckpt-text': Case(
        'test.py', 'a text file as the checkpoint', eval_argv('notes.txt'),
        lambda w: (f'{w / "notes.txt"} is not a checkpoint: it is a text file',)),
    'ckpt-random-bytes': Case(
        'convert_checkpoint.py', 'random bytes as the checkpoint',
        lambda w: [str(w / 'random.pth'), str(w / 'out.safetensors')],
        lambda w: (f'{w / "random.pth"} is not a checkpoint',)),
    'ckpt-empty': Case(
        'export_onnx.py', 'an empty file as the checkpoint',
        lambda w: ['nalaformer_xt', '--checkpoint', str(w / 'empty.pth'), '--out', str(w / 'out.onnx')],
        lambda w: (f'{w / "empty.pth"} is not a checkpoint: it is empty',)),
    'ckpt-zip': Case(
        'test.py', 'a zip archive of other files as the checkpoint', eval_argv('archive.pth'),
        lambda w: (f'{w / "archive.pth"} is not a checkpoint', 'zip archive of other files')),
    'ckpt-work-dir': Case(
        'test.py', 'a work dir as the checkpoint', eval_argv('run'),
        lambda w: (f'{w / "run"} is a folder, not a checkpoint', f'e.g. {w / "run" / "epoch_1.pth"}')),
    'ckpt-missing': Case(
        'test.py', 'a checkpoint that does not exist', eval_argv('nope.pth'),
        lambda w: (f'checkpoint {w / "nope.pth"} does not exist',)),
    'resume-text': Case(
        'train.py', '`--resume` a text file', train_argv('--resume', lambda w: str(w / 'notes.txt')),
        lambda w: (f'{w / "notes.txt"} is not a checkpoint',)),
    'resume-state-dict': Case(
        'train.py', '`--resume` a bare state dict', train_argv('--resume', lambda w: str(w / 'state_dict.pth')),
        lambda w: (f'{w / "state_dict.pth"} holds weights only', f'model.pretrained={w / "state_dict.pth"}',
                   'load_from')),
    'resume-safetensors': Case(
        'train.py', '`--resume` converted weights (.safetensors)',
        train_argv('--resume', lambda w: str(w / 'weights.safetensors')),
        lambda w: (f'{w / "weights.safetensors"} holds weights only', 'model.pretrained=')),
    'resume-other-model': Case(
        'train.py', '`--resume` a run of another model (other widths)',
        train_argv('--resume', lambda w: str(w / 'wide_run' / 'epoch_1.pth')),
        lambda w: (f'{w / "wide_run" / "epoch_1.pth"} was written by another model', 'tensors differ',
                   str(w / 'wide_run' / 'my_wide_config.py'))),
    'resume-other-attention': Case(
        'train.py', '`--resume` a run of other attention kernels (`relu`)',
        train_argv('--resume', lambda w: str(w / 'relu_run' / 'epoch_1.pth')),
        lambda w: (f'{w / "relu_run" / "epoch_1.pth"} was trained as nalaformer_t(attn_types=[\'relu\'',
                   '--cfg-options model.attn_types=')),
    'resume-best': Case(
        'train.py', '`--resume` a best-metric checkpoint (no optimizer state)',
        train_argv('--resume', lambda w: str(w / 'run' / 'best_accuracy_top1_epoch_1.pth')),
        lambda w: ('best_accuracy_top1_epoch_1.pth holds no optimizer state', 'epoch_*.pth', 'load_from=')),
}
# tools/train.py with bad --cfg-options: case id -> (the options, what the message must contain[, a note])
OPTION_CASES = {
    # --- config values
    'option-lr-text': (['optim_wrapper.optimizer.lr=3e-3x'],
                       ('--cfg-options optim_wrapper.optimizer.lr: expected a number', "the text '3e-3x'")),
    'option-epochs-text': (['train_cfg.max_epochs=ten'], ('train_cfg.max_epochs: expected a number', "'ten'")),
    'option-list-item': (['model.embed_dims=[16,32,x,64]'], ('model.embed_dims: expected a number, or a list of them',)),
    'option-dict-text': (['model.mixup=off'], ('model.mixup: expected a dict (or None)', "'off'"), 'a dict in the config'),
    'option-bool-for-number': (['model.drop_path_rate=True'], ('model.drop_path_rate: expected a number', 'got True')),
    'option-batch-size-zero': (['train_dataloader.batch_size=0'],
                               ('train_dataloader.batch_size: expected a whole number >= 1', 'got 0')),
    'option-lr-negative': (['optim_wrapper.optimizer.lr=-0.1'],
                           ('optim_wrapper.optimizer.lr: expected a finite number >= 0', 'got -0.1')),
    'option-nan': (['model.drop_path_rate=nan'], ('model.drop_path_rate: expected a number, not NaN',)),
    'option-key-typo': (['train_cfg.max_epoch=3'], ("no key 'max_epoch' at train_cfg", 'max_epochs'), 'no such key'),
    'option-optimizer-argument-typo': (['optim_wrapper.optimizer.lrr=0.1'],
                                       ("optim_wrapper.optimizer.lrr: AdamW takes no argument 'lrr'", "'lr'"),
                                       'not an argument of the optimizer'),
    'model-keyword-typo': (['model.drop_path=0.1'], ("takes no argument 'drop_path'", 'drop_path_rate'),
                           'not an argument of the model'),
    # --- kernel keywords
    'kernel-alpha-negative': (['model.attn_types=nala_cos', 'model.kernel_kwargs.alpha=-1'],
                              ("attention kernel 'nala_cos': alpha must be a finite number > 0, got -1",)),
    'kernel-alpha-nan': (['model.attn_types=nala_cos', 'model.kernel_kwargs.alpha=nan'],
                         ('--cfg-options model.kernel_kwargs.alpha: expected a number, not NaN',)),
    'kernel-power-zero': (['model.attn_types=relu', 'model.kernel_kwargs.power=0'],
                          ("attention kernel 'relu': power must be a finite number > 0, got 0",)),
    'kernel-power-inf': (['model.attn_types=const_power', 'model.kernel_kwargs.power=inf'],
                         ("attention kernel 'const_power': power must be a finite number > 0, got inf",)),
}


def option_case(options: List[str], says: Tuple[str, ...], note: str = '') -> Case:
    what = ' '.join(f'`{option}`' for option in options) + (f' ({note})' if note else '')
    return Case('train.py', what, train_options(*options), lambda w: says)


CASES.update({case_id: option_case(*case) for case_id, case in OPTION_CASES.items()})


# --- every task family x every tool that writes: each kind of config mistake is named before anything is touched
@dataclass
class Family:
    config: str
    prefix: str  # where the config holds the timm model's keywords
    number: str  # a number the config sets
    demo: str  # the family's demo tool; it reads the bad keyword or value from a config file
    demo_argv: Callable[[Path, str, str], List[str]]  # (world, config, --out) -> its arguments


def dense_demo_argv(w: Path, config: str, out: str) -> List[str]:
    return [str(w / 'photo.png'), config, str(w / 'run' / 'epoch_1.pth'), '--out', out]


FAMILIES = {
    'classification': Family(CONFIG, 'model.', 'model.drop_path_rate', 'export_onnx.py',
                             lambda w, config, out: [config, '--out', out]),
    'super-resolution': Family(SR_CONFIG, 'model.', 'model.upscale', 'sr_demo.py', lambda w, config, out: [
        str(w / 'photo.png'), out, '--config', config, '--checkpoint', str(w / 'run' / 'epoch_1.pth')]),
    'segmentation': Family(SEG_CONFIG, 'model.', 'model.backbone.drop_path_rate', 'seg_demo.py', dense_demo_argv),
    'detection': Family(DET_CONFIG, 'model.', 'model.backbone.drop_path_rate', 'det_demo.py', dense_demo_argv),
}
FAMILIES['segmentation'].prefix = FAMILIES['detection'].prefix = 'model.backbone.'
# the kinds of mistakes: (option, what the message must contain); '{prefix}', '{number}' and '{w}' filled in
KEYWORD = ('{prefix}attn_typo=nala', ('{prefix}attn_typo', "takes no argument 'attn_typo'", 'attn_types'))
VALUE_TYPE = ('{number}=high', ('{number}', 'expected a number', "'high'"))


def bad_config(w: Path, family: str, kind: str) -> str:
    """A user's config file inheriting the family's config with one mistake of ``kind`` (written by ``world``)."""
    return str(w / 'configs' / f'{family}_{kind}.py')


def write_bad_configs(w: Path) -> None:
    for name, family in FAMILIES.items():
        for kind, (option, _) in (('keyword', KEYWORD), ('type', VALUE_TYPE)):
            key, value = option.format(prefix=family.prefix, number=family.number).split('=')
            parts = key.split('.')
            text = repr(value)
            for part in reversed(parts[1:]):
                text = f'dict({part}={text})'
            path = Path(bad_config(w, name, kind))
            path.parent.mkdir(exist_ok=True)
            path.write_text(f'_base_ = [{family.config!r}]\n{parts[0]} = {text}\n')


def family_cases(name: str, family: Family) -> Dict[str, Case]:
    fill = lambda text, w: text.format(prefix=family.prefix, number=family.number, w=w)  # noqa: E731
    config = family.config
    earlier_run = lambda w: [config, '--work-dir', str(w / 'run'), '--overwrite']  # noqa: E731  (it would delete)
    evaluation = lambda w: [config, str(w / 'run' / 'epoch_1.pth'), '--work-dir', str(w / 'test_logs')]  # noqa: E731
    missing = 'train_dataloader.dataset.data_root={w}/nope'
    cases = {}
    for tool, argv, split in (('train.py', earlier_run, 'train'), ('test.py', evaluation, 'test')):
        what = 'with `--overwrite` in an earlier run\'s work dir' if tool == 'train.py' else ''
        for kind, (option, says) in (('keyword', KEYWORD), ('type', VALUE_TYPE),
                                     ('data-root', (missing.replace('train', split), ('{w}/nope', 'data_root')))):
            cases[f'{name}-{tool[:-3]}-{kind}'] = Case(
                tool, f'{name}: `--cfg-options {fill(option, "<dir>")}` {what}'.rstrip(),
                lambda w, argv=argv, option=option: [*argv(w), '--cfg-options', fill(option, w)],
                lambda w, says=says: tuple(fill(text, w) for text in says))
    cases[f'{name}-train-work-dir-below-file'] = Case(
        'train.py', f'{name}: `--work-dir` below a file', lambda w: [config, '--work-dir', str(w / 'notes' / 'run')],
        lambda w: (f'--work-dir {w / "notes" / "run"}', f'{w / "notes"} is a file, not a folder'))
    cases[f'{name}-test-work-dir-below-file'] = Case(
        'test.py', f'{name}: `--work-dir` below a file',
        lambda w: [config, str(w / 'run' / 'epoch_1.pth'), '--work-dir', str(w / 'notes' / 'logs')],
        lambda w: (f'--work-dir {w / "notes" / "logs"}', f'{w / "notes"} is a file, not a folder'))
    for tool, argv in (('train.py', lambda w: [config, '--work-dir', str(w / 'data' / 'run')]),
                       ('test.py', lambda w: [config, str(w / 'run' / 'epoch_1.pth'), '--work-dir',
                                              str(w / 'data' / 'logs')])):
        split = tool[:-3] if tool == 'test.py' else 'train'
        cases[f'{name}-{tool[:-3]}-work-dir-in-data'] = Case(
            tool, f'{name}: `--work-dir` inside the data root',
            lambda w, argv=argv, split=split: [*argv(w), '--cfg-options',
                                               f'{split}_dataloader.dataset.data_root={w / "data"}'],
            lambda w: (f'--work-dir {w / "data"}', 'data_root', 'a folder outside it'))
    for kind, (option, says) in (('keyword', KEYWORD), ('type', VALUE_TYPE)):
        cases[f'{name}-{family.demo[:-3]}-{kind}'] = Case(
            family.demo, f'{name}: a config file with `{fill(option, "<dir>")}`',
            lambda w, kind=kind: family.demo_argv(w, bad_config(w, name, kind), str(w / 'demo_out.png')),
            lambda w, says=says: tuple(fill(text, w) for text in says))
    cases[f'{name}-{family.demo[:-3]}-out-exists'] = Case(
        family.demo, f'{name}: an existing file as the output',
        lambda w: family.demo_argv(w, config, str(w / 'mine' / '0.png')),
        lambda w: (f'{w / "mine" / "0.png"} exists', '--overwrite'))
    return cases


for _name, _family in FAMILIES.items():
    CASES.update(family_cases(_name, _family))
ROWS: Dict[str, Tuple[str, str, str, int]] = {}  # case id -> (tool, bad input, message, exit code), for the table


def run_in_process(tools, tool: str, argv: List[str], capfd) -> Tuple[int, str]:
    capfd.readouterr()
    try:
        code = run_tool(tools[tool].main, argv)
    except SystemExit as e:  # argparse's usage errors; the quick start's failed step
        code = e.code
    return code, capfd.readouterr().err


SLOW_CASES = {'quick-start-foreign-data'}  # the quick start runs the converter as a process of its own


@pytest.mark.parametrize('case_id', [pytest.param(c, marks=pytest.mark.slow) if c in SLOW_CASES else c for c in CASES])
def test_bad_input_is_refused_and_changes_nothing(case_id, world, tools, capfd, monkeypatch):
    case = CASES[case_id]
    monkeypatch.setenv('OMP_NUM_THREADS', '1')
    before = snapshot(world)
    code, err = run_in_process(tools, case.tool, case.argv(world), capfd)
    assert snapshot(world) == before, 'files changed, appeared or disappeared'
    assert code == USER_ERROR_EXIT, err[-3000:]
    assert 'Traceback' not in err, err[-3000:]
    [message] = [line[len('error: '):] for line in err.splitlines() if line.startswith('error: ')]
    for fragment in case.says(world):
        assert fragment in message, (fragment, message)
    ROWS[case_id] = (case.tool, case.what, message.replace(str(world), '<dir>').replace(str(ROOT), '.'), code)


# ----------------------------------------------------------------------------------------------
# What the tools still do: the replacements they may make, the inputs they accept
# ----------------------------------------------------------------------------------------------
def test_overwrite_replaces_and_timm_folders_are_replaced_atomically(world, tools, tmp_path):
    convert = tools['convert_checkpoint.py'].main
    target = tmp_path / 'weights.safetensors'
    target.write_bytes(b'old')
    assert convert([str(world / 'weights.safetensors'), str(target)]) == USER_ERROR_EXIT
    assert target.read_bytes() == b'old'
    assert convert([str(world / 'weights.safetensors'), str(target), '--overwrite']) == 0
    source, written = Checkpoint.read(world / 'weights.safetensors'), Checkpoint.read(target)
    assert written.definitions == source.definitions and written.weights().keys() == source.weights().keys()
    assert all(torch.equal(written.weights()[k], v) for k, v in source.weights().items())
    assert written.origin == {'ema': False, 'source': str(world / 'weights.safetensors')}  # what it was written from
    assert convert([str(world / 'run' / 'epoch_1.pth'), str(tmp_path / 'run.pth')]) == 0
    assert convert([str(world / 'weights.safetensors'), str(tmp_path / 'run.pth')]) == 0  # its own output: again
    assert convert([str(world / 'run' / 'epoch_1.pth'), str(target)]) == 0
    assert target.read_bytes() != (world / 'weights.safetensors').read_bytes()
    folder = tmp_path / 'folder'
    shutil.copytree(world / 'timm_folder', folder)
    assert convert([str(world / 'run' / 'epoch_1.pth'), str(folder)]) == 0  # a timm folder: written again
    assert sorted(p.name for p in tmp_path.iterdir()) == ['folder', 'run.pth', 'weights.safetensors']  # no leftovers
    (folder / 'README.md').write_text('mine\n')  # no longer only a timm folder
    assert convert([str(world / 'run' / 'epoch_1.pth'), str(folder)]) == USER_ERROR_EXIT
    assert (folder / 'README.md').read_text() == 'mine\n'


def test_the_dataset_converter_rewrites_only_its_own_folder(tools, tmp_path, capfd):
    convert = tools['fashion_mnist_to_imagefolder.py'].main
    out = tmp_path / 'fm'
    assert convert([str(out), '--train-per-class', '2', '--val-per-class', '1']) == 0
    assert convert([str(out), '--train-per-class', '3', '--val-per-class', '1']) == 0  # its own: replaced
    assert sum(1 for _ in (out / 'train').rglob('*.png')) == 30
    extra = out / 'train' / 'bag' / 'mine.png'
    shutil.copy(next((out / 'train' / 'bag').iterdir()), extra)  # the user added an image: no longer its own
    before = snapshot(out)
    assert convert([str(out), '--train-per-class', '2', '--val-per-class', '1']) == USER_ERROR_EXIT
    assert snapshot(out) == before
    assert convert([str(out), '--train-per-class', '2', '--val-per-class', '1', '--overwrite']) == 0
    assert not extra.exists() and sum(1 for _ in (out / 'train').rglob('*.png')) == 20
    assert 'per class of at least 1' in run_in_process(tools, 'fashion_mnist_to_imagefolder.py',
                                                       [str(tmp_path / 'x'), '--train-per-class', '0'], capfd)[1]


def test_a_path_is_contained_in_a_folder_only_inside_it(tmp_path):
    """The one check before a run deletes anything: ``..``, links to folders outside and the folder itself are
    not inside; a link inside is (deleting it deletes the link)."""
    from nalaformer.files import contained
    work, other = tmp_path / 'work', tmp_path / 'other'
    (work / 'logs').mkdir(parents=True)
    other.mkdir()
    (work / 'outside').symlink_to(other, target_is_directory=True)
    (work / 'link.pth').symlink_to(other / 'best.pth')
    assert contained(work / 'epoch_1.pth', work) and contained(work / 'logs' / 'a.log', work)
    assert contained(work / 'link.pth', work) and contained(f'{work}/logs/../epoch_1.pth', work)
    assert not contained(other / 'best.pth', work) and not contained(f'{work}/../other/best.pth', work)
    assert not contained(work / 'outside' / 'best.pth', work) and not contained(work, work)
    assert not contained(tmp_path / 'work2' / 'epoch_1.pth', work)  # a sibling whose name starts alike


def test_valid_options_pass_the_type_check():
    from mmengine.config import Config

    from nalaformer.engine.launch import check_cfg_options
    cfg = Config.fromfile(CONFIG)
    check_cfg_options(cfg, {
        'model.attn_types': 'nala', 'train_dataloader.dataset.input_size': 32,  # one value for a list, a list
        'val_dataloader.dataset.input_size': [32, 48], 'model.grad_checkpointing': 'selective',  # for a number
        'optim_wrapper.optimizer.lr': 1, 'model.mixup': None, 'custom_hooks.0.momentum': 0.3,
        'train_dataloader.dataset.split': 2017, 'model.kernel_kwargs.alpha': 5.0, 'train_cfg.max_epochs': 2})


def test_kernel_keywords_are_checked_by_timm_create_model():
    import timm
    for attn, kwargs in (('nala_cos', dict(alpha=0.0)), ('nala_cos', dict(alpha=float('nan'))),
                         ('relu', dict(power=-1)), ('focused', dict(power=float('inf'))), ('polarity', dict(power=0))):
        with pytest.raises(ValueError, match=f"attention kernel '{attn}': .* must be a finite number > 0"):
            timm.create_model('nalaformer_t', attn_types=attn, kernel_kwargs=kwargs, **TINY)
    model = timm.create_model('nalaformer_t', attn_types='nala_cos', kernel_kwargs=dict(alpha=5), **TINY)
    assert model.layers[0].blocks[0].attn.kernel.alpha == 5.0


def test_a_class_map_keeps_indices_when_a_split_lacks_a_class(world):
    from nalaformer.classification import ImageFolderDataset
    val = ImageFolderDataset(str(world / 'missing_class'), split='val', input_size=8, classes=list(CLASSES))
    assert val.metainfo['classes'] == CLASSES
    labels = {Path(val.dataset.reader.filename(i)).parent.name: val[i]['data_samples'] for i in range(len(val))}
    assert labels == {'class0': 0, 'class2': 2}  # class2 keeps its index without class1's folder


def test_what_is_read_is_stated(world, tmp_path):
    from nalaformer.classification.dataset_check import scan_split
    shutil.copytree(world / 'data' / 'train', tmp_path / 'train')
    (tmp_path / 'train' / 'class0' / 'README.txt').write_text('about\n')
    line = scan_split(tmp_path / 'train').describe()
    assert '9 images in 3 class folders (extensions read: .png, .jpg, .jpeg)' in line
    assert '1 other files are not read (.txt: 1)' in line


def test_16_bit_images_are_scaled_and_float_images_named(tmp_path):
    from nalaformer.classification import ImageFolderDataset
    for c in ('dark', 'light'):
        write_images(tmp_path / 'val' / c, 1)
    ramp = (np.arange(16 * 16, dtype=np.uint32).reshape(16, 16) * 257).astype(np.uint16)  # 0, 257, ... 65535
    Image.fromarray(ramp).save(tmp_path / 'val' / 'dark' / 'ramp.png')
    assert Image.open(tmp_path / 'val' / 'dark' / 'ramp.png').mode == 'I;16'
    dataset = ImageFolderDataset(str(tmp_path), split='val', input_size=16,
                                 transform=dict(crop_pct=1.0, mean=(0, 0, 0), std=(1, 1, 1)))
    index = next(i for i in range(len(dataset)) if dataset.dataset.reader.filename(i).endswith('ramp.png'))
    pixels = dataset[index]['inputs'][0] * 255
    torch.testing.assert_close(pixels, torch.arange(256.).reshape(16, 16), rtol=0, atol=0.51)
    Image.fromarray(np.ones((16, 16), np.float32)).save(tmp_path / 'val' / 'light' / 'float.tif')
    (tmp_path / 'val' / 'light' / 'float.tif').rename(tmp_path / 'val' / 'light' / 'float.png')
    dataset = ImageFolderDataset(str(tmp_path), split='val', input_size=16)
    index = next(i for i in range(len(dataset)) if dataset.dataset.reader.filename(i).endswith('float.png'))
    with pytest.raises(OSError, match=r"float\.png .*mode 'F' \(32-bit float pixels\) has no fixed value range"):
        dataset[index]


@pytest.mark.slow
def test_tools_exit_2_with_one_line_in_a_subprocess(world, tmp_path):
    """The tools' own processes: one bad input each gives exit code 2 and one line on stderr; the issue's
    --out-json into a missing folder now works."""
    bad = {
        'train.py': CASES['model-keyword-typo'], 'test.py': CASES['ckpt-text'],
        'convert_checkpoint.py': CASES['convert-into-work-dir'], 'export_onnx.py': CASES['export-out-folder'],
        'fashion_mnist_to_imagefolder.py': CASES['converter-into-own-folder'],
        'quick_start.py': CASES['quick-start-foreign-work-dir'],
    }
    env = {**os.environ, 'OMP_NUM_THREADS': '1'}
    before = snapshot(world)
    procs = {tool: subprocess.Popen([sys.executable, str(ROOT / 'tools' / f'{TOOL_PATHS[tool]}.py'), *case.argv(world)],
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT, env=env)
             for tool, case in bad.items()}
    for tool, proc in procs.items():
        _, err = proc.communicate(timeout=600)
        assert proc.returncode == USER_ERROR_EXIT, (tool, err[-3000:])
        assert 'Traceback' not in err and err.strip().splitlines()[-1].startswith('error: '), (tool, err[-3000:])
    assert snapshot(world) == before
    # an evaluation inside a training run's work dir adds its logs and replaces nothing (the run's copy of the
    # config included); --out-json into a folder that does not exist yet works
    run = tmp_path / 'run'
    shutil.copytree(world / 'run', run)
    (run / Path(CONFIG).name).write_text(f'# the training run\'s copy\n_base_ = [{CONFIG!r}]\n')
    kept = snapshot(run)
    out = tmp_path / 'new' / 'folder' / 'metrics.json'
    result = subprocess.run([
        sys.executable, str(ROOT / 'tools' / 'test.py'), CONFIG, str(run / 'epoch_1.pth'), '--work-dir', str(run),
        '--out-json', str(out), '--cfg-options', *data_options(world / 'data'), *TINY_OPTIONS,
        'test_dataloader.dataset.input_size=32', 'test_dataloader.num_workers=0',
        'test_dataloader.persistent_workers=False'], capture_output=True, text=True, cwd=ROOT, env=env, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert 'accuracy/top1' in json.loads(out.read_text())
    after = snapshot(run)
    assert {k: v for k, v in after.items() if k in kept} == kept and len(after) > len(kept)


@pytest.mark.slow
def test_a_run_resumes_only_inside_its_work_dir_and_overwrite_starts_again(world, tmp_path):
    """A copied work dir resumes from its own checkpoint (its last_checkpoint names the original's) and writes
    only into itself; --overwrite deletes a run's checkpoints and trains again."""
    env = {**os.environ, 'OMP_NUM_THREADS': '1'}
    options = ['--cfg-options', *data_options(world / 'data'), *TINY_OPTIONS, 'param_scheduler=[]',
               *[f'{s}_dataloader.{k}' for s in ('train', 'val') for k in (
                   'num_workers=0', 'persistent_workers=False', 'batch_size=3', 'dataset.input_size=32')],
               'train_dataloader.sampler.num_repeats=1', 'model.mixup=None']

    def train(work, *args, epochs=1, config=CONFIG):
        result = subprocess.run([sys.executable, str(ROOT / 'tools' / 'train.py'), str(config), '--work-dir', str(work),
                                 *args, *options, f'train_cfg.max_epochs={epochs}'],
                                capture_output=True, text=True, cwd=ROOT, env=env, timeout=900)
        assert result.returncode == 0, result.stderr[-5000:]
        return result

    original, copy = tmp_path / 'original', tmp_path / 'copy'
    config = original / 'my_config.py'  # the user's config in the work dir: never replaced by mmengine's copy
    original.mkdir()
    config.write_text(f'_base_ = [{CONFIG!r}]\n')
    train(original, config=config)
    assert config.read_text() == f'_base_ = [{CONFIG!r}]\n'
    shutil.copytree(original, copy)
    assert (copy / 'last_checkpoint').read_text().strip() == str(original / 'epoch_1.pth')
    checkpoint = (original / 'epoch_1.pth').read_bytes()
    (original / 'epoch_1.pth').write_bytes(checkpoint[:len(checkpoint) // 2])  # reading the original's would fail
    kept = snapshot(original)
    train(copy, '--resume', epochs=2, config=copy / 'my_config.py')
    assert snapshot(original) == kept and (copy / 'my_config.py').read_text() == config.read_text()
    assert (copy / 'epoch_2.pth').is_file() and (copy / 'last_checkpoint').read_text().strip() == str(copy / 'epoch_2.pth')
    meta = torch.load(copy / 'epoch_2.pth', weights_only=True)['meta']
    assert meta['epoch'] == 2
    train(copy, '--overwrite', config=copy / 'my_config.py')  # a new run: the old checkpoints are gone, not mixed
    assert not (copy / 'epoch_2.pth').exists() and (copy / 'my_config.py').read_text() == config.read_text()
    assert torch.load(copy / 'epoch_1.pth', weights_only=True)['meta']['epoch'] == 1


# ----------------------------------------------------------------------------------------------
# What must work: a copied work dir resumes inside itself, for every task family
# ----------------------------------------------------------------------------------------------
@dataclass
class ResumedRun:
    config: str
    data: Callable[[Path], List[str]]  # writes a tiny dataset into the folder given; the run's --cfg-options
    step: str  # 'epoch' or 'iter': what the run counts
    first: int  # the original run's length
    then: int  # the length the copy resumes to
    best: str = ''  # the best checkpoints' name prefix, where the resumed run finds a new best


def squares_run(root: Path) -> List[str]:
    """Coloured squares the pico model learns within three epochs (a new best after the first)."""
    write_imagefolder(root)
    return [*data_options(root), 'train_dataloader.batch_size=3', 'val_dataloader.batch_size=6',
            'train_dataloader.num_workers=0', 'val_dataloader.num_workers=0', 'model.num_classes=3',
            'optim_wrapper.optimizer.lr=0.01', 'param_scheduler=[]']


def photos_run(root: Path) -> List[str]:
    """Two 64x64 training images in the DIV2K layout and one validation image (Set14), the x2 recipe with a pico
    network: a checkpoint every iteration, a validation every second, the best PSNR's checkpoint kept."""
    from nalaformer.datasets import write_lr_images
    for folder, seeds in ((root / 'DIV2K' / 'DIV2K_train_HR', (0, 1)), (root / 'benchmark' / 'Set14' / 'HR', (2,))):
        for seed in seeds:
            write_images(folder, 1, start=seed)
        for image in folder.iterdir():  # 8x8 -> 64x64: large enough for 32-pixel crops
            Image.open(image).resize((64, 64), Image.BICUBIC).save(image)
    write_lr_images(root / 'DIV2K' / 'DIV2K_train_HR', root / 'DIV2K' / 'DIV2K_train_LR_bicubic', [2])
    write_lr_images(root / 'benchmark' / 'Set14' / 'HR', root / 'benchmark' / 'Set14' / 'LR_bicubic', [2])
    return [*[f'{s}_dataloader.dataset.data_root={root}' for s in ('train', 'val', 'test')],
            *[f'{s}_dataloader.num_workers={0}' for s in ('train', 'val')], 'train_dataloader.persistent_workers=False',
            'train_dataloader.batch_size=2', 'train_dataloader.dataset.patch_size=32', 'model.embed_dim=24',
            'model.depths=[1,1]', 'model.num_heads=2', 'model.window_size=8', 'optim_wrapper.optimizer.lr=0.003',
            'train_cfg.val_interval=2', 'default_hooks.checkpoint.interval=1', 'default_hooks.logger.interval=1']


def ade_run(root: Path) -> List[str]:
    """tests/test_seg.py's tiny UperNet on its tiny ADE20K, validated every second iteration, best mIoU kept."""
    from test_seg import tiny_options
    return [*tiny_options(write_tiny_ade(root / 'ADEChallengeData2016')), 'default_hooks.checkpoint.save_best=mIoU']


def coco_run(root: Path) -> List[str]:
    """tests/test_det.py's tiny Mask R-CNN on its tiny COCO, validated every epoch, best box mAP kept."""
    from mmdet.datasets import CocoDataset
    from test_det import tiny_options
    return [*tiny_options(write_tiny_coco(root, CocoDataset.METAINFO['classes'])),
            'default_hooks.checkpoint.save_best=coco/bbox_mAP', 'default_hooks.checkpoint.rule=greater']


RESUMED_RUNS = {
    'classification': ResumedRun(PICO_CONFIG, squares_run, 'epoch', 1, 3, best='best_accuracy_top1_epoch_'),
    'super-resolution': ResumedRun(SR_X2_CONFIG, photos_run, 'iter', 2, 4, best='best_Set14_PSNR_iter_'),
    'segmentation': ResumedRun(SEG_CONFIG, ade_run, 'iter', 2, 4),
    'detection': ResumedRun(DET_CONFIG, coco_run, 'epoch', 1, 2),
}
RESUMED_CASES = {f'{kind}-{family}': family for kind in ('copied-work-dir', 'resumed-elsewhere')
                 for family in RESUMED_RUNS}


def logged(output: str, fragment: str) -> str:
    """The one log line of ``output`` holding ``fragment``, without mmengine's time and level."""
    [line] = [line for line in output.splitlines() if fragment in line]
    return line.split(' - mmengine - ', 1)[-1].split(' - ', 1)[-1]


@pytest.mark.slow
@pytest.mark.parametrize('family', RESUMED_RUNS)
def test_a_copied_work_dir_resumes_and_leaves_the_original_byte_identical(family, tmp_path):
    """``cp -r W1 W2; tools/train.py CONFIG --work-dir W2 --resume``: the checkpoint's bookkeeping (best and last
    checkpoints) names W1's files; the run re-roots it into W2 and deletes only there, while W1 and every other
    file stay byte-identical. Resuming W1's checkpoint into a new work dir forgets that bookkeeping."""
    run = RESUMED_RUNS[family]
    options = run.data(tmp_path / 'data')
    env = {'OMP_NUM_THREADS': '1'}

    def train(work, *args, length):
        result = run_script(ROOT / 'tools' / 'train.py', run.config, '--work-dir', work, *args, '--cfg-options',
                            *options, f'train_cfg.max_{run.step}s={length}', env=env)
        return result.stdout + result.stderr

    original, copy, elsewhere = tmp_path / 'original', tmp_path / 'copy', tmp_path / 'elsewhere'
    train(original, length=run.first)
    last = f'{run.step}_{run.first}.pth'
    assert (original / 'last_checkpoint').read_text().strip() == str(original / last)
    shutil.copytree(original, copy)
    kept = snapshot(tmp_path)
    output = train(copy, '--resume', length=run.then)
    assert {k: v for k, v in snapshot(tmp_path).items() if k in kept and not k.startswith('copy')} == \
        {k: v for k, v in kept.items() if not k.startswith('copy')}, 'files outside the copy changed'
    line = logged(output, f'restored from the checkpoint, {original / last}')
    assert f'using {copy / last}' in line
    best = [line for line in output.splitlines() if f'restored from the checkpoint, {original / "best_"}' in line]
    assert best and all(f'using {copy / "best_"}' in line for line in best)  # every family keeps a best
    assert (copy / f'{run.step}_{run.then}.pth').is_file()
    assert (copy / 'last_checkpoint').read_text().strip() == str(copy / f'{run.step}_{run.then}.pth')
    if run.best:  # a new best in the copy: its previous best, the copy's own, is replaced there
        best = f'{run.best}{run.first}.pth'
        assert not (copy / best).exists() and list(copy.glob(f'{run.best}*.pth')) and (original / best).is_file()
        assert f'previous best checkpoint {copy / best} is removed' in output
    ROWS[f'copied-work-dir-{family}'] = (
        'train.py', f'{family}: a copied work dir resumed (`cp -r W1 W2; train.py CONFIG --work-dir W2 --resume`)',
        line.replace(str(tmp_path), '<dir>'), 0)
    # the original's checkpoint resumed into a new work dir: its bookkeeping names files of another run
    kept = snapshot(original)
    output = train(elsewhere, '--resume', str(original / last), length=run.then)
    assert snapshot(original) == kept
    line = logged(output, f'restored from the checkpoint, {original / last}')
    assert 'forgotten (nothing outside the work dir is deleted)' in line
    assert (elsewhere / f'{run.step}_{run.then}.pth').is_file()
    ROWS[f'resumed-elsewhere-{family}'] = (
        'train.py', f'{family}: another run\'s checkpoint resumed into a new work dir (`--work-dir W3 --resume '
                    f'W1/{last}`)', line.replace(str(tmp_path), '<dir>'), 0)


def test_the_table_of_bad_inputs_is_written():
    """docs/bad_inputs.md, from the messages the cases above printed; the rows of cases that did not run in
    this session (e.g. slow ones left out) are kept from the table as it was."""
    earlier = TABLE.read_text().splitlines() if TABLE.is_file() else []
    rows = []
    for case_id in [*CASES, *RESUMED_CASES]:
        if case_id in ROWS:
            tool, what, message, code = ROWS[case_id]
            rows.append('| ' + ' | '.join([case_id, f'`{tool}`', what, message.replace('|', '\\|'), str(code)]) + ' |')
        else:
            kept = [line for line in earlier if line.startswith(f'| {case_id} |')]
            assert kept, f'{case_id} did not run and is not in {TABLE}: run tests/test_bad_inputs.py whole once'
            rows.append(kept[0])
    lines = ['# Bad inputs the tools refuse', '',
             'Written by tests/test_bad_inputs.py from the messages the tools printed (`<dir>`: the test\'s',
             'temporary folder). Each refusal happens before any work, leaves every existing file byte-identical',
             f'and exits with code {USER_ERROR_EXIT}; other errors (bugs) keep their traceback and exit with 1.',
             'Rows with exit code 0 are runs that must work and touch nothing outside their work dir (every other',
             'file hashed before and after); their message is the line the run logs.',
             '', '| case | tool | bad input | message (`error: ...`) | exit code |', '|---|---|---|---|---|', *rows]
    TABLE.write_text('\n'.join(lines) + '\n')
    assert all(f'| {case_id} |' in TABLE.read_text() for case_id in [*CASES, *RESUMED_CASES])
