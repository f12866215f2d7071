"""Registers, spills and shared memory of the fused NaLa kernels, compiled for a GPU without one.

Triton compiles each kernel ahead of time for a target architecture (default sm_90, the H100 /
H200) on any machine; ptxas then reports the registers per thread, spill stores and loads, and
the stack of the compiled code. From these and the shared memory the tool estimates how many
programs fit on one SM at once (65,536 registers, 64 warps and the architecture's shared memory
per SM: 164 KB on sm_80, 100 KB on sm_86 / sm_89, 228 KB on sm_90). No timing: use
``benchmark_kernels.py`` on a GPU for that. Spills mean the kernel keeps tiles in local memory
(global memory behind L1), which costs bandwidth and latency.

    python tools/analysis/kernel_resources.py                                 # d = 64, bf16, a tuning grid
    python tools/analysis/kernel_resources.py --head-dims 32 64 96 --dot ieee bf16 --out-dir runs/resources

Writes ``kernel_resources.json`` to ``--out-dir`` and prints one table row per kernel and tuning.
"""
import argparse
import itertools
import json
import os
import re
import subprocess
import tempfile
from pathlib import Path
from typing import Dict, List, Optional, Sequence

os.environ['TRITON_INTERPRET'] = '0'  # compiled kernels; read when triton is first imported

import torch  # noqa: E402
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from nalaformer.kernels.tuning import DOT_MODES, resolve_dot  # noqa: E402

KERNELS = ('_forward_state_kernel', '_forward_output_kernel', '_backward_query_kernel', '_backward_state_kernel',
           '_backward_key_kernel')
DTYPES = {'float32': (torch.float32, 'fp32'), 'float16': (torch.float16, 'fp16'),
          'bfloat16': (torch.bfloat16, 'bf16')}
# Pointers to the attention inputs and their gradients have the input dtype; the output, the
# output gradient (cast before the backward), rope table and state buffers are float32.
INPUT_POINTERS = ('q_ptr', 'k_ptr', 'v_ptr', 'dq_ptr', 'dk_ptr', 'dv_ptr')
SM_REGISTERS, SM_WARPS = 65536, 64
SM_SHARED_KB = {80: 164, 86: 100, 89: 100, 90: 228}


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--arch', type=int, default=90, help='compute capability x 10 (80: A100, 90: H100/H200)')
    parser.add_argument('--dtype', default='bfloat16', choices=sorted(DTYPES), help='q, k, v dtype')
    parser.add_argument('--head-dims', type=int, nargs='+', default=[64])
    parser.add_argument('--forms', nargs='+', default=['nala'], choices=('nala', 'nala_cos'))
    parser.add_argument('--block-n', type=int, nargs='+', default=[16, 32, 64])
    parser.add_argument('--warps', type=int, nargs='+', default=[4, 8])
    parser.add_argument('--stages', type=int, nargs='+', default=[3])
    parser.add_argument('--dot', nargs='+', default=['ieee', 'bf16'], choices=('auto',) + DOT_MODES,
                        help="operands of the tile products ('auto': the default's choice for --dtype and --arch)")
    parser.add_argument('--kernels', nargs='+', default=list(KERNELS), choices=KERNELS)
    parser.add_argument('--out-dir', type=Path, default=Path('kernel_resources'))
    return parser.parse_args(argv)


def signature(fn, meta: Dict[str, object], pointer_dtype: str):
    """Triton signature and constexpr values of one kernel for the launch ``meta`` of nala_jit."""
    types, constants = {}, {}
    for index, name in enumerate(fn.arg_names):
        if name in meta:
            types[name] = 'constexpr'
            constants[(index,)] = meta[name]
        elif name.endswith('_ptr'):
            types[name] = f'*{pointer_dtype}' if name in INPUT_POINTERS else '*fp32'
        else:
            types[name] = 'fp32' if name == 'alpha' else 'i32'
    return types, constants


