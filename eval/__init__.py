"""Evaluation: perplexity (and, later, MMLU through lm-eval and reports). Installed as compress.eval."""
