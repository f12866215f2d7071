"""The measurement toolkit of the benchmarks (nalaformer/analysis: timing, results, memory, grids) and the errors
of the analysis tools: what fails, what is recorded, what a user reads."""
import os
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from nalaformer.analysis.grids import token_grid
from nalaformer.analysis.machine import ProcessFailed
from nalaformer.analysis.memory import memory_env, run_memory_worker
from nalaformer.analysis.models import ModelSpec, create_model
from nalaformer.analysis.results import Failure, attempt
from nalaformer.analysis.timing import time_steps
from nalaformer.errors import run_tool

CPU = torch.device('cpu')


def builders(broken: BaseException):
    """Two working steps and one whose first call raises ``broken``."""
    calls = []

    def fails():
        raise broken
    return {'a': lambda: (lambda: calls.append('a')), 'broken': lambda: fails,
            'b': lambda: (lambda: calls.append('b'))}, calls


def test_a_failing_step_stops_the_timing_with_its_error():
    steps, _ = builders(ValueError('the broken step'))
    with pytest.raises(ValueError, match='the broken step') as failure:
        time_steps(steps, CPU, warmup=1, repeats=2, keep_going=False, what='size 7')
    assert failure.value.__notes__ == [
        '(broken at size 7 failed; --keep-going records the error of a failing row and goes on)']


def test_keep_going_records_the_error_and_times_the_others(capsys):
    steps, calls = builders(ValueError('the broken step'))
    timing = time_steps(steps, CPU, warmup=1, repeats=3, keep_going=True, what='size 7')
    assert timing.failures == {'broken': Failure('error', 'ValueError: the broken step')}
    assert set(timing.samples) == set(timing.steps) == {'a', 'b'}
    assert all(len(s) == 3 and min(s) >= 0 for s in timing.samples.values())
    assert calls == ['a', 'b'] + ['a', 'b'] * 3  # warm-up, then alternating rounds
    err = capsys.readouterr().err
    assert 'broken at size 7 failed; recorded' in err and 'Traceback' in err


def test_running_out_of_memory_is_a_result_not_a_failure():
    steps, _ = builders(torch.cuda.OutOfMemoryError('CUDA out of memory. Tried to allocate 64.00 GiB'))
    timing = time_steps(steps, CPU, warmup=0, repeats=2, keep_going=False, what='size 7')  # fails while timing
    assert timing.failures['broken'].status == 'out of memory'
    assert 'Tried to allocate 64.00 GiB' in timing.failures['broken'].error and set(timing.samples) == {'a', 'b'}
    assert attempt(lambda: 5, keep_going=False, what='x') == 5


def test_memory_workers_report_their_result_or_their_error():
    env = {**os.environ, 'PYTHONPATH': str(Path(__file__).parent)}  # the worker, found by its module's name
    assert run_memory_worker(token_grid_worker, dict(tokens=35), env) == dict(grid=[5, 7])
    with pytest.raises(ProcessFailed, match=r'^memory worker token_grid_worker exited 1: KeyError: .tokens.\n'):
        run_memory_worker(token_grid_worker, dict(), env)


def token_grid_worker(job):  # run in a fresh process by module and name
    print('log line')
    return dict(grid=list(token_grid(job['tokens'])))


def iteration_memory_worker(job):
    from nalaformer.analysis.memory import iteration_memory_mb, worker_memory
    held = []

    def step():  # each call keeps 8 MiB more
        held.append(torch.ones(2 ** 21))
    warmup = iteration_memory_mb(step, CPU, 0.0, warmup=1, iterations=2)
    held.clear()
    return dict(warmup=warmup, build=worker_memory(lambda: step, CPU, warmup=1, iterations=2, extra_since='build'))


@pytest.mark.slow
def test_iteration_memory_counts_from_the_warm_up_or_from_the_build():
    # a fixed mmap threshold: every 8 MiB tensor is mapped fresh and unmapped when freed
    memory = run_memory_worker(iteration_memory_worker, {},
                               {**memory_env(131072), 'PYTHONPATH': str(Path(__file__).parent)})
    if memory['warmup']['extra_mb'] is None:
        pytest.skip('this kernel refuses to reset VmHWM (/proc/self/clear_refs)')
    assert memory['warmup']['extra_mb'] == pytest.approx(16, abs=2)  # the two counted calls
    assert memory['build']['extra_mb'] == pytest.approx(24, abs=2)  # and the warm-up's


@pytest.mark.parametrize('tokens, grid', [(35, (5, 7)), (3136, (56, 56)), (13, (1, 13)), (73728, (256, 288))])
def test_token_grid_is_the_most_nearly_square(tokens, grid):
    assert token_grid(tokens) == grid


def test_a_value_error_from_inside_torch_keeps_its_traceback():
    def main(argv):  # a bug in a tool: torch refuses an argument
        F.cross_entropy(torch.zeros(1, 2), torch.zeros(1, dtype=torch.long), reduction='everything')
    with pytest.raises(ValueError, match='everything is not a valid value for reduction'):
        run_tool(main)


def test_a_bad_model_spec_is_one_line_with_exit_code_2(capsys):
    def main(argv):
        create_model(ModelSpec('nalaformer_xt', dict(attn_types='nala2')))
    assert run_tool(main) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: nalaformer_xt: unknown attention kernel 'nala2'") and len(err.splitlines()) == 1


def test_the_benchmarks_user_errors_exit_2(tmp_path, capsys):
    from analysis_tools import load_tool
    tool = load_tool('benchmark')
    assert run_tool(tool.main, ['op', '--methods', 'fast', 'sdpa', '--out-json', str(tmp_path / 'op.json')]) == 2
    assert capsys.readouterr().err == ("error: --methods ['sdpa'] are not methods of --what op: choose from "
                                       "['reference', 'fast']\n")
    assert not (tmp_path / 'op.json').exists()
