"""Trained models the kit converts from registry packages: a GGUF reader (`gguf`), the known models
(`registry`), the Hugging Face folder they become (`convert`, `tokenizer`)."""
