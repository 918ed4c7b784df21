"""Parallelism: tensor (07), pipeline (07c) and data (14b) parallel engines."""
