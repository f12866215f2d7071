"""setup.py's dependency floors are versions the package works with: CI installs timm at its floor.

The requirements are read as pip reads them (setup.py's egg_info metadata), not from the installed copy's
metadata, which was written when the package was installed.
"""
import subprocess
import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope='module')
def declared(tmp_path_factory):
    """{extra ('' for the core): [Requirement]} from setup.py."""
    out = tmp_path_factory.mktemp('egg')
    subprocess.run([sys.executable, 'setup.py', '-q', 'egg_info', '--egg-base', str(out)], cwd=ROOT, check=True,
                   capture_output=True)
    sections, extra = {'': []}, ''
    for line in (out / 'nalaformer.egg-info' / 'requires.txt').read_text().splitlines():
        if line.startswith('['):
            extra = line.strip('[]')
            sections[extra] = []
        elif line.strip():
            sections[extra].append(Requirement(line))
    return sections


def test_installed_versions_meet_the_declared_requirements(declared):
    for extra in ('', 'train', 'export'):
        for requirement in declared[extra]:
            try:
                installed = version(requirement.name)
            except PackageNotFoundError:
                assert extra, f'{requirement.name} is required but not installed'
                continue
            assert requirement.specifier.contains(installed, prereleases=True), \
                f'{requirement} declared, {installed} installed'


def test_ci_runs_timm_at_its_declared_floor(declared):
    """The models use timm helpers that appear in new timm releases; the floor is only known to work if CI runs it."""
    [timm] = [r for r in declared[''] if r.name == 'timm']
    floors = [Version(s.version) for s in timm.specifier if s.operator == '>=']
    assert floors, f'setup.py must state the oldest timm that works: {timm}'
    assert Version(version('timm')) == floors[0], (
        f'setup.py declares {timm} but CI runs timm {version("timm")}: check that `import nalaformer` and the '
        f'tests pass with timm {floors[0]} and pin it in requirements.txt, or raise the floor')
