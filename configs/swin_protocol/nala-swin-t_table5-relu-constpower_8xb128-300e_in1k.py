# Swin-T protocol, Table 5 row 1 "ReLU + constant power" (82.1 top-1 reported): phi(x) = relu(x)^3 in the
# global linear stages 1-2 (the 'relu' kernel with power=3), no sign information, no norm awareness.
_base_ = ['./nala-swin-t_table5-table6-nala_8xb128-300e_in1k.py']
model = dict(attn_types=('relu', 'relu', 'shifted_window', 'shifted_window'),
             kernel_kwargs=(dict(power=3.0), dict(power=3.0), None, None))
