# The release's ImageNet-1K recipe (ZacharyMeng/NaLaFormer NaLaformer/main.py defaults, pretrain.sh):
# AdamW, lr 5e-4 x total batch / 512 (main.py scales it always: 1e-3 at 8 x 128), wd 0.05, eps 1e-8; 300 epochs
# with 5 warm-up epochs from 1e-6 and cosine to 1e-5. The paper (v1) says 320 epochs with 20 warm-up; these
# configs follow the release (README: discrepancies). The lr changes every iteration here, every epoch there.
optim_wrapper = dict(
    type='OptimWrapper',
    optimizer=dict(type='AdamW', lr=1e-3, weight_decay=0.05, betas=(0.9, 0.999), eps=1e-8),
    # Decay as timm's create_optimizer in main.py: none for parameters with ndim <= 1 (norms) and names
    # ending in .bias, and none for model.no_weight_decay() (the release names absolute_pos_embed, which
    # the model does not have). LayerScale gamma_1/gamma_2 have shape (1, C, 1, 1), so they decay at 0.05.
    paramwise_cfg=dict(bias_decay_mult=0.0, flat_decay_mult=0.0),
    clip_grad=None,  # the release does not clip (--clip-grad None); e.g. dict(max_norm=5.0)
    accumulative_counts=1,
)
param_scheduler = [
    dict(type='LinearLR', start_factor=1e-3, by_epoch=True, begin=0, end=5, convert_to_iter_based=True),
    dict(type='CosineAnnealingLR', eta_min=1e-5, by_epoch=True, begin=5, end=300, convert_to_iter_based=True),
]
train_cfg = dict(by_epoch=True, max_epochs=300, val_interval=1)
val_cfg = dict()
test_cfg = dict()
# tools/train.py --auto-scale-lr: lr x total batch / 1024 (the release's rule); the warm-up and the cosine are in
# epochs, so they follow the batch's iterations; the EMA follows the batch always (default_runtime.py).
auto_scale_lr = dict(base_batch_size=1024, enable=False)
