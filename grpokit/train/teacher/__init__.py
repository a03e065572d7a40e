"""On-policy distillation's teacher: its settings, the tokenizer check, a local frozen teacher and a served one, and
the per-step scoring that turns their log-probs into the advantage term (docs/distillation.md)."""
