"""README's measured and accounted figures against the data files under docs/ that the tools wrote (issue 35).

FIGURES ties each figure to its file: where it is printed (a row of README's "Measured and accounted figures"
table, found by the start of its first cell, or None: anywhere in README), a pattern whose groups are the printed
numbers, and what the file says they are (units converted: MiB -> GiB, seconds -> minutes, fractions -> %). A
printed number agrees when the file's value rounds to it at the printed precision ("44x": within 0.5, "0.39":
within 0.005). The SR memory table is checked cell by cell against the accounting it shows. Memory is GiB only.
"""
import functools
import json
import re
from pathlib import Path

import pytest

from nalaformer.analysis.models import parse_entry

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / 'README.md'
DOCS = ROOT / 'docs'
FIGURES_TABLE = 'what'  # first header cell of README's "Measured and accounted figures" table
SR_TABLE = 'mode (accounted, GiB)'  # first header cell of README's SR memory table
SR = {'accounted': 'benchmark_sr_cpu/accounted/benchmark_sr.json', '16k': 'benchmark_sr_cpu/16k/benchmark_sr.json',
      'large': 'benchmark_sr_cpu/large/benchmark_sr.json'}
# README's peers tables: first header cell -> benchmark.py model's reports in docs/ (inference; training and
# compiled / ONNX twins, or None), whether the table gives peak memory at 2048, and the twins it shows ('': the
# plain model in the twins' run).
PEERS_TABLES = {
    'peers (ms per batch, median)': ('peers_cpu/infer.json', 'peers_cpu/train.json', 'peers_cpu/compiled.json', True,
                                     ('', 'compiled', 'frozen', 'onnx')),
    'peers, CUDA (ms per batch, median)': ('peers_cuda/infer.json', 'peers_cuda/train.json', 'peers_cuda/compiled.json',
                                           False, ('compiled',)),
    'peers XT (ms per batch, median)': ('peers_cpu/infer_xt.json', 'peers_cpu/train_xt.json',
                                        'peers_cpu/compiled_xt.json', True, ('', 'compiled', 'frozen', 'onnx')),
    'peers S (ms per batch, median)': ('peers_cpu/infer_s.json', 'peers_cpu/train_s.json', 'peers_cpu/compiled_s.json',
                                       True, ('', 'compiled', 'frozen', 'onnx')),
    'peers and the release (ms per batch, median)': ('peers_cpu/infer_release.json', None, None, True, ()),
    'peers S, CUDA (ms per batch, median)': ('peers_cuda/infer_s.json', None, None, False, ()),
    'peers XT, CUDA (ms per batch, median)': ('peers_cuda/infer_xt.json', None, None, False, ()),
}
# README's tables of eager models beside their twins: first header cell -> benchmark.py model's report, the sizes
# and the twins ('': the eager model) of its columns, sizes outer.
TWIN_TABLES = {
    'training step, eager and compiled (ms per step, median)': ('peers_cpu/train_compiled.json', (224, 512),
                                                                ('', 'compiled')),
}
NO_DATA_FILE = {'numerical parity with the release'}  # tolerances asserted by tests/test_release_parity.py


@functools.lru_cache(maxsize=None)
def data(name):
    return json.loads((DOCS / name).read_text())


def one(rows, **where):
    found = [r for r in rows if all(r.get(k) == v for k, v in where.items())]
    assert len(found) == 1, (where, len(found))
    return found[0]


def sr_run(which, slot, mode, tokens):
    return one(data(SR[which])['runs'], slot=slot, mode=mode, tokens=tokens)


def sr_ratios(which, slot, mode, key='memory_ratio'):
    return [r[key] for r in data(SR[which])['ratios'] if r['slot'] == slot and r['mode'] == mode]


def op(name, method, mode='forward_backward', size=None):
    return one(data(name)['results'], method=method, mode=mode, **({} if size is None else dict(size=size)))


def model(name, model_name, size):
    return one(data(name)['results'], model=model_name, size=[size, size])


def contention(policy, loaded):
    return one(data('contention_cpu.json')['cells'], policy=policy, loaded=loaded)['iter_s']


def det(backbone, step, metric):
    return 100 * one(one(data('dense_fit_det.json')['runs'], backbone=backbone)['metrics'], step=step)[metric]


