"""vLLM compatibility (lesson 95): its other engine arguments, env variables, module paths."""
