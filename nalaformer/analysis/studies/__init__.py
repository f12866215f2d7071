"""The studies behind ``tools/analysis/study.py``, one module per subcommand (``classification``, ``sr``, ``dense``),
each with ``add_arguments(parser)`` and ``main(args)``; ``runs`` holds their runs, report files and figure."""
