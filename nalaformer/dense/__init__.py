"""Dense-prediction support: the backbone registered in mmsegmentation's and mmdetection's registries.

Configs load it with ``custom_imports=dict(imports=['nalaformer.dense'], allow_failed_imports=False)``.
"""
from .backbone import NaLaBackbone
from .support import register_library_datasets

_registered = []
for _scope in ('mmseg', 'mmdet'):
    try:
        _registry = __import__(f'{_scope}.registry', fromlist=['MODELS']).MODELS
    except ImportError:
        continue
    _registry.register_module(module=NaLaBackbone)
    register_library_datasets(_scope)
    _registered.append(_scope)
if not _registered:
    raise ImportError('nalaformer.dense needs mmsegmentation or mmdetection: run `bash scripts/setup.sh`')
