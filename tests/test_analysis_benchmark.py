"""tools/analysis/benchmark.py model, op and segmentor: tiny end-to-end runs, their statistics and error handling."""
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from analysis_tools import load_tool
from nalaformer.analysis.benchmarks import model as bench
from nalaformer.analysis.benchmarks import op
from nalaformer.analysis.memory import memory_env
from nalaformer.analysis.models import ModelSpec, OnnxRuntimeModel, create_model, parse_entry
from nalaformer.analysis.profiles import op_class
from nalaformer.analysis.results import add_ratios
from nalaformer.analysis.steps import AMP_DTYPES, backend_context
from nalaformer.analysis.steps import loss_summary
from nalaformer.analysis.timing import summarize, timed
from nalaformer.errors import run_tool

ROOT = Path(__file__).resolve().parents[1]
BENCHMARK = ROOT / 'tools' / 'analysis' / 'benchmark.py'


@pytest.fixture(scope='module')
def tool():
    return load_tool('benchmark')


def run(*args):
    return subprocess.run([sys.executable, BENCHMARK, *map(str, args)], capture_output=True, text=True)


@pytest.mark.slow
def test_tiny_run_writes_json_and_png(tmp_path):
    out_json, out_png = tmp_path / 'bench.json', tmp_path / 'bench.png'
    # deit's 16x16 patches cannot cover an 8-pixel-wide image: with --keep-going that row records the error
    proc = run('model', '--models', 'nalaformer_xt', 'deit_small_patch16_224', '--sizes', '32', '16x8', '--repeats', 1,
               '--warmup', 1, '--device', 'cpu', '--keep-going', '--out-json', out_json, '--out-png', out_png)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(out_json.read_text())
    rows = {(r['model'], tuple(r['size'])): r for r in report['results']}
    assert set(rows) == {('nalaformer_xt', (32, 32)), ('deit_small_patch16_224', (32, 32)),
                         ('nalaformer_xt', (16, 8)), ('deit_small_patch16_224', (16, 8))}
    failed = rows[('deit_small_patch16_224', (16, 8))]
    assert failed['status'] == 'error' and failed['median_ms'] is None
    assert failed['error'].startswith('RuntimeError: ') and "Kernel size can't be greater" in failed['error']
    assert f"| error: {failed['error']} |" in proc.stdout  # the table says why, too
    assert 'deit_small_patch16_224 at 16x8 b1 failed' in proc.stderr and 'Traceback' in proc.stderr
    for key in [('nalaformer_xt', (32, 32)), ('deit_small_patch16_224', (32, 32)), ('nalaformer_xt', (16, 8))]:
        row = rows[key]
        assert row['status'] == 'ok' and row['median_ms'] > 0 and row['throughput'] > 0 and row['peak_mb'] > 0
        assert len(row['load_before']) == 3
    assert rows[('nalaformer_xt', (32, 32))]['latency_ratio'] == 1.0
    assert report['meta']['baseline'] == 'nalaformer_xt' and report['meta']['mode'] == 'infer'
    assert len(report['growth']['nalaformer_xt']) == 1
    assert out_png.read_bytes()[:8] == b'\x89PNG\r\n\x1a\n'


def test_a_failing_row_stops_the_benchmark_with_its_error(tool, tmp_path):
    out_json = tmp_path / 'bench.json'
    with pytest.raises(RuntimeError, match="Kernel size can't be greater") as failure:
        tool.main(['model', '--models', 'nalaformer_xt', 'deit_small_patch16_224', '--sizes', '16x8', '--repeats', '1',
                    '--warmup', '1', '--device', 'cpu', '--no-memory', '--out-json', str(out_json),
                    '--out-png', str(tmp_path / 'bench.png')])
    assert any('deit_small_patch16_224 at 16x8 b1 failed' in note and '--keep-going' in note
               for note in failure.value.__notes__)
    assert not out_json.exists()