def seg(backbone, step):
    return one(one(data('dense_fit_seg.json')['runs'], backbone=backbone)['metrics'], step=step)['mIoU']


def span(values):
    return min(values), max(values)


def mechanism_verdicts():
    return data('mechanism_study.json')['verdicts']


def non_tie(conv_mixers, a, b):
    return one(mechanism_verdicts(), conv_mixers=conv_mixers, a=a, b=b, verdict='>')['diff']


def inplace_1344(model_name, key):
    """A figure of all-NaLa NaLaFormer-T (``model_name`` with its implementation prefix) at 1344² in the in-place
    inference run."""
    return model('peers_cpu/inplace.json', f"{model_name}(attn_types='nala')", 1344)[key]


def gpu_kernel_speedups(mode):
    """The fused kernel's speed-up over the PyTorch op per shape in the GPU run (PyTorch op's time / fused's)."""
    rows = data('gpu_acceptance/summary.json')['reports']['kernels']['rows']
    ms = {(r['batch'], r['tokens'], r['method']): r['ms'] for r in rows if r['mode'] == mode}
    return [ms[b, n, 'torch'] / ms[b, n, 'fused'] for b, n, method in ms if method == 'fused']


def gpu_train_ratio():
    rows = {r['model']: r for r in data('gpu_acceptance/summary.json')['reports']['train_bf16']['results']}
    return rows['fused:nalaformer_t']['throughput'] / rows['nalaformer_t']['throughput']


def block_softmax():
    return [r for r in data('nala_block_vs_softmax_cpu.json')['results'] if r['method'] == 'softmax' and r['status'] == 'ok']


def cuda_nala_t(name, implementation, size, key='median_ms'):
    """A figure of all-NaLa NaLaFormer-T on the H200: on the PyTorch op (implementation '') or fused ('fused:')."""
    return model(f'peers_cuda/{name}.json', f"{implementation}nalaformer_t(attn_types='nala')", size)[key]


def twin_speedup(name, twin, size):
    """All-NaLa NaLaFormer of ``size`` in a CPU twins run: its eager time over its ``twin``'s at 224, batch 8."""
    spec = f"nalaformer_{size}(attn_types='nala')"
    return model(f'peers_cpu/{name}.json', spec, 224)['median_ms'] / model(f'peers_cpu/{name}.json', f'{twin}:{spec}',
                                                                             224)['median_ms']


def train_ratio(model_name, peer, size):
    """``model_name``'s training step time over ``peer``'s (a model or a twin) at ``size`` in the compiled training
    run (docs/peers_cpu/train_compiled.json)."""
    report = 'peers_cpu/train_compiled.json'
    return model(report, model_name, size)['median_ms'] / model(report, peer, size)['median_ms']


NALA_T = "nalaformer_t(attn_types='nala')"


def release_run_ratios(peer, key='median_ms', sizes=(224, 512, 1024, 2048)):
    """All-NaLa NaLaFormer-T's ``key`` over ``peer``'s per size in the run with the release beside the peers."""
    return [model('peers_cpu/infer_release.json', NALA_T, size)[key]
            / model('peers_cpu/infer_release.json', peer, size)[key] for size in sizes]


