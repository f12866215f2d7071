# NaLaFormer-T with NaLa attention in all four stages (the release uses softmax in stages 3-4).
_base_ = ['./nalaformer-t_8xb128_in1k.py']
model = dict(attn_types='nala')