def test_timed_gives_the_duration_of_one_call_in_ms():
    import time

    import torch
    calls = []
    ms = timed(lambda: (calls.append(1), time.sleep(0.05)), torch.device('cpu'))
    assert calls == [1] and 50 <= ms < 500


def test_train_mode_step_keeps_its_losses():
    import torch
    step = bench.make_step(ModelSpec('nalaformer_xt'), (32, 32), 2, 'train', torch.device('cpu'))
    step()
    step()
    assert len(step.losses) == 2 and step.losses[0].dim() == 0
    summary = loss_summary(step.losses)
    assert summary['losses_finite'] and summary['final_loss'] == pytest.approx(float(step.losses[-1]))
    step.losses.append(torch.tensor(float('nan')))
    assert loss_summary(step.losses)['losses_finite'] is False
    assert loss_summary([]) == {}  # inference


def watch_models(monkeypatch, watch):
    """The tool's models are handed to ``watch(model)`` as they are built."""
    create = bench.create_model

    def create_watched_model(*args, **kwargs):
        model = create(*args, **kwargs)
        watch(model)
        return model
    monkeypatch.setattr(bench, 'create_model', create_watched_model)


@pytest.mark.parametrize('amp', ['bf16', 'fp16'])  # fp16 also through the GradScaler
def test_amp_train_step_runs_forward_in_the_autocast_dtype(monkeypatch, amp):
    import torch
    dtypes = []
    watch_models(monkeypatch,
                 lambda model: model.head.register_forward_hook(lambda module, args, out: dtypes.append(out.dtype)))
    tiny = ModelSpec('nalaformer_xt', dict(embed_dims=(16, 32, 48, 64), depths=(1, 1, 1, 1), num_heads=(1, 2, 3, 4),
                                          num_classes=10))  # fp16 matrix products are slow on CPU
    step = bench.make_step(tiny, (32, 32), 2, 'train', torch.device('cpu'), amp=amp)
    step()
    assert dtypes == [AMP_DTYPES[amp]] and loss_summary(step.losses)['losses_finite']


def png_width(path: Path) -> int:
    return int.from_bytes(path.read_bytes()[16:20], 'big')  # the IHDR chunk's width


def test_train_run_reports_losses_and_amp(tool, tmp_path, capsys):
    out_json = tmp_path / 'train.json'
    assert tool.main(['model', '--mode', 'train', '--amp', 'bf16', '--models', 'nalaformer_xt', '--sizes', '32',
                       '--batch-sizes', '2', '--repeats', '2', '--warmup', '1', '--no-memory', '--device', 'cpu',
                       '--out-json', str(out_json), '--out-png', str(tmp_path / 'train.png')]) == 0
    report = json.loads(out_json.read_text())
    row, = report['results']
    assert report['meta']['amp'] == 'bf16' and report['meta']['nala_backend'] == 'auto'
    assert row['losses_finite'] is True and 5 < row['final_loss'] < 9  # cross-entropy of 1000 random classes
    assert '| yes |' in capsys.readouterr().out
    # without memory figures the plot is the latency panel alone (no empty memory panel beside it)
    with_memory = tmp_path / 'with_memory.png'
    bench.plot(dict(report, results=[dict(row, peak_mb=100.0)]), with_memory)
    assert png_width(tmp_path / 'train.png') < 0.6 * png_width(with_memory)


@pytest.mark.slow
def test_compile_times_each_model_eager_and_compiled(tool, tmp_path):
    out_json = tmp_path / 'compiled.json'
    assert tool.main(['model', '--compile', '--models', 'nalaformer_xt', 'fused:nalaformer_xt', '--sizes', '32',
                      '--repeats', '2', '--warmup', '1', '--no-memory', '--device', 'cpu', '--out-json',
                      str(out_json), '--out-png', str(tmp_path / 'compiled.png')]) == 0
    report = json.loads(out_json.read_text())
    rows = {r['model']: r for r in report['results']}
    # the compiled twin of each plain entry (a backend entry keeps its own prefix), timed beside it
    assert list(rows) == ['nalaformer_xt', 'fused:nalaformer_xt', 'compiled:nalaformer_xt']
    assert all(r['status'] == 'ok' and r['median_ms'] > 0 for r in rows.values())
    assert report['meta']['compile'] is True and rows['compiled:nalaformer_xt']['latency_ratio'] > 0


