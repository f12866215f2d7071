"""torch.compile through the tools: ``tools/train.py --compile`` (or ``--cfg-options compile=True``, mmengine's
setting) trains the compiled network to the eager run's numbers and writes checkpoints in the eager layout;
``tools/test.py`` with ``compile=True`` evaluates to the eager metrics. (Compiled models against eager, outputs and gradients,
with no graph break on the default and fused ops: tests/test_nala_fast.py, tests/test_triton_kernels.py.)"""
import json
from pathlib import Path

import pytest
import torch

from tool_runs import ROOT, run_script, write_imagefolder

CONFIG = ROOT / 'configs' / 'nalaformer' / 'nalaformer-pico_1xb64-10e_fashion-mnist-32px.py'
# no stochastic depth: the compiled and the eager network would draw different random numbers
SMALL = ['model.num_classes=3', 'model.drop_path_rate=0.0', 'train_cfg.max_epochs=1', 'param_scheduler=[]',
         'default_hooks.logger.interval=1', 'log_processor.window_size=1', 'train_dataloader.batch_size=12']


def options(data: Path):
    return [f'{loader}.{key}' for loader in ('train_dataloader', 'val_dataloader', 'test_dataloader')
            for key in (f'dataset.data_root={data}', 'num_workers=0', 'persistent_workers=False')] + SMALL


def scalars(work: Path):
    [path] = work.glob('*/vis_data/scalars.json')
    return [json.loads(line) for line in path.read_text().splitlines()]


def evaluate(data: Path, checkpoint: Path, work: Path, *extra):
    out = run_script(ROOT / 'tools' / 'test.py', CONFIG, checkpoint, '--work-dir', work, '--cfg-options',
                     *options(data), *extra)
    return eval(out.stdout.strip().splitlines()[-1])  # the metrics dict tools/test.py prints


@pytest.mark.slow
def test_compiled_runs_match_eager(tmp_path):
    data = tmp_path / 'data'
    write_imagefolder(data)
    bad = run_script(ROOT / 'tools' / 'train.py', CONFIG, '--work-dir', tmp_path / 'bad', '--cfg-options',
                     *options(data), 'compile=3', check=False)
    assert bad.returncode == 2 and '--cfg-options compile: expected True or False' in bad.stderr
    runs = {}
    for name, flags in (('eager', []), ('compiled', ['--compile'])):
        result = run_script(ROOT / 'tools' / 'train.py', CONFIG, '--work-dir', tmp_path / name, *flags,
                            '--cfg-options', *options(data))
        runs[name] = result.stdout + result.stderr
    assert 'compile: torch.compile of NaLaFormer' in runs['compiled'] and 'torch.compile' not in runs['eager']
    losses = [[r['loss'] for r in scalars(tmp_path / name) if 'loss' in r] for name in ('eager', 'compiled')]
    assert len(losses[0]) == len(losses[1]) == 3  # 36 images, batch 12, 1 epoch
    # the first loss is the same network on the same batch; Adam's steps after it amplify rounding differences
    assert abs(losses[1][0] - losses[0][0]) <= 1e-4 * abs(losses[0][0])
    torch.testing.assert_close(torch.tensor(losses[1]), torch.tensor(losses[0]), rtol=1e-2, atol=1e-2)
    # the checkpoints hold the eager layout (the weights under the names eager training gives them), EMA included
    weights = [torch.load(tmp_path / name / 'epoch_1.pth', map_location='cpu', weights_only=True)
               for name in ('eager', 'compiled')]
    for key in ('state_dict', 'ema_state_dict'):
        assert weights[0][key].keys() == weights[1][key].keys()
    checkpoint = tmp_path / 'compiled' / 'epoch_1.pth'
    eager_metrics = evaluate(data, checkpoint, tmp_path / 'test_eager')
    compiled_metrics = evaluate(data, checkpoint, tmp_path / 'test_compiled', 'compile=True')
    assert compiled_metrics == eager_metrics and 'accuracy/top1' in eager_metrics


@pytest.mark.parametrize('config, compiled', [
    ('nalaformer/nalaformer-pico_1xb64-10e_fashion-mnist-32px.py', 'NaLaFormer'),  # the classifier's timm model
    ('sr/nalasr-pico_1xb32-2k_photos-x2.py', 'NaLaSR'),                          # the SR wrapper's network
    ('ade20k/upernet_nalaformer-xt_8xb2-160k_ade20k-512x512.py', 'NaLaBackbone'),  # dense: the backbone
    ('coco/mask-rcnn_nalaformer-xt_fpn_1x_coco.py', 'NaLaBackbone'),
])
def test_compile_picks_each_task_familys_network(config, compiled):
    """What ``compile`` compiles in every task family: the network the config's task wrapper names."""
    from mmengine.registry import MODELS, init_default_scope

    from nalaformer.engine.checkpoint import compiled_part
    from nalaformer.engine.launch import load_config, model_spec
    cfg = load_config(str(ROOT / 'configs' / config))
    init_default_scope(cfg.get('default_scope') or 'mmengine')
    spec = model_spec(cfg)
    for option in spec.weight_options:  # no pretrained weights to load (no network in tests)
        spec.part(cfg)[option] = None
    model = MODELS.build(cfg.model)
    assert type(compiled_part(model, spec)).__name__ == compiled
    assert compiled_part(model, None) is model  # a config without a wrapper of this project: the whole model
