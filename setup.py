from pathlib import Path

from setuptools import find_packages, setup

ROOT = Path(__file__).parent


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
    # The oldest versions the package works with. timm: 1.0.31 is the first with the names the models use
    # (timm.layers.get_device_dtype, calculate_drop_path_rates, timm.models._input, Swin's window helpers;
    # 1.0.20-1.0.30 fail at import); requirements.txt pins it, so CI runs the floor (tests/test_dependencies.py).
    # pillow and scikit-image: nalaformer.images (image files, PSNR / SSIM) and the dataset writers
    install_requires=['torch>=2.4', 'torchvision', 'timm>=1.0.31', 'safetensors', 'numpy', 'pillow', 'scikit-image',
                      'pyyaml', 'tqdm'],
    extras_require={
        'train': ['mmengine>=0.10,<1.0', 'tensorboard', 'matplotlib'],
        'wandb': ['wandb'],
        # tools/deployment/export_onnx.py: torch's exporter (onnxscript) and the ONNX Runtime check
        'export': ['onnx>=1.16', 'onnxruntime>=1.18', 'onnxscript>=0.2'],
    },
    license='Apache-2.0',
)
