"""biencoder: config-driven ablation runner for bi-encoder counter-argument retrieval."""

__version__ = "0.1.0"