@pytest.mark.slow
def test_frozen_twin_computes_the_model_and_is_timed(tool, tmp_path):
    """'frozen:' is the model compiled with inductor's freezing: the model's logits, timed beside it (--freeze)."""
    spec = ModelSpec('nalaformer_xt')
    logits = {}
    for implementation in (None, 'frozen'):
        step = bench.make_step(spec, (32, 32), 2, 'infer', torch.device('cpu'), implementation)
        with torch.inference_mode():
            logits[implementation] = step.model.eval()(step.inputs)
    torch.testing.assert_close(logits['frozen'], logits[None], rtol=1e-4, atol=1e-5)
    out_json = tmp_path / 'frozen.json'
    assert tool.main(['model', '--freeze', '--models', 'nalaformer_xt', '--sizes', '32', '--repeats', '2',
                      '--warmup', '1', '--no-memory', '--device', 'cpu', '--out-json', str(out_json),
                      '--out-png', str(tmp_path / 'frozen.png')]) == 0
    report = json.loads(out_json.read_text())
    rows = {r['model']: r for r in report['results']}
    assert list(rows) == ['nalaformer_xt', 'frozen:nalaformer_xt'] and report['meta']['freeze'] is True
    assert all(r['status'] == 'ok' and r['median_ms'] > 0 for r in rows.values())


@pytest.mark.slow
def test_onnx_runtime_twin_matches_the_model_and_is_timed(tool, tmp_path):
    torch.manual_seed(0)
    model = create_model(ModelSpec('nalaformer_xt'), img_size=(64, 64)).eval()
    x = torch.randn(1, 3, 64, 64)
    with torch.no_grad():
        torch.testing.assert_close(OnnxRuntimeModel(model, x)(x), model(x), rtol=1e-4, atol=1e-4)
    out_json = tmp_path / 'onnx.json'
    assert tool.main(['model', '--onnx', '--models', 'nalaformer_xt', '--sizes', '64', '--repeats', '2', '--warmup',
                      '1', '--no-memory', '--device', 'cpu', '--out-json', str(out_json), '--out-png',
                      str(tmp_path / 'onnx.png')]) == 0
    report = json.loads(out_json.read_text())
    assert [(r['model'], r['status']) for r in report['results']] == [('nalaformer_xt', 'ok'),
                                                                       ('onnx:nalaformer_xt', 'ok')]
    assert report['meta']['onnx'] is True


def test_deploy_and_outofplace_twins_compute_the_model_and_are_timed(tool, tmp_path, monkeypatch):
    """'deploy:' is the reparameterized model (no LayerScale, no stem BatchNorm), 'outofplace:' the model run
    without in-place inference (a hook on fc1 keeps its output); both give the model's logits and are timed."""
    spec, _ = parse_entry("nalaformer_xt(attn_types='nala')")
    logits, fc1_kept = {}, {}
    for implementation in (None, 'deploy', 'outofplace'):
        step = bench.make_step(spec, (64, 64), 2, 'infer', torch.device('cpu'), implementation)
        model = step.model
        fc1 = model.layers[0].blocks[0].ffn.fc1
        kept = []
        fc1.register_forward_hook(lambda module, args, out: kept.append((out, F.linear(args[0], module.weight,
                                                                                       module.bias))))
        with torch.inference_mode(), step.context():
            logits[implementation] = model.eval()(step.inputs)
        fc1_kept[implementation] = torch.equal(*kept[0])
        assert (model.layers[0].blocks[0].gamma_1 is None) == (implementation == 'deploy')
    torch.testing.assert_close(logits['deploy'], logits[None], rtol=1e-5, atol=1e-5)
    assert torch.equal(logits['outofplace'], logits[None])
    assert fc1_kept == {None: False, 'deploy': False, 'outofplace': True}  # in place: GELU overwrote fc1's output
    out_json = tmp_path / 'deploy.json'
    assert tool.main(['model', '--deploy', '--models', 'nalaformer_xt', 'outofplace:nalaformer_xt', '--sizes', '32',
                      '--repeats', '1', '--warmup', '0', '--no-memory', '--device', 'cpu', '--out-json', str(out_json),
                      '--out-png', str(tmp_path / 'deploy.png')]) == 0
    rows = {r['model']: r['status'] for r in json.loads(out_json.read_text())['results']}
    assert rows == {'nalaformer_xt': 'ok', 'outofplace:nalaformer_xt': 'ok', 'deploy:nalaformer_xt': 'ok'}