FIGURES = [  # (row of the figures table or None for anywhere in README, pattern, the file's values)
    (None, r'compiled all-NaLa ([\d.]+)x its eager speed, frozen \(`--freeze`: weights folded into the graph\)\s+'
           r'([\d.]+)x, ONNX Runtime ([\d.]+)x; a second run \(`docs/peers_cpu/compiled_nala.json`, median of 9\) gave '
           r'([\d.]+)x and ([\d.]+)x',
     lambda: (twin_speedup('compiled', 'compiled', 't'), twin_speedup('compiled', 'frozen', 't'),
              twin_speedup('compiled', 'onnx', 't'), twin_speedup('compiled_nala', 'compiled', 't'),
              twin_speedup('compiled_nala', 'frozen', 't'))),
    (None, r"all-NaLa's training step on this CPU: ([\d.]+)x its eager speed at 224 and ([\d.]+)x at 512\s+"
           r"\(one graph, no breaks\), the hybrid ([\d.]+)x and ([\d.]+)x, Swin-T ([\d.]+)x and ([\d.]+)x, ConvNeXt-T "
           r"([\d.]+)x and ([\d.]+)x,\s+EfficientViT-B2 ([\d.]+)x and ([\d.]+)x",
     lambda: tuple(train_ratio(name, f'compiled:{name}', size) for name in (
         NALA_T, 'nalaformer_t', 'swin_tiny_patch4_window7_224', 'convnext_tiny', 'efficientvit_b2') for size in (224, 512))),
    (None, r"all-NaLa's step takes ([\d.]+)x and ([\d.]+)x Swin-T's time \(224 and\s+512\) and ([\d.]+)x and ([\d.]+)x "
           r"ConvNeXt-T's, while EfficientViT-B2's takes ([\d.]+)x and ([\d.]+)x all-NaLa's",
     lambda: (*(train_ratio(NALA_T, peer, size) for peer in ('swin_tiny_patch4_window7_224', 'convnext_tiny')
                for size in (224, 512)),
              *(train_ratio('efficientvit_b2', NALA_T, size) for size in (224, 512)))),
    (None, r"In this run all-NaLa takes ([\d.]+)-([\d.]+)x the time of the release's all-NaLa at every size, with "
           r"([\d.]+)x its peak\s+memory at 2048, and ([\d.]+)-([\d.]+)x ConvNeXt-T's time at every size, 2048 included",
     lambda: (*span(release_run_ratios(f'release:{NALA_T}')), *release_run_ratios(f'release:{NALA_T}', 'peak_mb', (2048,)),
              *span(release_run_ratios('convnext_tiny')))),
    (None, r'Compiled,\s+all-NaLa XT runs ([\d.]+)x its eager speed \(frozen ([\d.]+)x\)',
     lambda: (twin_speedup('compiled_xt', 'compiled', 'xt'), twin_speedup('compiled_xt', 'frozen', 'xt'))),
    (None, r'Compiled it gains ([\d.]+)x, frozen ([\d.]+)x',
     lambda: (twin_speedup('compiled_s', 'compiled', 's'), twin_speedup('compiled_s', 'frozen', 's'))),
    ('NaLaFormer-T inference on a GPU', r"fused forward ([\d.]+)x \(224, batch 32\) and ([\d.]+)x \(2048\) the PyTorch "
                                        r"op's speed, ([\d.]+)x CUDA peak memory at 2048",
     lambda: (cuda_nala_t('profile', '', 224) / cuda_nala_t('profile', 'fused:', 224),
              cuda_nala_t('profile', '', 2048) / cuda_nala_t('profile', 'fused:', 2048),
              cuda_nala_t('memory', 'fused:', 2048, 'peak_mb') / cuda_nala_t('memory', '', 2048, 'peak_mb'))),
    (None, r'all-NaLa took ([\d.]+) against ([\d.]+) ms at 224 b32 \(([\d.]+)x faster\) and ([\d.]+) against\s+'
           r'([\d.]+) ms at 2048 \(([\d.]+)x\), where ConvNeXt-T took ([\d.]+) and ([\d.]+) ms and EfficientViT-B2 '
           r'([\d.]+) and ([\d.]+) ms',
     lambda: (cuda_nala_t('profile', 'fused:', 224), cuda_nala_t('profile', '', 224),
              cuda_nala_t('profile', '', 224) / cuda_nala_t('profile', 'fused:', 224),
              cuda_nala_t('profile', 'fused:', 2048), cuda_nala_t('profile', '', 2048),
              cuda_nala_t('profile', '', 2048) / cuda_nala_t('profile', 'fused:', 2048),
              *(model('peers_cuda/profile.json', peer, size)['median_ms'] for peer in ('convnext_tiny', 'efficientvit_b2')
                for size in (224, 2048)))),
    (None, r'all-NaLa ([\d.]+) GiB on the op and ([\d.]+) GiB fused, the\s+hybrid ([\d.]+), Swin-T ([\d.]+), '
           r'ConvNeXt-T ([\d.]+), EfficientViT-B2 ([\d.]+) GiB',
     lambda: tuple(model('peers_cuda/memory.json', name, 2048)['peak_mb'] / 1024 for name in (
         "nalaformer_t(attn_types='nala')", "fused:nalaformer_t(attn_types='nala')", 'nalaformer_t',
         'swin_tiny_patch4_window7_224', 'convnext_tiny', 'efficientvit_b2'))),
    ('the fused kernel on a GPU', r'forward ([\d.]+)-([\d.]+)x, forward\+backward ([\d.]+)-([\d.]+)x the PyTorch op; '
                                  r'NaLaFormer-T bf16 training step ([\d.]+)x img/s',
     lambda: (*span(gpu_kernel_speedups('forward')), *span(gpu_kernel_speedups('forward_backward')), gpu_train_ratio())),
    ('NaLaFormer-T all-NaLa inference at 1344', r'([\d.]+)x peak memory \(([\d.]+)x out of place\), ([\d.]+)x time',
     lambda: (inplace_1344('nalaformer_t', 'peak_mb') / inplace_1344('release:nalaformer_t', 'peak_mb'),
              inplace_1344('outofplace:nalaformer_t', 'peak_mb') / inplace_1344('release:nalaformer_t', 'peak_mb'),
              inplace_1344('nalaformer_t', 'median_ms') / inplace_1344('release:nalaformer_t', 'median_ms'))),
    ('the fast NaLa op', r'forward\+backward ([\d.]+)x time, ([\d.]+)x memory',
     lambda: (op('nala_op_cpu.json', 'fast')['latency_ratio'], op('nala_op_cpu.json', 'fast')['memory_ratio'])),
    ('NaLaFormer-T vs the release', r'([\d.]+)x time, ([\d.]+)x live memory',
     lambda: (model('benchmark_nala_fast_train_cpu.json', 'nalaformer_t', 224)['latency_ratio'],
              model('benchmark_nala_fast_train_cpu_live_memory.json', 'nalaformer_t', 224)['extra_ratio'])),
    ('one NaLa block vs explicit softmax', r'(\d+)-(\d+)% less memory, (\d+)-(\d+)x faster',
     lambda: (*span([100 * (1 - 1 / r['memory_ratio']) for r in block_softmax()]),
              *span([r['latency_ratio'] for r in block_softmax()]))),
    ('one NaLa block vs explicit softmax', r'would need ~([\d.]+) GiB',
     lambda: [float(re.search(r'~([\d.]+) GiB', r['reason']).group(1)) for r in
              data('nala_block_vs_softmax_cpu.json')['results'] if r['status'] != 'ok']),
    ('the whole SR network', r'accounted: explicit softmax / NaLa ([\d.]+)-([\d.]+)x \(inference\), ([\d.]+)-([\d.]+)x',
     lambda: (*span(sr_ratios('accounted', 'softmax_explicit', 'infer')),
              *span(sr_ratios('accounted', 'softmax_explicit', 'train')))),
    ('the whole SR network', r'SDPA / NaLa ([\d.]+)-([\d.]+)x; measured at 16K: SDPA / NaLa memory ([\d.]+)x \(inference\), '
                             r'([\d.]+)x \(training\), time ([\d.]+)x \(inference\), ([\d.]+)x',
     lambda: (*span(sr_ratios('accounted', 'softmax', 'infer') + sr_ratios('accounted', 'softmax', 'train')),
              *sr_ratios('16k', 'softmax', 'infer'), *sr_ratios('16k', 'softmax', 'train'),
              *sr_ratios('16k', 'softmax', 'infer', 'time_ratio'), *sr_ratios('16k', 'softmax', 'train', 'time_ratio'))),
    ('CPU training on a busy machine', r'loaded / idle ([\d.]+)x with the thread policy \(torch\'s default threads: ([\d.]+)x\); '
                                       r'whole quick start ([\d.]+) min idle, ([\d.]+) min loaded',
     lambda: (contention('thread policy', True) / contention('thread policy', False),
              contention('torch default', True) / contention('torch default', False),
              data('contention_cpu.json')['quick_start']['idle']['wall_s'] / 60,
              data('contention_cpu.json')['quick_start']['loaded']['wall_s'] / 60)),
    ('the quick start', r'([\d.]+) min on 2 idle cores .*, ([\d.]+) % top-1',
     lambda: (data('contention_cpu.json')['quick_start']['idle']['wall_s'] / 60, data('quick_start.json')['top1'])),
    (None, r'measured here: ([\d.]+) % top-1', lambda: (data('quick_start.json')['top1'],)),
    (None, r'Fashion-MNIST test split, top-1: ([\d.]+)%', lambda: (data('quick_start.json')['top1'],)),
    ('SR on unseen real photographs', r'PSNR-Y ([\d.]+) dB vs bicubic ([\d.]+) dB \(\+([\d.]+) dB\), SSIM ([\d.]+) vs ([\d.]+)',
     lambda: (data('sr_photos.json')['Unseen4/PSNR'], data('sr_photos.json')['Unseen4/bicubic_PSNR'],
              data('sr_photos.json')['Unseen4/PSNR'] - data('sr_photos.json')['Unseen4/bicubic_PSNR'],
              data('sr_photos.json')['Unseen4/SSIM'], data('sr_photos.json')['Unseen4/bicubic_SSIM'])),
    (None, r'by ([\d.]+) dB\s+\(PSNR-Y ([\d.]+) vs ([\d.]+) dB, SSIM ([\d.]+) vs ([\d.]+)\)',
     lambda: (data('sr_photos.json')['Unseen4/PSNR'] - data('sr_photos.json')['Unseen4/bicubic_PSNR'],
              data('sr_photos.json')['Unseen4/PSNR'], data('sr_photos.json')['Unseen4/bicubic_PSNR'],
              data('sr_photos.json')['Unseen4/SSIM'], data('sr_photos.json')['Unseen4/bicubic_SSIM'])),
    ('the mechanism on trained models', r'accuracy: (\d+) of (\d+) comparisons tie; not: elu above softmax '
                                        r'\(\+([\d.]+)\) and NaLa \(\+([\d.]+)\) without conv mixers, softmax with '
                                        r'vs without them \(\+([\d.]+)\)',
     lambda: (sum(v['verdict'] == 'tie' for v in mechanism_verdicts()), len(mechanism_verdicts()),
              non_tie('off', 'elu', 'softmax'), non_tie('off', 'elu', 'nala'),
              non_tie('on vs off', 'softmax (on)', 'softmax (off)'))),
    ('the mechanism where tokens are many', r'PSNR: all tie \(([\d.]+)-([\d.]+) dB\)',
     lambda: span([c['psnr']['mean'] for c in data('sr_mechanism_study.json')['cells'].values()])),
    ('the mechanism where tokens are many', r'PSNR: all tie',
     lambda: [v for v in data('sr_mechanism_study.json')['verdicts'] if v['verdict'] != 'tie']),  # none
    ('dense models learn', r'Mask R-CNN (\d+) iterations, UperNet (\d+) of (\d+)',
     lambda: (data('dense_fit_det.json')['iters'], data('dense_fit_seg.json')['stopped_at'], data('dense_fit_seg.json')['iters'])),
    ('dense models learn', r'box/mask AP ([\d.]+)/([\d.]+) vs ResNet-18 ([\d.]+)/([\d.]+); UperNet-XT ([\d.]+) vs ([\d.]+) mIoU',
     lambda: (det('nalaformer_xt', 300, 'coco/bbox_mAP'), det('nalaformer_xt', 300, 'coco/segm_mAP'),
              det('resnet18', 300, 'coco/bbox_mAP'), det('resnet18', 300, 'coco/segm_mAP'),
              seg('nalaformer_xt', 200), seg('resnet18', 200))),
    ('parameters and FLOPs', r'T ([\d.]+)M / ([\d.]+)G',
     lambda: (one(data('flops_table.json')['variants'], model='nalaformer_t')['params'] / 1e6,
              one(data('flops_table.json')['variants'], model='nalaformer_t')['macs_hybrid'] / 1e9)),
    (None, r'NaLa training step at 73,728 tokens: ([\d.]+) GiB resident, ([\d.]+) GiB accounted',
     lambda: (sr_run('large', 'nala', 'train', 73728)['measured']['peak_mb'] / 1024,
              sr_run('large', 'nala', 'train', 73728)['accounted']['peak_mb'] / 1024)),
    (None, r'accounted: ([\d.]+) GiB for inference, ([\d.]+) GiB for a training step at 16K',
     lambda: (sr_run('accounted', 'softmax_explicit', 'infer', 16384)['accounted']['peak_mb'] / 1024,
              sr_run('accounted', 'softmax_explicit', 'train', 16384)['accounted']['peak_mb'] / 1024)),
    (None, r'Time on 2 CPU cores at 16,384 tokens \(measured, median; [^)]*\): inference\s+NaLa ([\d.]+) s, SDPA softmax '
           r'([\d.]+) s \(([\d.]+)x\), window only ([\d.]+) s; training step NaLa ([\d.]+) s, SDPA ([\d.]+) s \(([\d.]+)x\), '
           r'window\s+only ([\d.]+) s',
     lambda: tuple(v for mode in ('infer', 'train') for v in (
         sr_run('16k', 'nala', mode, 16384)['median_ms'] / 1e3, sr_run('16k', 'softmax', mode, 16384)['median_ms'] / 1e3,
         *sr_ratios('16k', 'softmax', mode, 'time_ratio'), sr_run('16k', 'none', mode, 16384)['median_ms'] / 1e3))),
]


