# The toy task plug-in's config: a pico NaLaFormer regressing square coverage, 4 epochs on one CPU.
custom_imports = dict(imports=['toy_task'], allow_failed_imports=False)
default_scope = None
runner_type = 'NaLaRunner'
model = dict(type='CoverageRegressor', arch='nalaformer_t', embed_dims=(16, 32, 48, 64), depths=(1, 1, 1, 1),
             num_heads=(1, 1, 1, 2), head_hidden_size=64, drop_path_rate=0.0, attn_types='nala')
train_dataloader = dict(batch_size=16, num_workers=0, sampler=dict(type='DefaultSampler', shuffle=True),
                        collate_fn=dict(type='default_collate'),
                        dataset=dict(type='SquareDataset', data_root='data/squares/train'))
val_dataloader = dict(batch_size=16, num_workers=0, sampler=dict(type='DefaultSampler', shuffle=False),
                      collate_fn=dict(type='default_collate'),
                      dataset=dict(type='SquareDataset', data_root='data/squares/val'))
test_dataloader = val_dataloader
val_evaluator = dict(type='CoverageError')
test_evaluator = val_evaluator
optim_wrapper = dict(type='OptimWrapper', optimizer=dict(type='AdamW', lr=2e-3, weight_decay=0.01))
train_cfg = dict(by_epoch=True, max_epochs=4, val_interval=1)
val_cfg = dict()
test_cfg = dict()
default_hooks = dict(checkpoint=dict(type='CheckpointHook', interval=1, max_keep_ckpts=1,
                                     save_best='coverage/mae', rule='less'),
                     logger=dict(type='LoggerHook', interval=5))
randomness = dict(seed=0)