@pytest.mark.parametrize('name, expected', [
    ('aten::addmm', 'matrix product'), ('aten::bmm', 'matrix product'), ('aten::mm', 'matrix product'),
    ('aten::mkldnn_convolution', 'convolution'), ('aten::native_layer_norm', 'normalization'),
    ('aten::native_batch_norm', 'normalization'), ('aten::gelu_', 'activation'), ('aten::silu', 'activation'),
    ('aten::add_', 'element-wise arithmetic'), ('aten::pow', 'element-wise arithmetic'),
    ('aten::copy_', 'copy / layout'), ('aten::cat', 'copy / layout'), ('aten::linalg_vector_norm', 'reduction'),
    ('aten::max_pool2d', 'pooling'), ('aten::_scaled_dot_product_flash_attention_for_cpu', 'attention (fused softmax)'),
    ('aten::_softmax', 'softmax'), ('aten::empty', 'other'),
    ('nalaformer::nala_attention_forward', 'attention (fused NaLa kernel)'),
    ('graph_0_cpp_fused_add_convolution_backward_gelu_12', 'compiled kernels (inductor)'),
])
def test_operators_are_classified(name, expected):
    assert op_class(name) == expected


def test_profile_gives_each_row_its_time_per_operator_class(tool, tmp_path, capsys):
    out_json = tmp_path / 'profile.json'
    assert tool.main(['model', '--profile', '--models', "nalaformer_xt(attn_types='nala')", 'convnext_femto',
                      '--sizes', '64', '--repeats', '1', '--warmup', '0', '--no-memory', '--device', 'cpu',
                      '--out-json', str(out_json), '--out-png', str(tmp_path / 'profile.png')]) == 0
    results = json.loads(out_json.read_text())['results']
    rows = {r['model']: r['profile_ms'] for r in results}
    assert all(r['gmacs'] > 0 and r['gmacs_per_s'] == pytest.approx(r['gmacs'] * 1000 / r['median_ms'])
               for r in results)
    for profile in rows.values():
        assert profile['total'] == pytest.approx(sum(v for k, v in profile.items() if k != 'total'))
        assert profile['matrix product'] > 0 and profile['convolution'] > 0
    assert 'normalization' in rows['convnext_femto'] and 'reduction' in rows["nalaformer_xt(attn_types='nala')"]
    assert '| model | size | batch | GMACs | GMACs/s | profiled ms | ' in capsys.readouterr().out


