"""What the mechanism studies share: resumable runs side by side (a run's folder holds ``settings.json`` and, once
finished, ``result.json``, reused when its settings match), and the files and figure of their report."""
import argparse
import json
import math
import os
import shlex
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple, Union

import torch

from ...errors import ConfigError
from ..machine import CHECKOUT
from ..mechanism import TIE_RULE, compare, format_mean_std, sweep_norms
from ..plots import grouped_bars, panels, save_figure
from ..results import markdown_table, write_json

__all__ = ['add_study_args', 'read_scalars', 'run_jobs', 'run_tool', 'study_report', 'mechanism_table',
           'study_markdown', 'plot_study', 'write_markdown', 'write_report']

BEGIN, END = '<!-- mechanism_study results: begin -->', '<!-- mechanism_study results: end -->'


def add_study_args(parser: argparse.ArgumentParser, attn_types: Sequence[str], seeds: Sequence[int], name: str):
    """The options every study takes: what to run, where (work_dirs/NAME, docs/NAME.*), how many side by side."""
    parser.add_argument('--attn-types', nargs='+', default=list(attn_types), choices=attn_types,
                        help='the attn_type of each run (one for the whole network)')
    parser.add_argument('--seeds', type=int, nargs='+', default=list(seeds))
    parser.add_argument('--threads', type=int, default=1, help='torch threads per training (1: two spinning '
                                                               'OpenMP threads on 2 shared cores were ~50x slower)')
    parser.add_argument('--jobs', type=int, default=2, help='trainings run side by side (each --threads threads)')
    parser.add_argument('--sweep-queries', type=int, default=64, help='query directions per head in the sweep')
    parser.add_argument('--work-dir', type=Path, default=CHECKOUT / 'work_dirs' / name)
    parser.add_argument('--out', type=Path, default=CHECKOUT / 'docs' / name,
                        help='output prefix: OUT.json, OUT.md, OUT.png')
    parser.add_argument('--combine', action='store_true', help='only collect finished runs and write the outputs')
    parser.add_argument('--retrain', action='store_true', help='ignore finished runs and train them again')


def read_result(directory: Path) -> Optional[Dict]:
    """The result of the run finished in ``directory``, or None."""
    result_file = directory / 'result.json'
    return json.loads(result_file.read_text()) if result_file.is_file() else None


def read_scalars(work_dir: Path) -> List[Dict]:
    """The rows of mmengine's scalars under ``work_dir`` (every timestamp folder, oldest first)."""
    return [json.loads(line) for scalars in sorted(work_dir.glob('*/vis_data/scalars.json'))
            for line in scalars.read_text().splitlines()]


def start_run(directory: Path, settings: Dict, retrain: bool) -> None:
    """Make ``directory`` the folder of a run with ``settings``: emptied first with ``retrain`` or when it holds
    a run with other settings (an interrupted run with these settings stays, to be resumed)."""
    settings_file = directory / 'settings.json'
    if retrain or (settings_file.is_file() and json.loads(settings_file.read_text()) != settings):
        shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True, exist_ok=True)
    settings_file.write_text(json.dumps(settings) + '\n')


def run_tool(tool: Union[str, Path], arguments: List[str], log: Path, threads: Optional[int] = None) -> None:
    """``tools/<tool> arguments`` (or the script at the absolute path ``tool``) with ``threads`` threads (None: torch's
    default), its output appended to ``log``; exits with the log's end if it fails."""
    env = {**os.environ, 'PYTHONPATH': f'{CHECKOUT}{os.pathsep}{os.environ.get("PYTHONPATH", "")}',
           **(dict(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads)) if threads else {})}
    command = [sys.executable, str(CHECKOUT / 'tools' / tool), *arguments]
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open('a') as f:
        code = subprocess.run(command, cwd=CHECKOUT, stdout=f, stderr=subprocess.STDOUT, env=env).returncode
    if code:
        raise SystemExit(f'{tool} failed (exit {code}): {shlex.join(command)}\n{log.read_text()[-4000:]}')


