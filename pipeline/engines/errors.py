"""The errors an engine raises that a caller handles by kind: a request that fails alone, and a
model the engine refuses at start. Apart from base.py so that what only names them (the job's
row conversion in its Ray tasks) imports no engine, drafter or torch."""


class RequestError(ValueError):
    """A request that cannot be generated as given (no prompt, an over-long one, a bad per-row
    setting); the message names the request. The request fails alone, as an error row."""


class ModelRefused(ValueError):
    """`engine.name` cannot run this model; the message names the model and the reason."""
