# NaLa-SR light, x2, on DIV2K: the authors' lightweight-SR recipe on 8 GPUs x 16 images.
#   bash tools/dist_train.sh configs/sr/nalasr-light_8xb16-500k_div2k-x2.py 8
#   python3 tools/test.py configs/sr/nalasr-light_8xb16-500k_div2k-x2.py work_dirs/.../iter_500000.pth
# PolaFormerPP ships x3 and x4 option files only; x2 takes their values with MambaIRv2's lightSR x2 crop.
_base_ = [
    '../_base_/models/nalasr_light.py',
    '../_base_/datasets/div2k_sr.py',
    '../_base_/schedules/sr_adam_500k.py',
    '../_base_/sr_runtime.py',
]
scale = 2
model = dict(upscale=scale)
train_dataloader = dict(dataset=dict(scale=scale, patch_size=128))  # gt_size 128 (MambaIRv2 lightSR x2)
val_dataloader = dict(dataset=dict(scale=scale, sets=['Set14']))  # MambaIRv2 lightSR x2 validates on Set14
test_dataloader = dict(dataset=dict(scale=scale))
# BasicSR's save_best: the checkpoint of the best validation PSNR is kept (best_Set14_PSNR_iter_N.pth)
default_hooks = dict(checkpoint=dict(save_best='Set14/PSNR', rule='greater'))