def run_jobs(args: argparse.Namespace, jobs: Sequence[tuple], settings: Dict, directory_of: Callable[[tuple], Path],
             train_and_measure: Callable[[tuple, Path], Dict], describe: Callable[[Dict], str],
             part: str) -> List[Dict]:
    """The result of every job: with ``--combine`` the finished runs with ``settings`` only; otherwise each job's
    finished run, or ``train_and_measure(job, folder)`` (``--jobs`` side by side), with a progress line each:
    ``describe(result)`` and the first ``part``'s (stage's, group's) Spearman and sweep ΔH."""
    if args.combine:
        runs = [result for result in map(read_result, map(directory_of, jobs))
                if result and result.get('settings') == settings]
    else:
        torch.set_num_threads(args.threads)  # the measurements in this process, beside the trainings
        start = time.perf_counter()

        def run(job: tuple, i: int, total: int) -> Dict:
            directory = directory_of(job)
            result = None if args.retrain else read_result(directory)
            done = result is not None and result.get('settings') == settings
            if not done:
                print(f'[{i}/{total}] {" ".join(map(str, job))}: training (log: {directory / "train.log"})', flush=True)
                start_run(directory, settings, args.retrain)
                result = train_and_measure(job, directory)
                (directory / 'result.json').write_text(json.dumps(result, indent=2) + '\n')
            first, label = result['stages'][0], f'{part[0]}1'
            spearman = float('nan') if first['spearman'] is None else first['spearman']
            cost = ('(done before)' if done else
                    f"train {result['seconds']:.0f} s + measure {result['measure_seconds']:.0f} s")
            print(f"[{i}/{total}] {describe(result)}  Spearman {label} {spearman:+.3f}  sweep ΔH {label} "
                  f"{first['sweep_change']:+.3f}  {cost}  [{(time.perf_counter() - start) / 60:.1f} min]", flush=True)
            return result

        with ThreadPoolExecutor(max_workers=args.jobs) as pool:
            runs = [f.result() for f in [pool.submit(run, job, i, len(jobs)) for i, job in enumerate(jobs, 1)]]
    if not runs:
        raise ConfigError(f'no finished runs under {args.work_dir}')
    return runs


def study_report(args: argparse.Namespace, settings: Dict, settings_text: str, kernels: List[str], cells: Dict,
                 verdicts: List[Dict], runs: List[Dict], **fields) -> Dict:
    """The report of a study (``OUT.json``): its command, settings, cells, verdicts and runs."""
    return dict(command=shlex.join(['python3', 'tools/analysis/study.py', *args.argv]), settings=settings,
                settings_text=settings_text, kernels=kernels, seeds=args.seeds, **fields,
                sweep_norms=sweep_norms().tolist(), tie_rule=TIE_RULE, cells=cells, verdicts=verdicts, runs=runs)


def mechanism_table(header: List[str], rows: List[Tuple[List[str], Dict]], part: str, tokens: bool = False,
                    versus_zero: bool = False) -> str:
    """A markdown table of (leading cells, summarised cell) ``rows``: after ``header``, the cell's Spearman(|q|, H)
    in each measured ``part`` (stage, group; ``tokens``: with its token count), with ``versus_zero`` the first
    one's :func:`compare` with 0, and the first one's sweep ΔH and sweep max |ΔH|."""
    stages = rows[0][1]['stages']
    measured = [s['stage'] for s in stages if 'spearman' in s]
    header = header + [f"Spearman(\\|q\\|, H) {part} {i + 1}" + (f" ({stages[i]['tokens']} tok.)" if tokens else '')
                       for i in measured] + [f'{part} 1 Spearman vs 0'] * versus_zero \
        + [f'sweep ΔH {part} 1 (nats)', f'sweep max \\|ΔH\\| {part} 1']
    lines = []
    for lead, cell in rows:
        first = cell['stages'][measured[0]]
        zero, max_change = dict(mean=0.0, std=0.0, n=first['spearman']['n']), first['sweep_max_abs_change']['mean']
        lines.append(lead + [format_mean_std(cell['stages'][i]['spearman'], signed=True) for i in measured]
                     + [compare(first['spearman'], zero)] * versus_zero
                     + [format_mean_std(first['sweep_change'], 3, signed=True),
                        '–' if max_change is None else f'{max_change:.1e}'])
    return markdown_table(header, lines)


def study_markdown(report: Dict, intro: Sequence[str], table: str, metric: str, unit: str, digits: int,
                   notes: Sequence[str] = (), group: Optional[str] = None) -> str:
    """``intro``, the settings, ``table``, ``notes``, then the verdicts on ``metric`` (differences in ``unit``
    with ``digits`` decimals; ``group``: a verdict field shown first, e.g. 'conv_mixers')."""
    groups = [group] if group else []
    verdicts = [[*(v[g] for g in groups), v['a'], v['b'], f"{v['diff']:+.{digits}f}", f"{v['spread']:.{digits}f}",
                 v['verdict']] for v in report['verdicts']]
    return '\n\n'.join([
        *intro, f"Settings: {report['settings_text']}", table, *notes,
        f'{metric} verdicts (tie: |difference| < the larger standard deviation; n/a: fewer than 2 seeds):',
        markdown_table([g.replace('_', ' ') for g in groups] + ['a', 'b', f'a − b ({unit})', 'larger std', 'verdict'],
                       verdicts)]) + '\n'