def agrees(printed: str, value: float) -> bool:
    """``value`` rounds to ``printed`` at its precision ("1,421" within 0.5, "0.39" within 0.005)."""
    printed = printed.replace(',', '')
    decimals = len(printed.split('.')[1]) if '.' in printed else 0
    return abs(float(printed) - value) <= 0.5 * 10 ** -decimals + 1e-9 * abs(value)


def tables(text):
    """Every Markdown table of ``text``: {first header cell: [row cells, ...]}."""
    found, rows = {}, None
    for line in text.splitlines() + ['']:
        if line.startswith('|'):
            cells = [c.strip() for c in line.strip().strip('|').split(' | ')]
            if rows is None:
                rows = found.setdefault(cells[0], [])
            elif not set(line) <= set('|-: '):
                rows.append(cells)
        else:
            rows = None
    return found


def figures_row(key):
    rows = [r for r in tables(README.read_text())[FIGURES_TABLE] if r[0].startswith(key)]
    assert len(rows) == 1, f'README has {len(rows)} rows of the figures table starting with {key!r}'
    return ' | '.join(rows[0])


@pytest.mark.parametrize('where, pattern, values', FIGURES, ids=[f'{w or "README"}: {p[:40]}' for w, p, _ in FIGURES])
def test_printed_figure_matches_its_data_file(where, pattern, values):
    text = figures_row(where) if where else README.read_text()
    matches = list(re.finditer(pattern, text))
    assert matches, f'README no longer prints {pattern!r}' + (f' in the row {where!r}' if where else '')
    expected = values()
    for match in matches:
        printed = match.groups()
        assert len(printed) == len(expected), (printed, expected)  # a pattern without groups: the list must be empty
        wrong = [(p, v) for p, v in zip(printed, expected) if not agrees(p, v)]
        assert not wrong, f'{match.group(0)!r}: printed / data file: {wrong}'


