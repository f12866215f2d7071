# Runtime shared by the segmentation configs: mmseg's (SegLocalVisualizer, SegTTAModel for
# `tools/test.py --tta`) with this project's atomic, weights-only loadable checkpoints.
_base_ = ['mmseg::_base_/default_runtime.py']

custom_imports = dict(imports=['nalaformer.dense', 'nalaformer.engine'], allow_failed_imports=False)
runner_type = 'NaLaRunner'  # atomic checkpoint writes
custom_hooks = [dict(type='ResumableCheckpointHook')]  # checkpoints load with torch.load(weights_only=True)
sync_bn = 'torch'  # the backbone's stem/downsampling BatchNorms synchronised across GPUs (heads use SyncBN)
vis_backends = [dict(type='LocalVisBackend'), dict(type='TensorboardVisBackend')]  # scalars.json + TensorBoard
visualizer = dict(vis_backends=vis_backends)
# long runs: stop a diverging run before it writes bad weights, save and stop on SIGTERM (nalaformer/engine/)
default_hooks = dict(nonfinite=dict(type='NonFiniteGuardHook', max_consecutive=3),
                     preemption=dict(type='PreemptionHook', signals=['SIGTERM']))
