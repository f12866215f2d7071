"""Attention entropy (nalaformer.analysis.entropy) and the attention analysis tools."""
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from nalaformer.analysis.entropy import (
    ATTN_TYPES, attention_entropy, attention_probs, capture_qk, entropy, norm_sweep, pearson, spearman,
)
from nalaformer.analysis.models import ModelSpec, create_model
from nalaformer.ops import ATTENTION_KERNELS, build_attention_kernel, rope_table

ROOT = Path(__file__).resolve().parents[1]
TOOLS = ROOT / 'tools' / 'analysis'


def test_uniform_and_one_hot():
    n = 37
    assert torch.allclose(entropy(torch.full((n,), 1 / n)), torch.tensor(math.log(n)))
    assert entropy(torch.eye(n)[3]) == 0
    q, k = torch.zeros(5, 8, dtype=torch.float64), torch.randn(n, 8, dtype=torch.float64)
    assert torch.allclose(attention_entropy('softmax', q, k), torch.full((5,), math.log(n), dtype=torch.float64))
    # ReLU scores (1, 0, 0): all attention on the first key
    one_hot = attention_entropy('relu', torch.tensor([[1., 0.]]), torch.tensor([[1., 0.], [0., 1.], [0., 2.]]))
    assert one_hot.item() == 0


def test_three_keys_by_hand():
    # scores 1, 1, 2 -> A = (1/4, 1/4, 1/2) -> H = 2 * (1/4) ln 4 + (1/2) ln 2 = 1.5 ln 2
    expected = 1.5 * math.log(2)
    relu = attention_entropy('relu', torch.tensor([[1., 0.]]), torch.tensor([[1., 0.], [1., 0.], [2., 0.]]))
    # softmax with d = 1: logits 0, 0, ln 2 give the same distribution
    softmax = attention_entropy('softmax', torch.tensor([[1.]]), torch.tensor([[0.], [0.], [math.log(2)]]))
    assert relu.item() == pytest.approx(expected) and softmax.item() == pytest.approx(expected)


@pytest.mark.parametrize('kernel', ATTN_TYPES)
def test_chunked_equals_naive(kernel):
    q, k = torch.randn(2, 3, 50, 16, dtype=torch.float64), torch.randn(2, 3, 50, 16, dtype=torch.float64)
    full = attention_probs(kernel, q, k)  # (2, 3, 50, 50): the naive N x N matrix
    naive = -(full * full.log()).nan_to_num(0.0).sum(-1)
    assert torch.allclose(attention_entropy(kernel, q, k, chunk=7), naive)
    assert torch.allclose(full.sum(-1), torch.ones(2, 3, 50, dtype=torch.float64))


@pytest.mark.parametrize('kernel', ATTN_TYPES)
def test_probs_are_the_model_kernels_attention(kernel):
    """With RoPE at angle 0 (identity), each registered kernel's output is A @ v."""
    q, k, v = (torch.randn(1, 2, 24, 16, dtype=torch.float64) for _ in range(3))
    identity_rope = rope_table(torch.zeros(8, dtype=torch.float64), 4, 6)
    out = build_attention_kernel(kernel).attend(q, k, v, identity_rope)
    assert torch.allclose(out, attention_probs(kernel, q, k) @ v, rtol=1e-4, atol=1e-6)


def test_kernels_are_softmax_and_every_kernel_with_feature_maps():
    assert ATTN_TYPES[0] == 'softmax' and len(set(ATTN_TYPES)) == len(ATTN_TYPES)
    assert {'nala', 'nala_cos', 'const_power', 'relu', 'elu', 'focused'} <= set(ATTN_TYPES)
    without_feature_maps = ('softmax', 'softmax_explicit', 'polarity')
    assert set(ATTN_TYPES[1:]) == {name for name in ATTENTION_KERNELS if name not in without_feature_maps}


