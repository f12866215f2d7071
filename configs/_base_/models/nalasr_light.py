# NaLa-SR light (nalaformer/models/nala_sr.py): MambaIRv2-Light's topology with the global slot computed by
# NaLa; trained on [0, 1] images with an L1 loss (the authors' pixel_opt: L1Loss, weight 1, mean).
# Validation and testing run in tiles of at most 200 LR pixels overlapping by 10%, as the authors'
# MambaIRv2LightModel.test (it cuts an image into h // 200 + 1 equal parts per axis, 10% overlap).
model = dict(type='SRModel', arch='nalasr_light', upscale=2, attn_types='nala', tile=200, tile_overlap=20)