@pytest.mark.slow
def test_profile_of_a_compiled_model_shows_its_generated_kernels(tool, tmp_path):
    out_json = tmp_path / 'profile.json'
    assert tool.main(['model', '--profile', '--compile', '--models', 'nalaformer_xt', '--sizes', '32', '--repeats',
                      '1', '--warmup', '1', '--no-memory', '--device', 'cpu', '--out-json', str(out_json),
                      '--out-png', str(tmp_path / 'profile.png')]) == 0
    rows = {r['model']: r['profile_ms'] for r in json.loads(out_json.read_text())['results']}
    kernels = 'compiled kernels (inductor)'
    assert kernels not in rows['nalaformer_xt'] and rows['compiled:nalaformer_xt'][kernels] > 0
    # what inductor fused (GELU, the norms) runs in its kernels, not as ATen operators
    assert rows['nalaformer_xt']['activation'] > 0 and 'normalization' in rows['nalaformer_xt']
    assert rows['compiled:nalaformer_xt'].get('normalization', 0) < rows['nalaformer_xt']['normalization']


def test_crossover_is_the_size_from_which_the_baseline_stays_faster():
    def row(model, side, batch, ms):
        return dict(model=model, size=[side, side], batch=batch, median_ms=ms)
    results = [row('nala', 224, 8, 80.0), row('nala', 512, 2, 50.0), row('nala', 1024, 1, 90.0),
               row('conv', 224, 8, 40.0), row('conv', 512, 2, 60.0), row('conv', 1024, 1, 100.0),
               row('swin', 224, 8, 120.0), row('swin', 512, 2, 40.0), row('swin', 1024, 1, 80.0),
               row('compiled:nala', 224, 8, 40.0), row('compiled:conv', 224, 8, 80.0)]
    table = bench.crossover(results, 'nala')
    assert table['conv']['overtakes_at'] == [512, 512]  # per image 10 vs 5 ms at 224, then 25 vs 30 and 90 vs 100
    assert table['conv']['latency_ratio'] == {'224x224': 2.0, '512x512': 25 / 30, '1024x1024': 0.9}
    assert table['swin']['overtakes_at'] is None  # faster at 224 only: slower at the largest size
    assert table['compiled:conv'] == dict(baseline='compiled:nala', overtakes_at=[224, 224],
                                          latency_ratio={'224x224': 0.5})
    assert 'nala' not in table and 'compiled:nala' not in table
    assert bench.crossover_sentence('conv', table['conv']) == (
        "nala takes at most conv's time per image from 512x512 on (224x224: 2.00x, 512x512: 0.83x, 1024x1024: 0.90x)")
    assert bench.crossover_sentence('swin', table['swin']).startswith(
        "nala takes at most swin's time per image not at the largest size measured (224x224: 0.67x, ")


@pytest.mark.parametrize('args, message', [
    (['--models', 'swin_tiny_patch4_windw7_224'], "unknown timm model 'swin_tiny_patch4_windw7_224'"),
    (['--sizes', '224x'], 'bad image size'),
    (['--sizes', '224', '448', '--batch-sizes', '1', '2', '3'], '--batch-sizes'),
    (['--models', 'convnext_tiny', '--baseline', 'resnet50'], '--baseline'),
    (['--models', 'nalaformer_xt', '--onnx', '--mode', 'train'], 'ONNX Runtime'),
    (['--models', 'nalaformer_xt', '--deploy', '--mode', 'train'], "a reparameterized model ('deploy:' models"),
    (['--models', 'deploy:nalaformer_xt', '--mode', 'train'], 'is for inference: use --mode infer'),
    (['--models', 'nalaformer_xt', '--freeze', '--mode', 'train'], "a frozen model ('frozen:' models, --freeze) is for"),
])
def test_user_errors_exit_2(tool, args, message, capfd):
    assert run_tool(tool.main, ['model', *args, '--repeats', '1']) == 2
    stderr = capfd.readouterr().err
    assert message in stderr and 'Traceback' not in stderr


