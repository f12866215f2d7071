# The default runtime for pico models on one CPU: frequent logging, two checkpoints kept, and an
# EMA with momentum 2e-2 per iteration (the ImageNet value would not move in ten small epochs).
_base_ = ['./default_runtime.py']
default_hooks = dict(logger=dict(interval=20), checkpoint=dict(max_keep_ckpts=2))  # the last two: one survives a damaged write
custom_hooks = [
    dict(type='DualEMAHook', momentum=2e-2, update_buffers=True),
    dict(type='EpochSeedHook'),
    dict(type='ResumableCheckpointHook'),
]
