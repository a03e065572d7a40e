"""Models: loading from a folder, the Hub or a module, LoRA targets, the KV-cache argument's name."""
