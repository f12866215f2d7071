"""Library code behind ``tools/analysis`` (each tool there is a thin command over it; no tool imports another).

The measurement toolkit of the benchmarks:

* ``timing``: one timed call, repeated calls, steps timed alternating with the contention recorded; statistics
* ``memory``: resident and CUDA peak memory of an iteration, measured in a fresh process (``--memory-worker``)
* ``machine``: the device's name and bandwidth, load, other processes' busy cores, child processes
* ``steps``: one inference or training iteration of a model (AMP dtypes, NaLa backend), loss summaries
* ``results``: failing rows (raised, or recorded with ``--keep-going``), ratios, report and figure writing
* ``grids``: input sizes and token grids
* ``tensor_memory``: tensor memory counted on fake tensors, for runs too large to measure

and the analyses: model specs (``models``, ``release``), FLOPs (``flops``), attention entropy (``entropy``,
``images``, ``cli``), the mechanism study (``mechanism``).
"""
