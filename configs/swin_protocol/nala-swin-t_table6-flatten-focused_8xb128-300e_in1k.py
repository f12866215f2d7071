# Swin-T protocol, Table 6 row "FLatten" (82.1 top-1 reported): FLatten-style focused linear attention
# (the 'focused' kernel, focusing power 3) in the global stages 1-2: the focused kernel inside the common
# protocol (same 5x5 depthwise conv on v, same 2D RoPE), not a port of FLatten's released Swin model.
_base_ = ['./nala-swin-t_table5-table6-nala_8xb128-300e_in1k.py']
model = dict(attn_types=('focused', 'focused', 'shifted_window', 'shifted_window'),
             kernel_kwargs=(dict(power=3.0), dict(power=3.0), None, None))
