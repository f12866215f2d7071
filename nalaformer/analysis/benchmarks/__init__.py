"""The measurements behind ``tools/analysis/benchmark.py``, one module per subcommand (``model``, ``op``, ``kernels``,
``sr``, ``segmentor``, ``contention``), each with ``add_arguments(parser)`` and ``main(args)``; ``common`` holds what
they share."""