def test_statistics():
    stats = summarize([4.0, 1.0, 3.0, 2.0, 5.0], batch=2)
    assert (stats['median_ms'], stats['q1_ms'], stats['q3_ms'], stats['min_ms'], stats['max_ms']) == (3, 2, 4, 1, 5)
    assert stats['throughput'] == pytest.approx(2 / 3e-3)
    rows = [dict(model=m, size=[s, s], batch=b, median_ms=t, peak_mb=mem)
            for m, s, b, t, mem in [('lin', 100, 4, 8.0, 10.0), ('lin', 200, 1, 8.0, 40.0),
                                    ('quad', 100, 4, 8.0, 10.0), ('quad', 200, 1, 32.0, 160.0)]]
    add_ratios(rows, lambda r: r['model'] == 'lin', lambda r: (tuple(r['size']), r['batch']),
               dict(latency_ratio='median_ms', memory_ratio='peak_mb'))
    assert [r['latency_ratio'] for r in rows] == [1, 1, 1, 4] and rows[3]['memory_ratio'] == 4
    growth = bench.growth(rows)
    # per image: 'lin' 2 ms -> 8 ms for 4x pixels; 'quad' 2 ms -> 32 ms
    assert growth['lin'][0]['latency_per_image_per_4x_pixels'] == pytest.approx(4)
    assert growth['quad'][0]['latency_per_image_per_4x_pixels'] == pytest.approx(16)
    assert growth['lin'][0]['peak_memory_per_4x_pixels'] == pytest.approx(4)


def test_backend_prefixes_run_our_model_on_that_nala_backend(monkeypatch):
    import torch
    import nalaformer.ops
    from nalaformer.ops import AttentionKernel
    spec, implementation = parse_entry("reference:nalaformer_xt(attn_types='nala')")
    assert implementation == 'reference' and spec.arch == 'nalaformer_xt' and spec.kwargs == {'attn_types': 'nala'}
    assert spec.label == "reference:nalaformer_xt(attn_types='nala')"
    assert parse_entry('fused:nalaformer_xt')[1] == 'fused'
    assert parse_entry('nalaformer_xt') == (ModelSpec('nalaformer_xt'), None)
    seen = []

    def record_backends(model):  # every attention kernel notes the backend it runs on
        for module in model.modules():
            if isinstance(module, AttentionKernel):
                module.register_forward_pre_hook(lambda *_: seen.append(nalaformer.ops.nala_backend()))
    watch_models(monkeypatch, record_backends)
    bench.make_step(spec, (32, 32), 1, 'infer', torch.device('cpu'), implementation)()
    assert seen and set(seen) == {'reference'} and nalaformer.ops.nala_backend() == 'auto'
    seen.clear()
    bench.make_step(spec, (32, 32), 1, 'infer', torch.device('cpu'))()
    assert seen and set(seen) == {'auto'}
    seen.clear()
    on_op, implementation = parse_entry('torch:nalaformer_xt')
    bench.make_step(on_op, (32, 32), 1, 'infer', torch.device('cpu'), implementation)()
    assert seen and set(seen) == {'torch'}
    with backend_context('fused')():
        assert nalaformer.ops.nala_backend() == 'fused'
    assert nalaformer.ops.nala_backend() == 'auto'


# A stand-in for the release's NALA.py (never kept here): it records what the tool builds from it and runs as a
# classifier of the asked number of classes.
RELEASE_STAND_IN = '''
import torch.nn as nn
class NALAFORMER(nn.Module):
    def __init__(self, **kwargs):
        super().__init__()
        self.kwargs = kwargs
        self.num_classes = kwargs['num_classes']
        self.head = nn.Linear(3, self.num_classes)
    def load_state_dict(self, state_dict, strict=True):
        self.loaded = dict(state_dict)
    def forward(self, x):
        return self.head(x.mean((2, 3)))
'''


