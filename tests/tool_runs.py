"""Scripts run as a user runs them: ``python SCRIPT ARGS`` in a process of its own, from the repository root."""
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_script(script: Path, *args, check: bool = True, timeout: float = 900,
               env: dict = None) -> subprocess.CompletedProcess:
    """Runs ``script`` with ``args`` (str() of each) and ``env`` added to this environment; with ``check``, a
    non-zero exit fails the test with the end of the script's output."""
    result = subprocess.run([sys.executable, str(script), *map(str, args)], capture_output=True, text=True,
                            timeout=timeout, cwd=ROOT, env={**os.environ, **(env or {})})
    if check:
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    return result


def train(config: Path, work_dir: Path, *options, **kwargs) -> Path:
    """``tools/train.py CONFIG --work-dir WORK_DIR --cfg-options OPTIONS``, checked; the work dir."""
    run_script(ROOT / 'tools' / 'train.py', config, '--work-dir', work_dir, '--cfg-options', *options, **kwargs)
    return work_dir
