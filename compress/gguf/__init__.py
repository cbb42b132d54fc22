"""GGUF files for llama.cpp and Ollama: our rounding inside llama.cpp's own block types (docs/gguf.md)."""