def write_markdown(path: Path, table: str) -> None:
    """Put ``table`` between the BEGIN/END markers of ``path`` (docs/mechanism_study.md keeps its text around
    them); a file without the markers is replaced by the table."""
    text = path.read_text() if path.is_file() else ''
    if BEGIN in text and END in text:
        head, rest = text.split(BEGIN, 1)
        table = f'{head}{BEGIN}\n{table}{END}{rest.split(END, 1)[1]}'
    path.write_text(table)


def write_report(out: Path, report: Dict, table: str, plot: Callable[[Dict, Path], None]) -> None:
    """Write ``OUT.json`` (``report``), ``OUT.md`` (:func:`write_markdown`) and ``OUT.png`` (``plot(report,
    path)``); print the table and the files written."""
    files = {suffix: Path(f'{out}.{suffix}') for suffix in ('json', 'md', 'png')}
    write_json(files['json'], report)
    write_markdown(files['md'], table)
    plot(report, files['png'])
    print(table)
    print(f"wrote {files['json']}, {files['md']} and {files['png']}")


def plot_study(rows: Dict[str, Dict[str, Dict]], runs: Dict[str, List[Dict]], metric: str, ylabel: str, part: str,
               sweep_norms: Sequence[float], path: Path, title: str = '', reference: Optional[float] = None):
    """A row of three panels per entry of ``rows`` ({row title: {attn_type: cell}}): ``metric``, mean ± std over
    seeds, with each seed's run of ``runs[row title]`` in gray (and ``reference`` dashed); the Spearman correlation
    of |q| and entropy per ``part`` (stage, group); the norm sweep of the first measured one."""
    fig, axes = panels(len(rows), 3, 5, 3.8, sharey='col')
    for axis, (row, cells) in zip(axes, rows.items()):
        attn_types = list(cells)
        stats = [cells[a][metric] for a in attn_types]
        axis[0].errorbar(range(len(attn_types)), [s['mean'] for s in stats], yerr=[s['std'] for s in stats],
                         fmt='o', capsize=4)
        for run in runs[row]:
            axis[0].plot(attn_types.index(run['kernel']) + 0.12, run[metric], '.', color='gray', ms=4)
        if reference is not None:
            axis[0].axhline(reference, color='gray', ls='--', lw=1, label='bicubic')
            axis[0].legend(fontsize=8)
        axis[0].set_xticks(range(len(attn_types)), attn_types, rotation=20)
        axis[0].set(xlim=(-0.5, len(attn_types) - 0.5), ylabel=ylabel)
        axis[0].set_title(f'{row}{ylabel}, mean ± std over seeds (gray: seeds)', fontsize=10)
        first = cells[attn_types[0]]['stages']
        measured = [s['stage'] for s in first if 'spearman' in s]
        spearman = {f"{part} {s + 1} ({first[s]['tokens']} tokens)": [cells[a]['stages'][s]['spearman'] for a in
                                                                      attn_types] for s in measured}
        grouped_bars(axis[1], attn_types, {k: [s['mean'] for s in v] for k, v in spearman.items()},
                     errors={k: [s['std'] or 0 for s in v] for k, v in spearman.items()})
        axis[1].axhline(0, color='gray', lw=1)
        axis[1].set(ylabel='Spearman(|q|, entropy)')
        axis[1].set_title('trained q, k: correlation of query norm and entropy', fontsize=10)
        for attn_type in attn_types:
            axis[2].plot(sweep_norms, cells[attn_type]['stages'][measured[0]]['sweep_mean_entropy'], label=attn_type)
        axis[2].axhline(math.log(first[measured[0]]['tokens']), color='gray', ls='--', lw=1)
        axis[2].set(xscale='log', xlabel='query norm (directions fixed)', ylabel='mean entropy (nats)')
        axis[2].set_title(f'norm sweep, {part} {measured[0] + 1} (dashed: log N), mean over seeds', fontsize=10)
        axis[2].legend(fontsize=8)
    if title:
        fig.suptitle(title, fontsize=9)
    save_figure(fig, path)
