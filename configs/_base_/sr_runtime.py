# Runtime of the super-resolution configs: iteration-based, BasicSR's logging and checkpoint rhythm
# (the authors' option files: print_freq 200, save_checkpoint_freq 5e3, TensorBoard on).
default_scope = None
custom_imports = dict(imports=['nalaformer.sr'], allow_failed_imports=False)
runner_type = 'NaLaRunner'  # atomic checkpoints that record the network's attn_types

default_hooks = dict(
    runtime_info=dict(type='RuntimeInfoHook'),
    timer=dict(type='IterTimerHook'),
    logger=dict(type='LoggerHook', interval=200),
    param_scheduler=dict(type='ParamSchedulerHook'),
    checkpoint=dict(type='CheckpointHook', by_epoch=False, interval=5000, max_keep_ckpts=3),
    sampler_seed=dict(type='DistSamplerSeedHook'),
    # long runs (nalaformer/engine/): stop a diverging run before it writes bad weights; save and stop on SIGTERM
    nonfinite=dict(type='NonFiniteGuardHook', max_consecutive=3),
    preemption=dict(type='PreemptionHook', signals=['SIGTERM']),
)
custom_hooks = [dict(type='ResumableCheckpointHook')]  # checkpoints load with torch.load(weights_only=True)

env_cfg = dict(
    threads=None,  # CPU threads: None = the cores other processes leave free (nalaformer/threads.py)
    cudnn_benchmark=False,  # test images differ in size
    mp_cfg=dict(mp_start_method='fork', opencv_num_threads=0),
    dist_cfg=dict(backend='nccl'),
)
visualizer = dict(type='Visualizer', vis_backends=[dict(type='LocalVisBackend'), dict(type='TensorboardVisBackend')])
log_processor = dict(by_epoch=False, window_size=50)
log_level = 'INFO'
load_from = None
resume = False
randomness = dict(seed=0, deterministic=False)  # the project's seed (the authors' option files use 10)
