# The authors' SR schedule (PolaFormerPP downstream/sr/options/train/mambairv2/train_MambaIRv2_lightSR_x{3,4}.yml,
# the same in MambaIRv2's lightSR x2/x3/x4 files): Adam lr 2e-4, betas (0.9, 0.99), no weight decay, no warm-up;
# 500k iterations, lr x0.5 at 250k / 400k / 450k / 475k; validation and checkpoints every 5k.
optim_wrapper = dict(type='OptimWrapper', optimizer=dict(type='Adam', lr=2e-4, betas=(0.9, 0.99), weight_decay=0.))
param_scheduler = [
    dict(type='MultiStepLR', by_epoch=False, milestones=[250000, 400000, 450000, 475000], gamma=0.5),
]
train_cfg = dict(type='IterBasedTrainLoop', max_iters=500000, val_interval=5000)
val_cfg = dict(type='ValLoop')
test_cfg = dict(type='TestLoop')
