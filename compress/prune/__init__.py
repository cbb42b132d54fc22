"""Minitron-style structured pruning (width and depth) and knowledge-distillation repair."""
