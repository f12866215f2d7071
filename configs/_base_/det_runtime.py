# Runtime shared by every detection config: mmdet's runtime (hooks, DetLocalVisualizer, 'mmdet' scope)
# with this project's runner (atomic checkpoint writes) and checkpoints that load with
# torch.load(weights_only=True). Importing nalaformer.dense registers NaLaBackbone in mmdet's MODELS.
_base_ = ['mmdet::_base_/default_runtime.py']

custom_imports = dict(imports=['nalaformer.dense'], allow_failed_imports=False)
runner_type = 'NaLaRunner'
custom_hooks = [
    dict(type='ResumableCheckpointHook'),
    # long runs (nalaformer/engine/): stop a diverging run before it writes bad weights; save and stop on SIGTERM
    dict(type='NonFiniteGuardHook', max_consecutive=3),
    dict(type='PreemptionHook', signals=['SIGTERM']),
]
default_hooks = dict(checkpoint=dict(interval=1, max_keep_ckpts=3))
randomness = dict(seed=0, deterministic=False)  # one seed for every run, as for classification; randomness.seed=N
