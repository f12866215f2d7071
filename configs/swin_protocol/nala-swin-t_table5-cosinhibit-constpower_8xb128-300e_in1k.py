# Swin-T protocol, Table 5 row 2 "+ cosine inhibit" (82.5 top-1 reported): NaLa's sign split (the hard
# limit of the cosine inhibit, as released) with a constant power 3 on the query direction and on the
# key: the 'const_power' kernel. Row 3 adds the norm-aware query power (full NaLa).
# The paper's continuous cosine form with the norm-aware power is the 'nala_cos' kernel.
_base_ = ['./nala-swin-t_table5-table6-nala_8xb128-300e_in1k.py']
model = dict(attn_types=('const_power', 'const_power', 'shifted_window', 'shifted_window'),
             kernel_kwargs=(dict(power=3.0), dict(power=3.0), None, None))
