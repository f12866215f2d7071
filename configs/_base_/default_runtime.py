# Runtime shared by every classification config: mmengine hooks, logging, checkpointing.
default_scope = None
custom_imports = dict(imports=['nalaformer.classification'], allow_failed_imports=False)
runner_type = 'NaLaRunner'  # atomic checkpoint writes

default_hooks = dict(
    runtime_info=dict(type='RuntimeInfoHook'),
    timer=dict(type='IterTimerHook'),
    logger=dict(type='LoggerHook', interval=100),
    param_scheduler=dict(type='ParamSchedulerHook'),
    # The best raw and the best EMA checkpoints are both kept (best_accuracy_top1_epoch_N.pth,
    # best_ema_accuracy_top1_epoch_M.pth): the release reports the larger of the two (main.py's max_accuracy).
    checkpoint=dict(type='CheckpointHook', interval=1, max_keep_ckpts=3,
                    save_best=['accuracy/top1', 'ema/accuracy/top1'], rule='greater'),
    sampler_seed=dict(type='DistSamplerSeedHook'),
    # long runs: stop a diverging run before it writes bad weights (nalaformer/engine/guard.py), save and stop on
    # SIGTERM (nalaformer/engine/preemption.py), replace unreadable training images up to a limit (engine/hooks.py)
    nonfinite=dict(type='NonFiniteGuardHook', max_consecutive=3),
    preemption=dict(type='PreemptionHook', signals=['SIGTERM']),
    unreadable=dict(type='UnreadableImageHook', max_fraction=0.001, min_count=5),
)
custom_hooks = [
    # EMA of weights and buffers, decay 0.99996 ** (total batch / 512) per iteration (release main.py:
    # --model-ema-decay 0.99996 scaled by batch_size * world_size / 512): momentum 8e-5 at 1024, 2e-5 at 256.
    # Validation reports raw and ema/ metrics.
    dict(type='DualEMAHook', decay=0.99996, decay_batch_size=512, update_buffers=True),
    dict(type='EpochSeedHook'),            # exact resume from epoch-end checkpoints
    dict(type='ResumableCheckpointHook'),  # checkpoints load with torch.load(weights_only=True)
]

env_cfg = dict(
    threads=None,  # CPU threads: None = the cores other processes leave free (nalaformer/threads.py)
    cudnn_benchmark=True,
    mp_cfg=dict(mp_start_method='fork', opencv_num_threads=0),
    dist_cfg=dict(backend='nccl'),
)
sync_bn = 'torch'  # BatchNorm -> SyncBatchNorm when distributed (release recipe)
visualizer = dict(type='Visualizer', vis_backends=[dict(type='LocalVisBackend'), dict(type='TensorboardVisBackend')])
log_processor = dict(by_epoch=True, window_size=50)
log_level = 'INFO'
load_from = None
resume = False
randomness = dict(seed=0, deterministic=False)  # release main.py: --seed 0 (+ rank)
