"""Analysis helpers used by ``tools/analysis``: model specs, FLOP counting, attention entropy."""
