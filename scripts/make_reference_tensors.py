"""Produce tests/data/release_reference.pt by running the authors' release code.

Usage: python3 scripts/make_reference_tensors.py --release-file /path/to/NaLaFormer/NaLaformer/NALA.py

The release code is imported from outside this repository and never committed; only the
tensors it produces are. Tests in tests/test_release_parity.py compare against them.
"""
import argparse
import importlib.util
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / 'tests'))
from reference_weights import deterministic_input, fill_deterministic  # noqa: E402

# Small architectures whose weights are stored in full; the released variants use seeded weights.
TINY = dict(embed_dims=[32, 64, 96, 128], depths=[1, 1, 2, 1], num_heads=[1, 2, 3, 4], mlp_ratios=[3.5] * 4,
            layerscales=[True] * 4, layer_init_values=[1, 1, 1, 1])
RELEASED = dict(
    XT=dict(embed_dims=[32, 64, 128, 384], depths=[2, 2, 2, 2], num_heads=[1, 2, 4, 12], mlp_ratios=[3.5] * 4),
    T=dict(embed_dims=[64, 128, 256, 512], depths=[2, 2, 6, 2], num_heads=[1, 2, 4, 8], mlp_ratios=[4] * 4),
)


def load_release(path):
    spec = importlib.util.spec_from_file_location('nala_release', path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def attention_case(release, kind, dim, heads, hw, seed):
    """An attention block on a non-square input whose query norms spread over tanh's range."""
    cls = release.NormAwareLinearAttn if kind == 'nala' else release.VanillaSelfAttention
    block = fill_deterministic(cls(dim, heads), seed)
    with torch.no_grad():  # shrink q so |q| lies in ~[0.05, 3], where the power p(|q|) varies
        block.qkvg.weight[:dim] *= 0.3
    h, w = hw
    token_scale = torch.linspace(0.05, 1.5, h * w).reshape(1, 1, h, w)
    x = (deterministic_input((2, dim, h, w), seed) * token_scale).requires_grad_(True)
    rope = release.RoPE(dim, heads)
    sin, cos = rope((h, w))
    out = block(x, sin, cos)
    grad_out = deterministic_input(out.shape, seed + 1)
    out.backward(grad_out)
    q = block.qkvg(x.detach().flatten(2).transpose(1, 2))[..., :dim]
    q_norm = q.reshape(2, h * w, heads, dim // heads).norm(dim=-1)
    return dict(state_dict=block.state_dict(), x=x.detach(), out=out.detach(), grad_out=grad_out,
                grad_x=x.grad.detach(), q_norm_quantiles=torch.quantile(q_norm.flatten(), torch.tensor([.05, .5, .95])))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--release-file', required=True, help='path of the release NALA.py')
    parser.add_argument('--out', default=str(ROOT / 'tests' / 'data' / 'release_reference.pt'))
    args = parser.parse_args()
    release = load_release(args.release_file)
    torch.manual_seed(0)
    ref = {}
    ref['attn_nala_c64_h2'] = attention_case(release, 'nala', 64, 2, (7, 11), seed=1)
    ref['attn_nala_c192_h2'] = attention_case(release, 'nala', 192, 2, (5, 9), seed=2)
    ref['attn_softmax_c64_h2'] = attention_case(release, 'softmax', 64, 2, (7, 11), seed=3)

    for name, flags in [('hybrid', None), ('all_nala', [['l'] * 10] * 4)]:
        extra = dict(flagss=flags) if flags else {}
        model = fill_deterministic(release.NALAFORMER(num_classes=10, **TINY, **extra), seed=4).eval()
        x = deterministic_input((2, 3, 64, 96), seed=5)
        with torch.no_grad():
            ref[f'tiny_{name}'] = dict(seed=4, input_seed=5, logits=model(x))

    for variant, arch in RELEASED.items():
        model = release.NALAFORMER(**arch, layerscales=[True] * 4, layer_init_values=[1] * 4)
        fill_deterministic(model, seed=6).eval()
        x = deterministic_input((1, 3, 224, 224), seed=7)
        with torch.no_grad():
            ref[f'{variant}_224'] = dict(seed=6, input_seed=7, logits=model(x))

    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    torch.save(ref, args.out)
    print(f'wrote {args.out}')
    for k, v in ref.items():
        if 'q_norm_quantiles' in v:
            print(k, 'q norm 5/50/95%:', [round(x, 3) for x in v['q_norm_quantiles'].tolist()])


if __name__ == '__main__':
    main()
