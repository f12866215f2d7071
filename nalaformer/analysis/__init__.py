"""Library code behind ``tools/analysis`` (each tool there is a thin command over it; no tool imports another).

The measurement toolkit (``timing``, ``memory``, ``tensor_memory``, ``machine``, ``steps``, ``results``, ``plots``,
``grids``), the model specs (``models``, ``release``), and the measurements: ``benchmarks`` (tools/analysis/
benchmark.py's subcommands), ``studies`` (tools/analysis/study.py's), ``flops``, attention entropy (``entropy``,
``images``, ``cli``) and the mechanism (``mechanism``).
"""
