# Swin-T protocol, Table 6 row "PolaFormer" (82.6 top-1 reported): PolaFormer-style polarity-aware linear
# attention (the 'polarity' kernel: same- and opposite-sign interactions on two halves of v, power 3) in
# the global stages 1-2: the kernel inside the common protocol, not a port of PolaFormer's released model.
_base_ = ['./nala-swin-t_table5-table6-nala_8xb128-300e_in1k.py']
model = dict(attn_types=('polarity', 'polarity', 'shifted_window', 'shifted_window'),
             kernel_kwargs=(dict(power=3.0), dict(power=3.0), None, None))
