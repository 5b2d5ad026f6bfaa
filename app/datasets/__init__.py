"""Datasets the product itself reads (the distillation's sources); see README.md."""
