# Fine-tune an ImageNet-1K NaLaFormer-T on your own ImageFolder data with a new head:
#   data/my_dataset/{train,val}/<class_name>/*.jpg
#   python3 tools/train.py configs/nalaformer/nalaformer-t_in1k-pre_1xb64-50e_imagefolder.py \
#       --cfg-options model.num_classes=<N> model.pretrained=<in1k checkpoint>
_base_ = ['./nalaformer-t_8xb128_in1k.py']
data_root = 'data/my_dataset'
model = dict(pretrained='checkpoints/nalaformer_t_in1k.pth', num_classes=10, drop_path_rate=0.1,
             mixup=None, label_smoothing=0.1)  # the classifier is re-initialised for num_classes
train_dataloader = dict(batch_size=64, num_workers=4, sampler=dict(_delete_=True, type='DefaultSampler', shuffle=True),
                        dataset=dict(data_root=data_root,
                                     transform=dict(auto_augment='rand-m9-mstd0.5-inc1', re_prob=0.0)))
val_dataloader = dict(batch_size=64, num_workers=4, dataset=dict(data_root=data_root))
test_dataloader = val_dataloader
val_evaluator = dict(topk=(1, 5))
test_evaluator = val_evaluator
optim_wrapper = dict(optimizer=dict(lr=1e-4, weight_decay=0.05))
param_scheduler = [
    dict(type='LinearLR', start_factor=1e-2, by_epoch=True, begin=0, end=2, convert_to_iter_based=True),
    dict(type='CosineAnnealingLR', eta_min=1e-6, by_epoch=True, begin=2, end=50, convert_to_iter_based=True),
]
train_cfg = dict(max_epochs=50)
custom_hooks = [
    dict(type='DualEMAHook', momentum=1e-3, update_buffers=True),
    dict(type='EpochSeedHook'),
    dict(type='ResumableCheckpointHook'),
]
auto_scale_lr = dict(base_batch_size=64)  # --auto-scale-lr: lr 1e-4 is for 1 x 64 images