@pytest.mark.parametrize('models, timed', [
    (['--peers', 'xt'], ["nalaformer_xt(attn_types='nala')", 'nalaformer_xt', 'convnext_femto', 'efficientvit_b1',
                         "release:nalaformer_xt(attn_types='nala')", 'release:nalaformer_xt']),
    (['--models', 'convnext_femto', 'nalaformer_xt', 'fused:nalaformer_xt'],
     ['convnext_femto', 'nalaformer_xt', 'fused:nalaformer_xt', 'release:nalaformer_xt']),
    (['--models', 'nalaformer_xt', "release:nalaformer_xt(attn_types='nala')"],
     ['nalaformer_xt', "release:nalaformer_xt(attn_types='nala')"]),
])
def test_release_file_times_the_release_beside_each_nalaformer_model(tool, tmp_path, models, timed):
    """--release-file adds the release of each plain NaLaFormer entry (of --peers or --models), unless the user
    names 'release:' models; each is timed in the same run."""
    stand_in, out_json = tmp_path / 'NALA.py', tmp_path / 'bench.json'
    stand_in.write_text(RELEASE_STAND_IN)
    assert tool.main(['model', *models, '--release-file', str(stand_in), '--sizes', '32', '--repeats', '1',
                      '--warmup', '1', '--no-memory', '--out-json', str(out_json),
                      '--out-png', str(tmp_path / 'bench.png')]) == 0
    report = json.loads(out_json.read_text())
    assert [r['model'] for r in report['results']] == timed
    assert all(r['status'] == 'ok' and r['median_ms'] > 0 for r in report['results'])
    assert report['meta']['release_file'] == str(stand_in)


@pytest.mark.parametrize('models, exists, message', [
    (['--models', 'convnext_femto'], True, "--release-file: the release defines nalaformer_* models only, and none of"),
    (['--peers', 'xt'], False, "need --release-file pointing at the release's NALA.py (got "),
])
def test_release_file_errors_exit_2(tool, tmp_path, models, exists, message, capfd, monkeypatch):
    monkeypatch.chdir(tmp_path)  # where a run that was not refused would write its report
    release_file = tmp_path / 'NALA.py'
    if exists:
        release_file.write_text(RELEASE_STAND_IN)
    assert run_tool(tool.main, ['model', *models, '--release-file', str(release_file), '--repeats', '1']) == 2
    stderr = capfd.readouterr().err
    assert message in stderr and 'Traceback' not in stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == (['NALA.py'] if exists else [])


@pytest.mark.slow
def test_release_models_need_the_release_file():
    proc = run('model', '--models', 'release:nalaformer_xt', '--sizes', '32', '--repeats', 1, '--no-memory')
    assert proc.returncode == 2 and '--release-file' in proc.stderr and 'Traceback' not in proc.stderr


def test_release_model_gets_our_architecture_and_weights(tmp_path):
    stand_in = tmp_path / 'NALA.py'
    stand_in.write_text(RELEASE_STAND_IN)
    from nalaformer.analysis.release import release_model
    ours = create_model(ModelSpec('nalaformer_xt'))
    release = release_model(ours, stand_in)
    kw = release.kwargs
    assert kw['embed_dims'] == [32, 64, 128, 384] and kw['depths'] == [2, 2, 2, 2] and kw['num_heads'] == [1, 2, 4, 12]
    assert kw['mlp_ratios'] == [3.5] * 4 and kw['flagss'] == [['l'] * 2, ['l'] * 2, ['v'] * 2, ['v'] * 2]
    assert kw['layerscales'] == [True] * 4 and kw['drop_path_rate'] == 0. and kw['projection'] == 1024
    assert release.loaded.keys() == ours.state_dict().keys()


