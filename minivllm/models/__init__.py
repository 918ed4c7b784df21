"""Model families beyond Llama: mixture of experts (07d), Gemma and Phi (07e)."""
