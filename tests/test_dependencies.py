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


def test_ci_installs_timm_at_its_declared_floor(declared):
    """The models use timm helpers that appear in new timm releases: the floor setup.py states is known to work only
    if the suite runs it, so requirements.txt (what setup installs for CI) pins timm at that floor."""
    [timm] = [r for r in declared[''] if r.name == 'timm']
    floors = [s.version for s in timm.specifier if s.operator == '>=']
    assert floors, f'setup.py must state the oldest timm that works: {timm}'
    lines = [line.split('#')[0].strip() for line in (ROOT / 'requirements.txt').read_text().splitlines()]
    [pinned] = [Requirement(line) for line in lines if line and Requirement(line).name == 'timm']
    assert str(pinned.specifier) == f'=={floors[0]}', (
        f'setup.py declares {timm} but requirements.txt installs {pinned}: pin the floor there, or raise the floor')
