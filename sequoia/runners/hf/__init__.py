"""The Hugging Face / torch runtime: models from transformers, tree masks, DynamicCache, CPU kernels."""
