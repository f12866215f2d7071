from pathlib import Path

from setuptools import find_packages, setup

ROOT = Path(__file__).parent


def requirements():
    lines = (ROOT / 'requirements.txt').read_text().splitlines()
    reqs = [line.split('#')[0].strip() for line in lines]
    return [r for r in reqs if r and not r.startswith(('pytest', 'setuptools'))]


setup(
    name='nalaformer',
    version='0.1.0',
    description='NaLaFormer: norm-aware linear attention for vision (models, kernels, training configs)',
    long_description=(ROOT / 'README.md').read_text() if (ROOT / 'README.md').exists() else '',
    long_description_content_type='text/markdown',
    python_requires='>=3.9',
    # The Triton kernels live in kernels/ at the top of the repository but are installed as
    # nalaformer.kernels, so that `import kernels` never collides with another package.
    packages=find_packages(include=['nalaformer', 'nalaformer.*']) + ['nalaformer.kernels'],
    package_dir={'nalaformer.kernels': 'kernels'},
    install_requires=requirements(),
    extras_require={'wandb': ['wandb'], 'tensorboard': ['tensorboard']},
    license='Apache-2.0',
)