def test_sr_memory_table_is_the_accounting():
    rows = tables(README.read_text())[SR_TABLE]
    accounted = data(SR['accounted'])['runs']
    assert len(rows) == len({(r['mode'], r['tokens']) for r in accounted}) == 6
    slots = ('nala', 'softmax', 'softmax_explicit', 'none')
    for mode_name, tokens, *cells in rows:
        mode, tokens = {'inference': 'infer', 'training step': 'train'}[mode_name], int(tokens.replace(',', ''))
        gib = [sr_run('accounted', slot, mode, tokens)['accounted']['peak_mb'] / 1024 for slot in slots]
        ratio = {r['slot']: r['memory_ratio'] for r in data(SR['accounted'])['ratios']
                 if r['mode'] == mode and r['tokens'] == tokens}
        expected = [*gib, ratio['softmax_explicit'], ratio['softmax']]
        printed = [c.rstrip('x') for c in cells]
        assert all(agrees(p, v) for p, v in zip(printed, expected)), (mode_name, tokens, printed, expected)


@pytest.mark.parametrize('title', PEERS_TABLES)
def test_peers_table_is_the_benchmark(title):
    """Each cell of a README peers table: the median time of its model at its size in benchmark.py model's reports
    (inference at 224-2048; training at 224 and 512 and compiled / ONNX Runtime twins at 224 where the table has
    them), the peak memory at 2048 where the table has it, and where all-NaLa is as fast."""
    infer_file, train_file, twins_file, memory, twin_names = PEERS_TABLES[title]
    rows = tables(README.read_text())[title]
    infer = data(infer_file)

    def cell(report, model, side, key='median_ms', scale=1.0):
        found = [r for r in report['results'] if r['model'] == model and r['size'] == [side, side]]
        return None if not found or found[0].get(key) is None else found[0][key] * scale

    assert [r[0].strip('`') for r in rows] == list(dict.fromkeys(r['model'] for r in infer['results']))
    for model, *printed in (r for r in rows):
        model = model.strip('`')
        expected = [cell(infer, model, side) for side in (224, 512, 1024, 2048)] + \
            [cell(infer, model, 2048, 'peak_mb', 1 / 1024)] * memory + \
            ([cell(data(train_file), model, side) for side in (224, 512)] if train_file else []) + \
            [cell(data(twins_file), f'{twin}:{model}' if twin else model, 224) for twin in twin_names]
        assert len(printed) == len(expected) + 1, (title, model, printed)
        for text, value in zip(printed, expected):
            assert (text == '—') if value is None else agrees(text, value), (model, printed, expected)
        crossing = infer['crossover'].get(model)
        assert printed[-1] == ('baseline' if crossing is None else 'none up to 2048' if crossing['overtakes_at'] is None
                               else str(crossing['overtakes_at'][0])), (model, printed[-1])


