"""Resumable runs of the mechanism studies (``tools/analysis/mechanism_study.py``, ``sr_mechanism_study.py``)
and the files of their report.

A run's folder holds ``settings.json`` (the settings of the run in it, finished or interrupted) and, once the
run has finished, ``result.json`` (its result, which records those settings under ``settings``).
"""
import argparse
import json
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

__all__ = ['add_run_args', 'read_result', 'run_side_by_side', 'start_run', 'write_result', 'write_report']


def add_run_args(parser: argparse.ArgumentParser) -> None:
    """``--combine`` and ``--retrain``."""
    parser.add_argument('--combine', action='store_true', help='only collect finished runs and write the outputs')
    parser.add_argument('--retrain', action='store_true', help='ignore finished runs and train them again')


def read_result(directory: Path) -> Optional[Dict]:
    """The result of the run finished in ``directory``, or None."""
    result_file = directory / 'result.json'
    return json.loads(result_file.read_text()) if result_file.is_file() else None


def write_result(directory: Path, result: Dict) -> None:
    """Record ``result`` as the result of the run in ``directory``."""
    (directory / 'result.json').write_text(json.dumps(result, indent=2) + '\n')


def start_run(directory: Path, settings: Dict, retrain: bool) -> None:
    """Make ``directory`` the folder of a run with ``settings``: emptied first with ``retrain`` or when it holds
    a run with other settings (an interrupted run with these settings stays, to be resumed)."""
    settings_file = directory / 'settings.json'
    if retrain or (settings_file.is_file() and json.loads(settings_file.read_text()) != settings):
        shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True, exist_ok=True)
    settings_file.write_text(json.dumps(settings) + '\n')


def run_side_by_side(run: Callable[[Tuple, int, int], Dict], jobs: Sequence[Tuple], workers: int) -> List[Dict]:
    """``run(job, i, len(jobs))`` for every job (``i`` counted from 1), ``workers`` threads at a time; the results
    in the order of ``jobs``."""
    with ThreadPoolExecutor(max_workers=workers) as pool:
        futures = [pool.submit(run, job, i, len(jobs)) for i, job in enumerate(jobs, 1)]
        return [future.result() for future in futures]


def write_report(out: Path, report: Dict, table: str, write_table: Callable[[Path, str], None],
                 plot: Callable[[Dict, Path], None]) -> None:
    """Write ``OUT.json`` (``report``), ``OUT.md`` (``write_table(path, table)``) and ``OUT.png``
    (``plot(report, path)``); print the table and the files written."""
    files = {suffix: Path(f'{out}.{suffix}') for suffix in ('json', 'md', 'png')}
    files['json'].parent.mkdir(parents=True, exist_ok=True)
    files['json'].write_text(json.dumps(report, indent=2) + '\n')
    write_table(files['md'], table)
    plot(report, files['png'])
    print(table)
    print(f"wrote {files['json']}, {files['md']} and {files['png']}")
