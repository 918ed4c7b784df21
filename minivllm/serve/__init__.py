"""Serving: the async engine (14), the OpenAI-compatible server (15), the command line (17)."""