@pytest.mark.parametrize('title', TWIN_TABLES)
def test_twins_table_is_the_benchmark(title):
    """Each cell of a README table of models beside their twins: the median time of that model (or its twin) at that
    size in the report; the rows are the report's eager models, in its order."""
    name, sizes, twins = TWIN_TABLES[title]
    report = data(name)
    rows = tables(README.read_text())[title]
    eager = [m for m in dict.fromkeys(r['model'] for r in report['results']) if parse_entry(m)[1] is None]
    assert [r[0].strip('`') for r in rows] == eager
    for model_name, *printed in rows:
        model_name = model_name.strip('`')
        expected = [model(name, f'{twin}:{model_name}' if twin else model_name, size)['median_ms']
                    for size in sizes for twin in twins]
        assert len(printed) == len(expected), (title, model_name, printed)
        assert all(agrees(p, v) for p, v in zip(printed, expected)), (model_name, printed, expected)


def test_every_figures_row_has_its_data_file():
    rows = tables(README.read_text())[FIGURES_TABLE]
    tied = {w for w, _, _ in FIGURES if w}
    for cells in rows:
        if cells[0] in NO_DATA_FILE:
            continue
        assert any(cells[0].startswith(w) for w in tied), f'no data file checked for the row {cells[0]!r}'
        assert re.search(r'docs/[\w./-]+\.json', cells[-1]), f'the row {cells[0]!r} names no data file'


