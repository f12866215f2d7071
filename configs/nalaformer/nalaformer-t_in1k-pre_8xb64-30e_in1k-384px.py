# Fine-tune an ImageNet-1K NaLaFormer-T at 384x384 (RoPE adapts to any size; no interpolation needed).
_base_ = ['./nalaformer-t_8xb128_in1k.py']
model = dict(pretrained='checkpoints/nalaformer_t_in1k.pth', drop_path_rate=0.1)
train_dataloader = dict(batch_size=64, dataset=dict(input_size=384))
val_dataloader = dict(batch_size=64, dataset=dict(input_size=384, transform=dict(crop_pct=1.0)))
test_dataloader = val_dataloader
optim_wrapper = dict(optimizer=dict(lr=2e-5, weight_decay=1e-8))
param_scheduler = [dict(type='CosineAnnealingLR', eta_min=2e-7, by_epoch=True, begin=0, end=30,
                        convert_to_iter_based=True)]
train_cfg = dict(max_epochs=30)
auto_scale_lr = dict(base_batch_size=512)  # --auto-scale-lr: lr 2e-5 is for 8 x 64 images
