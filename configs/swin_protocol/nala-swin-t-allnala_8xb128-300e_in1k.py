# Swin-T protocol with NaLa in all four stages (not a row of the paper): global linear attention
# everywhere, no windows at all.
_base_ = ['./nala-swin-t_table5-table6-nala_8xb128-300e_in1k.py']
model = dict(attn_types='nala')
