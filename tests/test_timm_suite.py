"""timm's own model test-suite (tests/test_models.py of the installed timm), run on our models.

scripts/setup.sh puts timm's tests (from its sdist) in $NALAFORMER_CACHE/timm-<version>-tests.
Each of our families (nalaformer, nala_swin) is added to the list of modules with
forward_intermediates() support, so the feature and intermediate tests run for it too; then every
test whose id names one of its models runs: forward/backward, default cfgs, features,
intermediates, TorchScript, FX. One family: pytest tests/test_timm_suite.py -k nala_swin
"""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import timm

CACHE = Path(os.environ.get('NALAFORMER_CACHE', Path.home() / '.cache' / 'nalaformer'))
TIMM_TESTS = CACHE / f'timm-{timm.__version__}-tests'


# Our model families: timm module name (for the forward_intermediates filter and -k) and variants.
FAMILIES = {
    'nalaformer': ('nalaformer_xt', 'nalaformer_t', 'nalaformer_s', 'nalaformer_b', 'nalaformer_l'),
    'nala_swin': ('nala_swin_tiny', 'nala_swin_small', 'nala_swin_base'),
}


@pytest.mark.slow
@pytest.mark.timeout(3600)  # timm's suite on the large variants takes minutes on 2 cores
@pytest.mark.parametrize('family', list(FAMILIES))
def test_timm_model_suite_passes(tmp_path, family):
    source = TIMM_TESTS / 'test_models.py'
    assert source.is_file(), f'{source} is missing: run `bash scripts/setup.sh` first'
    text = source.read_text()
    anchor = 'FEAT_INTER_FILTERS = ['
    assert anchor in text, 'timm test-suite layout changed: FEAT_INTER_FILTERS not found'
    (tmp_path / 'test_models.py').write_text(text.replace(anchor, anchor + f"'{family}', ", 1))
    shutil.copy(TIMM_TESTS / 'conftest.py', tmp_path / 'conftest.py')
    result = subprocess.run(
        [sys.executable, '-m', 'pytest', '-p', 'nalaformer', '-p', 'no:cacheprovider', '-v', '-W', 'ignore',
         '-k', family, 'test_models.py'],
        cwd=tmp_path, capture_output=True, text=True, timeout=3000,
        # timm's own knob for its per-test limits (120 s by default, tight for the base variants on 2 cores)
        env={**os.environ, 'TIMEOUT': os.environ.get('TIMEOUT', '900')})
    summary = result.stdout.strip().splitlines()[-1] if result.stdout.strip() else ''
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]
    assert 'passed' in summary and 'failed' not in summary and 'error' not in summary, summary
    passed = {line.split(' ')[0].split('::')[1] for line in result.stdout.splitlines() if line.endswith('PASSED')
              or ' PASSED ' in line}
    for test in ('test_model_forward', 'test_model_backward', 'test_model_default_cfgs',
                 'test_model_forward_features', 'test_model_forward_intermediates',
                 'test_model_forward_intermediates_features', 'test_model_forward_torchscript',
                 'test_model_forward_fx', 'test_model_backward_fx', 'test_model_forward_fx_torchscript'):
        for variant in FAMILIES[family]:
            batch = 2 if 'backward' in test else 1
            assert f'{test}[{batch}-{variant}]' in passed, f'{test} did not pass for {variant}'
