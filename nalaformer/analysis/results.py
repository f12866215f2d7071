"""A benchmark's result rows: a row that fails stops the run with its error, unless the run keeps going
(``--keep-going``) and records the error; running out of memory is a result, not a failure. Also ratios to a baseline
row, the formatting of optional figures and tables, and the writing of a report (JSON, atomically) and its figure."""
import gc
import json
import os
import sys
import traceback
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Dict, Hashable, Iterable, List, Optional, Sequence, TypeVar, Union

import torch

__all__ = ['Failure', 'add_ratios', 'attempt', 'format_error', 'format_optional', 'markdown_table', 'out_of_memory',
           'write_json', 'write_report']

OUT_OF_MEMORY = 'out of memory'
ERROR = 'error'
T = TypeVar('T')


@dataclass(frozen=True)
class Failure:
    """A row without a result: ``status`` 'out of memory' or 'error', ``error`` the exception's first line."""
    status: str
    error: str

    def as_row(self) -> Dict[str, str]:
        return asdict(self)


def out_of_memory(error: BaseException) -> bool:
    """An allocation that failed: CUDA's or the host's out-of-memory error, also when reported by a child process."""
    if isinstance(error, (torch.cuda.OutOfMemoryError, MemoryError)):
        return True
    text = str(error).lower()
    return 'out of memory' in text or "can't allocate memory" in text


def format_error(error: BaseException) -> str:
    """The exception's type and first line, for the error of a row."""
    text = str(error).strip().splitlines()
    return f'{type(error).__name__}: {text[0] if text else ""}'[:300]


def attempt(fn: Callable[[], T], keep_going: bool, what: str) -> Union[T, Failure]:
    """``fn()``; or, where it raises, a :class:`Failure`: always for running out of memory, for any other error only
    when ``keep_going`` (the traceback is printed); otherwise the error propagates, noting ``what`` failed."""
    try:
        return fn()
    except Exception as error:
        gc.collect()  # what the failed row held
        if torch.cuda.is_initialized():
            torch.cuda.empty_cache()
        if out_of_memory(error):
            return Failure(OUT_OF_MEMORY, format_error(error))
        if not keep_going:
            error.add_note(f'({what} failed; --keep-going records the error of a failing row and goes on)')
            raise
        print(f'warning: {what} failed; recorded, going on (--keep-going):', file=sys.stderr)
        traceback.print_exc()
        return Failure(ERROR, format_error(error))


def add_ratios(rows: List[Dict], is_baseline: Callable[[Dict], bool], group: Callable[[Dict], Hashable],
               ratios: Dict[str, str]):
    """For every ``ratio_key: value_key`` of ``ratios``, ``row[ratio_key]`` = the row's value over the value of the
    baseline row of its group (None where either is missing or the baseline's is 0)."""
    baselines = {group(r): r for r in rows if is_baseline(r)}
    for row in rows:
        base = baselines.get(group(row), {})
        for ratio_key, value_key in ratios.items():
            ok = row.get(value_key) is not None and base.get(value_key)
            row[ratio_key] = row[value_key] / base[value_key] if ok else None


def format_optional(value: Optional[float], spec: str) -> str:
    """``format(value, spec)``, or 'n/a' for None."""
    return 'n/a' if value is None else format(value, spec)


def markdown_table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    """A Markdown table of string cells."""
    lines = ['| ' + ' | '.join(header) + ' |', '|' + '---|' * len(header)]
    return '\n'.join(lines + ['| ' + ' | '.join(row) + ' |' for row in rows])


def write_json(path: Path, report: Dict):
    """Write ``report`` to ``path`` atomically: a run stopped while writing keeps the previous file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + '.tmp')
    tmp.write_text(json.dumps(report, indent=2) + '\n')
    os.replace(tmp, path)


def write_report(report: Dict, json_path: Path, plot: Optional[Callable[[Dict, Path], None]] = None,
                 png_path: Optional[Path] = None) -> str:
    """Write ``report`` to ``json_path`` (:func:`write_json`) and, given ``plot``, its figure to ``png_path``; the last
    line a benchmark prints: the load averages at its start and end (where its ``meta`` has them), the files."""
    write_json(json_path, report)
    paths = [json_path]
    if plot is not None:
        plot(report, png_path)
        paths.append(png_path)
    meta = report.get('meta', {})
    load = f"load {meta['load_at_start']} -> {meta['load_at_end']}; " if 'load_at_end' in meta else ''
    return f"{load}wrote {' and '.join(map(str, paths))}"
