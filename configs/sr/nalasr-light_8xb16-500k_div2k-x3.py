# NaLa-SR light, x3, on DIV2K: the authors' lightweight-SR recipe on 8 GPUs x 16 images
# (PolaFormerPP downstream/sr/options/train/mambairv2/train_MambaIRv2_lightSR_x3.yml).
#   bash tools/dist_train.sh configs/sr/nalasr-light_8xb16-500k_div2k-x3.py 8
#   python3 tools/test.py configs/sr/nalasr-light_8xb16-500k_div2k-x3.py work_dirs/.../iter_500000.pth
_base_ = [
    '../_base_/models/nalasr_light.py',
    '../_base_/datasets/div2k_sr.py',
    '../_base_/schedules/sr_adam_500k.py',
    '../_base_/sr_runtime.py',
]
scale = 3
model = dict(upscale=scale)
train_dataloader = dict(dataset=dict(scale=scale))
val_dataloader = dict(dataset=dict(scale=scale, sets=['Set14']))  # the x3 file validates on Set14
test_dataloader = dict(dataset=dict(scale=scale))
# BasicSR's save_best: the checkpoint of the best validation PSNR is kept (best_Set14_PSNR_iter_N.pth)
default_hooks = dict(checkpoint=dict(save_best='Set14/PSNR', rule='greater'))
