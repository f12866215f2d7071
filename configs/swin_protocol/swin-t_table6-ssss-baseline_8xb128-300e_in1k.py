# Swin-T protocol, Table 6 row "Swin-T" (81.2 top-1 reported; Swin's paper: 81.3): shifted-window softmax
# attention in every stage. attn_types='shifted_window' is exactly timm's swin_tiny_patch4_window7_224
# (same parameter names; its weights load), trained with the same recipe as the other rows.
_base_ = ['./nala-swin-t_table5-table6-nala_8xb128-300e_in1k.py']
model = dict(attn_types='shifted_window')
