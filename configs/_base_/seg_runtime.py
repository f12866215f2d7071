# Runtime shared by the segmentation configs: mmseg's (SegLocalVisualizer, SegTTAModel for
# `tools/test.py --tta`) with this project's atomic, weights-only loadable checkpoints.
_base_ = ['mmseg::_base_/default_runtime.py']

custom_imports = dict(imports=['nalaformer.dense'], allow_failed_imports=False)
runner_type = 'NaLaRunner'  # atomic checkpoint writes
custom_hooks = [
    dict(type='ResumableCheckpointHook'),  # checkpoints load with torch.load(weights_only=True)
    # long runs (nalaformer/engine/): stop a diverging run before it writes bad weights; save and stop on SIGTERM.
    # Custom hooks here because mmseg's schedule bases own default_hooks.
    dict(type='NonFiniteGuardHook', max_consecutive=3),
    dict(type='PreemptionHook', signals=['SIGTERM']),
]
sync_bn = 'torch'  # the backbone's stem/downsampling BatchNorms synchronised across GPUs (heads use SyncBN)
vis_backends = [dict(type='LocalVisBackend'), dict(type='TensorboardVisBackend')]  # scalars.json + TensorBoard
visualizer = dict(vis_backends=vis_backends)
randomness = dict(seed=0, deterministic=False)  # one seed for every run, as for classification; randomness.seed=N
