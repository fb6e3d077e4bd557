"""The lowest layer, below the drafters and everything above them: sampling primitives (settings,
random state, the target's filtered distribution), forward helpers over a Hugging Face model's KV
cache, and the keys of artifacts built once."""
