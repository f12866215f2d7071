"""The NaLa backend (nalaformer.ops.backend): a scoped choice, carried into recomputation; the fused
kernels left out only where triton is missing, and a fused request that falls back says why, once.

The switch between the implementations themselves is tested in test_triton_kernels.py and test_nala_fast.py.
"""
import json
import os
import subprocess
import sys
import threading

import pytest
import timm
import torch

from nalaformer.ops import nala_backend, use_nala_backend
from nalaformer.ops.kernels import NaLaKernel


def test_a_block_s_backend_holds_in_its_own_thread_only():
    """Two threads in blocks of different backends at once each see their own; a thread started inside a
    block, and code after it, see the default."""
    default = nala_backend()
    both_inside = threading.Barrier(2, timeout=30)
    seen = {}

    def run(name):
        with use_nala_backend(name):
            both_inside.wait()  # the other thread has entered its block too
            seen[name] = nala_backend()
            both_inside.wait()  # ... and read its backend
            started_inside = threading.Thread(target=lambda: seen.setdefault(f'started in {name}', nala_backend()))
            started_inside.start()
            started_inside.join()
        seen[f'after {name}'] = nala_backend()

    threads = [threading.Thread(target=run, args=(name,)) for name in ('reference', 'fused')]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert seen == {'reference': 'reference', 'fused': 'fused', 'started in reference': default,
                    'started in fused': default, 'after reference': default, 'after fused': default}
    assert nala_backend() == default


TINY_MODELS = {
    'nalaformer_xt': dict(embed_dims=(16, 32, 32, 32), depths=(1, 1, 1, 1), num_heads=(1, 2, 2, 2)),
    'nala_swin_tiny': dict(embed_dim=16, depths=(1, 1, 1, 1), num_heads=(1, 2, 2, 4)),
}


@pytest.mark.parametrize('model_name,checkpointing', [
    ('nalaformer_xt', True), ('nalaformer_xt', 'selective'), ('nala_swin_tiny', True)])
def test_recomputation_runs_on_the_backend_of_its_forward(model_name, checkpointing):
    """Gradient checkpointing recomputes a forward run inside a use_nala_backend block on that block's backend,
    although backward runs after the block: the same gradients as without checkpointing."""
    torch.manual_seed(0)
    model = timm.create_model(model_name, num_classes=3, attn_types='nala', **TINY_MODELS[model_name]).train()
    ran_on = []
    for module in model.modules():
        if isinstance(module, NaLaKernel):
            module.register_forward_pre_hook(lambda *_: ran_on.append(nala_backend()))
    x = torch.randn(2, 3, 64, 64)
    grads = []
    for enable in (False, checkpointing):
        model.zero_grad()
        model.set_grad_checkpointing(enable)
        with use_nala_backend('reference'):
            loss = model(x).square().sum()
        loss.backward()  # outside the block: recomputation (if any) runs now
        grads.append({name: p.grad.clone() for name, p in model.named_parameters()})
    kernels = sum(isinstance(module, NaLaKernel) for module in model.modules())
    assert ran_on == ['reference'] * kernels * 3  # forward, forward, recomputation
    for name, grad in grads[0].items():
        torch.testing.assert_close(grads[1][name], grad, rtol=1e-5, atol=1e-6 * grad.abs().max().item(), msg=name)


def run_python(code: str, pythonpath_first: str = '') -> subprocess.CompletedProcess:
    env = dict(os.environ)
    if pythonpath_first:
        env['PYTHONPATH'] = os.pathsep.join(p for p in (pythonpath_first, env.get('PYTHONPATH')) if p)
    return subprocess.run([sys.executable, '-c', code], env=env, capture_output=True, text=True, timeout=600)


WITHOUT_TRITON = '''
import json, sys, warnings
sys.modules['triton'] = None  # as if triton were not installed
import torch
from nalaformer.ops import ATTENTION_KERNELS, build_attention_kernel, rope_angles, rope_table, use_nala_backend

q, k, v = torch.randn(3, 1, 2, 12, 16).unbind(0)
rope = rope_table(rope_angles(16), 3, 4)
kernel = build_attention_kernel('nala')
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter('always')
    with use_nala_backend('fused'):
        fused = [kernel(q, k, v, rope) for _ in range(3)]
    pytorch_op = kernel(q, k, v, rope)
print(json.dumps(dict(kernels=sorted(ATTENTION_KERNELS), same=all(torch.equal(out, pytorch_op) for out in fused),
                      warnings=[str(w.message) for w in caught if 'NaLa' in str(w.message)])))
'''


@pytest.mark.slow
def test_without_triton_a_fused_request_runs_the_pytorch_operator_and_says_so_once():
    result = run_python(WITHOUT_TRITON)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert 'nala' in report['kernels'] and 'nala_triton' not in report['kernels']
    assert report['same']
    assert report['warnings'] == ["the 'fused' NaLa backend runs the PyTorch operator instead: triton is not installed"]


@pytest.mark.slow
def test_a_broken_triton_install_fails_the_import_instead_of_dropping_the_fused_kernels(tmp_path):
    (tmp_path / 'triton').mkdir()
    (tmp_path / 'triton' / '__init__.py').write_text('raise ImportError("libcuda.so.1: cannot open shared object")\n')
    result = run_python('import nalaformer', pythonpath_first=str(tmp_path))
    assert result.returncode != 0
    assert 'the fused NaLa kernels (nalaformer.kernels.nala_triton) failed to import: libcuda.so.1' in result.stderr
    assert 'repair the installation, or uninstall triton' in result.stderr
