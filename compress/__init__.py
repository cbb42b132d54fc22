"""compress: LLM compression toolkit with its own decoding runtime."""

__version__ = "0.1.0"