@pytest.mark.slow
def test_nala_op_benchmark_tiny_run(tmp_path):
    out = tmp_path / 'op.json'
    proc = subprocess.run([sys.executable, BENCHMARK, 'op', '--sides', '4', '--modes', 'forward_backward', '--repeats', '2',
                           '--warmup', '1', '--out-json', out], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(out.read_text())
    rows = {r['method']: r for r in report['results']}
    assert set(rows) == {'reference', 'fast'} and report['meta']['baseline'] == 'reference'
    for row in rows.values():
        assert row['status'] == 'ok' and row['median_ms'] > 0 and row['extra_mb'] is not None
        assert len(row['load_before']) == 3 and row['mode'] == 'forward_backward'
    assert rows['reference']['latency_ratio'] == 1.0


def test_block_benchmark_tiny_run_and_softmax_skip(tool, tmp_path):
    out = tmp_path / 'block.json'
    proc = subprocess.run([sys.executable, BENCHMARK, 'op', '--what', 'block', '--tokens', '35', '--repeats', '1',
                           '--warmup', '0', '--no-memory', '--out-json', out], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(out.read_text())
    assert [r['method'] for r in report['results']] == ['nala', 'nala_reference', 'sdpa', 'softmax']
    assert all(r['status'] == 'ok' and r['size'] == 35 for r in report['results'])
    assert report['meta']['grids'] == {'35': [5, 7]}

    args = tool.parse_args(['op', '--what', 'block'])
    assert op.block_skip_reason('softmax', args, 10 ** 6).startswith('skipped')  # an 8 TB N x N matrix
    assert op.block_skip_reason('sdpa', args, 10 ** 6) is None


def test_memory_workers_run_with_glibc_defaults_or_a_fixed_mmap_threshold(monkeypatch):
    monkeypatch.setenv('MALLOC_MMAP_MAX_', '0')
    assert 'MALLOC_MMAP_MAX_' not in memory_env() and 'MALLOC_MMAP_THRESHOLD_' not in memory_env()
    assert memory_env(131072)['MALLOC_MMAP_THRESHOLD_'] == '131072'


UPERNET_T = ROOT / 'configs' / 'ade20k' / 'upernet_nalaformer-t_8xb2-160k_ade20k-512x512.py'


def test_segmentor_benchmark_trains_the_configs_model_with_amp(tool, tmp_path):
    config = tmp_path / 'upernet_tiny.py'  # UperNet-T's config with a tiny backbone and heads
    config.write_text(f"_base_ = ['{UPERNET_T}']\n"
                      "model = dict(backbone=dict(embed_dims=[16, 32, 48, 64], depths=[1, 1, 1, 1], "
                      "num_heads=[1, 2, 3, 4]), decode_head=dict(in_channels=[16, 32, 48, 64], channels=32), "
                      "auxiliary_head=dict(in_channels=48, channels=16))\n")
    out = tmp_path / 'seg.json'
    assert tool.main(['segmentor', '--config', str(config), '--device', 'cpu', '--size', '32x48', '--amp', 'bf16',
                                '--backend', 'reference', '--warmup', '1', '--repeats', '2',
                                '--out-json', str(out)]) == 0
    report = json.loads(out.read_text())
    meta, result = report['meta'], report['result']
    assert meta['batch'] == 2 and meta['size'] == [32, 48] and meta['optim_wrapper'] == 'CPUAmpOptimWrapper'
    assert meta['nala_backend'] == 'reference' and meta['mmcv_ops'] == 'compiled'
    assert len(result['losses']) == 3 and result['losses_finite'] and result['final_loss'] == result['losses'][-1]
    assert result['samples'] == 2 and result['median_ms'] > 0 and result['peak_mb'] is None
    assert 3 < result['losses'][0] < 10  # decode + 0.4 x auxiliary cross-entropy over 150 classes


@pytest.mark.parametrize('args, message', [
    (['--amp', 'fp16', '--device', 'cpu'], 'float16 mixed precision needs a GPU'),
    (['--config', str(ROOT / 'configs' / 'nalaformer' / 'nalaformer-t_8xb128_in1k.py'), '--device', 'cpu'],
     'not a segmentation config'),
    (['--config', 'missing.py', '--device', 'cpu'], 'does not exist'),
])
def test_segmentor_benchmark_user_errors_exit_2(tool, args, message, capsys):
    assert run_tool(tool.main, ['segmentor', *args, '--repeats', '1']) == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]  # (after mmengine's warnings)
    assert last.startswith('error: ') and message in last