def referenced_files(text):
    """docs/... paths ending in .json or / named in ``text``, with one {a,b} group expanded."""
    paths = set()
    for ref in re.findall(r'docs/[\w./{},-]*?(?:\.json|/(?=[`)\s]))', text):
        brace = re.search(r'\{([^}]*)\}', ref)
        paths |= {ref[:brace.start()] + alt + ref[brace.end():] for alt in brace.group(1).split(',')} if brace else {ref}
    return paths


def test_referenced_data_files_exist():
    pages = [README, *sorted(DOCS.glob('*.md'))]
    refs = {(page.name, ref) for page in pages for ref in referenced_files(page.read_text())}
    assert ('README.md', 'docs/quick_start.json') in refs and ('README.md', 'docs/sr_photos.json') in refs
    missing = [(page, ref) for page, ref in refs if not (ROOT / ref).exists()]
    assert not missing


def test_readme_memory_unit_is_gib_only():
    text = README.read_text()
    assert not re.findall(r'\b(?:GB|MB|KB)\b', text), 'README states memory in GiB (2^30 bytes) only'
    assert text.count('GiB (2^30 bytes)') == 1  # said once


def test_agrees_compares_at_the_printed_precision():
    assert agrees('0.39', 0.387) and agrees('44', 44.08) and agrees('1,421', 1421.2) and agrees('14.75', 14.749)
    assert not agrees('0.40', 0.387) and not agrees('15.10', 14.749) and not agrees('300', 200)
    row = '| 50 | 49.6 | 64.0 | 0.77 |'
    assert not agrees(row.split(' | ')[-1].strip(' |'), 49.58 / 63.95)  # the ratio README's dense table once printed