def test_entropy_uses_each_kernels_own_feature_maps_and_arguments():
    torch.manual_seed(0)
    q, k = torch.randn(2, 3, 20, 8, dtype=torch.float64), torch.randn(2, 3, 30, 8, dtype=torch.float64)
    phi_q, phi_k = build_attention_kernel('relu', power=3).feature_maps(q, k)
    assert torch.equal(phi_q, q.relu() ** 3)
    scores = phi_q @ phi_k.transpose(-2, -1)
    expected = scores / scores.sum(-1, keepdim=True)
    torch.testing.assert_close(attention_probs('relu', q, k, dict(power=3)), expected)
    torch.testing.assert_close(attention_entropy('relu', q, k, chunk=7, kernel_kwargs=dict(power=3)),
                               -torch.special.xlogy(expected, expected).sum(-1))
    assert not torch.allclose(attention_probs('relu', q, k), expected)  # the default power is 1
    sharp, soft = (attention_entropy('nala_cos', q, k, kernel_kwargs=dict(alpha=alpha)) for alpha in (50., 0.1))
    assert not torch.allclose(sharp, soft)
    norms = torch.tensor([0.5, 5.0])
    sweep = norm_sweep('relu', q, k, norms, kernel_kwargs=dict(power=3))
    assert sweep.shape == (2, 2, 3, 20) and torch.allclose(sweep[0], sweep[1])  # relu^3 is homogeneous too
    with pytest.raises(TypeError, match="'relu' takes \\['power'\\]"):
        attention_probs('relu', q, k, dict(alpha=1.))


def test_kernels_without_one_distribution_are_refused():
    q, k = torch.randn(4, 8), torch.randn(6, 8)
    with pytest.raises(ValueError, match="'polarity' is not one linear attention.*choose from .*'nala'"):
        attention_probs('polarity', q, k)
    with pytest.raises(ValueError, match='polarity'):
        attention_entropy('polarity', q, k, kernel_kwargs=dict(power=2.))
    with pytest.raises(ValueError, match="unknown attention kernel 'nope'"):
        attention_probs('nope', q, k)


def test_query_norm_dependence():
    torch.manual_seed(1)
    q, k = torch.randn(1, 64, 32, dtype=torch.float64), torch.randn(1, 256, 32, dtype=torch.float64)
    norms = torch.tensor([0.05, 0.5, 1.0, 3.0, 10.0, 30.0])
    relu, softmax, nala = (norm_sweep(name, q, k, norms).mean(-1).squeeze(-1) for name in ('relu', 'softmax', 'nala'))
    assert torch.allclose(relu, relu[0].expand_as(relu))  # scale-invariant
    assert (softmax.diff() < 0).all()  # softmax entropy falls with the inverse temperature |q|
    assert nala[3] < nala[0] - 0.01  # NaLa: the power p(|q|) grows with |q| (saturates past |q| ~ 2)


def test_correlations():
    x = torch.linspace(-2, 3, 40)
    assert pearson(x, 2 * x + 1) == pytest.approx(1.0)
    assert spearman(x, x ** 3) == pytest.approx(1.0) and pearson(x, x ** 3) < 1
    assert spearman(x, -x) == pytest.approx(-1.0)
    y = x.clone()
    y[5] = float('nan')
    assert pearson(x, y) == pytest.approx(1.0)


def test_capture_qk():
    model = create_model(ModelSpec('nalaformer_xt'))
    q, k, grid = capture_qk(model, torch.randn(2, 3, 64, 96), stage=1, block=1)
    assert grid == (8, 12) and q.shape == k.shape == (2, 2, 96, 32)
    with pytest.raises(ValueError, match='layers'):
        capture_qk(model, torch.randn(1, 3, 64, 64), stage=4, block=0)


@pytest.mark.slow
def test_tools_write_outputs(tmp_path):
    png, js, vis = tmp_path / 'entropy.png', tmp_path / 'entropy.json', tmp_path / 'map.png'
    common = ['--model', 'nalaformer_xt', '--size', '64']
    proc = subprocess.run([sys.executable, TOOLS / 'attention_entropy.py', *common, '--attn-types', 'softmax', 'relu',
                           'nala', '--sweep-steps', '3', '--sweep-queries', '16', '--out', png, '--json', js],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(js.read_text())
    assert report['tokens'] == 256 and set(report['kernels']) == {'softmax', 'relu', 'nala'}
    assert report['kernels']['relu']['sweep']['change_low_to_high_norm'] == pytest.approx(0, abs=1e-9)
    assert png.read_bytes()[:8] == b'\x89PNG\r\n\x1a\n'
    proc = subprocess.run([sys.executable, TOOLS / 'visualize_attention.py', *common, '--out', vis],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert vis.read_bytes()[:8] == b'\x89PNG\r\n\x1a\n'
    bad = subprocess.run([sys.executable, TOOLS / 'visualize_attention.py', '--size', '0', '--out', vis],
                         capture_output=True, text=True)
    assert bad.returncode == 2 and 'bad image size' in bad.stderr and 'Traceback' not in bad.stderr