def ptxas_usage(ptx: str, arch: int) -> Dict[str, int]:
    """Registers, spill bytes and stack of PTX code, from ``ptxas -v``."""
    suffix = 'a' if arch >= 90 else ''
    with tempfile.TemporaryDirectory() as tmp:
        source = Path(tmp) / 'kernel.ptx'
        source.write_text(ptx)
        report = subprocess.run(
            [triton.knobs.nvidia.ptxas.path, f'-arch=sm_{arch}{suffix}', '-v', str(source), '-o', str(source) + '.o'],
            capture_output=True, text=True, check=True).stderr

    def number(pattern: str) -> int:
        match = re.search(pattern, report)
        return int(match.group(1)) if match else 0

    return {'registers': number(r'Used (\d+) registers'), 'spill_stores': number(r'(\d+) bytes spill stores'),
            'spill_loads': number(r'(\d+) bytes spill loads'), 'stack': number(r'(\d+) bytes stack frame')}


def programs_per_sm(registers: int, warps: int, shared: int, arch: int) -> int:
    """Programs one SM holds at once, limited by registers, warps and shared memory."""
    per_program_registers = max(registers, 1) * 32 * warps
    limits = [SM_REGISTERS // per_program_registers, SM_WARPS // warps]
    if shared:
        limits.append(SM_SHARED_KB.get(arch, 228) * 1024 // shared)
    return min(limits)


def measure(args: argparse.Namespace) -> List[Dict[str, object]]:
    from tqdm import tqdm

    from nalaformer.kernels import nala_jit
    from nalaformer.kernels.tuning import Tuning
    torch_dtype, pointer_dtype = DTYPES[args.dtype]
    target = GPUTarget('cuda', args.arch, 32)
    rows = []
    grid = list(itertools.product(args.head_dims, args.forms, args.block_n, args.warps, args.stages, args.dot))
    for head_dim, form, block_n, warps, stages, dot in tqdm(grid, desc='compile', unit='tuning'):
        dot = resolve_dot(dot, torch_dtype, divmod(args.arch, 10))
        tune = Tuning(block_n=block_n, num_warps=warps, num_stages=stages, dot=dot)
        x = torch.empty(1, 1, block_n, head_dim, device='meta', dtype=torch_dtype)
        meta = dict(nala_jit._Launch(x, None, 20.0 if form == 'nala_cos' else None, tune).meta)
        options = {key: meta.pop(key) for key in ('num_warps', 'num_stages')}
        for name in args.kernels:
            fn = getattr(nala_jit, name)
            row = {'kernel': name.strip('_').replace('_kernel', ''), 'head_dim': head_dim, 'form': form,
                   'block_n': block_n, 'num_warps': warps, 'num_stages': stages, 'dot': dot}
            try:
                compiled = triton.compile(ASTSource(fn, *signature(fn, meta, pointer_dtype)), target=target,
                                          options=options)
            except Exception as err:  # noqa: BLE001 - a configuration the compiler rejects is a result
                row['status'] = f'{type(err).__name__}: {str(err).splitlines()[0][:200]}'
            else:
                usage = ptxas_usage(compiled.asm['ptx'], args.arch)
                shared = compiled.metadata.shared
                row.update(status='ok', shared=shared, **usage,
                           programs_per_sm=programs_per_sm(usage['registers'], warps, shared, args.arch))
            rows.append(row)
    return rows


def table(rows: List[Dict[str, object]]) -> str:
    header = ('kernel', 'head_dim', 'form', 'block_n', 'num_warps', 'dot', 'registers', 'spill_stores',
              'spill_loads', 'shared', 'programs_per_sm')
    lines = ['  '.join(f'{h:>15}' if i == 0 else f'{h:>9}' for i, h in enumerate(header))]
    for row in rows:
        if row['status'] != 'ok':
            lines.append(f"{row['kernel']:>15}  {row['head_dim']:>9}  {row['block_n']:>9}  {row['num_warps']:>9}  "
                         f"{row['dot']:>9}  {row['status']}")
            continue
        lines.append('  '.join(f'{row[h]:>15}' if i == 0 else f'{row[h]:>9}' for i, h in enumerate(header)))
    return '\n'.join(lines)


def main(argv: Optional[Sequence[str]] = None) -> Dict[str, object]:
    args = parse_args(argv)
    rows = measure(args)
    results = {'config': {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
               'triton': triton.__version__, 'ptxas': triton.knobs.nvidia.ptxas.version, 'rows': rows}
    args.out_dir.mkdir(parents=True, exist_ok=True)
    (args.out_dir / 'kernel_resources.json').write_text(json.dumps(results, indent=2))
    print(f"sm_{args.arch}, {args.dtype} inputs, triton {results['triton']}, ptxas {results['ptxas']}")
    print(table(rows))
    return results


if __name__ == '__main__':
    main()
