"""FLOP counting (nalaformer.analysis.flops, tools/analysis/get_flops.py) against analytic counts."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from nalaformer.analysis.flops import count_flops, model_flops, variant_rows
from nalaformer.analysis.models import ModelSpec, ModelSpecError, create_model, parse_model_spec
from nalaformer.engine.model_spec import UnknownModelError
from nalaformer.models.layers import NaLaAttention

ROOT = Path(__file__).resolve().parents[1]
GET_FLOPS = ROOT / 'tools' / 'analysis' / 'get_flops.py'


def nala_block_macs(B, N, C, heads):
    """MACs of one NaLaAttention block with the 'nala' kernel (what the counter counts: products only).

    qkvg Linear C -> 4C:                      B N C 4C
    LePE 5x5 depthwise conv on C channels:    B N C 25
    normaliser phi_q . mean(phi_k):           B heads N 2d        (N x 2d times 2d x 1)
    state phi_k^T v:                          B heads 2d N d
    output phi_q . state:                     B heads N 2d d
    out_proj Linear C -> C:                   B N C C
    Not counted: feature maps, RoPE, the mean over tokens, division, LayerNorm, SiLU gate, biases.
    """
    d = C // heads
    return (B * N * C * 4 * C + B * N * C * 25 + B * heads * N * 2 * d
            + B * heads * 2 * d * N * d + B * heads * N * 2 * d * d + B * N * C * C)


def softmax_block_macs(B, N, C, heads):
    """Same block with softmax: q k^T and attn v are B heads N N d each (SDPA), no normaliser."""
    d = C // heads
    return B * N * C * 4 * C + B * N * C * 25 + 2 * B * heads * N * N * d + B * N * C * C


@pytest.mark.parametrize('device', [None, 'cpu'])  # None: meta copy; cpu: real run (CPU SDPA formula)
@pytest.mark.parametrize('kernel, formula', [('nala', nala_block_macs), ('softmax', softmax_block_macs)])
def test_attention_block_matches_analytic_count(device, kernel, formula):
    B, C, heads, H, W = 2, 64, 2, 7, 9
    block = NaLaAttention(C, heads, attn_type=kernel)
    count = count_flops(block, (B, C, H, W), device=device)
    assert count.macs == formula(B, H * W, C, heads)
    assert count.params == sum(p.numel() for p in block.parameters())


def test_release_t_numbers():
    (row,) = variant_rows(['nalaformer_t'])
    assert row['params'] == 15_907_752
    assert abs(row['macs_hybrid'] / 2.9e9 - 1) < 0.03  # the release measured with fvcore: about 2.9G
    assert not row['matches_paper'] and 'mlp ratio 3.5' in row['note']
    # hybrid - all-NaLa = stages 3-4 (softmax there): per block 2 N^2 C - (2 N C + 4 N C d)
    stage3 = 6 * (2 * 196 ** 2 * 256 - (2 * 196 * 256 + 4 * 196 * 256 * 64))
    stage4 = 2 * (2 * 49 ** 2 * 512 - (2 * 49 * 512 + 4 * 49 * 512 * 64))
    assert row['macs_hybrid'] - row['macs_all_nala'] == stage3 + stage4


def test_t_with_mlp_ratio_3_5_matches_paper():
    (row,) = variant_rows(["nalaformer_t(mlp_ratios=3.5)"])
    assert round(row['params'] / 1e5) == 149 and row['matches_paper']


def test_meta_and_cpu_counts_agree_on_a_model():
    model = ModelSpec('nalaformer_xt')
    meta = model_flops(model, (64, 96))
    cpu = count_flops(create_model(model), (1, 3, 64, 96), device='cpu')
    assert meta.macs == cpu.macs and meta.params == cpu.params == 6_142_248


def test_config_files_ask_the_task_wrapper(tmp_path):
    """A config's timm model is what its wrapper builds: the wrapper's own arguments (loading options included) stay
    out of the model's kwargs; for a dense config, the backbone only."""
    import inspect
    from nalaformer.classification.model import TimmClassifier
    own = {name: None for name in inspect.signature(TimmClassifier).parameters if name not in ('arch', 'model_kwargs')}
    config = tmp_path / 'classifier.py'
    config.write_text("custom_imports = dict(imports=['nalaformer.classification'])\n"
                      f"model = dict(type='TimmClassifier', arch='nalaformer_xt', attn_types='nala', drop_path_rate=0.1, "
                      f"**{own!r})\n")
    spec = parse_model_spec(str(config))
    assert (spec.arch, spec.kwargs) == ('nalaformer_xt', {'attn_types': 'nala', 'drop_path_rate': 0.1})
    assert spec.label == 'classifier.py: nalaformer_xt'
    spec = parse_model_spec(str(ROOT / 'configs' / 'ade20k' / 'upernet_nalaformer-t_8xb2-160k_ade20k-512x512.py'))
    assert spec.arch == 'nalaformer_t' and spec.label.endswith('(backbone only)')
    plain = tmp_path / 'plain.py'  # no wrapper of this project: not read as a guess
    plain.write_text("model = dict(type='nalaformer_xt', attn_types='nala')\n")
    with pytest.raises(ModelSpecError, match='no task wrapper'):
        parse_model_spec(str(plain))


def test_spec_errors():
    with pytest.raises(UnknownModelError, match="unknown timm model 'nalaformer_tt'"):
        parse_model_spec('nalaformer_tt')
    with pytest.raises(ModelSpecError, match='key=value'):
        parse_model_spec("nalaformer_t('nala')")


@pytest.mark.slow
def test_cli(tmp_path):
    out = tmp_path / 'flops.json'
    proc = subprocess.run([sys.executable, GET_FLOPS, 'nalaformer_xt', '--attn-types', 'nala', '--shape', '96', '128',
                           '--json', out], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(out.read_text())['model']
    assert report['params'] == 6_142_248 and report['input_shape'] == [1, 3, 96, 128]
    bad = subprocess.run([sys.executable, GET_FLOPS, 'nalaformer_q'], capture_output=True, text=True)
    assert bad.returncode == 2 and 'similar names' in bad.stderr and 'Traceback' not in bad.stderr
