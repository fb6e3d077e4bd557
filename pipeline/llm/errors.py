"""The error that stops a job or a processor on purpose, in a module of its own: the input readers
raise it in Ray's read tasks, which must not import the engines (torch, transformers) to do so."""


class JobFailed(RuntimeError):
    """The job or processor stopped on purpose (a model the engine cannot run, no node for an actor,
    too many errored rows, unusable input); the message says why."""
