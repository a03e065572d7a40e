"""The optimizers grpokit runs, by transformers' names (TrainingArguments' ``optim``), as the ``optimizer`` key takes
them: torch's AdamW, and bitsandbytes' AdamW8bit (both of its names). Torch-free, so the config can list them."""

OPTIMIZERS = ("adamw_torch_fused", "adamw_torch", "adamw_bnb_8bit", "adamw_8bit")
EIGHT_BIT_OPTIMIZERS = ("adamw_bnb_8bit", "adamw_8bit")
