"""The core path (lessons 00-13): from a request's sampling parameters to `LLM.generate`."""
