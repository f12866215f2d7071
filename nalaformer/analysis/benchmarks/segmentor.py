"""Training-iteration time, peak memory and losses of a segmentation config's model on random data.

Times ``model.train_step`` of the config's whole segmentor (UperNet-T by default; SyncBN as BatchNorm) with its
optimizer wrapper on one random batch: time per iteration, img/s, CUDA peak memory, the losses. Example::

    python3 tools/analysis/benchmark.py segmentor --device cuda --amp bf16 --out-json runs/upernet_t.json
"""
import argparse
from pathlib import Path
from typing import Dict

import torch

from ...errors import ConfigError, UserError
from ...mmcv_build import allow_mmcv_lite
from ...ops import BACKENDS, nala_backend
from ..grids import parse_size
from ..machine import CHECKOUT
from ..memory import MIB
from ..results import format_optional, write_report
from ..steps import AMP_DTYPES, backend_context, loss_summary
from ..timing import summarize, synchronize, time_repeats
from .common import add_amp_arg, add_device_arg, check_device, finish_meta, start_meta

DEFAULT_CONFIG = CHECKOUT / 'configs' / 'ade20k' / 'upernet_nalaformer-t_8xb2-160k_ade20k-512x512.py'


def add_arguments(parser: argparse.ArgumentParser):
    parser.add_argument('--config', type=Path, default=DEFAULT_CONFIG, help='segmentation config (mmseg scope)')
    parser.add_argument('--size', default='512', help='input size: 512 or HxW (the crop the model pads to)')
    parser.add_argument('--batch', type=int, default=None, help="images per iteration (default: the config's)")
    add_amp_arg(parser)
    parser.add_argument('--backend', choices=BACKENDS, default=None, help='NaLa backend (default: the current one)')
    add_device_arg(parser)
    parser.add_argument('--warmup', type=int, default=2, help='untimed iterations')
    parser.add_argument('--repeats', type=int, default=5, help='timed iterations')
    parser.add_argument('--out-json', type=Path, default=Path('benchmark_segmentor.json'))


def import_mmseg() -> Dict[str, str]:
    """Register mmseg's and our modules; whether mmcv's ops are compiled or stand-ins (mmcv-lite), the versions."""
    try:
        lite = allow_mmcv_lite()
        import mmcv
        import mmseg
        from mmseg.utils import register_all_modules
        import nalaformer.dense  # noqa: F401  (NaLaBackbone in mmseg's registry)
        import nalaformer.engine  # noqa: F401  (CPUAmpOptimWrapper)
    except ImportError as e:
        raise UserError(f'this benchmark needs mmsegmentation, mmengine and mmcv (mmcv-lite is enough): {e}') from None
    from mmengine.logging import MMLogger
    MMLogger.get_instance('benchmark_segmentor', log_level='WARNING')  # not mmengine's per-parameter INFO lines
    register_all_modules(init_default_scope=False)
    return dict(mmcv_ops='stand-ins (mmcv-lite)' if lite else 'compiled', mmcv=mmcv.__version__,
                mmseg=mmseg.__version__)


def build(args: argparse.Namespace, size, device: torch.device):
    """The config's segmentor on ``device`` in training mode, its optimizer wrapper, and the config."""
    from mmengine.model import revert_sync_batchnorm
    from mmengine.optim import build_optim_wrapper
    from mmengine.registry import MODELS, DefaultScope

    from ...engine.launch import apply_amp, load_config
    cfg = load_config(str(args.config))
    if 'decode_head' not in cfg.model:
        raise ConfigError(f'{args.config}: not a segmentation config (its model has no decode_head)')
    cfg.model.backbone.init_cfg = None
    cfg.model.data_preprocessor.size = size
    if args.amp != 'none':
        apply_amp(cfg, str(AMP_DTYPES[args.amp]).removeprefix('torch.'), device.type)  # 'bfloat16' / 'float16'
    torch.manual_seed(0)
    with DefaultScope.overwrite_default_scope(cfg.get('default_scope', 'mmseg')):
        model = revert_sync_batchnorm(MODELS.build(cfg.model)).to(device).train()
        optim_wrapper = build_optim_wrapper(model, cfg.optim_wrapper)
    return model, optim_wrapper, cfg


def random_batch(batch: int, size, num_classes: int) -> Dict:
    """A data batch as the runner's dataloader gives it: uint8 images (3, H, W) and (1, H, W) label maps."""
    from mmengine.structures import PixelData
    from mmseg.structures import SegDataSample
    g = torch.Generator().manual_seed(0)
    inputs, samples = [], []
    for _ in range(batch):
        inputs.append(torch.randint(0, 256, (3, *size), generator=g, dtype=torch.uint8))
        sample = SegDataSample(metainfo=dict(img_shape=size, ori_shape=size))
        sample.gt_sem_seg = PixelData(data=torch.randint(0, num_classes, (1, *size), generator=g))
        samples.append(sample)
    return dict(inputs=inputs, data_samples=samples)


def run(args: argparse.Namespace) -> Dict:
    device = check_device(args.device)
    if args.repeats < 1 or args.warmup < 0 or (args.batch is not None and args.batch < 1):
        raise ConfigError('--repeats and --batch must be positive, --warmup not negative')
    size, cuda = parse_size(args.size), device.type == 'cuda'
    meta = start_meta(device, args, config=str(args.config), size=list(size), amp=args.amp)
    libraries = import_mmseg()
    model, optim_wrapper, cfg = build(args, size, device)
    batch = args.batch or cfg.train_dataloader.batch_size
    data = random_batch(batch, size, cfg.model.decode_head.num_classes)
    losses = []

    def step():
        losses.append(model.train_step(data, optim_wrapper)['loss'].detach())

    with backend_context(args.backend)():
        backend = nala_backend()
        for _ in range(args.warmup):
            step()
        if cuda:
            synchronize(device)
            torch.cuda.reset_peak_memory_stats(device)
        samples = time_repeats(step, device, warmup=0, repeats=args.repeats)
    meta.update(batch=batch, nala_backend=backend, optim_wrapper=type(optim_wrapper).__name__, **libraries,
                memory='torch.cuda.max_memory_allocated over the timed iterations' if cuda else 'not measured on CPU')
    result = dict(status='ok', **summarize(samples, batch),
                  peak_mb=torch.cuda.max_memory_allocated(device) / MIB if cuda else None,
                  losses=[float(loss) for loss in losses], **loss_summary(losses))
    return dict(meta=finish_meta(meta), result=result)


def main(args: argparse.Namespace) -> int:
    report = run(args)
    written = write_report(report, args.out_json)
    meta, r = report['meta'], report['result']
    print(f"{Path(meta['config']).name} {meta['size'][0]}x{meta['size'][1]} batch {meta['batch']}, amp {meta['amp']}, "
          f"{meta['device_name']}, NaLa backend {meta['nala_backend']}, mmcv ops {meta['mmcv_ops']}: "
          f"{r['median_ms']:.1f} ms/iteration (IQR {r['q1_ms']:.1f}-{r['q3_ms']:.1f}), {r['throughput']:.1f} img/s, "
          f"peak {format_optional(r['peak_mb'], '.0f')} MiB, final loss {r['final_loss']:.4f}, "
          f"losses finite: {'yes' if r['losses_finite'] else 'NO'}; {written}")
    return 0
